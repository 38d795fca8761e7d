"""PostgreSQL stopped while a store is under way (files placed, index not committed): the
instances fail with 0x0110 Processing Failure (PS3.7 Annex C), the same for STOW-RS's
FailureReason (0008,1197) and the C-STORE-RSP status. They failed with 0xA700 "Refused: Out of
Resources" (PS3.4 B.2.3), which tells a modality the archive is full: unavailable is not full.
A full disk still answers 0xA700 (tests/routing/test_outbox.py, tests/store/test_s3.py). A
C-GET with the index down then fails with 0xC000 (it was a Success with nothing sent), and the
outbox in the same database (storage commitment reports) fails at once as the index does."""

from __future__ import annotations

import pytest
from pydicom import uid as U
from pydicom.dataset import Dataset
from pynetdicom import AE
from pynetdicom.sop_class import StudyRootQueryRetrieveInformationModelGet

from dicomweb_server import archive as archive_module
from dicomweb_server.archive import Archive
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.scp import DimseServer
from dicomweb_server.settings import Settings
from dicomweb_server.store.base import IndexUnavailable
from tests.helpers import make_dataset, to_bytes


@pytest.fixture
def pg():
    from tests.postgres import PostgresServer, skipped

    if skipped():
        pytest.skip("DICOMWEB_POSTGRES=skip")
    server = PostgresServer()  # a server of its own: the tests stop it
    yield server
    try:
        server.stop()
    except RuntimeError:  # stopped by the test: pg_ctl finds no server; its folder goes all the same
        import shutil

        shutil.rmtree(server.dir, ignore_errors=True)


def _stop_at_placed(monkeypatch, pg) -> list[str]:
    """Stop PostgreSQL (immediate: as a crash) when a store reaches ``placed``."""
    real, stopped = archive_module.faults.point, []

    def point(step):
        if step == "placed" and not stopped:
            pg._run("pg_ctl", "-D", str(pg.dir / "data"), "-m", "immediate", "-w", "stop")
            stopped.append(step)
        real(step)

    monkeypatch.setattr(archive_module.faults, "point", point)
    return stopped


def test_stow_failure_reason_is_processing_failure(tmp_path, pg, monkeypatch):
    from dicomweb_server.dicom.multipart import SpooledPart

    archive = Archive.open(Settings(data_dir=tmp_path, index="postgresql", database_url=pg.url))
    try:
        def part():
            ds = make_dataset()
            p = archive.blobs.spool / f"{ds.SOPInstanceUID}.part"
            p.write_bytes(to_bytes(ds))
            return ds, SpooledPart(headers={}, path=p, size=p.stat().st_size, complete=True)

        first = archive.store([part()[1]]).stored  # the pools hold live connections now
        assert len(first) == 1
        stopped = _stop_at_placed(monkeypatch, pg)
        (a, pa), (b, pb) = part(), part()
        outcome = archive.store([pa, pb])
        assert stopped == ["placed"]
        assert outcome.stored == []
        assert [(int(f.reason), f.sop_instance_uid) for f in outcome.failed] == [
            (0x0110, a.SOPInstanceUID), (0x0110, b.SOPInstanceUID)]
        assert all(f.message.startswith("cannot commit the index: ") for f in outcome.failed)
        # nothing of the failed store left placed
        assert [p.rsplit("/", 1)[1] for p in archive.blobs.walk()] == [first[0].sop_instance_uid + ".dcm"]
    finally:
        archive.close()


def test_c_store_status_is_processing_failure(tmp_path, pg, monkeypatch):
    archive = Archive.open(Settings(data_dir=tmp_path, index="postgresql", database_url=pg.url))
    server = DimseServer(archive)
    port = server.start(host="127.0.0.1", port=0)
    try:
        ae = AE(ae_title="TESTSCU")
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 60
        ae.add_requested_context("1.2.840.10008.5.1.4.1.1.2", U.ExplicitVRLittleEndian)
        assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
        assert assoc.is_established
        first = make_dataset()
        assert assoc.send_c_store(first).Status == S.SUCCESS
        stopped = _stop_at_placed(monkeypatch, pg)
        rsp = assoc.send_c_store(make_dataset())
        assert stopped == ["placed"]
        assert rsp.Status == S.PROCESSING_FAILURE, hex(rsp.Status)
        assert rsp.ErrorComment.startswith("cannot commit the index")
        assoc.release()
        # C-GET with the index down: 0xC000 unable to process, as C-FIND (it was Success with
        # no sub-operation: pynetdicom answers a count of 0 with Success)
        ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
        assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
        ident = Dataset()
        ident.QueryRetrieveLevel = "STUDY"
        ident.StudyInstanceUID = first.StudyInstanceUID
        final = [s for s, _ in assoc.send_c_get(ident, StudyRootQueryRetrieveInformationModelGet)][-1]
        assoc.release()
        assert final.Status == S.QR_UNABLE_TO_PROCESS, hex(final.Status)
        assert "the index database" in final.ErrorComment
        # the outbox in the same database says so at once too (it waited for its pool's 30 s,
        # then PoolTimeout: the listener's stop below waited that twice, a minute)
        with pytest.raises(IndexUnavailable, match="cannot be reached"):
            server.commitment.outbox.release("nobody")
    finally:
        server.stop()
        archive.close()

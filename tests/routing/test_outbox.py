"""The outbox rows and the instance rows commit together: if the outbox cannot be
written, the instance is not stored (and not acknowledged), with every index."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.dicom.status import FailureReason
from dicomweb_server.routing.outbox import Outbox
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset
from tests.routing.conftest import ALL


def _part(archive: Archive, name: str, **attrs) -> SpooledPart:
    path = archive.blobs.spool / name
    make_dataset(**attrs).save_as(path, enforce_file_format=True)
    return SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True)


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_an_outbox_that_cannot_be_written_fails_the_store(tmp_path, monkeypatch, backend):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
                      '[[rules]]\nmatch = { Modality = "CT" }\ndestinations = ["pacs"]\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index=backend.index, routes_file=routes,
                                    **backend.settings))
    try:
        ok = archive.store([_part(archive, "a.dcm", modality="CT"), _part(archive, "b.dcm", modality="MR")])
        assert len(ok.stored) == 2
        assert [(r["destination"], r["state"]) for r in archive.routing.outbox.rows()] == [("pacs", "pending")]

        def disk_full(self, entries, con=None, decided=()):
            if backend.index == "postgresql":
                import psycopg

                raise psycopg.errors.DiskFull("could not extend file: No space left on device")
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(Outbox, "insert", disk_full)
        failed = archive.store([_part(archive, "c.dcm", modality="CT", PatientID="lost")])
        assert [f.reason for f in failed.failed] == [FailureReason.OUT_OF_RESOURCES] and not failed.stored
        assert archive.index.count() == 2  # nothing of the failed store is visible
        assert sorted(p.name for p in (tmp_path / "data" / "blobs").rglob("*.dcm")) == sorted(
            f"{s.sop_instance_uid}.dcm" for s in ok.stored)
        # an instance the rules do not match writes no row, so the outbox is not in its way; but
        # the in-memory index enters every instance in its ledger (routing/__init__.py)
        unmatched = archive.store([_part(archive, "d.dcm", modality="MR")])
        assert len(unmatched.stored) == (0 if backend.index == "memory" else 1)
    finally:
        archive.close()


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_delivered_rows_are_removed_after_keep_delivered(tmp_path, backend):
    """Delivered rows older than ``keep_delivered`` go (oldest first, ``limit`` at a time);
    recent deliveries, owed rows and dead letters stay. Before, every forward ever made
    stayed in the table that the queue's counts and the /metrics gauges read whole."""
    import asyncio

    from dicomweb_server.routing.forwarder import Forwarder
    from dicomweb_server.routing.outbox import Settlement

    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
                      '[[rules]]\ndestinations = ["pacs"]\n[delivery]\nkeep_delivered = 3600\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index=backend.index, routes_file=routes,
                                    **backend.settings))
    try:
        outbox = archive.routing.outbox
        with outbox._reading() as con:  # found by an index (PostgreSQL: schema version 3)
            names = {r[0] for r in con.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'outbox'" if backend.index == "postgresql"
                else "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox'")}
        assert "outbox_delivered" in names
        assert len(archive.store([_part(archive, f"{i}.dcm", PatientID=f"P{i}") for i in range(5)]).stored) == 5
        rows, _ = outbox.claim("pacs", 4, "test:1:x:0", 60.0, 2)
        ids = sorted(r.id for r in rows)
        ids += [r["id"] for r in outbox.rows() if r["id"] not in ids]  # the fifth, still owed
        outbox.settle(Settlement(delivered=ids[:3], retry=[], failed=[(ids[3], "refused")], solo=[]), "test:1:x:0")
        with outbox._transaction() as con:  # two deliveries two and three hours ago, one just now
            for i, age in ((ids[0], 7200), (ids[1], 10800)):
                con.execute(outbox._sql("UPDATE outbox SET _delivered = _delivered - ? WHERE id = ?"), (age, i))

        def states():
            return sorted((r["id"], r["state"]) for r in outbox.rows())

        before = states()
        assert outbox.prune(3600, limit=1) == 1  # the oldest first
        assert states() == [s for s in before if s[0] != ids[1]]
        assert outbox.prune(3600) == 1
        assert outbox.prune(3600) == 0
        assert states() == [(ids[2], "delivered"), (ids[3], "failed"), (ids[4], "pending")] == \
            [s for s in before if s[0] not in ids[:2]]
        assert outbox.stats()["pacs"] | {"oldest_pending_age": None, "last_delivered": None} == {
            "pending": 1, "in_flight": 0, "delivered": 1, "failed": 1, "oldest_pending_age": None,
            "last_error": "refused", "last_delivered": None}

        # the forwarder removes them at start (and every PRUNE_EVERY seconds after)
        with outbox._transaction() as con:
            con.execute(outbox._sql("UPDATE outbox SET _delivered = _delivered - 7200 WHERE id = ?"), (ids[2],))

        async def start_and_stop():
            fw = Forwarder(archive.routing, archive.blobs)
            await fw.start()
            for _ in range(200):
                if ids[2] not in {r["id"] for r in outbox.rows()}:
                    break
                await asyncio.sleep(0.05)
            await fw.stop()

        asyncio.run(start_and_stop())
        assert ids[2] not in {r["id"] for r in outbox.rows()}
        assert {r["id"] for r in outbox.rows()} >= {ids[3]}  # the dead letter stays
    finally:
        archive.close()


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_a_job_with_a_payload_is_claimed_with_it(tmp_path, backend):
    """A job that is not an instance forward (a storage commitment report, dimse/commitment.py):
    its payload comes back with the claim (the _payload column: PostgreSQL schema version 9),
    not before its delay, and is settled like any row."""
    from dicomweb_server.routing import open_outbox
    from dicomweb_server.routing.outbox import Settlement

    settings = Settings(data_dir=tmp_path / "data", index=backend.index, **backend.settings)
    (tmp_path / "data").mkdir(exist_ok=True)
    box = open_outbox(settings)
    try:
        box.insert_job("dimse:storage-commitment", "storage-commitment", "1.2.3", '{"a": 1}', delay=0.3)
        assert box.claim("dimse:storage-commitment", 8, "me:1", 30, 4)[0] == []  # not due yet
        time.sleep(0.4)
        [row], _ = box.claim("dimse:storage-commitment", 8, "me:1", 30, 4)
        assert (row.sop_uid, row.payload, row.change, row.attempts) == ("1.2.3", '{"a": 1}', None, 0)
        box.settle(Settlement([row.id], [], [], []), "me:1")
        assert [(r["SOPInstanceUID"], r["state"]) for r in box.rows("dimse:storage-commitment")] == [
            ("1.2.3", "delivered")]
    finally:
        box.close()

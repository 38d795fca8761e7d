"""C-ECHO and C-STORE (PS3.4 Annexes A, B): one write path with STOW-RS."""

from __future__ import annotations

import io

import pydicom

from dicomweb_server.dimse import status as S
from tests.helpers import make_dataset


def test_echo(dimse):
    assoc = dimse.associate()
    assert assoc.send_c_echo().Status == S.SUCCESS
    assoc.release()


def test_store_then_qido_and_wado(dimse):
    ds = make_dataset(rows=16, columns=16, PatientID="DIMSE1")
    assert dimse.store([ds]) == [S.SUCCESS]
    found = dimse.http.get("/instances", params={"PatientID": "DIMSE1"}).json()
    assert [f["00080018"]["Value"][0] for f in found] == [ds.SOPInstanceUID]
    r = dimse.http.get(f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}",
                       headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
    assert r.status_code == 200
    got = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"DICM") - 128:]))
    assert got.PixelData == ds.PixelData
    assert got.file_meta.SourceApplicationEntityTitle == "TESTSCU"
    assert got.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID


def test_the_same_instance_through_both_front_doors_is_a_duplicate(dimse):
    """STOW-RS then C-STORE of one instance, and C-STORE then STOW-RS of another: the
    second copy differs only in its file meta (the C-STORE's is built from the
    association), so it is the identical instance: Success / 200, the first copy kept.
    Before: 0x0111 and 409 (the DIMSE walk-through of docs/dimse.md, after `import --samples`)."""
    from tests.helpers import multipart, to_bytes

    def stow(ds) -> int:
        body, ctype = multipart([to_bytes(ds)])
        return dimse.http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code

    a, b = make_dataset(PatientID="BOTH1"), make_dataset(PatientID="BOTH2")
    assert stow(a) == 200
    assert dimse.store([a]) == [S.SUCCESS]
    assert dimse.store([b]) == [S.SUCCESS]
    assert stow(b) == 200
    a.PatientName = "Other^Content"
    assert dimse.store([a]) == [S.DUPLICATE_SOP_INSTANCE]  # other content: refused
    for ds, aet in ((a, None), (b, "TESTSCU")):
        r = dimse.http.get(f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}",
                           headers={"Accept": "application/dicom; transfer-syntax=*"})
        got = pydicom.dcmread(io.BytesIO(r.content))
        assert got.file_meta.get("SourceApplicationEntityTitle") == aet  # the first copy, kept
        assert got.PatientName != "Other^Content"


def test_associations_in_the_audit_log(tmp_path):
    import json

    from pynetdicom import AE

    from tests.helpers import LiveServer, free_port

    port, log = free_port(), tmp_path / "audit.jsonl"
    srv = LiveServer(tmp_path / "d", "sqlite", dimse_port=port, dimse_in_worker=True, audit_log=log,
                     dimse_allowed_aes=["GOODSCU"]).start()
    try:
        for calling in ("GOODSCU", "BADSCU"):
            ae = AE(ae_title=calling)
            ae.add_requested_context("1.2.840.10008.1.1")
            assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
            if assoc.is_established:
                assoc.send_c_echo()
                assoc.release()
    finally:
        srv.stop()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    seen = [(r["event"], r["calling_ae"]) for r in records if r.get("protocol") == "DIMSE"]
    assert ("accepted", "GOODSCU") in seen and ("released", "GOODSCU") in seen and ("rejected", "BADSCU") in seen


def test_an_instance_of_a_study_stored_for_another_patient_is_refused(dimse):
    """A study belongs to one patient (Patient ID within its Issuer, dicom/patient.py):
    C-STORE answers 0xA900 with the reason in the Error Comment, as STOW-RS fails the
    instance; the same patient under a corrected name, and the identical instance
    again, are stored."""
    from pynetdicom import build_context

    from tests.helpers import multipart, to_bytes

    first = make_dataset(PatientID="DIMSE-PA", IssuerOfPatientID="HOSP", PatientName="Doe^John")
    same_study = {"study": first.StudyInstanceUID, "series": first.SeriesInstanceUID}
    intruder = make_dataset(**same_study, PatientID="DIMSE-PB", IssuerOfPatientID="HOSP")
    no_issuer = make_dataset(**same_study, PatientID="DIMSE-PA")
    renamed = make_dataset(**same_study, PatientID="DIMSE-PA", IssuerOfPatientID="HOSP", PatientName="Doe^Jon")
    assert dimse.store([first]) == [S.SUCCESS]
    assoc = dimse.associate([build_context(first.SOPClassUID, str(first.file_meta.TransferSyntaxUID))])
    try:
        rsp = assoc.send_c_store(intruder)
    finally:
        assoc.release()
    assert rsp.Status == S.STORE_DATASET_MISMATCH == 0xA900
    assert rsp.ErrorComment == f"Study {first.StudyInstanceUID} belongs to patient 'DIMSE-PA' (issuer"[:64]
    assert dimse.store([no_issuer, renamed, first]) == [S.STORE_DATASET_MISMATCH, S.SUCCESS, S.SUCCESS]
    body, ctype = multipart([to_bytes(intruder)])  # the other front door refuses it the same way
    r = dimse.http.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 409 and r.json()["00081198"]["Value"][0]["00081197"]["Value"] == [0xA900]
    found = dimse.http.get("/instances", params={"StudyInstanceUID": first.StudyInstanceUID}).json()
    assert sorted(f["00080018"]["Value"][0] for f in found) == sorted([first.SOPInstanceUID, renamed.SOPInstanceUID])
    assert dimse.http.get("/studies", params={"PatientID": "DIMSE-PB"}).json() == []


def test_the_original_re_sent_after_an_after_ack_pass_is_a_duplicate(tmp_path, monkeypatch):
    """A ``when = "after_ack"`` rule stores as received, then re-encodes (JPEG-LS lossless)
    in the background: the modality re-sending its original (Explicit VR Little Endian,
    other bytes now) gets Success by C-STORE and 200 by STOW-RS, the re-encoded file kept;
    one attribute changed (PatientName) is other content: 0x0111 and 409. Before: 0x0111 / 409
    for the original too."""
    import httpx

    from dicomweb_server.policy import recompress
    from tests.dimse.conftest import Dimse
    from tests.helpers import LiveServer, free_port, multipart, to_bytes
    from tests.routing.conftest import wait_for

    monkeypatch.setattr(recompress, "AFTER_ACK_INTERVAL", 0.2)
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nstore_as = "jpeg-ls-lossless"\nwhen = "after_ack"\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=None,
                     routes_file=routes).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            d = Dimse(srv, port, http)

            def stow(ds) -> int:
                body, ctype = multipart([to_bytes(ds)])
                return http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code

            a, b = make_dataset(rows=32, columns=32, PatientID="RESEND1"), make_dataset(rows=32, columns=32,
                                                                                        PatientID="RESEND2")
            assert d.store([a]) == [S.SUCCESS] and stow(b) == 200
            index = srv.archive.index
            wait_for(lambda: all(index.locate(ds.SOPInstanceUID).transfer_syntax_uid == "1.2.840.10008.1.2.4.80"
                                 for ds in (a, b)), 60, "the after-ack pass")
            sizes = {ds.SOPInstanceUID: index.locate(ds.SOPInstanceUID).size for ds in (a, b)}
            assert d.store([a, b]) == [S.SUCCESS, S.SUCCESS]  # the originals, re-sent
            assert stow(a) == 200 and stow(b) == 200
            for ds in (a, b):
                ds.PatientName = "Other^Content"
            assert d.store([a]) == [S.DUPLICATE_SOP_INSTANCE] and stow(b) == 409
            assert {ds.SOPInstanceUID: index.locate(ds.SOPInstanceUID).size for ds in (a, b)} == sizes
            assert all(index.locate(ds.SOPInstanceUID).transfer_syntax_uid == "1.2.840.10008.1.2.4.80"
                       for ds in (a, b))
    finally:
        srv.stop()

"""Modality Performed Procedure Step SCP (PS3.4 Annex F; dimse/mpps.py): pynetdicom as the
modality. N-CREATE marks the worklist entry it names STARTED; N-SET completes it, and the
images its Performed Series Sequence lists show on the operator's study page as declared;
a completed step is no longer updated (0x0110, Error ID 0xA710: Table F.7.2-2); the other
refusals; the write scope of a peer. (Debian's dcmtk has no MPPS SCU tool: pynetdicom only.)"""

from __future__ import annotations

import json

import httpx
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom import AE, build_context, evt
from pynetdicom.sop_class import CTImageStorage, ModalityPerformedProcedureStep, Verification

from tests.helpers import LiveServer, free_port, make_dataset
from tests.store.test_mpps import completed, created, worklist_entry

MPPS = ModalityPerformedProcedureStep


def _ds(doc: dict) -> Dataset:
    return Dataset.from_json(doc)


def _assoc(dimse, ae_title="CT1"):
    return dimse.associate([build_context(MPPS), build_context(CTImageStorage)], ae_title=ae_title)


def _sps_status(dimse, sps_id: str) -> str:
    r = dimse.http.get(f"/worklist/{sps_id}")
    assert r.status_code == 200, r.text
    return r.json()["00400100"]["Value"][0]["00400020"]["Value"][0]


def test_a_modality_performs_a_scheduled_step(dimse):
    study, series = generate_uid(), generate_uid()
    assert dimse.http.post("/worklist", json=worklist_entry("SPS1", study)).status_code == 201
    assert _sps_status(dimse, "SPS1") == "SCHEDULED"
    images = [make_dataset(study=study, series=series, PatientID="P1", InstanceNumber=n) for n in (1, 2)]
    missing = generate_uid()
    uid = generate_uid()
    assoc = _assoc(dimse)
    try:
        status, attrs = assoc.send_n_create(_ds(created("SPS1", study)), MPPS, uid)
        assert status.Status == 0x0000
        assert _sps_status(dimse, "SPS1") == "STARTED"
        key = "ScheduledProcedureStepSequence.ScheduledProcedureStepStatus"
        assert dimse.http.get("/worklist", params={key: "SCHEDULED"}).json() == []  # nothing left to do
        assert len(dimse.http.get("/worklist", params={key: "STARTED"}).json()) == 1
        # the same UID again: Duplicate SOP instance (PS3.7 Annex C)
        assert assoc.send_n_create(_ds(created("SPS1", study)), MPPS, uid)[0].Status == 0x0111
        assert [int(assoc.send_c_store(ds).Status) for ds in images] == [0, 0]
        status, _ = assoc.send_n_set(_ds(completed(series, [str(d.SOPInstanceUID) for d in images] + [missing])),
                                     MPPS, uid)
        assert status.Status == 0x0000
        assert _sps_status(dimse, "SPS1") == "COMPLETED"
        # completed: no longer updated (PS3.4 F.7.2.2.3, Table F.7.2-2)
        status, _ = assoc.send_n_set(_ds({"00400254": {"vr": "LO", "Value": ["late"]}}), MPPS, uid)
        assert (status.Status, status.ErrorID, status.ErrorComment) == (
            0x0110, 0xA710, "Performed Procedure Step Object may no longer be updated")
        # an instance the archive does not hold
        assert assoc.send_n_set(_ds({"00400254": {"vr": "LO", "Value": ["x"]}}), MPPS,
                                generate_uid())[0].Status == 0x0112
    finally:
        assoc.release()
    step = dimse.http.get(f"/mpps/{uid}").json()  # GET /mpps/{uid}: the step as it ended
    assert (step["00400252"]["Value"], step["00400253"]["Value"], step["00400251"]["Value"]) == (
        ["COMPLETED"], ["PPS1"], ["084500"])
    assert len(step["00400340"]["Value"][0]["00081140"]["Value"]) == 3
    assert dimse.http.get(f"/mpps/{generate_uid()}").status_code == 404
    doc = dimse.http.get(f"/admin/studies/{study}/arrivals").json()
    assert [(c["kind"], c["transaction"], c["requester"], c["declared"], c["arrived"], c["missing"])
            for c in doc["commitments"]] == [
        ("mpps", uid, "CT1", 3, 2, [{"sop_class": str(CTImageStorage), "sop": missing}])]
    assert doc["sources"] == {"dimse:CT1": 2}


def test_refused_requests(dimse):
    study = generate_uid()
    assert dimse.http.post("/worklist", json=worklist_entry("SPS2", study)).status_code == 201
    assoc = _assoc(dimse)
    try:
        # N-CREATE only IN PROGRESS (F.7.2.1.3); a Type 1 attribute missing
        status, _ = assoc.send_n_create(_ds(created("SPS2", study, "COMPLETED")), MPPS, generate_uid())
        assert status.Status == 0x0106 and "IN PROGRESS" in status.ErrorComment
        no_station = created("SPS2", study)
        del no_station["00400241"]
        status, _ = assoc.send_n_create(_ds(no_station), MPPS, generate_uid())
        assert (status.Status, status.ErrorComment) == (0x0120, "no Performed Station AE Title (0040,0241)")
        assert _sps_status(dimse, "SPS2") == "SCHEDULED"
        # no Affected SOP Instance UID: the archive gives one, in the N-CREATE-RSP (PS3.7 10.1.5.1.4)
        given = []
        assoc.bind(evt.EVT_DIMSE_RECV, lambda e: given.append(e.message.command_set.get("AffectedSOPInstanceUID")))
        status, _ = assoc.send_n_create(_ds(created("SPS2", study)), MPPS)
        assert status.Status == 0x0000 and given and given[-1]
        uid = str(given[-1])
        assert _sps_status(dimse, "SPS2") == "STARTED"
        # "Not allowed" in N-SET (Table F.7.2-1); a status that is not one
        status, _ = assoc.send_n_set(_ds({"00100020": {"vr": "LO", "Value": ["OTHER"]}}), MPPS, uid)
        assert (status.Status, status.ErrorComment) == (0x0106, "Patient ID (0010,0020) may not be N-SET")
        status, _ = assoc.send_n_set(_ds({"00400252": {"vr": "CS", "Value": ["DONE"]}}), MPPS, uid)
        assert status.Status == 0x0106
        # COMPLETED without the end time (Final State Type 1)
        end = completed(generate_uid(), [generate_uid()])
        del end["00400251"]
        status, _ = assoc.send_n_set(_ds(end), MPPS, uid)
        assert status.Status == 0x0121 and "End Time" in status.ErrorComment
        # discontinued, then no longer updated
        status, _ = assoc.send_n_set(_ds(completed(generate_uid(), [], "DISCONTINUED")), MPPS, uid)
        assert status.Status == 0x0000
        assert _sps_status(dimse, "SPS2") == "DISCONTINUED"
        assert assoc.send_n_set(_ds(completed(generate_uid(), [])), MPPS, uid)[0].Status == 0x0110
    finally:
        assoc.release()


@pytest.fixture
def guarded(tmp_path):
    """Authentication configured: a peer with the read scope, one with write."""
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"READER": {"host": "127.0.0.1", "scopes": ["read"]},
                                 "CT1": {"host": "127.0.0.1", "scopes": ["read", "write"]}}))
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=peers,
                     api_keys={"k-0123456789": ["read", "write"]}).start()
    yield srv, port
    srv.stop()


def test_mpps_needs_the_write_scope(guarded):
    srv, port = guarded
    study = generate_uid()
    results = {}
    for ae_title in ("READER", "CT1"):
        ae = AE(ae_title=ae_title)
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
        ae.add_requested_context(MPPS)
        ae.add_requested_context(Verification)
        assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
        assert assoc.is_established
        try:
            uid = generate_uid()
            results[ae_title] = (assoc.send_n_create(_ds(created(None, study)), MPPS, uid)[0].Status,
                                 assoc.send_n_set(_ds({"00400254": {"vr": "LO", "Value": ["x"]}}), MPPS,
                                                  uid)[0].Status)
        finally:
            assoc.release()
    # READER: 0x0124 Refused: Not Authorized for both (its N-SET names no instance it made)
    assert results == {"READER": (0x0124, 0x0124), "CT1": (0x0000, 0x0000)}
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/worklist", headers={"Authorization": "Bearer k-0123456789"}).status_code == 200


def test_a_deflated_attribute_list_is_inflated_with_a_bound(dimse):
    """An N-CREATE whose attribute list, in Deflated Explicit VR Little Endian (PS3.5 §A.5),
    inflates past 1 MiB (dicom/reading.py MAX_IDENTIFIER_BYTES; here a private OB of 4 MiB of
    zeros, 4 KB on the wire): 0x0110 Processing failure (PS3.7 §10.1.5.1.6), the step not
    created. pynetdicom inflated it whole, without a bound, and the step was created."""
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    study = generate_uid()
    assert dimse.http.post("/worklist", json=worklist_entry("SPS9", study)).status_code == 201
    assoc = dimse.associate([build_context(MPPS, DeflatedExplicitVRLittleEndian)])
    try:
        ds = _ds(created("SPS9", study))
        ds.add_new(0x00090010, "LO", "BOMB")
        ds.add_new(0x00091001, "OB", bytes(4 * 1024 * 1024))
        status, _ = assoc.send_n_create(ds, MPPS, generate_uid())
        assert (status.Status, status.ErrorComment) == (
            0x0110, "the attribute list cannot be decoded: the Deflated data set infl")
        assert _sps_status(dimse, "SPS9") == "SCHEDULED"
    finally:
        assoc.release()

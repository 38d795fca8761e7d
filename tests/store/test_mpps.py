"""Modality Performed Procedure Step instances in every index (store/mpps.py, dicom/mpps.py;
PS3.4 F.7.2): N-CREATE and N-SET as the index keeps them, the worklist entry they name
marked, a completed step's instances declared for the operator's study page, and each
refusal with its status, writing nothing."""

from __future__ import annotations

import pytest
from pydicom.uid import generate_uid

from dicomweb_server.arrivals import study_arrivals
from dicomweb_server.dicom import mpps
from dicomweb_server.dicom.mpps import MppsError
from dicomweb_server.dicom.worklist import prepare
from tests.helpers import CT_IMAGE_STORAGE
from tests.store.test_index_contract import index, record  # noqa: F401 - the fixture

MPPS_UID = "1.2.826.0.1.3680043.8.498.4242"


def _v(vr: str, *values) -> dict:
    return {"vr": vr, "Value": list(values)} if values else {"vr": vr}


def worklist_entry(sps_id: str, study_uid: str) -> dict:
    return {"00100010": _v("PN", {"Alphabetic": "Doe^Jane"}), "00100020": _v("LO", "P1"),
            "0020000D": _v("UI", study_uid), "00080050": _v("SH", "A1"),
            "00400100": _v("SQ", {"00400009": _v("SH", sps_id), "00400001": _v("AE", "CT1"),
                                  "00080060": _v("CS", "CT"), "00400002": _v("DA", "20260105"),
                                  "00400020": _v("CS", "SCHEDULED")})}


def created(sps_id: str | None, study_uid: str, status: str = "IN PROGRESS") -> dict:
    """An N-CREATE attribute list as a modality sends it (PS3.4 Table F.7.2-1)."""
    item = {"0020000D": _v("UI", study_uid), "00080050": _v("SH", "A1"), "00401001": _v("SH", "RP1"),
            "00400009": _v("SH", sps_id) if sps_id else _v("SH")}
    return {"00400270": _v("SQ", item), "00100010": _v("PN", {"Alphabetic": "Doe^Jane"}), "00100020": _v("LO", "P1"),
            "00400253": _v("SH", "PPS1"), "00400241": _v("AE", "CT1"), "00400244": _v("DA", "20260105"),
            "00400245": _v("TM", "083000"), "00400252": _v("CS", status), "00080060": _v("CS", "CT"),
            "00400250": _v("DA"), "00400251": _v("TM"), "00400340": _v("SQ")}


def completed(series_uid: str, sops: list[str], status: str = "COMPLETED") -> dict:
    """An N-SET modification list that ends the step, its series listing ``sops``."""
    series = {"0020000E": _v("UI", series_uid), "00081050": _v("PN"), "00400254": _v("LO", "CT head"),
              "0008103E": _v("LO", "axial"), "00080054": _v("AE", "CT1"), "00181030": _v("LO", "head"),
              "00081140": _v("SQ", *({"00081150": _v("UI", CT_IMAGE_STORAGE), "00081155": _v("UI", s)}
                                     for s in sops)), "00400220": _v("SQ")}
    return {"00400252": _v("CS", status), "00400250": _v("DA", "20260105"), "00400251": _v("TM", "084500"),
            "00400340": _v("SQ", series)}


def _sps_status(index, sps_id: str) -> str:  # noqa: F811
    return index.worklist_entry(sps_id)["00400100"]["Value"][0]["00400020"]["Value"][0]


def _refused(call) -> MppsError:
    with pytest.raises(MppsError) as e:
        call()
    return e.value


def test_create_set_complete_marks_the_worklist_and_declares(index, tmp_path):  # noqa: F811
    study, series = generate_uid(), generate_uid()
    index.put_worklist([prepare(worklist_entry("SPS1", study))])
    step = index.create_mpps(MPPS_UID, "CT1", created("SPS1", study), 1700000000.0)
    assert (step.status, step.sps_ids, step.references) == ("IN PROGRESS", ["SPS1"], [])
    assert _sps_status(index, "SPS1") == "STARTED"
    assert index.mpps(MPPS_UID)["00400253"] == _v("SH", "PPS1")
    # an N-SET while in progress (a description), then the end: three images listed, two stored
    step = index.modify_mpps(MPPS_UID, "CT1", {"00400254": _v("LO", "CT head w/o")}, 1700000001.0)
    assert step.status == "IN PROGRESS" and index.mpps(MPPS_UID)["00400254"] == _v("LO", "CT head w/o")
    recs = [record(tmp_path, study=study, series=series, PatientID="P1", InstanceNumber=n) for n in (1, 2)]
    assert index.add(recs) == [True, True]
    missing = generate_uid()
    step = index.modify_mpps(MPPS_UID, "CT1", completed(series, [r.sop_uid for r in recs] + [missing]),
                             1700000002.0)
    assert step.status == "COMPLETED" and len(step.references) == 3
    assert _sps_status(index, "SPS1") == "COMPLETED"
    stored = index.mpps(MPPS_UID)
    assert stored["00400252"] == _v("CS", "COMPLETED")
    assert stored["00400254"] == _v("LO", "CT head w/o") and stored["00400253"] == _v("SH", "PPS1")  # kept
    doc = study_arrivals(index, study)
    assert doc["commitments"] == [{
        "kind": "mpps", "transaction": MPPS_UID, "requester": "CT1", "time": "2023-11-14T22:13:22.000000Z",
        "declared": 3, "arrived": 2, "in_study": 2, "missing_count": 1,
        "missing": [{"sop_class": CT_IMAGE_STORAGE, "sop": missing}]}]
    # completed: no longer updated (Table F.7.2-2), nothing changed
    e = _refused(lambda: index.modify_mpps(MPPS_UID, "CT1", {"00400254": _v("LO", "late")}, 1700000003.0))
    assert (e.status, e.error_id, str(e)) == (0x0110, 0xA710, mpps.NO_LONGER_UPDATED)
    assert index.mpps(MPPS_UID) == stored


def test_discontinued_and_unscheduled(index):  # noqa: F811
    study = generate_uid()
    index.put_worklist([prepare(worklist_entry("SPS2", study))])
    index.create_mpps("1.2.3.1", "CT1", created("SPS2", study), 1.0)
    index.modify_mpps("1.2.3.1", "CT1", completed(generate_uid(), [generate_uid()], "DISCONTINUED"), 2.0)
    assert _sps_status(index, "SPS2") == "DISCONTINUED"
    assert index.declarations([s for (_, s) in mpps.references(index.mpps("1.2.3.1"))]) == []  # not completed
    e = _refused(lambda: index.modify_mpps("1.2.3.1", "CT1", {"00400252": _v("CS", "COMPLETED")}, 3.0))
    assert (e.status, e.error_id) == (0x0110, 0xA710)
    # an unscheduled step (no Scheduled Procedure Step ID) and one naming an unknown entry: kept, nothing marked
    index.create_mpps("1.2.3.2", "CT1", created(None, study), 4.0)
    index.create_mpps("1.2.3.3", "CT1", created("NOSUCH", study), 4.0)
    assert index.mpps("1.2.3.2")["00400270"]["Value"][0]["00400009"] == _v("SH")
    assert index.worklist_entry("NOSUCH") is None


def test_refusals_write_nothing(index):  # noqa: F811
    study = generate_uid()
    index.put_worklist([prepare(worklist_entry("SPS3", study))])
    assert _refused(lambda: index.create_mpps("1.2.3.9", "CT1", created("SPS3", study, "COMPLETED"), 1.0)
                    ).status == 0x0106  # F.7.2.1.3: N-CREATE only IN PROGRESS
    no_station = created("SPS3", study)
    del no_station["00400241"]
    assert _refused(lambda: index.create_mpps("1.2.3.9", "CT1", no_station, 1.0)).status == 0x0120
    no_station["00400241"] = _v("AE")
    assert _refused(lambda: index.create_mpps("1.2.3.9", "CT1", no_station, 1.0)).status == 0x0121
    assert index.mpps("1.2.3.9") is None and _sps_status(index, "SPS3") == "SCHEDULED"
    index.create_mpps("1.2.3.9", "CT1", created("SPS3", study), 1.0)
    before = index.mpps("1.2.3.9")
    e = _refused(lambda: index.create_mpps("1.2.3.9", "CT1", created("SPS3", study), 2.0))
    assert e.status == 0x0111
    # "Not allowed" in N-SET (Table F.7.2-1): the patient, the scheduled step, the start
    for tag in ("00100010", "00400270", "00400244", "00080060"):
        e = _refused(lambda: index.modify_mpps("1.2.3.9", "CT1", {tag: _v("LO", "x")}, 2.0))
        assert e.status == 0x0106 and "may not be N-SET" in str(e)
    e = _refused(lambda: index.modify_mpps("1.2.3.9", "CT1", {"00400252": _v("CS", "DONE")}, 2.0))
    assert e.status == 0x0106
    # the final state needs the end date and time, and (COMPLETED) a series with its UID
    end = completed(generate_uid(), [generate_uid()])
    del end["00400251"]
    assert _refused(lambda: index.modify_mpps("1.2.3.9", "CT1", end, 2.0)).status == 0x0121
    end = completed(generate_uid(), [])
    end["00400340"] = _v("SQ")
    assert _refused(lambda: index.modify_mpps("1.2.3.9", "CT1", end, 2.0)).status == 0x0121
    assert index.mpps("1.2.3.9") == before and _sps_status(index, "SPS3") == "STARTED"
    assert _refused(lambda: index.modify_mpps("1.2.3.404", "CT1", {}, 2.0)).status == 0x0112

"""Modality Worklist (PS3.4 Annex K): entries added, listed and removed over REST, found by
C-FIND on the Modality Worklist Information Model - FIND with pynetdicom and DCMTK's
``findscu -W``: by Scheduled Station AE Title and start date range, wildcard patient name,
sequence matching in the Scheduled Procedure Step Sequence, no match."""

from __future__ import annotations

import pydicom
import pytest
from pydicom.dataset import Dataset
from pynetdicom import build_context
from pynetdicom.sop_class import ModalityWorklistInformationFind

from dicomweb_server.dimse import status as S

from .test_dcmtk import run


def _entry(sps_id: str | None, patient: str, pid: str, station: str, modality: str, date: str, time: str,
           accession: str, description: str) -> dict:
    sps = {"00400001": {"vr": "AE", "Value": [station]}, "00080060": {"vr": "CS", "Value": [modality]},
           "00400002": {"vr": "DA", "Value": [date]}, "00400003": {"vr": "TM", "Value": [time]},
           "00400007": {"vr": "LO", "Value": [description]},
           "00400006": {"vr": "PN", "Value": [{"Alphabetic": "Welby^Marcus"}]}}
    if sps_id:
        sps["00400009"] = {"vr": "SH", "Value": [sps_id]}
    return {"00100010": {"vr": "PN", "Value": [{"Alphabetic": patient}]}, "00100020": {"vr": "LO", "Value": [pid]},
            "00100030": {"vr": "DA", "Value": ["19700101"]}, "00100040": {"vr": "CS", "Value": ["F"]},
            "00080050": {"vr": "SH", "Value": [accession]}, "00401001": {"vr": "SH", "Value": ["RP" + accession]},
            "00321060": {"vr": "LO", "Value": [description]},
            "00400100": {"vr": "SQ", "Value": [sps]}}


ENTRIES = [
    _entry("SPS1", "Doe^Jane", "P1", "CT1", "CT", "20260105", "083000", "A1", "CT head"),
    _entry("SPS2", "Dobbs^Rick", "P2", "CT1", "CT", "20260107", "140000", "A2", "CT chest"),
    _entry("SPS3", "Doe^John", "P3", "MR1", "MR", "20260105", "090000", "A3", "MR knee"),
    _entry("SPS4", "Roe^Anna", "P4", "CT1", "CT", "20260201", "100000", "A4", "CT abdomen"),
]


def _add(dimse, entries=ENTRIES) -> list[dict]:
    r = dimse.http.post("/worklist", json=entries)
    assert r.status_code == 201, r.text
    return r.json()


def _find(dimse, identifier: Dataset) -> list[Dataset]:
    assoc = dimse.associate([build_context(ModalityWorklistInformationFind)], ae_title="CT1")
    try:
        out = []
        for status, answer in assoc.send_c_find(identifier, ModalityWorklistInformationFind):
            if status.Status == S.PENDING:
                out.append(answer)
            else:
                assert status.Status == S.SUCCESS, hex(status.Status)
        return out
    finally:
        assoc.release()


def _identifier(**sps) -> Dataset:
    """The keys a modality asks (Table K.6-1), with these Scheduled Procedure Step keys."""
    ds = Dataset()
    ds.PatientName = ""
    ds.PatientID = ""
    ds.AccessionNumber = ""
    ds.StudyInstanceUID = ""
    ds.RequestedProcedureID = ""
    item = Dataset()
    for k in ("ScheduledStationAETitle", "Modality", "ScheduledProcedureStepStartDate",
              "ScheduledProcedureStepStartTime", "ScheduledProcedureStepID", "ScheduledProcedureStepDescription"):
        setattr(item, k, sps.get(k, ""))
    ds.ScheduledProcedureStepSequence = [item]
    return ds


def _ids(answers: list[Dataset]) -> list[str]:
    return [str(a.ScheduledProcedureStepSequence[0].ScheduledProcedureStepID) for a in answers]


def test_find_by_station_and_date_range(dimse):
    stored = _add(dimse)
    answers = _find(dimse, _identifier(ScheduledStationAETitle="CT1",
                                       ScheduledProcedureStepStartDate="20260101-20260131"))
    assert _ids(answers) == ["SPS1", "SPS2"]
    first = answers[0]
    assert str(first.PatientName) == "Doe^Jane" and first.PatientID == "P1" and first.AccessionNumber == "A1"
    assert first.RequestedProcedureID == "RPA1"
    assert first.StudyInstanceUID == stored[0]["0020000D"]["Value"][0]  # assigned by POST
    item = first.ScheduledProcedureStepSequence[0]
    assert (item.ScheduledStationAETitle, item.Modality, item.ScheduledProcedureStepStartDate,
            item.ScheduledProcedureStepStartTime, item.ScheduledProcedureStepDescription) == \
        ("CT1", "CT", "20260105", "083000", "CT head")
    assert "ScheduledPerformingPhysicianName" not in item  # not asked for: not returned
    assert "PatientBirthDate" not in first
    # an open range, a time range
    assert _ids(_find(dimse, _identifier(ScheduledProcedureStepStartDate="20260107-"))) == ["SPS2", "SPS4"]
    assert _ids(_find(dimse, _identifier(ScheduledProcedureStepStartTime="0800-0930"))) == ["SPS1", "SPS3"]


def test_find_wildcard_patient_name_and_sequence_matching(dimse):
    _add(dimse)
    ds = _identifier()
    ds.PatientName = "DOE*"  # PN: case-insensitive, as QIDO-RS
    assert _ids(_find(dimse, ds)) == ["SPS1", "SPS3"]
    # both keys must hold in one item (PS3.4 C.2.2.2.6): MR at CT1 is nobody
    assert _ids(_find(dimse, _identifier(Modality="MR", ScheduledStationAETitle="MR1"))) == ["SPS3"]
    assert _ids(_find(dimse, _identifier(Modality="MR", ScheduledStationAETitle="CT1"))) == []
    assert _ids(_find(dimse, _identifier(ScheduledProcedureStepDescription="CT*"))) == ["SPS1", "SPS2", "SPS4"]


def test_find_returns_only_the_matching_scheduled_steps(dimse):
    """An entry with two Scheduled Procedure Step items: a request item matching one of
    them answers with that item only, holding only the requested item keys; an empty item
    returns both whole (PS3.4 K.2.2, C.2.2.2.6)."""
    entry = _entry("SPS7", "Two^Steps", "P7", "CT1", "CT", "20260105", "083000", "A7", "CT head")
    second = dict(entry["00400100"]["Value"][0], **{
        "00400001": {"vr": "AE", "Value": ["MR1"]}, "00080060": {"vr": "CS", "Value": ["MR"]},
        "00400009": {"vr": "SH", "Value": ["SPS8"]}, "00400007": {"vr": "LO", "Value": ["MR head"]}})
    entry["00400100"]["Value"].append(second)
    _add(dimse, [entry])
    (answer,) = _find(dimse, _identifier(Modality="MR"))
    assert [(i.ScheduledProcedureStepID, i.Modality, i.ScheduledStationAETitle, i.ScheduledProcedureStepDescription)
            for i in answer.ScheduledProcedureStepSequence] == [("SPS8", "MR", "MR1", "MR head")]
    assert "ScheduledPerformingPhysicianName" not in answer.ScheduledProcedureStepSequence[0]
    (answer,) = _find(dimse, _identifier(ScheduledStationAETitle="CT1"))
    assert [i.ScheduledProcedureStepID for i in answer.ScheduledProcedureStepSequence] == ["SPS7"]
    ds = Dataset()
    ds.PatientID = "P7"
    ds.ScheduledProcedureStepSequence = [Dataset()]
    (answer,) = _find(dimse, ds)
    assert [(i.ScheduledProcedureStepID, str(i.ScheduledPerformingPhysicianName))
            for i in answer.ScheduledProcedureStepSequence] == [("SPS7", "Welby^Marcus"), ("SPS8", "Welby^Marcus")]


def test_find_no_match_and_bad_identifier(dimse):
    _add(dimse)
    assert _find(dimse, _identifier(ScheduledStationAETitle="US9")) == []
    ds = _identifier(ScheduledProcedureStepStartDate="2026-01-01x")
    assoc = dimse.associate([build_context(ModalityWorklistInformationFind)])
    try:
        [(status, _)] = list(assoc.send_c_find(ds, ModalityWorklistInformationFind))
        assert status.Status == S.QR_IDENTIFIER_MISMATCH
    finally:
        assoc.release()


@pytest.mark.parametrize("value", ["20201345", "20260230-20260301"])
def test_find_an_impossible_date_is_0xA900(dimse, value):
    """Searched for and answered Success with no match, before (PS3.5 Table 6.2-1)."""
    _add(dimse)
    assoc = dimse.associate([build_context(ModalityWorklistInformationFind)])
    try:
        [(status, _)] = list(assoc.send_c_find(_identifier(ScheduledProcedureStepStartDate=value),
                                               ModalityWorklistInformationFind))
        assert status.Status == S.QR_IDENTIFIER_MISMATCH
    finally:
        assoc.release()
    r = dimse.http.get("/worklist", params={"00400100.00400002": value})
    assert r.status_code == 400
    assert "is not a valid date value or range" in r.json()["detail"]


def test_rest_an_empty_parameter_name_is_400(dimse):
    r = dimse.http.get("/worklist?=x")
    assert r.status_code == 400
    assert r.json() == {"detail": "empty parameter name in '=x'"}
    assert dimse.http.get("/worklist?&").status_code == 200


def test_rest_add_list_get_delete(dimse):
    stored = _add(dimse, [ENTRIES[0], _entry(None, "Poe^Ed", "P9", "CT2", "CT", "20260110", "1000", "A9", "CT")])
    assert stored[0]["00400100"]["Value"][0]["00400009"]["Value"] == ["SPS1"]
    new_id = stored[1]["00400100"]["Value"][0]["00400009"]["Value"][0]  # assigned
    assert len(new_id) == 16 and new_id != "SPS1"
    r = dimse.http.get("/worklist", params={"ScheduledProcedureStepSequence.ScheduledStationAETitle": "CT2"})
    assert r.status_code == 200 and [e["00100020"]["Value"][0] for e in r.json()] == ["P9"]
    r = dimse.http.get("/worklist", params={"PatientName": "poe*", "00400100.00400002": "20260101-20260131"})
    assert [e["00100020"]["Value"][0] for e in r.json()] == ["P9"]
    assert [e["00100020"]["Value"][0] for e in dimse.http.get("/worklist").json()] == ["P1", "P9"]
    assert dimse.http.get(f"/worklist/{new_id}").json() == stored[1]
    # the same ID again replaces the entry
    changed = _entry("SPS1", "Doe^Jane", "P1", "CT1", "CT", "20260106", "083000", "A1", "CT head")
    assert dimse.http.post("/worklist", json=changed).status_code == 201
    assert dimse.http.get("/worklist/SPS1").json()["00400100"]["Value"][0]["00400002"]["Value"] == ["20260106"]
    assert dimse.http.delete(f"/worklist/{new_id}").status_code == 204
    assert dimse.http.get(f"/worklist/{new_id}").status_code == 404
    assert dimse.http.delete(f"/worklist/{new_id}").status_code == 404
    assert [e["00100020"]["Value"][0] for e in dimse.http.get("/worklist").json()] == ["P1"]


def test_rest_refuses_bad_entries(dimse):
    r = dimse.http.post("/worklist", json=[ENTRIES[0], {"00100010": {"vr": "PN", "Value": [{"Alphabetic": "X"}]}}])
    assert r.status_code == 400 and "entry 1" in r.text and "Scheduled Procedure Step Sequence" in r.text
    assert dimse.http.get("/worklist").json() == []  # nothing stored
    assert dimse.http.post("/worklist", content=b"{").status_code == 400
    assert dimse.http.get("/worklist", params={"NoSuchKeyword": "1"}).status_code == 400


def test_findscu_worklist(dimse, tmp_path):
    """DCMTK's findscu -W (Modality Worklist model) by station AE and date range."""
    _add(dimse)
    out = tmp_path / "found"
    out.mkdir()
    run("findscu", "-W", "-aet", "CT1", "-aec", "DICOMWEB", "-X", "-od", str(out),
        "-k", "PatientName", "-k", "PatientID", "-k", "AccessionNumber",
        "-k", "ScheduledProcedureStepSequence[0].ScheduledStationAETitle=CT1",
        "-k", "ScheduledProcedureStepSequence[0].ScheduledProcedureStepStartDate=20260101-20260131",
        "-k", "ScheduledProcedureStepSequence[0].Modality",
        "-k", "ScheduledProcedureStepSequence[0].ScheduledProcedureStepID",
        "127.0.0.1", str(dimse.port), cwd=tmp_path)
    answers = [pydicom.dcmread(p) for p in sorted(out.iterdir())]
    assert sorted((a.PatientID, a.AccessionNumber, a.ScheduledProcedureStepSequence[0].ScheduledProcedureStepID,
                   a.ScheduledProcedureStepSequence[0].Modality) for a in answers) == \
        [("P1", "A1", "SPS1", "CT"), ("P2", "A2", "SPS2", "CT")]

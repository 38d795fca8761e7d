"""C-FIND answers equal QIDO-RS answers for the same keys at each level (Patient and
Study Root), and C-GET / C-MOVE deliver an instance, a series and a study (PS3.4 C.4)."""

from __future__ import annotations

import json
import re
import time

import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, StoragePresentationContexts, build_context, build_role, evt
from pynetdicom.sop_class import (
    PatientRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from dicomweb_server.dimse import status as S
from tests.helpers import free_port, make_dataset

from .conftest import archive_moving_to

S3 = True  # tests/conftest.py: the dimse fixture runs with the instances in a local S3 server too


@pytest.fixture
def archive_data(dimse):
    """Two patients; study A with two series (2 + 1 instances), study B with one."""
    a, b = "1.2.826.0.1.3680043.8.498.1", "1.2.826.0.1.3680043.8.498.2"
    sa1, sa2, sb1 = a + ".1", a + ".2", b + ".1"
    dss = [make_dataset(study=a, series=sa1, PatientID="PQR1", PatientName="Doe^Jane", StudyDate="20240301",
                        AccessionNumber="ACC1", InstanceNumber=i) for i in (1, 2)]
    dss.append(make_dataset(study=a, series=sa2, modality="MR", sop_class="1.2.840.10008.5.1.4.1.1.4",
                            PatientID="PQR1", PatientName="Doe^Jane", StudyDate="20240301", AccessionNumber="ACC1"))
    dss.append(make_dataset(study=b, series=sb1, PatientID="PQR2", PatientName="Roe^Rick", StudyDate="20231105",
                            AccessionNumber="ACC2"))
    assert dimse.store(dss) == [S.SUCCESS] * 4
    return dss


def _find(dimse, model, keys: dict) -> list[Dataset]:
    ident = Dataset()
    for k, v in keys.items():
        setattr(ident, k, v)
    assoc = dimse.associate([build_context(model)])
    try:
        out = []
        for status, answer in assoc.send_c_find(ident, model):
            assert status is not None
            if status.Status == S.PENDING:
                out.append(answer)
            else:
                assert status.Status == S.SUCCESS, hex(status.Status)
        return out
    finally:
        assoc.release()


def _qido_values(item: dict, tag: str):
    v = item.get(tag, {}).get("Value")
    if not v:
        return None
    v = [x["Alphabetic"] if isinstance(x, dict) else x for x in v]
    return v[0] if len(v) == 1 else v


def _value(ds: Dataset, kw: str):
    v = ds.get(kw)
    if v is None or v == "" or v == []:
        return None
    if isinstance(v, (list, tuple)) or type(v).__name__ == "MultiValue":
        return [str(x) for x in v] if len(v) > 1 else str(v[0])
    return str(v) if not isinstance(v, int) else v


CASES = [
    # (level, C-FIND keys (empty = return key), QIDO-RS path, QIDO-RS params)
    ("STUDY", {"PatientName": "doe*", "StudyInstanceUID": "", "StudyDate": "", "AccessionNumber": "",
               "ModalitiesInStudy": "", "NumberOfStudyRelatedInstances": ""}, "/studies", {"PatientName": "doe*"}),
    ("STUDY", {"StudyDate": "20240101-20241231", "StudyInstanceUID": "", "PatientID": ""}, "/studies",
     {"StudyDate": "20240101-20241231"}),
    ("SERIES", {"StudyInstanceUID": "1.2.826.0.1.3680043.8.498.1", "SeriesInstanceUID": "", "Modality": "MR",
                "NumberOfSeriesRelatedInstances": ""}, "/studies/1.2.826.0.1.3680043.8.498.1/series",
     {"Modality": "MR"}),
    ("IMAGE", {"StudyInstanceUID": "1.2.826.0.1.3680043.8.498.1", "SeriesInstanceUID": "1.2.826.0.1.3680043.8.498.1.1",
               "SOPInstanceUID": "", "InstanceNumber": "", "SOPClassUID": ""},
     "/studies/1.2.826.0.1.3680043.8.498.1/series/1.2.826.0.1.3680043.8.498.1.1/instances", {}),
]


@pytest.mark.parametrize("level,keys,path,params", CASES)
def test_find_equals_qido(dimse, archive_data, level, keys, path, params):
    answers = _find(dimse, StudyRootQueryRetrieveInformationModelFind, {"QueryRetrieveLevel": level, **keys})
    qido = dimse.http.get(path, params=params).json()
    assert answers and len(answers) == len(qido)
    from pydicom.datadict import tag_for_keyword

    got = sorted(json.dumps({k: _value(a, k) for k in keys}, sort_keys=True) for a in answers)
    want = sorted(json.dumps({k: _qido_values(q, f"{tag_for_keyword(k):08X}") for k in keys}, sort_keys=True)
                  for q in qido)
    assert got == want
    for a in answers:  # only the requested keys, plus QueryRetrieveLevel and SpecificCharacterSet
        assert {e.keyword for e in a} <= set(keys) | {"QueryRetrieveLevel", "SpecificCharacterSet"}
        assert a.QueryRetrieveLevel == level


def test_patient_root_levels(dimse, archive_data):
    model = PatientRootQueryRetrieveInformationModelFind
    patients = _find(dimse, model, {"QueryRetrieveLevel": "PATIENT", "PatientID": "PQR*", "PatientName": ""})
    assert sorted((p.PatientID, str(p.PatientName)) for p in patients) == [("PQR1", "Doe^Jane"), ("PQR2", "Roe^Rick")]
    studies = _find(dimse, model, {"QueryRetrieveLevel": "STUDY", "PatientID": "PQR1", "StudyInstanceUID": ""})
    assert [s.StudyInstanceUID for s in studies] == ["1.2.826.0.1.3680043.8.498.1"]


def test_patient_level_counts(dimse, archive_data):
    """Number of Patient Related Studies, Series and Instances (0020,1200/1202/1204), PATIENT
    level return keys (PS3.4 Table C.6-1, C.3.4): counted over each patient's studies
    (before, returned with zero length). A second study for PQR1: 2 studies, 3 + 1 series,
    3 + 2 instances."""
    c = "1.2.826.0.1.3680043.8.498.3"
    more = [make_dataset(study=c, series=c + ".1", PatientID="PQR1", PatientName="Doe^Jane", InstanceNumber=i)
            for i in (1, 2)]
    assert dimse.store(more) == [S.SUCCESS] * 2
    model = PatientRootQueryRetrieveInformationModelFind
    patients = _find(dimse, model, {"QueryRetrieveLevel": "PATIENT", "PatientID": "PQR*", "PatientName": "",
                                    "NumberOfPatientRelatedStudies": "", "NumberOfPatientRelatedSeries": "",
                                    "NumberOfPatientRelatedInstances": ""})
    got = sorted((p.PatientID, p.NumberOfPatientRelatedStudies, p.NumberOfPatientRelatedSeries,
                  p.NumberOfPatientRelatedInstances) for p in patients)
    assert got == [("PQR1", 2, 3, 5), ("PQR2", 1, 1, 1)]
    # one count asked for: only it is answered
    (one,) = _find(dimse, model, {"QueryRetrieveLevel": "PATIENT", "PatientID": "PQR2",
                                  "NumberOfPatientRelatedInstances": ""})
    assert one.NumberOfPatientRelatedInstances == 1 and "NumberOfPatientRelatedStudies" not in one


def test_find_bad_level(dimse, archive_data):
    ident = Dataset()
    ident.QueryRetrieveLevel = "FRAME"
    assoc = dimse.associate([build_context(StudyRootQueryRetrieveInformationModelFind)])
    statuses = [s.Status for s, _ in assoc.send_c_find(ident, StudyRootQueryRetrieveInformationModelFind)]
    assoc.release()
    assert statuses == [S.QR_IDENTIFIER_MISMATCH]


@pytest.mark.parametrize("key, value", [("StudyDate", "20201345"), ("StudyTime", "2500"),
                                        ("StudyDate", "20200230-"), ("PatientBirthDate", "19991399")])
def test_find_an_impossible_date_or_time_is_0xA900(dimse, archive_data, key, value):
    """It was searched for, and answered Success with no match (PS3.5 Table 6.2-1)."""
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    setattr(ident, key, value)
    ident.StudyInstanceUID = ""
    assoc = dimse.associate([build_context(StudyRootQueryRetrieveInformationModelFind)])
    answers = list(assoc.send_c_find(ident, StudyRootQueryRetrieveInformationModelFind))
    assoc.release()
    assert [s.Status for s, _ in answers] == [S.QR_IDENTIFIER_MISMATCH]
    assert f"{key}: {value!r} is not a valid" in answers[0][0].ErrorComment


def _ident(level, **uids) -> Dataset:
    ds = Dataset()
    ds.QueryRetrieveLevel = level
    for k, v in uids.items():
        setattr(ds, k, v)
    return ds


RETRIEVES = [  # (identifier, expected instance indexes of archive_data)
    (lambda d: _ident("IMAGE", StudyInstanceUID=d[0].StudyInstanceUID, SeriesInstanceUID=d[0].SeriesInstanceUID,
                      SOPInstanceUID=d[1].SOPInstanceUID), [1]),
    (lambda d: _ident("SERIES", StudyInstanceUID=d[0].StudyInstanceUID, SeriesInstanceUID=d[0].SeriesInstanceUID),
     [0, 1]),
    (lambda d: _ident("STUDY", StudyInstanceUID=d[0].StudyInstanceUID), [0, 1, 2]),
]


def _c_get(dimse, archive_data, identifier: Dataset) -> tuple[list, list[Dataset]]:
    """A C-GET (Study Root) of ``identifier``: the responses and the data sets received."""
    received: list[Dataset] = []

    def on_store(event):
        received.append(event.dataset)
        return 0x0000

    ae = AE(ae_title="GETSCU")
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    classes = sorted({str(d.SOPClassUID) for d in archive_data})
    for c in classes:
        ae.add_requested_context(c)
    roles = [build_role(c, scp_role=True) for c in classes]
    assoc = ae.associate("127.0.0.1", dimse.port, ae_title="DICOMWEB", ext_neg=roles,
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.is_established
    responses = list(assoc.send_c_get(identifier, StudyRootQueryRetrieveInformationModelGet))
    assoc.release()
    return responses, received


@pytest.mark.parametrize("make,expected", RETRIEVES)
def test_get(dimse, archive_data, make, expected):
    responses, received = _c_get(dimse, archive_data, make(archive_data))
    final = responses[-1][0]
    assert final.Status == S.SUCCESS
    assert final.NumberOfCompletedSuboperations == len(expected)
    assert final.NumberOfFailedSuboperations == 0
    assert sorted(d.SOPInstanceUID for d in received) == sorted(archive_data[i].SOPInstanceUID for i in expected)
    by_uid = {d.SOPInstanceUID: d for d in archive_data}
    for d in received:
        assert d.PixelData == by_uid[d.SOPInstanceUID].PixelData


@pytest.fixture
def store_scp():
    """A Storage SCP the archive C-MOVEs to (AE MOVEDEST)."""
    received: list[Dataset] = []

    def on_store(event):
        received.append(event.dataset)
        return 0x0000

    ae = AE(ae_title="MOVEDEST")
    ae.supported_contexts = StoragePresentationContexts
    ae.add_supported_context(Verification)  # as storescp: a failed C-MOVE associates with Verification only
    port = free_port()
    server = ae.start_server(("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    yield port, received
    server.shutdown()


@pytest.fixture
def move_dimse(tmp_path, store_scp):
    with archive_moving_to(tmp_path, store_scp[0]) as d:
        yield d


@pytest.mark.parametrize("make,expected", RETRIEVES)
def test_move(move_dimse, store_scp, make, expected):
    dss = [make_dataset(study="1.2.826.0.1.3680043.8.498.1", series="1.2.826.0.1.3680043.8.498.1.1")
           for _ in range(2)]
    dss.append(make_dataset(study="1.2.826.0.1.3680043.8.498.1", series="1.2.826.0.1.3680043.8.498.1.2"))
    assert move_dimse.store(dss) == [0, 0, 0]
    assoc = move_dimse.associate([build_context(StudyRootQueryRetrieveInformationModelMove)])
    responses = list(assoc.send_c_move(make(dss), "MOVEDEST", StudyRootQueryRetrieveInformationModelMove))
    final = responses[-1][0]
    assert final.Status == S.SUCCESS
    assert final.NumberOfCompletedSuboperations == len(expected)
    assert sorted(d.SOPInstanceUID for d in store_scp[1]) == sorted(dss[i].SOPInstanceUID for i in expected)
    unknown = list(assoc.send_c_move(make(dss), "NOSUCHAE", StudyRootQueryRetrieveInformationModelMove))
    assoc.release()
    assert unknown[-1][0].Status == S.QR_MOVE_DESTINATION_UNKNOWN


def test_get_of_a_missing_file_is_a_failed_sub_operation(dimse, archive_data):
    """Damaged storage (missing_data.py): an indexed instance whose file or object is gone
    is one failed C-STORE sub-operation of a C-GET, its UID in the Failed SOP Instance UID
    List (PS3.4 C.4.2.1.4), counted at /metrics; the others are sent."""
    from tests.helpers import remove_stored

    def missing_total() -> float:  # the counter of this process's registry (the listener runs in it)
        m = re.search(r"^dicomweb_instance_data_missing_total (\S+)$", dimse.http.get("/metrics").text, re.M)
        return float(m.group(1)) if m else 0.0

    before = missing_total()
    lost = archive_data[1]
    remove_stored(dimse.server.settings, f"{lost.StudyInstanceUID}/{lost.SeriesInstanceUID}/{lost.SOPInstanceUID}.dcm")
    responses, received = _c_get(dimse, archive_data, _ident("STUDY", StudyInstanceUID=lost.StudyInstanceUID))
    final, identifier = responses[-1]
    assert final.Status == S.QR_SUBOPS_WARNING
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (2, 1)
    assert identifier.FailedSOPInstanceUIDList == lost.SOPInstanceUID
    assert sorted(d.SOPInstanceUID for d in received) == sorted(archive_data[i].SOPInstanceUID for i in (0, 2))
    assert missing_total() == before + 1


def test_move_of_a_missing_file_is_a_failed_sub_operation(move_dimse, store_scp):
    """As for C-GET: the C-MOVE of a series with one file removed sends the other, and
    names the missing one in the Failed SOP Instance UID List (status 0xB000)."""
    from tests.helpers import remove_stored

    dss = [make_dataset(study="1.2.826.0.1.3680043.8.498.1", series="1.2.826.0.1.3680043.8.498.1.1")
           for _ in range(2)]
    assert move_dimse.store(dss) == [0, 0]
    lost = dss[0]
    remove_stored(move_dimse.server.settings,
                  f"{lost.StudyInstanceUID}/{lost.SeriesInstanceUID}/{lost.SOPInstanceUID}.dcm")
    assoc = move_dimse.associate([build_context(StudyRootQueryRetrieveInformationModelMove)])
    responses = list(assoc.send_c_move(_ident("SERIES", StudyInstanceUID=lost.StudyInstanceUID,
                                              SeriesInstanceUID=lost.SeriesInstanceUID),
                                       "MOVEDEST", StudyRootQueryRetrieveInformationModelMove))
    assoc.release()
    final, identifier = responses[-1]
    assert final.Status == S.QR_SUBOPS_WARNING
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (1, 1)
    assert identifier.FailedSOPInstanceUIDList == lost.SOPInstanceUID
    assert [d.SOPInstanceUID for d in store_scp[1]] == [dss[1].SOPInstanceUID]


def test_get_and_move_bad_level(move_dimse, store_scp):
    """An identifier that does not match the SOP class fails a C-GET or C-MOVE with 0xA900
    (PS3.4 C.4.2.1.5, C.4.3.1.4): it was answered Success with no sub-operation (pynetdicom
    answers a count of 0 with Success), as if nothing matched. (pynetdicom counts the one
    sub-operation announced as failed.)"""
    ident = _ident("FRAME")
    assoc = move_dimse.associate([build_context(StudyRootQueryRetrieveInformationModelGet),
                                  build_context(StudyRootQueryRetrieveInformationModelMove)])
    get = [s for s, _ in assoc.send_c_get(ident, StudyRootQueryRetrieveInformationModelGet)]
    move = [s for s, _ in assoc.send_c_move(ident, "MOVEDEST", StudyRootQueryRetrieveInformationModelMove)]
    assoc.release()
    for final in get[-1], move[-1]:
        assert (final.Status, final.NumberOfCompletedSuboperations) == (S.QR_IDENTIFIER_MISMATCH, 0), final
        assert final.ErrorComment.startswith("QueryRetrieveLevel")
    assert store_scp[1] == []


def test_find_matches_a_sequence_item(dimse):
    """A sequence with one item in the identifier matches the series having an item that
    matches all its keys (PS3.4 C.2.2.2.6); an empty sequence is only returned."""
    def item(**kw):
        ds = Dataset()
        for k, v in kw.items():
            setattr(ds, k, v)
        return ds

    study = "1.2.826.0.1.3680043.8.498.77"  # a hierarchical query: the study's series (PS3.4 C.4.1.2.1)
    a = make_dataset(study=study, PatientID="SQF", RequestAttributesSequence=[
        item(RequestedProcedureID="XYZ", ScheduledProcedureStepID="S1"), item(RequestedProcedureID="ABC")])
    b = make_dataset(study=study, PatientID="SQF", RequestAttributesSequence=[item(RequestedProcedureID="QQQ")])
    assert dimse.store([a, b]) == [S.SUCCESS] * 2
    model = StudyRootQueryRetrieveInformationModelFind
    keys = {"QueryRetrieveLevel": "SERIES", "StudyInstanceUID": study, "PatientID": "SQF", "SeriesInstanceUID": "",
            "RequestAttributesSequence": [item(RequestedProcedureID="XYZ", ScheduledProcedureStepID="")]}
    (answer,) = _find(dimse, model, keys)
    assert answer.SeriesInstanceUID == a.SeriesInstanceUID
    # only the matching item, with only the item's keys (PS3.4 C.2.2.2.6)
    assert [(i.RequestedProcedureID, i.ScheduledProcedureStepID) for i in answer.RequestAttributesSequence] \
        == [("XYZ", "S1")]
    keys["RequestAttributesSequence"] = [item(RequestedProcedureID="ABC", ScheduledProcedureStepID="S1")]
    assert _find(dimse, model, keys) == []  # two keys, two different items
    keys["RequestAttributesSequence"] = []
    assert {x.SeriesInstanceUID for x in _find(dimse, model, keys)} == {a.SeriesInstanceUID, b.SeriesInstanceUID}
    ident = Dataset()
    ident.QueryRetrieveLevel, ident.StudyInstanceUID, ident.PatientID = "SERIES", study, "SQF"
    ident.RequestAttributesSequence = [item(RequestedProcedureID="XYZ"), item(RequestedProcedureID="ABC")]
    assoc = dimse.associate([build_context(model)])
    try:  # a sequence matching key holds one item: 0xA900 (identifier does not match the model)
        assert [s.Status for s, _ in assoc.send_c_find(ident, model)] == [S.QR_IDENTIFIER_MISMATCH]
    finally:
        assoc.release()


def _item(**kw) -> Dataset:
    ds = Dataset()
    for k, v in kw.items():
        setattr(ds, k, v)
    return ds


def _keywords(items) -> list[list[str]]:
    return [[e.keyword for e in item] for item in items]


def test_find_returns_the_matching_items_with_the_requested_item_keys(dimse):
    """A sequence key answers with the stored items matching all its item keys, each
    holding only the requested item attributes (an absent one with zero length); a
    zero-length item returns the whole stored sequence (PS3.4 C.2.2.2.6)."""
    ds = make_dataset(PatientID="SQR", RequestAttributesSequence=[
        _item(RequestedProcedureID="RPX", ScheduledProcedureStepID="SPSX"),
        _item(RequestedProcedureID="RPY", ScheduledProcedureStepID="SPSY")],
        ProcedureCodeSequence=[_item(CodeValue="CTCHEST", CodingSchemeDesignator="LOCAL", CodeMeaning="CT Chest")])
    assert dimse.store([ds]) == [S.SUCCESS]
    model = StudyRootQueryRetrieveInformationModelFind
    series = {"QueryRetrieveLevel": "SERIES", "PatientID": "SQR", "StudyInstanceUID": ds.StudyInstanceUID}

    # an item key matching one of two items: that item, with that key only
    (answer,) = _find(dimse, model, {**series, "RequestAttributesSequence": [_item(RequestedProcedureID="RPX")]})
    assert _keywords(answer.RequestAttributesSequence) == [["RequestedProcedureID"]]
    assert answer.RequestAttributesSequence[0].RequestedProcedureID == "RPX"

    # a wildcard matching both; a return key inside the item; an item key the items lack
    (answer,) = _find(dimse, model, {**series, "RequestAttributesSequence": [
        _item(RequestedProcedureID="RP*", ScheduledProcedureStepID="", AccessionNumber="")]})
    assert _keywords(answer.RequestAttributesSequence) == [
        ["AccessionNumber", "ScheduledProcedureStepID", "RequestedProcedureID"]] * 2  # in tag order
    assert [(i.RequestedProcedureID, i.ScheduledProcedureStepID, i.AccessionNumber)
            for i in answer.RequestAttributesSequence] == [("RPX", "SPSX", ""), ("RPY", "SPSY", "")]

    # a zero-length item: the whole stored sequence
    (answer,) = _find(dimse, model, {**series, "RequestAttributesSequence": [Dataset()]})
    assert [(i.RequestedProcedureID, i.ScheduledProcedureStepID) for i in answer.RequestAttributesSequence] \
        == [("RPX", "SPSX"), ("RPY", "SPSY")]

    # a study-level sequence whose item asks for some attributes only
    study = {"QueryRetrieveLevel": "STUDY", "PatientID": "SQR"}
    (answer,) = _find(dimse, model, {**study, "ProcedureCodeSequence": [
        _item(CodeValue="CTCHEST", CodingSchemeDesignator="")]})
    assert _keywords(answer.ProcedureCodeSequence) == [["CodeValue", "CodingSchemeDesignator"]]
    assert (answer.ProcedureCodeSequence[0].CodeValue, answer.ProcedureCodeSequence[0].CodingSchemeDesignator) \
        == ("CTCHEST", "LOCAL")
    (answer,) = _find(dimse, model, {**study, "ProcedureCodeSequence": [_item(CodeValue="")]})
    assert _keywords(answer.ProcedureCodeSequence) == [["CodeValue"]]
    (answer,) = _find(dimse, model, {**study, "ProcedureCodeSequence": []})  # empty sequence: returned whole
    assert _keywords(answer.ProcedureCodeSequence) == [["CodeValue", "CodingSchemeDesignator", "CodeMeaning"]]


def test_find_with_a_timezone_offset(dimse):
    """Timezone Offset From UTC in the identifier: its date and time values are in that
    offset (PS3.4 C.4.1.1.3.1), each instance's in its own; a date range with a time range is
    one date-time range (C.2.2.2.5.1)."""
    a = make_dataset(PatientID="TZF", StudyDate="20200102", StudyTime="003000", TimezoneOffsetFromUTC="+0100")
    b = make_dataset(PatientID="TZF", StudyDate="20200102", StudyTime="120000", TimezoneOffsetFromUTC="+0100")
    assert dimse.store([a, b]) == [S.SUCCESS] * 2
    model = StudyRootQueryRetrieveInformationModelFind
    keys = {"QueryRetrieveLevel": "STUDY", "PatientID": "TZF", "StudyInstanceUID": "", "StudyDate": "20200101",
            "TimezoneOffsetFromUTC": "-0100"}
    assert [x.StudyInstanceUID for x in _find(dimse, model, keys)] == [a.StudyInstanceUID]  # 22:30 at -0100
    keys = {"QueryRetrieveLevel": "STUDY", "PatientID": "TZF", "StudyInstanceUID": "",
            "StudyDate": "20200101-20200102", "StudyTime": "2300-0100"}
    assert [x.StudyInstanceUID for x in _find(dimse, model, keys)] == [a.StudyInstanceUID]


# --- baseline (non-relational) retrieve and hierarchical search (PS3.4 C.4.1.2.1, C.4.2.2.1, C.4.3.2.1)

A, B = "1.2.826.0.1.3680043.8.498.1", "1.2.826.0.1.3680043.8.498.2"
STUDY_UID, SERIES_UID, SOP_UID = 0x0020000D, 0x0020000E, 0x00080018

BAD_RETRIEVES = [  # (Patient Root?, identifier keys, Error Comment, Offending Element)
    (False, {"QueryRetrieveLevel": "STUDY"}, "StudyInstanceUID missing (required at STUDY level)", STUDY_UID),
    (False, {"QueryRetrieveLevel": "STUDY", "StudyInstanceUID": "*"},
     "StudyInstanceUID: no wildcard matching at STUDY level", STUDY_UID),
    (False, {"QueryRetrieveLevel": "STUDY", "StudyInstanceUID": ""},
     "StudyInstanceUID empty (required at STUDY level)", STUDY_UID),
    (False, {"QueryRetrieveLevel": "STUDY", "StudyInstanceUID": [A, ""]},
     "StudyInstanceUID: an empty UID in the list", STUDY_UID),
    (False, {"QueryRetrieveLevel": "SERIES", "PatientID": "PQR1"},
     "SeriesInstanceUID missing (required at SERIES level)", SERIES_UID),
    (False, {"QueryRetrieveLevel": "SERIES", "StudyInstanceUID": [A, B], "SeriesInstanceUID": A + ".1"},
     "StudyInstanceUID must be a single value above SERIES level", STUDY_UID),
    (False, {"QueryRetrieveLevel": "IMAGE", "StudyInstanceUID": A, "SeriesInstanceUID": A + ".?"},
     "SeriesInstanceUID: no wildcard matching above IMAGE level", SERIES_UID),
    (False, {"QueryRetrieveLevel": "IMAGE", "StudyInstanceUID": A, "SeriesInstanceUID": A + ".1"},
     "SOPInstanceUID missing (required at IMAGE level)", SOP_UID),
    (False, {"QueryRetrieveLevel": "study", "StudyInstanceUID": A},  # CS is upper case (PS3.5 §6.2)
     "QueryRetrieveLevel 'study' is not one of STUDY, SERIES, IMAGE", 0x00080052),
    (True, {"QueryRetrieveLevel": "STUDY", "PatientID": "PQR*", "StudyInstanceUID": A},
     "PatientID: no wildcard matching above STUDY level", 0x00100020),
    (True, {"QueryRetrieveLevel": "PATIENT", "PatientID": "PQR*"},
     "PatientID: no wildcard matching at PATIENT level", 0x00100020),
    (True, {"QueryRetrieveLevel": "PATIENT", "PatientID": ""},
     "PatientID empty (required at PATIENT level)", 0x00100020),
]


def _keys(keys: dict) -> Dataset:
    ds = Dataset()
    for k, v in keys.items():
        setattr(ds, k, v)
    return ds


def _store_two_studies(d) -> list[Dataset]:
    dss = [make_dataset(study=A, series=A + ".1", PatientID="PQR1", InstanceNumber=i) for i in (1, 2)]
    dss.append(make_dataset(study=A, series=A + ".2", PatientID="PQR1"))
    dss.append(make_dataset(study=B, series=B + ".1", PatientID="PQR2"))
    assert d.store(dss) == [S.SUCCESS] * 4
    return dss


@pytest.mark.parametrize("patient_root,keys,comment,offending", BAD_RETRIEVES)
def test_get_and_move_need_the_unique_keys(move_dimse, store_scp, patient_root, keys, comment, offending):
    """A C-GET or C-MOVE identifier is not a search (PS3.4 C.4.2.2.1, C.4.3.2.1, baseline:
    relational retrieve is not negotiated): a single value in the unique key of each level
    above the Query/Retrieve Level, one UID or a UID list at it (Patient ID: one value), no
    wildcard, no universal matching. Else 0xA900 naming the key (Error Comment, Offending
    Element), and nothing is sent. Before, each was a C-FIND: ``StudyInstanceUID=*`` or none
    at all sent the whole archive, a SERIES retrieve by Patient ID the patient's series."""
    from pynetdicom.sop_class import PatientRootQueryRetrieveInformationModelGet as PGet
    from pynetdicom.sop_class import PatientRootQueryRetrieveInformationModelMove as PMove

    dss = _store_two_studies(move_dimse)
    get_model, move_model = (PGet, PMove) if patient_root else (StudyRootQueryRetrieveInformationModelGet,
                                                               StudyRootQueryRetrieveInformationModelMove)
    received: list[Dataset] = []

    def on_store(event):
        received.append(event.dataset)
        return 0x0000

    ae = AE(ae_title="GETSCU")
    ae.add_requested_context(get_model)
    ae.add_requested_context(move_model)
    ae.add_requested_context(dss[0].SOPClassUID)
    assoc = ae.associate("127.0.0.1", move_dimse.port, ae_title="DICOMWEB", evt_handlers=[(evt.EVT_C_STORE, on_store)],
                         ext_neg=[build_role(dss[0].SOPClassUID, scp_role=True)])
    assert assoc.is_established
    try:
        get = [s for s, _ in assoc.send_c_get(_keys(keys), get_model)]
        move = [s for s, _ in assoc.send_c_move(_keys(keys), "MOVEDEST", move_model)]
    finally:
        assoc.release()
    for responses in get, move:
        final = responses[-1]
        assert len(responses) == 1, responses  # no pending response: no sub-operation
        assert final.Status == S.QR_IDENTIFIER_MISMATCH, final
        assert final.ErrorComment == comment
        assert final.OffendingElement == offending
        assert final.get("NumberOfCompletedSuboperations", 0) == 0
    assert received == [] and store_scp[1] == []


def test_get_and_move_retrieve_what_the_unique_keys_name(move_dimse, store_scp):
    """A UID list at the Query/Retrieve Level retrieves each entity (PS3.4 C.4.2.1.4.1 Note);
    other keys (PatientName here, keys below the level) are not matching keys of a retrieve
    and are ignored (real SCUs send them). Patient Root: PATIENT by Patient ID, STUDY with
    the Patient ID above it."""
    from pynetdicom.sop_class import PatientRootQueryRetrieveInformationModelMove as PMove

    dss = _store_two_studies(move_dimse)
    uids = lambda idx: sorted(dss[i].SOPInstanceUID for i in idx)  # noqa: E731
    responses, received = _c_get(move_dimse, dss, _keys({
        "QueryRetrieveLevel": "SERIES", "StudyInstanceUID": A, "SeriesInstanceUID": [A + ".1", A + ".2"],
        "PatientName": "Nobody^Here", "SOPInstanceUID": dss[0].SOPInstanceUID, "Modality": ""}))
    assert (responses[-1][0].Status, responses[-1][0].NumberOfCompletedSuboperations) == (S.SUCCESS, 3)
    assert sorted(d.SOPInstanceUID for d in received) == uids([0, 1, 2])
    assoc = move_dimse.associate([build_context(PMove)])
    try:
        final = list(assoc.send_c_move(_keys({"QueryRetrieveLevel": "PATIENT", "PatientID": "PQR2"}),
                                       "MOVEDEST", PMove))[-1][0]
        assert (final.Status, final.NumberOfCompletedSuboperations) == (S.SUCCESS, 1)
        assert [d.SOPInstanceUID for d in store_scp[1]] == uids([3])
        final = list(assoc.send_c_move(_keys({"QueryRetrieveLevel": "STUDY", "PatientID": "PQR2",
                                              "StudyInstanceUID": A}), "MOVEDEST", PMove))[-1][0]
        assert (final.Status, final.NumberOfCompletedSuboperations) == (S.SUCCESS, 0)  # not that patient's study
        # a unique key above the level absent or empty is tolerated: the level's UIDs name what is
        # retrieved (a Patient Root STUDY retrieve by Study Instance UID alone; IMAGE by SOP UIDs)
        final = list(assoc.send_c_move(_keys({"QueryRetrieveLevel": "STUDY", "StudyInstanceUID": A}),
                                       "MOVEDEST", PMove))[-1][0]
        assert (final.Status, final.NumberOfCompletedSuboperations) == (S.SUCCESS, 3)
        final = list(assoc.send_c_move(_keys({"QueryRetrieveLevel": "IMAGE", "PatientID": "", "StudyInstanceUID": A,
                                              "SOPInstanceUID": [dss[0].SOPInstanceUID, dss[2].SOPInstanceUID]}),
                                       "MOVEDEST", PMove))[-1][0]
        assert (final.Status, final.NumberOfCompletedSuboperations) == (S.SUCCESS, 2)
        assert sorted(d.SOPInstanceUID for d in store_scp[1]) == sorted(uids([3]) + uids([0, 1, 2]) + uids([0, 2]))
    finally:
        assoc.release()


RELATIONAL_FINDS = [  # (Patient Root?, keys, the unique keys answered): unique keys above the level missing
    (True, {"QueryRetrieveLevel": "SERIES", "SeriesInstanceUID": ""}, [A + ".1", A + ".2", B + ".1"]),
    (True, {"QueryRetrieveLevel": "SERIES", "PatientID": "PQR1", "SeriesInstanceUID": ""}, [A + ".1", A + ".2"]),
    (True, {"QueryRetrieveLevel": "STUDY", "PatientID": "PQR*", "StudyInstanceUID": ""}, [A, B]),
    (False, {"QueryRetrieveLevel": "SERIES", "StudyInstanceUID": [A, B], "SeriesInstanceUID": ""},
     [A + ".1", A + ".2", B + ".1"]),
]


@pytest.mark.parametrize("patient_root,keys,expected", RELATIONAL_FINDS)
def test_a_relational_find_is_answered(dimse, patient_root, keys, expected):
    """A C-FIND without single values in the unique keys of the levels above (a relational
    query, PS3.4 C.4.1.2.2) is answered as the search it is, negotiated or not: SCUs in the
    field send them (a Patient Root STUDY query by a Patient ID pattern). C-GET and C-MOVE,
    which send data, are held to the baseline keys (test_get_and_move_need_the_unique_keys)."""
    _store_two_studies(dimse)
    model = PatientRootQueryRetrieveInformationModelFind if patient_root else StudyRootQueryRetrieveInformationModelFind
    level = keys["QueryRetrieveLevel"]
    key = "SeriesInstanceUID" if level == "SERIES" else "StudyInstanceUID"
    assert sorted(str(f[key].value) for f in _find(dimse, model, keys)) == expected


def test_a_lower_case_level_is_refused(dimse):
    """A CS value is upper case (PS3.5 §6.2): ``study`` is not a Query/Retrieve Level (0xA900,
    naming it; pynetdicom's qrscp refuses it too). Before, it was searched as STUDY."""
    _store_two_studies(dimse)
    model = StudyRootQueryRetrieveInformationModelFind
    assoc = dimse.associate([build_context(model)])
    try:
        responses = [s for s, _ in assoc.send_c_find(_keys({"QueryRetrieveLevel": "study", "StudyInstanceUID": ""}),
                                                     model)]
    finally:
        assoc.release()
    assert [(s.Status, s.ErrorComment) for s in responses] == [
        (S.QR_IDENTIFIER_MISMATCH, "QueryRetrieveLevel 'study' is not one of STUDY, SERIES, IMAGE")]


def _raw_request(d, model, raw: bytes, get: bool = False, ts: str = "1.2.840.10008.1.2.1") -> list:
    """Send a C-FIND (or C-GET) whose identifier is ``raw`` (in ``ts``, Explicit VR Little
    Endian unless told); the statuses of the responses, or "C-STORE" for a sub-operation."""
    import io

    from pynetdicom.dimse_primitives import C_FIND, C_GET

    ae = AE(ae_title="RAWSCU")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(model, ts)
    assoc = ae.associate("127.0.0.1", d.port, ae_title="DICOMWEB")
    assert assoc.is_established
    req = C_GET() if get else C_FIND()
    req.MessageID, req.AffectedSOPClassUID, req.Priority, req.Identifier = 1, model, 2, io.BytesIO(raw)
    assoc._reactor_checkpoint.clear()  # as send_c_find: the reactor leaves the responses to us
    while not assoc._is_paused:
        time.sleep(0.001)
    assoc.dimse.send_msg(req, assoc.accepted_contexts[0].context_id)
    out: list = []
    try:
        while True:
            _, rsp = assoc.dimse.get_msg(block=True)
            if rsp is None or not hasattr(rsp, "Status") or rsp.Status is None:
                out.append("C-STORE" if rsp is not None else None)
                break
            out.append((rsp.Status, rsp.ErrorComment))
            if rsp.Status not in (S.PENDING, 0xFF01):
                break
    finally:
        assoc._reactor_checkpoint.set()
        assoc.abort() if out and out[-1] == "C-STORE" else assoc.release()
    return out


def test_a_truncated_identifier_is_unable_to_process(dimse):
    """An element whose length runs past the end of the identifier (PS3.5 §7.1: here the last
    element declares 500 bytes, 6 are there): 0xC000 Unable to process (PS3.4 C.4.1.1.4,
    C.4.3.1.4), as STOW-RS and C-STORE refuse a truncated element. pydicom kept the 6 bytes:
    a STUDY query was answered with every study, a C-GET of the study sent it."""
    import struct

    def el(g, e, vr, value, length=None):
        return struct.pack("<HH", g, e) + vr + struct.pack("<H", len(value) if length is None else length) + value

    _store_two_studies(dimse)
    level = el(0x0008, 0x0052, b"CS", b"STUDY ", 500)
    assert _raw_request(dimse, StudyRootQueryRetrieveInformationModelFind, level) == [
        (S.QR_UNABLE_TO_PROCESS, "identifier truncated: (0008,0052) declares 500 bytes, has 6")]
    uid = A.encode() + b"\0"
    get = el(0x0008, 0x0052, b"CS", b"STUDY ") + el(0x0020, 0x000D, b"UI", uid, 64)
    assert _raw_request(dimse, StudyRootQueryRetrieveInformationModelGet, get, get=True) == [
        (S.QR_UNABLE_TO_PROCESS, f"identifier truncated: (0020,000D) declares 64 bytes, has {len(uid)}")]
    from pynetdicom.sop_class import ModalityWorklistInformationFind

    assert _raw_request(dimse, ModalityWorklistInformationFind, el(0x0010, 0x0020, b"LO", b"PQR1", 50)) == [
        (S.QR_UNABLE_TO_PROCESS, "identifier truncated: (0010,0020) declares 50 bytes, has 4")]
    # inside a sequence item (defined lengths): the same
    inner = el(0x0008, 0x0050, b"SH", b"ACC1", 40)
    item = struct.pack("<HHI", 0xFFFE, 0xE000, len(inner)) + inner
    seq = struct.pack("<HH", 0x0008, 0x1110) + b"SQ\0\0" + struct.pack("<I", len(item)) + item
    assert _raw_request(dimse, StudyRootQueryRetrieveInformationModelFind, el(0x0008, 0x0052, b"CS", b"STUDY ") + seq) \
        == [(S.QR_UNABLE_TO_PROCESS, "identifier truncated: (0008,0050) declares 40 bytes, has 4")]


def _deflated_identifier(zeros: int) -> bytes:
    """A STUDY C-FIND identifier in Deflated Explicit VR Little Endian (PS3.5 §A.5) followed
    by ``zeros`` zero bytes (8-byte elements of tag (0000,0000), length 0): deflate shrinks
    them about 1000:1."""
    import zlib

    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset

    ident = Dataset()
    ident.QueryRetrieveLevel, ident.StudyInstanceUID = "STUDY", A
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_dataset(fp, ident)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    return comp.compress(fp.getvalue() + bytes(zeros)) + comp.flush()


def test_a_deflated_identifier_is_inflated_with_a_bound(dimse):
    """A C-FIND identifier of 64 KB inflating to 64 MiB: 0xC000 Unable to process (PS3.4
    C.4.1.1.4) at once. pynetdicom inflated it whole, twice (once only to log it), and parsed
    its 8 million elements: a 97 KB identifier held its association 48 s and 270 MB. One
    within the bound (dicom/reading.py MAX_IDENTIFIER_BYTES) is answered."""
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    from dicomweb_server.dicom import reading

    _store_two_studies(dimse)
    model = StudyRootQueryRetrieveInformationModelFind
    bomb = _deflated_identifier(64 * 1024 * 1024)
    assert len(bomb) < 100_000
    start = time.monotonic()
    assert _raw_request(dimse, model, bomb, ts=DeflatedExplicitVRLittleEndian) == [
        (S.QR_UNABLE_TO_PROCESS, "identifier refused: the Deflated data set inflates to more than")]
    assert time.monotonic() - start < 5
    small = _deflated_identifier(reading.MAX_IDENTIFIER_BYTES // 2)
    out = _raw_request(dimse, model, small, ts=DeflatedExplicitVRLittleEndian)
    assert [status for status, _ in out] == [S.PENDING, S.SUCCESS]

"""Specific Character Set (0008,0005) of C-FIND answers built from the archive's Unicode data
(dicom/charset.py; PS3.4 C.4.1.1.3.2, K.4.1.1.3.2; PS3.5 §6.1.2.3): the modality worklist
(entries POSTed as DICOM JSON) and the stored-image C-FIND. A non-ASCII value comes with
the character set that holds it, its bytes in it, never replacement characters: the SCU's
requested one when it holds every value, else the data's own, else the archive's
``dimse_character_set`` (default ISO_IR 100), else ISO_IR 192; an ASCII answer without
(0008,0005). Checked with pynetdicom and DCMTK's findscu, on the bytes."""

from __future__ import annotations

import httpx
import pydicom
import pytest
from pydicom.dataset import Dataset
from pynetdicom.sop_class import (
    PatientRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelFind,
)

from dicomweb_server.dimse import status as S
from tests.helpers import LiveServer, free_port, make_dataset

from .conftest import Dimse
from .test_dcmtk import run
from .test_query_retrieve import _find as qr_find
from .test_worklist import _find as worklist_find

PN = 0x00100010
LATIN1 = "Müller^Jörg"
GREEK_KANJI = "Ωmega^山田"


def _entry(name: str, pid: str, station: str, sps_id: str, description: str = "CT Kopf") -> dict:
    sps = {"00400001": {"vr": "AE", "Value": [station]}, "00080060": {"vr": "CS", "Value": ["CT"]},
           "00400002": {"vr": "DA", "Value": ["20260106"]}, "00400009": {"vr": "SH", "Value": [sps_id]},
           "00400007": {"vr": "LO", "Value": [description]}}
    return {"00100010": {"vr": "PN", "Value": [{"Alphabetic": name}]}, "00100020": {"vr": "LO", "Value": [pid]},
            "00400100": {"vr": "SQ", "Value": [sps]}}


def _add(dimse, *entries: dict) -> None:
    r = dimse.http.post("/worklist", json=list(entries))
    assert r.status_code == 201, r.text


def _mwl_find(dimse, station: str, charset: str | None = None) -> list[Dataset]:
    ds = Dataset()
    if charset:
        ds.SpecificCharacterSet = charset
    ds.PatientName = ""
    ds.PatientID = ""
    item = Dataset()
    item.ScheduledStationAETitle = station
    item.ScheduledProcedureStepDescription = ""
    ds.ScheduledProcedureStepSequence = [item]
    return worklist_find(dimse, ds)


def _raw(ds: Dataset, tag: int) -> bytes:
    """The PN value's bytes as they came on the wire (raw until read; a PersonName keeps them)."""
    value = ds.get_item(tag).value
    return (value if isinstance(value, bytes) else value.original_string).rstrip(b" ")  # less the even-length padding


@pytest.mark.parametrize("requested, charset, raw", [
    (None, "ISO_IR 100", LATIN1.encode("latin-1")),  # no request: the archive's dimse_character_set holds it
    ("ISO_IR 100", "ISO_IR 100", LATIN1.encode("latin-1")),  # the SCU's, which holds it
    ("ISO_IR 192", "ISO_IR 192", LATIN1.encode("utf-8")),
    ("ISO_IR 126", "ISO_IR 100", LATIN1.encode("latin-1")),  # Greek cannot hold it: the archive's
])
def test_worklist_latin1_name(dimse, requested, charset, raw):
    _add(dimse, _entry(LATIN1, "P2", "CT2", "SPS2"))
    [answer] = _mwl_find(dimse, "CT2", requested)
    assert answer.SpecificCharacterSet == charset
    assert _raw(answer, PN) == raw
    assert str(answer.PatientName) == LATIN1


@pytest.mark.parametrize("requested", [None, "ISO_IR 100", "ISO_IR 192"])
def test_worklist_name_outside_latin1_is_utf8(dimse, requested):
    """Greek and Kanji: not in Latin-1 even when the SCU asks for it (C.4.1.1.3.2: the SCP
    may answer in another); never '?'."""
    _add(dimse, _entry(GREEK_KANJI, "P3", "CT3", "SPS3", "Θώρακας"))
    [answer] = _mwl_find(dimse, "CT3", requested)
    assert answer.SpecificCharacterSet == "ISO_IR 192"
    assert _raw(answer, PN) == GREEK_KANJI.encode("utf-8")
    assert str(answer.PatientName) == GREEK_KANJI
    # in the item too
    assert answer.ScheduledProcedureStepSequence[0].ScheduledProcedureStepDescription == "Θώρακας"


def test_worklist_requested_greek_holds_greek(dimse):
    _add(dimse, _entry("Ωmega^Άννα", "P5", "CT5", "SPS5"))
    [answer] = _mwl_find(dimse, "CT5", "ISO_IR 126")
    assert answer.SpecificCharacterSet == "ISO_IR 126"
    assert _raw(answer, PN) == "Ωmega^Άννα".encode("iso8859_7")
    assert str(answer.PatientName) == "Ωmega^Άννα"


@pytest.mark.parametrize("requested", [None, "ISO_IR 100"])
def test_worklist_ascii_answer_has_no_character_set(dimse, requested):
    """C.4.1.1.3.2: (0008,0005) only when a value needs more than the default repertoire."""
    _add(dimse, _entry("Doe^John", "P4", "CT4", "SPS4"))
    [answer] = _mwl_find(dimse, "CT4", requested)
    assert "SpecificCharacterSet" not in answer
    assert _raw(answer, PN) == b"Doe^John"


def test_worklist_entry_with_a_character_set_that_cannot_hold_it(dimse):
    """An entry POSTed with (0008,0005) ISO_IR 100 and a Kanji name: its own set is a
    preference, not what the answer must use."""
    entry = _entry(GREEK_KANJI, "P6", "CT6", "SPS6")
    entry["00080005"] = {"vr": "CS", "Value": ["ISO_IR 100"]}
    latin = _entry(LATIN1, "P7", "CT6", "SPS7")
    latin["00080005"] = {"vr": "CS", "Value": ["ISO_IR 100"]}
    _add(dimse, entry, latin)
    kanji, german = _mwl_find(dimse, "CT6")
    assert (kanji.SpecificCharacterSet, str(kanji.PatientName)) == ("ISO_IR 192", GREEK_KANJI)
    assert (german.SpecificCharacterSet, _raw(german, PN)) == ("ISO_IR 100", LATIN1.encode("latin-1"))


@pytest.mark.parametrize("requested, charset, raw", [
    (None, "ISO_IR 100", LATIN1.encode("latin-1")),
    ("ISO_IR 192", "ISO_IR 192", LATIN1.encode("utf-8")),
])
def test_findscu_worklist_latin1(dimse, tmp_path, requested, charset, raw):
    """The integrator's repro with DCMTK's findscu -W: the answer file's bytes."""
    _add(dimse, _entry(LATIN1, "P2", "CT2", "SPS2"))
    keys = ["-k", "PatientName", "-k", "PatientID",
            "-k", "ScheduledProcedureStepSequence[0].ScheduledStationAETitle=CT2"]
    if requested:
        keys += ["-k", f"SpecificCharacterSet={requested}"]
    run("findscu", "-W", "-X", "-aet", "CT2", "-aec", "DICOMWEB", *keys, "127.0.0.1", str(dimse.port), cwd=tmp_path)
    answer = pydicom.dcmread(tmp_path / "rsp0001.dcm")
    assert answer.SpecificCharacterSet == charset
    assert _raw(answer, PN) == raw
    assert str(answer.PatientName) == LATIN1


def test_findscu_worklist_greek_kanji(dimse, tmp_path):
    _add(dimse, _entry(GREEK_KANJI, "P3", "CT3", "SPS3"))
    run("findscu", "-W", "-X", "-aet", "CT3", "-aec", "DICOMWEB", "-k", "SpecificCharacterSet=ISO_IR 100",
        "-k", "PatientName", "-k", "PatientID", "-k", "ScheduledProcedureStepSequence[0].ScheduledStationAETitle=CT3",
        "127.0.0.1", str(dimse.port), cwd=tmp_path)
    answer = pydicom.dcmread(tmp_path / "rsp0001.dcm")
    assert answer.SpecificCharacterSet == "ISO_IR 192"
    assert _raw(answer, PN) == GREEK_KANJI.encode("utf-8") and b"?" not in _raw(answer, PN)
    # DCMTK decodes it to the same name
    dump = run("dcmdump", "+U8", str(tmp_path / "rsp0001.dcm"), cwd=tmp_path).stdout
    assert GREEK_KANJI in dump


def _study_find(dimse, charset: str | None, **keys) -> list[Dataset]:
    return qr_find(dimse, StudyRootQueryRetrieveInformationModelFind,
                   {**({"SpecificCharacterSet": charset} if charset else {}), "QueryRetrieveLevel": "STUDY",
                    "StudyInstanceUID": "", "PatientName": "", "StudyDescription": "", **keys})


def test_study_find_same_rule(dimse):
    """The stored-image C-FIND uses the same choice: a stored UTF-8 Latin-1 name in the
    SCU's ISO_IR 100 when asked, in its stored set otherwise; a Kanji name in UTF-8 even
    when ISO_IR 100 is asked; an ASCII study without (0008,0005) whatever it was stored in."""
    latin = make_dataset(study="1.2.826.0.1.3680043.8.498.71", PatientID="Q1", PatientName=LATIN1,
                         StudyDescription="Schädel")
    latin.SpecificCharacterSet = "ISO_IR 192"
    kanji = make_dataset(study="1.2.826.0.1.3680043.8.498.72", PatientID="Q2", PatientName=GREEK_KANJI)
    kanji.SpecificCharacterSet = "ISO_IR 192"
    ascii_ = make_dataset(study="1.2.826.0.1.3680043.8.498.73", PatientID="Q3", PatientName="Doe^Jane")
    ascii_.SpecificCharacterSet = "ISO_IR 100"
    assert dimse.store([latin, kanji, ascii_]) == [S.SUCCESS] * 3

    [a] = _study_find(dimse, "ISO_IR 100", PatientID="Q1")
    assert (a.SpecificCharacterSet, _raw(a, PN)) == ("ISO_IR 100", LATIN1.encode("latin-1"))
    assert (str(a.PatientName), a.StudyDescription) == (LATIN1, "Schädel")
    [a] = _study_find(dimse, None, PatientID="Q1")  # the study's own before the archive's ISO_IR 100
    assert (a.SpecificCharacterSet, _raw(a, PN)) == ("ISO_IR 192", LATIN1.encode("utf-8"))
    [a] = _study_find(dimse, "ISO_IR 100", PatientID="Q2")
    assert (a.SpecificCharacterSet, str(a.PatientName)) == ("ISO_IR 192", GREEK_KANJI)
    [a] = _study_find(dimse, None, PatientID="Q3")
    assert "SpecificCharacterSet" not in a and _raw(a, PN) == b"Doe^Jane"


@pytest.mark.parametrize("requested", ["ISO_IR 100", "ISO_IR 192"])
def test_worklist_non_ascii_matching_key(dimse, requested):
    """A Patient's Name key in the request's own character set matches the entry's Unicode
    value (the SCP decodes the identifier with its (0008,0005): PS3.4 C.4.1.1.3.1)."""
    _add(dimse, _entry(LATIN1, "P2", "CT8", "SPS8"), _entry("Mueller^Hans", "P9", "CT8", "SPS9"))
    ds = Dataset()
    ds.SpecificCharacterSet = requested
    ds.PatientName = "Mül*"
    ds.PatientID = ""
    answers = worklist_find(dimse, ds)
    assert [(a.PatientID, str(a.PatientName), a.SpecificCharacterSet) for a in answers] == [("P2", LATIN1, requested)]


def test_patient_level_one_answer_whatever_the_studies_were_stored_in(dimse):
    """Two studies of one patient, received in ISO_IR 100 and in ISO_IR 192: the same
    patient (the same Unicode name), one PATIENT level answer (PS3.4 C.6.1.1.2), in the
    character set the SCU asked for."""
    first = make_dataset(study="1.2.826.0.1.3680043.8.498.81", PatientID="Q8", PatientName=LATIN1)
    first.SpecificCharacterSet = "ISO_IR 100"
    second = make_dataset(study="1.2.826.0.1.3680043.8.498.82", PatientID="Q8", PatientName=LATIN1)
    second.SpecificCharacterSet = "ISO_IR 192"
    assert dimse.store([first, second]) == [S.SUCCESS] * 2
    [patient] = qr_find(dimse, PatientRootQueryRetrieveInformationModelFind,
                        {"SpecificCharacterSet": "ISO_IR 100", "QueryRetrieveLevel": "PATIENT",
                         "PatientID": "Q8", "PatientName": ""})
    assert (patient.SpecificCharacterSet, _raw(patient, PN)) == ("ISO_IR 100", LATIN1.encode("latin-1"))


def test_archive_preferring_utf8(tmp_path):
    """``dimse_character_set`` empty: a Latin-1 name the SCU named no set for goes out in UTF-8;
    a set the SCU names still comes first."""
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=None,
                     dimse_character_set="").start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            dimse = Dimse(srv, port, client)
            _add(dimse, _entry(LATIN1, "P2", "CT2", "SPS2"))
            [answer] = _mwl_find(dimse, "CT2")
            assert (answer.SpecificCharacterSet, _raw(answer, PN)) == ("ISO_IR 192", LATIN1.encode("utf-8"))
            [answer] = _mwl_find(dimse, "CT2", "ISO_IR 100")
            assert (answer.SpecificCharacterSet, _raw(answer, PN)) == ("ISO_IR 100", LATIN1.encode("latin-1"))
    finally:
        srv.stop()

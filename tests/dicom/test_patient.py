"""Patient identity (dicom/patient.py): Patient ID within its Issuer of Patient ID,
values as PS3.5 defines LO (padding is not part of the value)."""

from __future__ import annotations

from dicomweb_server.dicom.patient import PatientIdentity, patient_identity


def lo(*values):
    return {"vr": "LO", "Value": list(values)}


def test_identity_is_the_id_within_its_issuer():
    assert patient_identity({"00100020": lo("P1"), "00100021": lo("HOSP")}) == PatientIdentity("P1", "HOSP")
    # padding (spaces either side, NUL) is not part of an LO value; case is
    assert patient_identity({"00100020": lo(" P1  "), "00100021": lo("HOSP\x00")}) == ("P1", "HOSP")
    assert patient_identity({"00100020": lo("p1")}) != patient_identity({"00100020": lo("P1")})


def test_empty_and_absent_are_the_same():
    absent = patient_identity({"00100020": lo("P1")})
    for issuer in ({"vr": "LO"}, lo(""), lo(None), lo("  ")):
        assert patient_identity({"00100020": lo("P1"), "00100021": issuer}) == absent == ("P1", "")
    assert patient_identity({}) == patient_identity({"00100020": {"vr": "LO"}}) == ("", "")


def test_other_attributes_do_not_count():
    base = {"00100020": lo("P1"), "00100021": lo("HOSP")}
    other = {**base, "00100010": {"vr": "PN", "Value": [{"Alphabetic": "Doe^Jon"}]}, "00100030": {"vr": "DA"},
             "00100024": {"vr": "SQ", "Value": [{"00400032": {"vr": "UT", "Value": ["1.2.3"]}}]}}
    assert patient_identity(other) == patient_identity(base)


def test_text_names_id_and_issuer():
    assert str(PatientIdentity("P1", "HOSP")) == "'P1' (issuer 'HOSP')"
    assert str(PatientIdentity("", "")) == "'' (no issuer)"

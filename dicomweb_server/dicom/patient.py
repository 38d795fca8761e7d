"""Patient identity: which patient a study belongs to.

A study belongs to one patient (PS3.3 §A.1.2.1-A.1.2.2: the Patient IE is the
subject of one or more studies; PS3.4 §C.6.1.1, the Patient Root information model,
puts every study under exactly one patient). The index refuses an instance whose
study is already stored under another patient (store/base.py ``hierarchy_conflict``).

A patient is identified by Patient ID (0010,0020) within its Issuer of Patient ID
(0010,0021), as DICOM identifies it (PS3.3 §C.7.1.1: the Patient ID is assigned by
the issuer; the same ID from two issuers names two patients) and as archives key
their patient records (dcm4chee-arc: ID and issuer). Nothing else counts:

- Patient's Name, Birth Date, Sex... are demographics of the patient, corrected
  over time; two instances of one study with two spellings of a name are one patient.
- Issuer of Patient ID Qualifiers Sequence (0010,0024), Type of Patient ID and
  Other Patient IDs Sequence are left out: senders fill them inconsistently, and
  comparing them would refuse instances of one patient for the way they were sent.

Values are compared as DICOM defines LO values: leading and trailing spaces are
padding, not part of the value (PS3.5 Table 6.2-1, LO), so are NUL bytes some
writers pad with; an empty element and an absent one are the same (no value:
PS3.5 §7.4, Type 2 and 3 attributes). The ID is case-sensitive.
"""

from __future__ import annotations

from typing import NamedTuple

PATIENT_ID = "00100020"
ISSUER_OF_PATIENT_ID = "00100021"

_PAD = " \x00"


class PatientIdentity(NamedTuple):
    """Patient ID and Issuer of Patient ID, without padding ("" when absent or empty)."""

    patient_id: str
    issuer: str

    def __str__(self) -> str:
        return f"{self.patient_id!r}" + (f" (issuer {self.issuer!r})" if self.issuer else " (no issuer)")


def _text(json: dict, tag: str) -> str:
    values = (json.get(tag) or {}).get("Value") or ()
    return "\\".join("" if v is None else str(v) for v in values).strip(_PAD)


def patient_identity(json: dict) -> PatientIdentity:
    """The patient a DICOM JSON object (an instance's, or a study record) names."""
    return PatientIdentity(_text(json, PATIENT_ID), _text(json, ISSUER_OF_PATIENT_ID))

"""Modality Performed Procedure Step instances (PS3.4 Annex F, F.7): what an N-CREATE may
hold, what an N-SET may change and when, as plain DICOM JSON (the listener's side:
dimse/mpps.py; the table: store/mpps.py).

- N-CREATE (F.7.2.1): Performed Procedure Step Status (0040,0252) must be "IN PROGRESS",
  otherwise 0x0106 Invalid attribute value (F.7.2.1.3). The attributes Table F.7.2-1 makes
  Type 1 at N-CREATE must be there with a value: 0x0120 Missing attribute when absent,
  0x0121 Missing attribute value when empty.
- N-SET (F.7.2.2): accepted only while the stored status is "IN PROGRESS"; otherwise
  0x0110 Processing failure with Error Comment "Performed Procedure Step Object may no
  longer be updated" and Error ID (0000,0903) 0xA710 (Table F.7.2-2; 0xC310 is the Unified
  Procedure Step's status, PS3.4 CC.2, not this SOP Class's). An attribute Table F.7.2-1
  marks "Not allowed" for N-SET (:data:`NOT_SETTABLE`): 0x0106. The status may become
  "COMPLETED" or "DISCONTINUED" (or stay "IN PROGRESS"); then the Final State
  requirements: Performed Procedure Step End Date and End Time with values, and for
  "COMPLETED" a Performed Series Sequence of at least one item, each with its Series
  Instance UID, the images it names with Referenced SOP Class and Instance UID
  (0x0121 Missing attribute value otherwise).
- The modification list's elements replace the stored ones whole (a sequence with all its
  items: PS3.7 10.1.3.1.2); a zero-length element sets the attribute empty.
"""

from __future__ import annotations

from dataclasses import dataclass

IN_PROGRESS = "IN PROGRESS"
COMPLETED = "COMPLETED"
DISCONTINUED = "DISCONTINUED"
FINAL = (COMPLETED, DISCONTINUED)

# statuses (PS3.7 Annex C; PS3.4 F.7.2.1.2, Table F.7.2-2)
NO_SUCH_ATTRIBUTE = 0x0105
INVALID_ATTRIBUTE_VALUE = 0x0106
PROCESSING_FAILURE = 0x0110
DUPLICATE_SOP_INSTANCE = 0x0111
NO_SUCH_OBJECT_INSTANCE = 0x0112
NO_SUCH_SOP_CLASS = 0x0118
MISSING_ATTRIBUTE = 0x0120
MISSING_ATTRIBUTE_VALUE = 0x0121
#: Table F.7.2-2: the Error ID (0000,0903) of an N-SET after the step was completed or discontinued
NO_LONGER_UPDATED_ERROR_ID = 0xA710
NO_LONGER_UPDATED = "Performed Procedure Step Object may no longer be updated"

STATUS = "00400252"  # Performed Procedure Step Status
SCHEDULED_STEP_ATTRIBUTES = "00400270"  # Scheduled Step Attributes Sequence
SPS_ID = "00400009"  # Scheduled Procedure Step ID (in its items)
STUDY_UID = "0020000D"
PERFORMED_SERIES = "00400340"  # Performed Series Sequence
SERIES_UID = "0020000E"
REFERENCED_IMAGES = "00081140"  # Referenced Image Sequence
REFERENCED_NON_IMAGES = "00400220"  # Referenced Non-Image Composite SOP Instance Sequence
REF_CLASS = "00081150"
REF_INSTANCE = "00081155"
END_DATE = "00400250"
END_TIME = "00400251"

#: Type 1 at N-CREATE (PS3.4 Table F.7.2-1): keyword by tag
REQUIRED_AT_CREATE = {
    SCHEDULED_STEP_ATTRIBUTES: "Scheduled Step Attributes Sequence",
    "00400253": "Performed Procedure Step ID",
    "00400241": "Performed Station AE Title",
    "00400244": "Performed Procedure Step Start Date",
    "00400245": "Performed Procedure Step Start Time",
    STATUS: "Performed Procedure Step Status",
    "00080060": "Modality",
}

#: "Not allowed" in N-SET (PS3.4 Table F.7.2-1): the Performed Procedure Step Relationship
#: attributes (scheduled step, patient) and those of the step's start (ID, station, location,
#: start date and time, modality, Study ID), and the instance's own UIDs
NOT_SETTABLE = {
    SCHEDULED_STEP_ATTRIBUTES: "Scheduled Step Attributes Sequence",
    "00100010": "Patient's Name", "00100020": "Patient ID", "00100021": "Issuer of Patient ID",
    "00100024": "Issuer of Patient ID Qualifiers Sequence", "00101002": "Other Patient IDs Sequence",
    "00100030": "Patient's Birth Date", "00100040": "Patient's Sex", "00081120": "Referenced Patient Sequence",
    "00400253": "Performed Procedure Step ID", "00400241": "Performed Station AE Title",
    "00400242": "Performed Station Name", "00400243": "Performed Location",
    "00400244": "Performed Procedure Step Start Date", "00400245": "Performed Procedure Step Start Time",
    "00080060": "Modality", "00200010": "Study ID",
    "00080016": "SOP Class UID", "00080018": "SOP Instance UID",
}

#: the worklist entry's Scheduled Procedure Step Status (0040,0020) for a step's status:
#: STARTED is PS3.3's defined term (C.4.10); COMPLETED and DISCONTINUED as dcm4chee writes them
WORKLIST_STATUS = {IN_PROGRESS: "STARTED", COMPLETED: "COMPLETED", DISCONTINUED: "DISCONTINUED"}


class MppsError(ValueError):
    """An N-CREATE or N-SET the archive refuses: its status, why, and an Error ID when the
    standard gives one."""

    def __init__(self, status: int, message: str, error_id: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_id = error_id


@dataclass(frozen=True, slots=True)
class Performed:
    """What a step's N-CREATE or N-SET leaves: the instance whole and what it changes elsewhere."""

    doc: dict  # the instance's attributes (DICOM JSON)
    status: str
    sps_ids: list[str]  # the worklist entries it names (Scheduled Step Attributes Sequence)
    references: list[tuple[str, str]]  # (SOP Class, SOP Instance UID) its Performed Series Sequence lists


def _values(doc: dict, tag: str) -> list:
    element = doc.get(tag)
    return list(element.get("Value") or []) if isinstance(element, dict) else []


def _text(doc: dict, tag: str) -> str:
    values = _values(doc, tag)
    return str(values[0]).strip() if values and not isinstance(values[0], dict) else ""


def status_of(doc: dict) -> str:
    return _text(doc, STATUS).upper()


def sps_ids(doc: dict) -> list[str]:
    """The Scheduled Procedure Step IDs of the Scheduled Step Attributes Sequence (an
    unscheduled step has items without one: PS3.4 F.7.2.1 Note)."""
    out = []
    for item in _values(doc, SCHEDULED_STEP_ATTRIBUTES):
        if isinstance(item, dict) and (sps := _text(item, SPS_ID)) and sps not in out:
            out.append(sps)
    return out


def references(doc: dict) -> list[tuple[str, str]]:
    """(Referenced SOP Class UID, Referenced SOP Instance UID) of every image and non-image
    composite instance the Performed Series Sequence lists."""
    out = []
    for series in _values(doc, PERFORMED_SERIES):
        if not isinstance(series, dict):
            continue
        for seq in (REFERENCED_IMAGES, REFERENCED_NON_IMAGES):
            for item in _values(series, seq):
                if isinstance(item, dict) and _text(item, REF_CLASS) and _text(item, REF_INSTANCE):
                    out.append((_text(item, REF_CLASS), _text(item, REF_INSTANCE)))
    return out


def _performed(doc: dict) -> Performed:
    return Performed(doc, status_of(doc), sps_ids(doc), references(doc))


def create(doc: dict) -> Performed:
    """The instance an N-CREATE's attribute list (DICOM JSON) makes, or :class:`MppsError`."""
    for tag, name in REQUIRED_AT_CREATE.items():
        if tag not in doc:
            raise MppsError(MISSING_ATTRIBUTE, f"no {name} ({tag[:4]},{tag[4:]})")
        if not _values(doc, tag):
            raise MppsError(MISSING_ATTRIBUTE_VALUE, f"{name} ({tag[:4]},{tag[4:]}) is empty")
    status = status_of(doc)
    if status != IN_PROGRESS:
        raise MppsError(INVALID_ATTRIBUTE_VALUE, f"Performed Procedure Step Status {status!r}, not IN PROGRESS")
    for item in _values(doc, SCHEDULED_STEP_ATTRIBUTES):
        if not isinstance(item, dict) or not _text(item, STUDY_UID):
            raise MppsError(MISSING_ATTRIBUTE_VALUE, "a Scheduled Step Attributes Sequence item without "
                                                     "Study Instance UID")
    return _performed(doc)


def modify(stored: dict, changes: dict) -> Performed:
    """The stored instance with an N-SET's modification list applied, or :class:`MppsError`."""
    if status_of(stored) != IN_PROGRESS:
        raise MppsError(PROCESSING_FAILURE, NO_LONGER_UPDATED, NO_LONGER_UPDATED_ERROR_ID)
    for tag in changes:
        if tag in NOT_SETTABLE:
            raise MppsError(INVALID_ATTRIBUTE_VALUE, f"{NOT_SETTABLE[tag]} ({tag[:4]},{tag[4:]}) may not be N-SET")
    doc = {**stored, **changes}
    status = status_of(doc)
    if status not in (IN_PROGRESS, *FINAL):
        raise MppsError(INVALID_ATTRIBUTE_VALUE, f"Performed Procedure Step Status {status!r} "
                                                 "(IN PROGRESS, COMPLETED or DISCONTINUED)")
    if status in FINAL:
        for tag, name in ((END_DATE, "Performed Procedure Step End Date"),
                          (END_TIME, "Performed Procedure Step End Time")):
            if not _text(doc, tag):
                raise MppsError(MISSING_ATTRIBUTE_VALUE, f"{status}: no {name} ({tag[:4]},{tag[4:]})")
    if status == COMPLETED:
        series = _values(doc, PERFORMED_SERIES)
        if not series:
            raise MppsError(MISSING_ATTRIBUTE_VALUE, "COMPLETED: no Performed Series Sequence item")
        for item in series:
            if not isinstance(item, dict) or not _text(item, SERIES_UID):
                raise MppsError(MISSING_ATTRIBUTE_VALUE, "a Performed Series Sequence item without Series Instance UID")
            for seq in (REFERENCED_IMAGES, REFERENCED_NON_IMAGES):
                for ref in _values(item, seq):
                    if not isinstance(ref, dict) or not _text(ref, REF_CLASS) or not _text(ref, REF_INSTANCE):
                        raise MppsError(MISSING_ATTRIBUTE_VALUE, "a referenced instance without Referenced SOP "
                                                                 "Class or Instance UID")
    return _performed(doc)

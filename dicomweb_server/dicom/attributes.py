"""Attributes of each query/retrieve level: what QIDO-RS matches on, what it
returns by default, and which of an instance's attributes belong to the study and
series levels.

References
----------
PS3.18 §10.6.1.2.1 (matching keys) and Tables 10.6.3-3, -4, -5 (default return
attributes of studies, series and instances); PS3.4 C.6.1.1 (study root
information model levels).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from pydicom.datadict import dictionary_VR, keyword_for_tag, tag_for_keyword

Level = Literal["study", "series", "instance"]
LEVELS: tuple[Level, ...] = ("study", "series", "instance")


class Kind(str, Enum):
    """How a matching key is compared (PS3.4 C.2.2.2)."""

    UID = "uid"  # single value or UID list matching
    TEXT = "text"  # single value / wildcard, case-sensitive
    PN = "pn"  # single value / wildcard, case-insensitive, fuzzy matching
    DATE = "date"  # DA: single value or range
    TIME = "time"  # TM: single value or range
    DATETIME = "datetime"  # DT: single value or range
    INT = "int"  # IS/US: single value
    MULTI = "multi"  # CS list stored per entity (ModalitiesInStudy): any value matches
    SEQUENCE = "sequence"  # SQ: an item must match all the item keys (PS3.4 C.2.2.2.6)


@dataclass(frozen=True, slots=True)
class Attribute:
    """A matchable, indexed attribute: its DICOM keyword, tag, level and kind."""

    keyword: str
    tag: str  # 8 uppercase hex digits, as in the DICOM JSON model
    level: Level
    kind: Kind
    computed: bool = False  # derived from lower levels (ModalitiesInStudy, counts)
    items: tuple["Attribute", ...] = ()  # SEQUENCE: the keys an item can be matched on
    sources: tuple[str, ...] = ()  # a derived date-time column: (DA, TM) keywords or (DT,)
    utc: bool = False  # ... converted to UTC with the instance's offset (dicom/timezones.py)


def keyword_tag(keyword: str) -> int | None:
    """The tag of a DICOM keyword (PS3.6), None for anything that is not one. pydicom's
    ``tag_for_keyword`` maps a few strings that are no keyword: ``''`` (the dictionary
    entry without a keyword, 300A0782) among them, so an empty parameter name was taken
    for that attribute. Every keyword lookup of the archive goes through here: a keyword
    is an identifier that the dictionary maps back to itself."""
    if not keyword or not keyword.isidentifier():
        return None
    tag = tag_for_keyword(keyword)
    if tag is None or keyword_for_tag(tag) != keyword:
        return None
    return tag


def level_article(level: str) -> str:
    """The article before a level's name: "a study-level", "an instance-level"."""
    return "an" if level[:1].lower() in "aeiou" else "a"


def _tag(keyword: str) -> str:
    t = keyword_tag(keyword)
    assert t is not None, keyword
    return f"{t:08X}"


def _a(keyword: str, level: Level, kind: Kind, computed: bool = False) -> Attribute:
    return Attribute(keyword, _tag(keyword), level, kind, computed)


#: Every attribute the index keeps as a column, in column order per level.
INDEXED: tuple[Attribute, ...] = (
    # study (patient attributes are kept at the study level: study root model)
    _a("StudyInstanceUID", "study", Kind.UID),
    _a("StudyDate", "study", Kind.DATE),
    _a("StudyTime", "study", Kind.TIME),
    _a("AccessionNumber", "study", Kind.TEXT),
    _a("ReferringPhysicianName", "study", Kind.PN),
    _a("PatientName", "study", Kind.PN),
    _a("PatientID", "study", Kind.TEXT),
    _a("PatientBirthDate", "study", Kind.DATE),
    _a("PatientSex", "study", Kind.TEXT),
    _a("StudyID", "study", Kind.TEXT),
    _a("StudyDescription", "study", Kind.TEXT),
    _a("ModalitiesInStudy", "study", Kind.MULTI, computed=True),
    _a("SOPClassesInStudy", "study", Kind.MULTI, computed=True),
    _a("NumberOfStudyRelatedSeries", "study", Kind.INT, computed=True),
    _a("NumberOfStudyRelatedInstances", "study", Kind.INT, computed=True),
    # series
    _a("SeriesInstanceUID", "series", Kind.UID),
    _a("Modality", "series", Kind.TEXT),
    _a("SeriesNumber", "series", Kind.INT),
    _a("SeriesDescription", "series", Kind.TEXT),
    _a("BodyPartExamined", "series", Kind.TEXT),
    _a("PerformedProcedureStepStartDate", "series", Kind.DATE),
    _a("PerformedProcedureStepStartTime", "series", Kind.TIME),
    _a("NumberOfSeriesRelatedInstances", "series", Kind.INT, computed=True),
    # instance
    _a("SOPInstanceUID", "instance", Kind.UID),
    _a("SOPClassUID", "instance", Kind.UID),
    _a("InstanceNumber", "instance", Kind.INT),
    _a("ContentDate", "instance", Kind.DATE),
    _a("ContentTime", "instance", Kind.TIME),
    _a("AcquisitionDateTime", "instance", Kind.DATETIME),
    _a("Rows", "instance", Kind.INT),
    _a("Columns", "instance", Kind.INT),
    _a("BitsAllocated", "instance", Kind.INT),
    _a("NumberOfFrames", "instance", Kind.INT),
)



def _sq(keyword: str, level: Level, items: tuple[tuple[str, Kind], ...]) -> Attribute:
    return Attribute(keyword, _tag(keyword), level, Kind.SEQUENCE,
                     items=tuple(_a(k, level, kind) for k, kind in items))


#: Sequences matched by their items (PS3.4 C.2.2.2.6): the sequence, the level whose record
#: holds it, and the item attributes kept for matching (text, UID, DA and TM kinds: the
#: indexes keep item values as text). A new matchable sequence is one line here.
SEQUENCES: tuple[Attribute, ...] = (
    # General Study module (PS3.3 C.7.2.1)
    _sq("ReferencedStudySequence", "study",
        (("ReferencedSOPClassUID", Kind.UID), ("ReferencedSOPInstanceUID", Kind.UID))),
    _sq("ProcedureCodeSequence", "study",
        (("CodeValue", Kind.TEXT), ("CodingSchemeDesignator", Kind.TEXT), ("CodingSchemeVersion", Kind.TEXT),
         ("CodeMeaning", Kind.TEXT))),
    # General Series module, Request Attributes Sequence (PS3.3 C.7.3.1, Table 10-9);
    # a series-level return key of QIDO-RS (PS3.18 Table 10.6.3-4)
    _sq("RequestAttributesSequence", "series",
        (("RequestedProcedureID", Kind.TEXT), ("ScheduledProcedureStepID", Kind.TEXT),
         ("AccessionNumber", Kind.TEXT), ("StudyInstanceUID", Kind.UID),
         ("RequestedProcedureDescription", Kind.TEXT), ("ScheduledProcedureStepDescription", Kind.TEXT))),
    # General Image module (PS3.3 C.7.6.1): the images an image refers to
    _sq("ReferencedImageSequence", "instance",
        (("ReferencedSOPClassUID", Kind.UID), ("ReferencedSOPInstanceUID", Kind.UID))),
)

BY_KEYWORD: dict[str, Attribute] = {a.keyword: a for a in (*INDEXED, *SEQUENCES)}
BY_TAG: dict[str, Attribute] = {a.tag: a for a in (*INDEXED, *SEQUENCES)}



def _dt(column: str, level: Level, sources: tuple[str, ...], utc: bool) -> Attribute:
    return Attribute(column, "", level, Kind.DATETIME, sources=sources, utc=utc)


#: Date-time columns derived from a DA and a TM (combined matching, PS3.4 C.2.2.2.5.1) or a DT,
#: in local time as stored and in UTC (dicom/timezones.py): not DICOM attributes (no tag),
#: never returned, named with a leading ``_``. Each is a range over one column: an index lookup.
DERIVED: tuple[Attribute, ...] = (
    _dt("_StudyDateTime", "study", ("StudyDate", "StudyTime"), False),
    _dt("_StudyDateTimeUTC", "study", ("StudyDate", "StudyTime"), True),
    _dt("_PPSStartDateTime", "series", ("PerformedProcedureStepStartDate", "PerformedProcedureStepStartTime"), False),
    _dt("_PPSStartDateTimeUTC", "series", ("PerformedProcedureStepStartDate", "PerformedProcedureStepStartTime"),
        True),
    _dt("_ContentDateTime", "instance", ("ContentDate", "ContentTime"), False),
    _dt("_ContentDateTimeUTC", "instance", ("ContentDate", "ContentTime"), True),
    _dt("_AcquisitionDateTimeUTC", "instance", ("AcquisitionDateTime",), True),
)

#: Stored (not computed) indexed attributes of each level, in column order (derived last).
STORED: dict[Level, tuple[Attribute, ...]] = {
    lv: tuple(a for a in (*INDEXED, *DERIVED) if a.level == lv and not a.computed) for lv in LEVELS
}
#: Matchable sequences of each level (kept beside the columns: store/sql.py sequence_item).
SEQUENCES_OF: dict[Level, tuple[Attribute, ...]] = {lv: tuple(a for a in SEQUENCES if a.level == lv) for lv in LEVELS}

# PS3.18 Table 10.6.3-3/-4/-5: default return attributes (RetrieveURL added by the web layer).
DEFAULT_RETURN: dict[Level, tuple[str, ...]] = {
    "study": tuple(
        _tag(k)
        for k in (
            "SpecificCharacterSet", "StudyDate", "StudyTime", "AccessionNumber",
            "InstanceAvailability", "ModalitiesInStudy", "ReferringPhysicianName",
            "TimezoneOffsetFromUTC", "StudyDescription", "PatientName", "PatientID",
            "PatientBirthDate", "PatientSex", "StudyInstanceUID", "StudyID",
            "NumberOfStudyRelatedSeries", "NumberOfStudyRelatedInstances",
        )
    ),
    "series": tuple(
        _tag(k)
        for k in (
            "SpecificCharacterSet", "Modality", "TimezoneOffsetFromUTC", "SeriesDescription",
            "SeriesInstanceUID", "SeriesNumber", "NumberOfSeriesRelatedInstances",
            "PerformedProcedureStepStartDate", "PerformedProcedureStepStartTime",
            "RequestAttributesSequence", "StudyInstanceUID",
        )
    ),
    "instance": tuple(
        _tag(k)
        for k in (
            "SpecificCharacterSet", "SOPClassUID", "SOPInstanceUID", "InstanceAvailability",
            "TimezoneOffsetFromUTC", "InstanceNumber", "Rows", "Columns", "BitsAllocated",
            "NumberOfFrames", "StudyInstanceUID", "SeriesInstanceUID",
        )
    ),
}

# Attributes of the Patient, General Study and Patient Study modules (PS3.3 C.7.1.1,
# C.7.2.1, C.7.2.2): what an instance contributes to its study's record.
_STUDY_MODULE_KEYWORDS = (
    "SpecificCharacterSet", "TimezoneOffsetFromUTC",
    "PatientName", "PatientID", "IssuerOfPatientID", "TypeOfPatientID", "PatientBirthDate",
    "PatientBirthTime", "PatientSex", "OtherPatientIDsSequence", "OtherPatientNames",
    "EthnicGroup", "PatientComments", "PatientSpeciesDescription", "PatientBreedDescription",
    "ResponsiblePerson", "ResponsibleOrganization", "PatientIdentityRemoved",
    "StudyInstanceUID", "StudyDate", "StudyTime", "ReferringPhysicianName",
    "ReferringPhysicianIdentificationSequence", "ReferencedStudySequence", "StudyID", "AccessionNumber",
    "IssuerOfAccessionNumberSequence", "StudyDescription", "PhysiciansOfRecord",
    "NameOfPhysiciansReadingStudy", "RequestingService", "ProcedureCodeSequence",
    "AdmittingDiagnosesDescription", "PatientAge", "PatientSize", "PatientWeight",
    "Occupation", "AdditionalPatientHistory", "PatientSexNeutered", "MedicalAlerts", "Allergies",
    "PregnancyStatus", "InstitutionName",
)
_SERIES_MODULE_KEYWORDS = (
    "SeriesInstanceUID", "Modality", "SeriesNumber", "SeriesDescription", "SeriesDate",
    "SeriesTime", "Laterality", "PerformingPhysicianName", "ProtocolName", "OperatorsName",
    "BodyPartExamined", "PatientPosition", "PerformedProcedureStepID",
    "PerformedProcedureStepStartDate", "PerformedProcedureStepStartTime",
    "PerformedProcedureStepDescription", "RequestAttributesSequence", "FrameOfReferenceUID",
    "PositionReferenceIndicator", "Manufacturer", "ManufacturerModelName", "StationName",
    "SoftwareVersions", "DeviceSerialNumber",
)

STUDY_LEVEL_TAGS: frozenset[str] = frozenset(_tag(k) for k in _STUDY_MODULE_KEYWORDS)
SERIES_LEVEL_TAGS: frozenset[str] = frozenset(_tag(k) for k in _SERIES_MODULE_KEYWORDS)

RETRIEVE_URL = "00081190"
SPECIFIC_CHARACTER_SET = "00080005"


def resolve_attribute(name: str) -> tuple[str, str]:
    """Map a keyword or 8-hex-digit tag to ``(tag, keyword)``.

    Raises
    ------
    ValueError
        Unknown keyword or malformed tag (HTTP 400 at the web layer).
    """
    if len(name) == 8 and all(c in "0123456789abcdefABCDEF" for c in name):
        tag = name.upper()
        kw = keyword_for_tag(int(tag, 16)) or ""
        return tag, kw
    if name == "":
        raise ValueError("empty parameter name")
    t = keyword_tag(name)
    if t is None:
        raise ValueError(f"{name!r} is neither a DICOM keyword nor a tag (8 hex digits)")
    return f"{t:08X}", name


def vr_of(tag: str) -> str:
    """The dictionary VR of a tag ('UN' when unknown, first of ambiguous VRs)."""
    try:
        vr = dictionary_VR(int(tag, 16))
    except KeyError:
        return "UN"
    return vr.split(" or ")[0]

"""Modality worklist entries (scheduled procedure steps) and their matching.

An entry is a DICOM JSON object holding the attributes of PS3.4 Table K.6-1 (Patient,
Visit, Imaging Service Request, Requested Procedure and the Scheduled Procedure Step
Sequence). It is kept whole (its JSON) with a few key columns the index filters on
first (:class:`Entry`, :func:`prefilter`); every matching key is then checked here
(:func:`matches`), with the query model's rules (dicom/matching.py: single value,
wildcard, range, UID list; PS3.4 C.2.2.2) and sequence matching inside the Scheduled
Procedure Step Sequence (C.2.2.2.6: some item matches every key of the request's item).

Both front doors use this module: the Modality Worklist C-FIND SCP (dimse/worklist.py,
identifier = a pydicom Dataset) and ``GET /worklist`` (api/worklist.py, QIDO-RS style
parameters turned into the same identifier by :func:`identifier_from_params`).

Choices (PS3.4 K.2.2.1 leaves them to the SCP):
- any attribute of an entry may be a matching key, by the matching type of its VR (PN
  case-insensitive, as QIDO-RS; DA/TM/DT ranges; UI lists; others single value or
  wildcard); a key naming an attribute that an entry lacks does not match that entry;
- Scheduled Procedure Step Start Date and Start Time are matched each on its own (the
  optional combined date-time matching of C.2.2.2.5 is not done);
- a multi-valued stored attribute (e.g. two Scheduled Station AE Titles) matches when one
  of its values does.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from pydicom.datadict import dictionary_VR, keyword_for_tag
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.uid import generate_uid

from .attributes import Attribute, Kind, keyword_tag
from .charset import of_json, set_character_set, terms
from .matching import Match, QueryError, match_value, normalize_stored, parse_match

SPS_SEQUENCE = "00400100"  # Scheduled Procedure Step Sequence
SPS_ID = "00400009"  # Scheduled Procedure Step ID (in the item)
STATION_AE = "00400001"
START_DATE = "00400002"
MODALITY = "00080060"
STUDY_UID = "0020000D"
ACCESSION = "00080050"
PATIENT_ID = "00100020"
SPECIFIC_CHARACTER_SET = "00080005"

#: the return keys of PS3.4 Table K.6-1 this archive documents (any other attribute of an
#: entry is returned and matched as well: module docstring)
TABLE_K6_1: tuple[str, ...] = (
    "ScheduledProcedureStepSequence", "ScheduledStationAETitle", "ScheduledProcedureStepStartDate",
    "ScheduledProcedureStepStartTime", "Modality", "ScheduledPerformingPhysicianName",
    "ScheduledProcedureStepDescription", "ScheduledStationName", "ScheduledProcedureStepLocation",
    "ScheduledProcedureStepID", "ScheduledProcedureStepStatus", "RequestedProcedureID",
    "RequestedProcedureDescription", "StudyInstanceUID", "AccessionNumber", "ReferringPhysicianName",
    "RequestingPhysician", "PatientName", "PatientID", "IssuerOfPatientID", "PatientBirthDate", "PatientSex",
)

_KINDS = {"PN": Kind.PN, "DA": Kind.DATE, "TM": Kind.TIME, "DT": Kind.DATETIME, "UI": Kind.UID,
          "SQ": Kind.SEQUENCE}


class WorklistError(ValueError):
    """An entry or a query the worklist cannot accept (HTTP 400 / C-FIND 0xA900), with this message."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A worklist entry as the index keeps it: its ID (the first item's Scheduled Procedure
    Step ID), key columns (None when absent or multi-valued, and the step columns of an entry
    with several steps: never filtered out in SQL) and the whole DICOM JSON."""

    sps_id: str
    study_uid: str | None
    accession: str | None
    patient_id: str | None
    modality: str | None
    station_ae: str | None
    start_date: str | None
    json: dict


def _attribute(tag: str) -> Attribute:
    try:
        vr = dictionary_VR(int(tag, 16))
    except KeyError:
        raise WorklistError(f"{tag} is not an attribute of the DICOM dictionary") from None
    kind = _KINDS.get(vr.split(" or ")[0], Kind.TEXT)
    return Attribute(keyword_for_tag(int(tag, 16)) or tag, tag, "study", kind)


def _values(element: dict | None) -> list:
    if not element:
        return []
    out = []
    for v in element.get("Value") or []:
        if isinstance(v, dict) and "Alphabetic" in v:
            v = v["Alphabetic"]
        out.append(v)
    return out


def _single(entry: dict, tag: str) -> str | None:
    values = _values(entry.get(tag))
    return str(values[0]).strip() or None if len(values) == 1 and not isinstance(values[0], dict) else None


# --- entries ------------------------------------------------------------------------------


def prepare(item: object) -> Entry:
    """An entry of ``POST /worklist``: a DICOM JSON object holding a Scheduled Procedure
    Step Sequence of at least one item. A first item without Scheduled Procedure Step ID,
    and an entry without Study Instance UID, get one (a new ID, a new UID: the modality
    takes both from the worklist, so the archive that keeps it assigns them)."""
    if not isinstance(item, dict):
        raise WorklistError("a worklist entry is a DICOM JSON object")
    try:
        Dataset.from_json(item)  # every element must be valid DICOM JSON
    except Exception as e:  # noqa: BLE001 - pydicom names what is wrong
        raise WorklistError(f"not a valid DICOM JSON object: {e}") from None
    sps = item.get(SPS_SEQUENCE, {}).get("Value")
    if not sps or not isinstance(sps[0], dict):
        raise WorklistError("a worklist entry needs a Scheduled Procedure Step Sequence (0040,0100) with an item")
    first = sps[0]
    if not _single(first, SPS_ID):
        first[SPS_ID] = {"vr": "SH", "Value": [secrets.token_hex(8).upper()]}  # SH: 16 characters at most
    if not _single(item, STUDY_UID):
        item[STUDY_UID] = {"vr": "UI", "Value": [str(generate_uid())]}
    sps_id = str(_single(first, SPS_ID))
    if len(sps_id) > 16 or "\\" in sps_id:
        raise WorklistError(f"Scheduled Procedure Step ID {sps_id!r} is not an SH value (16 characters)")
    # the step columns only of a single step: another item may match where the first does not
    one = first if len(sps) == 1 else {}
    start = _single(one, START_DATE)
    return Entry(sps_id, _single(item, STUDY_UID), _single(item, ACCESSION), _single(item, PATIENT_ID),
                 _single(one, MODALITY), _single(one, STATION_AE),
                 normalize_stored(_attribute(START_DATE), start) if start else None, item)  # type: ignore[arg-type]


# --- queries ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a query: its attribute, its match, and (a sequence) the keys of its item."""

    attribute: Attribute
    match: Match | None
    items: tuple["Key", ...] = ()

    @property
    def tag(self) -> str:
        return self.attribute.tag


def _raw(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (MultiValue, list, tuple)):
        return "\\".join(str(x) for x in value)
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return str(value)


def parse_identifier(identifier: Dataset) -> list[Key]:
    """The keys of a C-FIND identifier (or of :func:`identifier_from_params`): each element,
    in order; a sequence with one item holds item keys (PS3.4 C.2.2.2.6)."""
    keys = []
    for elem in identifier:
        tag = f"{int(elem.tag):08X}"
        if elem.tag.is_private or elem.tag.group == 0x0002 or tag in (SPECIFIC_CHARACTER_SET, "00080052"):
            continue
        attribute = _attribute(tag)
        if elem.VR == "SQ":
            items = elem.value or []
            if len(items) > 1:
                raise WorklistError(f"{attribute.keyword}: a sequence matching key holds one item (PS3.4 C.2.2.2.6)")
            keys.append(Key(attribute, None, tuple(parse_identifier(items[0])) if items else ()))
            continue
        try:
            keys.append(Key(attribute, parse_match(attribute, _raw(elem.value))))
        except QueryError as e:
            raise WorklistError(str(e)) from None
    return keys


def identifier_from_params(params: Iterable[tuple[str, str]]) -> Dataset:
    """A QIDO-RS style query (``PatientName=DOE*``, ``00400100.00400001=CT1``,
    ``ScheduledProcedureStepSequence.ScheduledProcedureStepStartDate=20260101-20260131``)
    as a C-FIND identifier. ``limit``/``offset``/``includefield`` are the caller's."""
    ds = Dataset()
    for name, value in params:
        path = name.split(".")
        if len(path) > 2:
            raise WorklistError(f"{name}: one level of sequence at most")
        tags = []
        for part in path:
            tag = keyword_tag(part)
            if tag is None:
                try:
                    tag = int(part, 16) if len(part) == 8 else None
                except ValueError:
                    tag = None
            if tag is None:
                raise WorklistError(f"{part} is neither an attribute keyword nor a tag" if part
                                    else f"empty parameter name in {name + '=' + value!r}")
            tags.append(tag)
        target = ds
        if len(tags) == 2:
            if dictionary_VR(tags[0]) != "SQ":
                raise WorklistError(f"{path[0]} is not a sequence")
            if tags[0] not in ds or not ds[tags[0]].value:
                ds.add_new(tags[0], "SQ", [Dataset()])
            target = ds[tags[0]].value[0]
        vr = dictionary_VR(tags[-1])
        if vr == "SQ":
            target.add_new(tags[-1], "SQ", [])
        else:
            target.add_new(tags[-1], vr.split(" or ")[0], value or None)
    return ds


def _key_matches(key: Key, entry: dict) -> bool:
    element = entry.get(key.tag)
    if key.attribute.kind is Kind.SEQUENCE:
        matching = [k for k in key.items if k.match is not None and k.match.type != "universal" or k.items]
        if not matching:
            return True  # universal: returned, not matched
        items = (element or {}).get("Value") or []
        return any(isinstance(item, dict) and all(_key_matches(k, item) for k in matching) for item in items)
    assert key.match is not None
    if key.match.type == "universal":
        return True
    return any(match_value(key.match, normalize_stored(key.attribute, v)) for v in _values(element))


def matches(keys: list[Key], entry: dict) -> bool:
    """Does the entry (its DICOM JSON) satisfy every matching key? (PS3.4 C.2.2.2)"""
    return all(_key_matches(k, entry) for k in keys)


def prefilter(keys: list[Key]) -> dict[str, tuple]:
    """What the index may filter on in SQL before :func:`matches` (a superset of the
    matches): column -> ("eq", value) for single values without wildcards, or ("range",
    low, high) of the start date."""
    out: dict[str, tuple] = {}
    columns = {PATIENT_ID: "PatientID", ACCESSION: "AccessionNumber", STUDY_UID: "StudyInstanceUID"}
    sps_columns = {MODALITY: "Modality", STATION_AE: "ScheduledStationAETitle"}

    def add(k: Key, names: dict[str, str]) -> None:
        m = k.match
        if m is None:
            return
        if k.tag in names and m.type == "single" and k.attribute.kind is not Kind.PN:
            out[names[k.tag]] = ("eq", m.values[0])
        elif k.tag == START_DATE and names is sps_columns and m.type in ("single", "range"):
            lo, hi = (m.values[0], m.values[0]) if m.type == "single" else m.values
            out["StartDate"] = ("range", lo, hi)

    for k in keys:
        if k.tag == SPS_SEQUENCE:
            for item_key in k.items:
                add(item_key, sps_columns)
        else:
            add(k, columns)
    return out


def response(entry: dict, identifier: Dataset, default_charset: tuple[str, ...] | None = None) -> Dataset:
    """The C-FIND response identifier of a matching entry (PS3.4 K.4.1.3.2 and C.4.1.1.3.2):
    every key of the request, with the entry's value or zero length; a sequence key with
    an item returns the stored items that match all the item's keys, each with the item's
    keys only (all the items, whole, when the request's sequence or item is empty: PS3.4
    C.2.2.2.6, which K.2.2 applies). Its Specific Character Set: the one the request names
    when it holds every value, else the entry's own, else ``default_charset`` (the
    ``dimse_character_set`` setting), else ISO_IR 192; none when every value is ASCII
    (dicom/charset.py)."""
    out = Dataset()
    for elem in identifier:
        tag = f"{int(elem.tag):08X}"
        if elem.tag.group == 0x0002 or tag == SPECIFIC_CHARACTER_SET:
            continue
        stored = entry.get(tag)
        if elem.VR == "SQ":
            items = []
            wanted = [f"{int(e.tag):08X}" for e in elem.value[0]] if elem.value and len(elem.value[0]) else None
            item_keys = parse_identifier(elem.value[0]) if wanted is not None else []
            matching = [k for k in item_keys if k.match is not None and k.match.type != "universal" or k.items]
            for item in (stored or {}).get("Value") or []:
                if not isinstance(item, dict) or not all(_key_matches(k, item) for k in matching):
                    continue  # only the matching items are returned (C.2.2.2.6)
                chosen = item if wanted is None else {t: item[t] for t in wanted if t in item}
                ds = Dataset.from_json(chosen)
                if wanted is not None:
                    for e in elem.value[0]:
                        if e.tag not in ds:
                            ds.add_new(e.tag, e.VR, [] if e.VR == "SQ" else None)
                items.append(ds)
            out.add_new(elem.tag, "SQ", items)
        elif stored and stored.get("Value"):
            out.update(Dataset.from_json({tag: stored}))
        else:
            out.add_new(elem.tag, elem.VR, None)
    return set_character_set(out, terms(identifier.get("SpecificCharacterSet")),
                             of_json(entry), default_charset)

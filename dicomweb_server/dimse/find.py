"""C-FIND over the QIDO-RS query model: a C-FIND identifier becomes the same
:class:`~dicomweb_server.dicom.matching.Query` a QIDO-RS request does (same matching
rules: wildcards, ranges, UID lists, PN case), answered by the same index.

References
----------
PS3.4 C.4.1 (C-FIND SCP: the response identifier holds the requested keys, with
values or zero length, plus Query/Retrieve Level and, when a value is not ASCII,
Specific Character Set: C.4.1.1.3.2; its choice: dicom/charset.py),
C.2.2.2 (matching), C.6.1 (Patient Root: PATIENT, STUDY, SERIES, IMAGE levels),
C.6.2 (Study Root: STUDY, SERIES, IMAGE), PS3.5 §6.2 (CS: upper case). A query without the
unique keys of the levels above (relational, PS3.4 C.4.1.2.2) is answered, negotiated or not:
it is a search, and SCUs in the field send them (a Patient Root STUDY query by name, without
Patient ID); C-GET and C-MOVE, which send data, are held to the baseline keys (retrieve.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from pydicom.dataelem import DataElement
from pydicom.datadict import tag_for_keyword
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.uid import UID

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.attributes import BY_TAG, SPECIFIC_CHARACTER_SET, Kind, Level, vr_of
from ..dicom.charset import of_json, set_character_set, terms
from ..dicom.reading import TruncatedElement, Unacceptable, read_identifier
from ..dicom.matching import TIMEZONE_OFFSET, Match, Query, QueryError, column_value, match_value, parse_query
from ..dicom.search_results import build_result
from ..store.base import Index, SearchHit

#: Query/Retrieve Level (0008,0052) -> the QIDO-RS level searched (PS3.4 C.6)
LEVELS: dict[str, Level] = {"PATIENT": "study", "STUDY": "study", "SERIES": "series", "IMAGE": "instance"}
PATIENT_KEYS = ("PatientID", "PatientName", "PatientBirthDate", "PatientSex")
#: Number of Patient Related Studies, Series, Instances (0020,1200/1202/1204): PATIENT level
#: return keys (PS3.4 Table C.6-1, C.3.4): counted over the patient's studies, the series and
#: instances from each study's own counts
PATIENT_COUNTS = (0x00201200, 0x00201202, 0x00201204)
_SKIP = {0x00080052, 0x00080005}  # QueryRetrieveLevel, SpecificCharacterSet: not matching keys
_PAGE = 1000


#: the levels of each information model, top down (PS3.4 C.6.1.1, C.6.2.1)
MODEL_LEVELS = {"patient": ("PATIENT", "STUDY", "SERIES", "IMAGE"), "study": ("STUDY", "SERIES", "IMAGE")}
#: the unique key of each level (PS3.4 C.6.1.1.2-5, C.6.2.1.2-4)
UNIQUE_KEYS = {"PATIENT": "PatientID", "STUDY": "StudyInstanceUID", "SERIES": "SeriesInstanceUID",
               "IMAGE": "SOPInstanceUID"}
WILDCARDS = ("*", "?")  # PS3.4 C.2.2.2.4


class IdentifierError(ValueError):
    """The identifier does not fit the information model (0xA900), with this message and,
    when one element is at fault, its tag (``offending``: the response's Offending Element,
    PS3.4 C.4.1.1.4, C.4.2.1.5, C.4.3.1.4)."""

    def __init__(self, message: str, offending: int | None = None) -> None:
        super().__init__(message)
        self.offending = offending


def decoded_identifier(event) -> tuple[Dataset | None, str]:
    """The identifier of a C-FIND, C-GET or C-MOVE request parsed whole, or (None, the Error
    Comment of its 0xC000 Unable to process, PS3.4 C.4.1.1.4, C.4.2.1.5, C.4.3.1.4). pydicom
    parses lazily and keeps an element whose declared length runs past the end of the
    identifier with the bytes that were there (a Query/Retrieve Level declaring 500 bytes, 6
    there, was matched as ``STUDY``): such an element is refused, at any depth, as STOW-RS and
    C-STORE refuse it in a file (dicom/reading.py :func:`check_complete`), and every sequence
    is parsed now (an unclosed one fails here, not in the middle of the answers)."""
    try:
        identifier = parsed_identifier(event.request.Identifier, event.context.transfer_syntax)
    except TruncatedElement as e:
        tag = f"({e.tag >> 16:04X},{e.tag & 0xFFFF:04X})"
        return None, f"identifier truncated: {tag} declares {e.declared} bytes, has {e.present}"
    except Unacceptable as e:
        return None, f"identifier refused: {e}"
    except Exception:  # noqa: BLE001 - does not decode, in any way
        return None, "identifier cannot be decoded"
    return identifier, ""


def parsed_identifier(identifier, transfer_syntax: str) -> Dataset:
    """The request's Identifier (a BytesIO) in ``transfer_syntax``, read with the bounds of
    :func:`..dicom.reading.read_identifier` (pynetdicom's ``event.identifier`` inflates a
    Deflated one whole: a 97 KB C-FIND identifier held its association for 48 s). Also the
    data set of an N-ACTION (storage commitment) or N-CREATE/N-SET (MPPS) request."""
    ts = UID(str(transfer_syntax))
    return read_identifier(identifier.getvalue(), ts.is_implicit_VR, ts.is_little_endian, ts.is_deflated)


def key_values(identifier: Dataset, keyword: str) -> list[str] | None:
    """The values of a key of the identifier: None when absent, [] when zero length (universal
    matching), else each value, its padding stripped."""
    tag = tag_for_keyword(keyword)
    if tag not in identifier:
        return None
    raw = _raw(identifier[tag])
    return [v.strip() for v in raw.split("\\")] if raw.strip() else []


def single_value(identifier: Dataset, keyword: str, where: str) -> str:
    """The one value of the unique key ``keyword`` (Single Value Matching, PS3.4 C.2.2.2.1:
    no wildcard, no list, not empty); IdentifierError naming it otherwise (``where``:
    ``above SERIES level``...)."""
    values = key_values(identifier, keyword)
    tag = tag_for_keyword(keyword)
    if not values or not values[0]:
        raise IdentifierError(f"{keyword} {'missing' if values is None else 'empty'} (required {where})", tag)
    if len(values) > 1:
        raise IdentifierError(f"{keyword} must be a single value {where}", tag)
    if any(w in values[0] for w in WILDCARDS):
        raise IdentifierError(f"{keyword}: no wildcard matching {where}", tag)
    return values[0]


def _raw(elem: DataElement) -> str:
    """The matching value as QIDO-RS would get it: multiple values joined by ``\\``."""
    v = elem.value
    if v is None:
        return ""
    if isinstance(v, (MultiValue, list, tuple)):
        return "\\".join(str(x) for x in v)
    if isinstance(v, bytes):
        return v.decode("ascii", "replace")
    return str(v)


def _sequence_keys(tag: str, elem: DataElement) -> list[tuple[str, str]]:
    """The matching keys of a sequence in the identifier: its one item's attributes with a
    value, as QIDO-RS attribute paths (``00400275.00401001``; PS3.4 C.2.2.2.6). An empty
    sequence or item is universal matching (the sequence is returned); item keys the
    index cannot match on are not matched (PS3.4 C.2.2.1.1)."""
    sequence = BY_TAG.get(tag)
    if sequence is None or sequence.kind is not Kind.SEQUENCE or not elem.value:
        return []
    if len(elem.value) != 1:
        raise IdentifierError(f"{sequence.keyword}: a sequence matching key holds one item (PS3.4 C.2.2.2.6), "
                              f"not {len(elem.value)}")
    supported = {a.tag for a in sequence.items}
    keys = []
    for item_elem in elem.value[0]:
        item_tag = f"{int(item_elem.tag):08X}"
        value = _raw(item_elem) if item_elem.VR != "SQ" else ""
        if value and item_tag in supported:
            keys.append((f"{tag}.{item_tag}", value))
    return keys


def query_level(identifier: Dataset, model: str) -> str:
    """The identifier's QueryRetrieveLevel, checked against the model (``patient`` or ``study``
    root). A CS value is upper case (PS3.5 §6.2): ``study`` is not a level (pynetdicom's qrscp
    refuses it too; its leading and trailing spaces are not significant)."""
    level = str(identifier.get("QueryRetrieveLevel", "")).strip()
    allowed = MODEL_LEVELS[model]
    if level not in allowed:
        raise IdentifierError(f"QueryRetrieveLevel {level!r} is not one of {', '.join(allowed)}", 0x00080052)
    return level


def build_query(identifier: Dataset, level: str, max_results: int, offset: int = 0) -> tuple[Query, list[int]]:
    """The QIDO-RS query of an identifier, and the tags to return (every key in the
    identifier, in order). Keys with a value match; empty keys are return keys.
    A key the index cannot match on is returned only (PS3.4 C.2.2.1.1: an SCP
    matches on the keys it supports)."""
    qido_level = LEVELS[level]
    # Specific Character Set always: pydicom encodes the answer values in it (PS3.4 C.4.1.1.3.2)
    params: list[tuple[str, str]] = [("limit", str(_PAGE)), ("offset", str(offset)), ("includefield", "00080005")]
    wanted: list[int] = []
    for elem in identifier:
        if elem.tag in _SKIP or elem.tag.is_private or elem.tag.group == 0x0002:
            continue
        wanted.append(int(elem.tag))
        tag = f"{int(elem.tag):08X}"
        if elem.VR == "SQ":
            params += _sequence_keys(tag, elem)
            params.append(("includefield", tag))
            continue
        value = _raw(elem)
        if value and (tag in BY_TAG or tag == TIMEZONE_OFFSET):  # the offset of the identifier's values
            params.append((tag, value))
        else:
            params.append(("includefield", tag))
    try:
        return parse_query(qido_level, params, max_results=max(max_results, _PAGE)), wanted
    except QueryError as e:
        raise IdentifierError(str(e)) from None


def search_all(index: Index, identifier: Dataset, level: str, max_results: int,
               allowed: Filter = UNRESTRICTED) -> Iterator[tuple[Query, SearchHit]]:
    """Every match among the studies ``allowed`` lets through (access/filter.py), page by
    page (C-FIND has no limit; pages keep memory bounded)."""
    offset = 0
    while True:
        query, _ = build_query(identifier, level, max_results, offset)
        hits = index.search(query, allowed)
        for hit in hits:
            yield query, hit
        if len(hits) < query.limit:
            return
        offset += len(hits)


def _item_matches(match: Match | None, item: dict) -> bool:
    """Does a stored item (DICOM JSON) match every item key of ``match`` (a ``sequence``
    Match of the query; None or ``universal``: every item does)? The keys the index matched
    on, by the same rules (dicom/matching.py, PS3.4 C.2.2.2.6)."""
    if match is None or match.type != "sequence":
        return True
    return all(match_value(k, column_value(item, k.attribute)) for k in match.values)


def _sequence_answer(element: dict | None, request: DataElement, match: Match | None) -> dict | None:
    """The answer of a sequence key (PS3.4 C.2.2.2.6): a zero-length sequence or item asks
    for the whole stored sequence; an item with keys, for the stored items matching all its
    keys (``match``), each holding only the item's keys (stored value, or zero length when
    the item lacks it). A sequence inside the item is answered the same way, without
    matching (the index matches one level of sequences: its items are returned only)."""
    if element is None or not request.value or not len(request.value[0]):
        return element
    keys = [(f"{int(e.tag):08X}", e) for e in request.value[0]]
    items = []
    for item in element.get("Value") or []:
        if not isinstance(item, dict) or not _item_matches(match, item):
            continue
        out: dict = {}
        for tag, e in keys:
            if e.VR == "SQ":
                nested = _sequence_answer(item.get(tag), e, None)
                out[tag] = nested if nested is not None else {"vr": "SQ"}
            else:
                out[tag] = item.get(tag) or {"vr": vr_of(tag) if " or " in e.VR else e.VR}
        items.append(out)
    return {"vr": "SQ", "Value": items}


def _response(result: dict, wanted: list[int], level: str, *charsets: tuple[str, ...] | None,
              identifier: Dataset | None = None, query: Query | None = None) -> Dataset:
    """The response identifier (PS3.4 C.4.1.1.3.2): the requested keys, Query/Retrieve Level
    and the Specific Character Set dicom/charset.py chooses: the request's when it holds
    every value, else the stored one, else the archive's preferred one, else ISO_IR 192
    (``charsets``: the request's and the archive's); none for ASCII. A sequence key of
    ``identifier`` returns the matching items with the requested item keys only
    (:func:`_sequence_answer`, PS3.4 C.2.2.2.6)."""
    result.pop("00081190", None)  # RetrieveURL is QIDO-RS only
    stored = of_json(result)
    if identifier is not None:
        sequences = {m.attribute.tag: m for m in query.matches} if query is not None else {}
        for elem in identifier:
            tag = f"{int(elem.tag):08X}"
            if elem.VR == "SQ" and tag in result:
                result[tag] = _sequence_answer(result[tag], elem, sequences.get(tag))
    ds = Dataset.from_json({k: v for k, v in result.items() if int(k, 16) in wanted})
    for tag in wanted:  # requested keys without a value are returned with zero length (PS3.4 C.4.1.1.3.2)
        if tag not in ds:
            ds.add_new(tag, vr_of(f"{tag:08X}"), None)
    ds.QueryRetrieveLevel = level
    requested, default = charsets
    return set_character_set(ds, requested, stored, default)


def find(index: Index, identifier: Dataset, model: str, max_results: int,
         allowed: Filter = UNRESTRICTED, default_charset: tuple[str, ...] | None = None) -> Iterator[Dataset]:
    """The C-FIND response identifiers of ``identifier`` (Patient or Study Root), of the
    studies ``allowed`` lets through; ``default_charset``: the archive's preferred Specific
    Character Set (the ``dimse_character_set`` setting, dicom/charset.py)."""
    level = query_level(identifier, model)
    _, wanted = build_query(identifier, level, max_results)
    requested = terms(identifier.get("SpecificCharacterSet"))
    if level == "PATIENT":  # patients are kept at the study level: one answer per patient
        yield from _patient_answers(index, identifier, max_results, allowed, wanted, requested, default_charset)
        return
    for query, hit in search_all(index, identifier, level, max_results, allowed):
        result = build_result(query, hit.study_json, hit.series_json, hit.instance_json, hit.computed, "", ())
        yield _response(result, wanted, level, requested, default_charset, identifier=identifier, query=query)


def _patient_answers(index: Index, identifier: Dataset, max_results: int, allowed: Filter, wanted: list[int],
                     requested: tuple[str, ...] | None, default_charset: tuple[str, ...] | None
                     ) -> Iterator[Dataset]:
    """One answer per distinct patient (the values of the patient keys asked for; the same
    patient whatever character set each study came in: its values are Unicode). With a
    Number of Patient Related ... key asked for, every matching study is seen first, in
    one pass over the index, so that each answer holds its patient's counts (a second
    pass could meet a patient the first had not: a study stored meanwhile)."""
    counting = any(t in wanted for t in PATIENT_COUNTS)
    patients: dict[tuple, tuple] = {}  # patient -> (query, answer, [studies, series, instances])
    for query, hit in search_all(index, identifier, "PATIENT", max_results, allowed):
        result = build_result(query, hit.study_json, hit.series_json, hit.instance_json, hit.computed, "", ())
        result = {k: v for k, v in result.items()
                  if k == SPECIFIC_CHARACTER_SET or BY_TAG.get(k) is None or BY_TAG[k].keyword in PATIENT_KEYS}
        key = tuple(str(result.get(t, "")) for t in sorted(result) if t != SPECIFIC_CHARACTER_SET)
        seen = patients.get(key)
        if not counting:
            if seen is None:
                patients[key] = ()
                yield _response(result, wanted, "PATIENT", requested, default_charset, identifier=identifier,
                                query=query)
            continue
        if seen is None:
            seen = patients[key] = (query, result, [0, 0, 0])
        n = seen[2]
        n[0] += 1
        n[1] += int(hit.computed.get("NumberOfStudyRelatedSeries") or 0)  # type: ignore[call-overload]
        n[2] += int(hit.computed.get("NumberOfStudyRelatedInstances") or 0)  # type: ignore[call-overload]
    if counting:
        for query, result, n in patients.values():
            for tag, value in zip(PATIENT_COUNTS, n):
                result[f"{tag:08X}"] = {"vr": "IS", "Value": [value]}
            yield _response(result, wanted, "PATIENT", requested, default_charset, identifier=identifier, query=query)

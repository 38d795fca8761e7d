"""QIDO-RS query parsing and attribute matching.

One parsed :class:`Query` serves both index back ends: the in-memory index
evaluates it with :func:`match_value`, the SQLite index compiles it to SQL.

References
----------
PS3.18 §8.3.4 (query parameters: ``{attributeID}={value}``, ``includefield``,
``fuzzymatching``, ``limit``, ``offset``); PS3.4 C.2.2.2 (single value, list of UID,
universal, wildcard and range matching).
"""

from __future__ import annotations

import calendar
import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from .attributes import (
    BY_KEYWORD, BY_TAG, DERIVED, LEVELS, SEQUENCES_OF, SERIES_LEVEL_TAGS, STORED, STUDY_LEVEL_TAGS, Attribute, Kind,
    Level, level_article, resolve_attribute,
)
from .json_model import level_attributes
from .timezones import dt_offset, parse_offset, to_utc
from .uids import validate_uid


class QueryError(ValueError):
    """A query parameter the archive cannot accept (HTTP 400, with this message)."""


@dataclass(frozen=True, slots=True)
class Match:
    """One matching key.

    ``type`` is one of ``single`` (values: one normalised value), ``list`` (UID list
    or multi-valued CS: any value matches), ``wildcard`` (values: the pattern with
    ``*``/``?``), ``range`` (values: (low or None, high or None), inclusive),
    ``sequence`` (values: the item keys, each a Match; some item must match all of
    them, PS3.4 C.2.2.2.6) and ``universal`` (no constraint; the attribute is returned).
    """

    attribute: Attribute
    type: str
    values: tuple


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed QIDO-RS request (PS3.18 §10.6.1)."""

    level: Level
    study_uid: str | None
    series_uid: str | None
    matches: tuple[Match, ...]
    includefields: tuple[str, ...]  # tags, 8 uppercase hex
    include_all: bool
    fuzzy: bool
    limit: int
    offset: int
    limited: bool  # True when the server maximum cut the client's limit (or none was given)
    timezone_offset: int | None = None  # the query's TimezoneOffsetFromUTC, minutes east of UTC


_DATE_RE = re.compile(r"^\d{8}$")
_TIME_RE = re.compile(r"^(\d{2})(\d{2})?(\d{2})?(?:\.(\d{1,6}))?$")
_DT_RE = re.compile(r"^(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?(?:\.(\d{1,6}))?([+-]\d{4})?$")

# Aliases kept for clients that send series/instance keys to a study search: they
# mean "any series/instance of the study has this value" (documented in docs/dicomweb.md).
_STUDY_ALIASES = {"Modality": "ModalitiesInStudy", "SOPClassUID": "SOPClassesInStudy"}

#: Longest matching value accepted (HTTP 400 beyond). The longest VR a key can hold is a
#: PN of three 64-character component groups (PS3.5 §6.2); 256 leaves room for ranges
#: and wildcards. It bounds the work of every wildcard (see :func:`wildcard_regex`).
MAX_VALUE_CHARS = 256
#: Most UIDs (or ModalitiesInStudy/SOPClassesInStudy values) in one list match (PS3.4 C.2.2.2.2).
MAX_UIDS = 1000
#: IS and US values (PS3.5 §6.2): what an integer key can hold.
_INT_MIN, _INT_MAX = -(2**31), 2**32 - 1
_INT_RE = re.compile(r"[+-]?[0-9]+")
#: Characters that separate the words of a person name for fuzzy matching.
PN_WORD_SEPARATORS = "^=, "
_PN_SPLIT = re.compile("[" + re.escape(PN_WORD_SEPARATORS) + "]+")


# --- normalisation (shared with the indexes, which store normalised values) ---------------


def normalize_date(value: str) -> str | None:
    """DA ``YYYYMMDD`` as stored; None when empty or malformed (never matches a range)."""
    v = value.strip()
    return v if _DATE_RE.match(v) else None


def normalize_time(value: str, upper: bool = False) -> str | None:
    """TM to the fixed width ``HHMMSS.ffffff``; missing components are filled with
    zeros (or their maximum when ``upper``, so that ``-10`` includes 10:59)."""
    m = _TIME_RE.match(value.strip())
    if not m:
        return None
    hh, mm, ss, frac = m.groups()
    fill = "59" if upper else "00"
    return f"{hh}{mm or fill}{ss or fill}.{(frac or '').ljust(6, '9' if upper else '0')}"


def normalize_datetime(value: str, upper: bool = False) -> str | None:
    """DT to ``YYYYMMDDHHMMSS.ffffff`` (the UTC offset suffix is ignored)."""
    m = _DT_RE.match(value.strip())
    if not m:
        return None
    y, mo, d, hh, mi, ss, frac, _tz = m.groups()
    if upper:
        return f"{y}{mo or '12'}{d or '31'}{hh or '23'}{mi or '59'}{ss or '59'}.{(frac or '').ljust(6, '9')}"
    return f"{y}{mo or '01'}{d or '01'}{hh or '00'}{mi or '00'}{ss or '00'}.{(frac or '').ljust(6, '0')}"


def normalize_pn(value: str) -> str:
    """Person names are matched case-insensitively (a documented choice; PS3.4
    C.2.2.2.1 leaves PN case sensitivity to the implementation)."""
    return value.strip().upper()


def parse_int(text: str) -> int | None:
    """An IS/US value (ASCII digits, in range) or None."""
    text = text.strip()
    if not _INT_RE.fullmatch(text):
        return None
    n = int(text)
    return n if _INT_MIN <= n <= _INT_MAX else None


def normalize_stored(attribute: Attribute, value: object) -> object:
    """The value an index keeps for ``attribute`` (None when absent, empty or not in
    the format of its VR: such a value is returned but never matched; both indexes
    keep exactly this, so they answer alike)."""
    if value is None or value == "":
        return None
    kind = attribute.kind
    text = str(value)
    if kind is Kind.INT:
        return parse_int(text)
    if kind is Kind.DATE:
        return normalize_date(text)
    if kind is Kind.TIME:
        return normalize_time(text)
    if kind is Kind.DATETIME:
        return normalize_datetime(text)
    if kind is Kind.PN:
        return normalize_pn(text)
    return text.strip()


def column_value(meta: dict, attribute: Attribute) -> object:
    """The index value of an attribute, read from an instance's DICOM JSON (already
    converted once; reading the pydicom Dataset again costs ~10% of a STOW)."""
    values = meta.get(attribute.tag, {}).get("Value")
    if not values:
        return None
    texts = []
    for v in values:
        if isinstance(v, dict):  # PN: the alphabetic group is what is matched
            v = v.get("Alphabetic", "")
        texts.append("" if v is None else v)
    value = texts[0] if len(texts) == 1 else "\\".join(str(t) for t in texts)
    try:
        return normalize_stored(attribute, value if isinstance(value, (int, float)) else str(value))
    except Exception:  # an unusable value is not indexed; it never fails the instance
        return None


def sequence_items(meta: dict, attribute: Attribute) -> list[dict[str, object]] | None:
    """The items of a matchable sequence (attributes.SEQUENCES) as the indexes keep them:
    per item, item keyword -> normalised value (:func:`column_value`); None when absent."""
    items = meta.get(attribute.tag, {}).get("Value")
    if not items:
        return None
    return [{a.keyword: column_value(item, a) for a in attribute.items} for item in items
            if isinstance(item, dict)] or None


TIMEZONE_OFFSET = "00080201"
_START_OF_DAY, _END_OF_DAY = "000000.000000", "235959.999999"


def _first_text(meta: dict, keyword: str) -> str | None:
    values = meta.get(BY_KEYWORD[keyword].tag, {}).get("Value")
    return str(values[0]) if values and values[0] is not None else None


def derived_value(meta: dict, attribute: Attribute) -> str | None:
    """A date-time column of attributes.DERIVED: the DA and TM of ``sources`` as one
    ``YYYYMMDDHHMMSS.ffffff`` (a missing time is the start of the day), or the DT; in
    UTC when ``attribute.utc``, with the DT's own offset, else the instance's Timezone
    Offset From UTC (PS3.3 C.12.1.1.8). Without either, the local time is kept as it is:
    the standard leaves it unknown, and the archive does not guess (docs/dicomweb.md, time zones).
    None without a (valid) date."""
    if len(attribute.sources) == 1:
        raw = _first_text(meta, attribute.sources[0])
        value = normalize_datetime(raw) if raw else None
        own = dt_offset(raw) if raw else None
    else:
        date = _first_text(meta, attribute.sources[0])
        day = normalize_date(date) if date else None
        if day is None:
            return None
        time = _first_text(meta, attribute.sources[1])
        value, own = day + ((normalize_time(time) if time else None) or _START_OF_DAY), None
    if value is None or not attribute.utc:
        return value
    if own is None:
        tz = meta.get(TIMEZONE_OFFSET, {}).get("Value")
        own = parse_offset(tz[0]) if tz else None
    return to_utc(value, own or 0)


#: (UTC column, the column it equals when the instance has no offset) of each level
_SAME_WITHOUT_OFFSET: dict[Level, list[tuple[str, str]]] = {
    lv: [(a.keyword, next((b.keyword for b in DERIVED if b.sources == a.sources and not b.utc), a.sources[0]))
         for a in DERIVED if a.utc and a.level == lv] for lv in LEVELS}


def level_values(meta: dict, level: Level) -> dict[str, object]:
    """What the index keeps for matching at ``level``: a value per column (STORED, the
    derived date-times included) and the items of each matchable sequence of the level
    (SEQUENCES_OF)."""
    values: dict[str, object] = {a.keyword: derived_value(meta, a) if a.sources else column_value(meta, a)
                                 for a in STORED[level]}
    for utc, local in _SAME_WITHOUT_OFFSET[level]:
        if values[utc] == values[local]:  # no offset: one string object for both (the memory index keeps both)
            values[utc] = values[local]
    for a in SEQUENCES_OF[level]:
        values[a.keyword] = sequence_items(meta, a)
    return values


def level_record(meta: dict, level: Level) -> tuple[dict[str, object], dict]:
    """What an instance (its DICOM JSON) says about its study or series: the index
    columns of ``level`` and the DICOM JSON of the level's modules. The index keeps
    this for the instance that speaks for the study/series (the earliest received
    still stored), and computes it again when that one is deleted."""
    tags = STUDY_LEVEL_TAGS if level == "study" else SERIES_LEVEL_TAGS
    return level_values(meta, level), level_attributes(meta, tags)


# --- parsing -----------------------------------------------------------------------------


def _level_rank(level: Level) -> int:
    return LEVELS.index(level)


def _split_list(value: str) -> list[str]:
    return [v for v in re.split(r"[\\,]", value) if v != ""]


def _collapse_stars(value: str) -> str:
    """``**`` means what ``*`` means; a run of them is one (bounds wildcard work)."""
    return re.sub(r"\*{2,}", "*", value) if "**" in value else value


def _parse_match(attribute: Attribute, raw: str) -> Match:
    kind = attribute.kind
    if kind is Kind.SEQUENCE:  # the sequence itself: only universal matching (return it)
        if raw.strip() not in ("", "*"):
            raise QueryError(f"{attribute.keyword} is a sequence: match its items' attributes "
                             f"({attribute.keyword}.{attribute.items[0].keyword}=...), or give no value to return it")
        return Match(attribute, "universal", ())
    if "\x00" in raw:
        raise QueryError(f"{attribute.keyword}: a NUL character is not allowed in a value")
    if kind not in (Kind.UID, Kind.MULTI) and len(raw) > MAX_VALUE_CHARS:
        raise QueryError(f"{attribute.keyword}: value longer than {MAX_VALUE_CHARS} characters")
    value = _collapse_stars(raw.strip() if kind is not Kind.TEXT else raw)
    if value == "" or value == "*":
        return Match(attribute, "universal", ())
    if kind is Kind.UID:
        uids = _split_list(value)
        if not uids:
            raise QueryError(f"{attribute.keyword}: {raw!r} holds no UID")
        if len(uids) > MAX_UIDS:
            raise QueryError(f"{attribute.keyword}: more than {MAX_UIDS} UIDs in one list")
        try:
            uids = [validate_uid(u) for u in uids]
        except ValueError as e:
            raise QueryError(f"{attribute.keyword}: {e}") from None
        return Match(attribute, "single" if len(uids) == 1 else "list", tuple(uids))
    if kind is Kind.MULTI:
        values = tuple(_split_list(value))
        if len(values) > MAX_UIDS or any(len(v) > 64 for v in values):  # CS 16, UI 64 (PS3.5 §6.2)
            raise QueryError(f"{attribute.keyword}: more than {MAX_UIDS} values or a value over 64 characters")
        return Match(attribute, "list", values) if values else Match(attribute, "universal", ())
    if kind is Kind.INT:
        n = parse_int(value)
        if n is None:
            raise QueryError(f"{attribute.keyword}: {raw!r} is not an integer of the IS/US range")
        return Match(attribute, "single", (n,))
    if kind in (Kind.DATE, Kind.TIME, Kind.DATETIME):
        return _parse_temporal(attribute, value, raw)
    if kind is Kind.PN:
        value = normalize_pn(value)
    if "*" in value or "?" in value:
        return Match(attribute, "wildcard", (value,))
    return Match(attribute, "single", (value,))


def parse_match(attribute: Attribute, raw: str) -> Match:
    """One matching key's value as the query model reads it (single value, wildcard, range,
    UID list, universal: PS3.4 C.2.2.2), for an attribute outside the QIDO-RS levels too
    (the modality worklist's keys, dicom/worklist.py)."""
    return _parse_match(attribute, raw)


_NORMALIZERS = {
    Kind.DATE: (normalize_date, normalize_date),
    Kind.TIME: (normalize_time, lambda v: normalize_time(v, upper=True)),
    Kind.DATETIME: (normalize_datetime, lambda v: normalize_datetime(v, upper=True)),
}


def _parse_temporal(attribute: Attribute, value: str, raw: str) -> Match:
    """DA/TM/DT single value or range ``low-high`` with either end open (PS3.4
    C.2.2.2.5). A partial TM/DT names a period and matches all of it. Each end must be
    a date or time of the calendar (PS3.5 Table 6.2-1: ``20201345`` or ``StudyTime=25``
    is refused, not searched for)."""
    kind = attribute.kind
    normalizers = _NORMALIZERS[kind]
    problems: list[str] = []

    def bound(text: str, upper: bool = False) -> str | None:
        normalized = normalizers[upper](text)
        if normalized is not None and (problem := _calendar_problem(kind, text)):
            problems.append(problem)
            return None
        return normalized

    lo = bound(value)
    if lo is not None:  # a single value (a DT may carry a "-hhmm" UTC offset)
        if kind is Kind.DATE:
            return Match(attribute, "single", (lo,))
        return Match(attribute, "range", (lo, bound(value, upper=True)))
    for i, ch in enumerate(value):
        if ch != "-":
            continue
        lo_raw, hi_raw = value[:i], value[i + 1 :]
        lo = bound(lo_raw) if lo_raw else None
        hi = bound(hi_raw, upper=True) if hi_raw else None
        if (lo_raw and lo is None) or (hi_raw and hi is None) or (lo is None and hi is None):
            continue
        return Match(attribute, "range", (lo, hi))
    message = f"{attribute.keyword}: {raw!r} is not a valid {kind.value} value or range"
    if problems:
        message += f": {problems[0]} (PS3.5 Table 6.2-1)"
    if " " in value:
        try:
            _parse_temporal(attribute, value.replace(" ", "+"), raw)
            message += PLUS_HINT
        except QueryError:
            pass
    raise QueryError(message)


#: Said when a value would be valid with a '+' where it has a space: in a query string a '+'
#: means a space (application/x-www-form-urlencoded, WHATWG URL Standard §5.1), so
#: ``AcquisitionDateTime=20200101120000+0100`` typed into curl arrives with a space.
PLUS_HINT = " (a '+' in a URL's query string is read as a space: send it as %2B)"

_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _calendar_problem(kind: Kind, text: str) -> str | None:
    """Why a DA, TM or DT of the right shape (digits where digits go) is not a date or
    time, None when it is one: month 01-12, a day of that month (29 February in leap
    years of the Gregorian calendar only), hour 00-23, minute 00-59, second 00-60 (a
    leap second), UTC offset -1200 to +1400 (PS3.5 §6.2, Table 6.2-1)."""
    text = text.strip()
    if kind is Kind.DATE:
        year, month, day, hour, minute, second, offset = text[:4], text[4:6], text[6:8], None, None, None, None
    elif kind is Kind.TIME:
        m = _TIME_RE.match(text)
        if not m:
            return None
        year = month = day = offset = None
        hour, minute, second, _frac = m.groups()
    else:
        m = _DT_RE.match(text)
        if not m:
            return None
        year, month, day, hour, minute, second, _frac, offset = m.groups()
    if month is not None and not 1 <= int(month) <= 12:
        return f"month {month} is not 01-12"
    if day is not None:
        last = 28 if int(month) == 2 and not calendar.isleap(int(year)) else _DAYS_IN_MONTH[int(month) - 1]
        if not 1 <= int(day) <= last:
            return f"day {day} is not 01-{last} in {year}-{month}"
    for name, part, top in (("hour", hour, 23), ("minute", minute, 59), ("second", second, 60)):
        if part is not None and int(part) > top:
            return f"{name} {part} is not 00-{top}"
    if offset is not None and parse_offset(offset) is None:
        return f"UTC offset {offset} is not -1200 to +1400"
    return None


def _add_item_key(matches: dict[str, Match], sequence: Attribute | None, name: str, item_name: str,
                  value: str, rank: int) -> None:
    """Add ``{sequence}.{attribute}={value}`` to the sequence's match (PS3.4 C.2.2.2.6: one item
    holding all the keys of the request's item; each key by its own matching type)."""
    if sequence is None or sequence.kind is not Kind.SEQUENCE:
        raise QueryError(f"{name}: not a sequence supported for matching; supported: "
                         + ", ".join(a.keyword for a in BY_KEYWORD.values() if a.kind is Kind.SEQUENCE))
    if _level_rank(sequence.level) > rank:
        raise QueryError(f"{sequence.keyword} is {level_article(sequence.level)} {sequence.level}-level attribute; "
                         f"it cannot be matched in a {LEVELS[rank]} search")
    if "." in item_name:
        raise QueryError(f"{name}.{item_name}: only one level of sequence nesting is supported for matching")
    try:
        tag, keyword = resolve_attribute(item_name)
    except ValueError as e:
        raise QueryError(f"{sequence.keyword}.{item_name}: {e}") from None
    item = next((a for a in sequence.items if a.tag == tag), None)
    if item is None:
        raise QueryError(f"{sequence.keyword}.{keyword or tag} is not supported as a matching key; supported: "
                         + ", ".join(f"{sequence.keyword}.{a.keyword}" for a in sequence.items))
    old = matches.get(sequence.keyword)
    keys = old.values if old is not None and old.type == "sequence" else ()
    if any(k.attribute is item for k in keys):
        raise QueryError(f"{sequence.keyword}.{item.keyword} is given more than once")
    key = _parse_match(item, value)
    if key.type != "universal":
        keys = (*keys, key)
    matches[sequence.keyword] = Match(sequence, "sequence", keys) if keys else Match(sequence, "universal", ())


def _derive(matches: dict[str, Match], raws: dict[str, str], tz: int | None) -> list[str]:
    """Date and time keys matched as one date-time, on a derived column (attributes.DERIVED);
    returns the tags of the keys replaced (returned as matched keys are).

    - A date range with a time (PS3.4 C.2.2.2.5.1, combined date-time matching):
      ``StudyDate=20200101-20200102&StudyTime=2200-0200`` is from 2020-01-01 22:00 to
      2020-01-02 02:00, not "either day, 22:00 to 02:00" (which matches nothing).
    - A query with an offset (``TimezoneOffsetFromUTC``, or a DT value's suffix): its
      values are in that offset (PS3.4 C.4.1.1.3.1), matched against the UTC columns;
      a date alone is the whole day in that offset.
    A time alone, and a query without an offset, match the values as stored.
    """
    replaced: list[str] = []
    local = {a.sources: a for a in DERIVED if not a.utc}
    for a in DERIVED:
        if not a.utc:
            continue
        if len(a.sources) == 1:
            m = matches.get(a.sources[0])
            raw = raws.get(a.sources[0], "")
            if m is None or m.type == "universal":
                continue
            lo_raw, hi_raw = _bounds(_collapse_stars(raw.strip()))
            offsets = [dt_offset(b) if b else None for b in (lo_raw, hi_raw)]
            if tz is None and offsets == [None, None]:
                continue
            lo, hi = (None if v is None else to_utc(v, o if o is not None else tz or 0)
                      for v, o in zip(m.values, offsets))
            del matches[a.sources[0]]
            matches[a.keyword] = Match(a, "range", (lo, hi))
            replaced.append(m.attribute.tag)
            continue
        dm, tm = matches.get(a.sources[0]), matches.get(a.sources[1])
        if dm is None or dm.type == "universal":
            continue
        tm = tm if tm is not None and tm.type != "universal" else None
        if tz is None and (tm is None or dm.type != "range"):
            continue
        lo_d, hi_d = dm.values if dm.type == "range" else (dm.values[0], dm.values[0])
        lo_t, hi_t = tm.values if tm is not None else (None, None)
        lo = None if lo_d is None else lo_d + (lo_t or _START_OF_DAY)
        hi = None if hi_d is None else hi_d + (hi_t or _END_OF_DAY)
        target = a if tz is not None else local[a.sources]
        if tz is not None:
            lo, hi = (None if v is None else to_utc(v, tz) for v in (lo, hi))
        for k in a.sources:
            if k in matches:
                replaced.append(matches.pop(k).attribute.tag)
        matches[target.keyword] = Match(target, "range", (lo, hi))
    return replaced


def _bounds(value: str) -> tuple[str | None, str | None]:
    """The two bounds of a DT value or range as written (a single value is both), split
    where :func:`_parse_temporal` split it (a valid date-time on each side)."""

    def valid(text: str) -> bool:
        return normalize_datetime(text) is not None and _calendar_problem(Kind.DATETIME, text) is None

    if valid(value):
        return value, value
    for i, ch in enumerate(value):
        if ch != "-":
            continue
        lo_raw, hi_raw = value[:i], value[i + 1:]
        if (lo_raw and not valid(lo_raw)) or (hi_raw and not valid(hi_raw)) or not (lo_raw or hi_raw):
            continue
        return lo_raw or None, hi_raw or None
    raise AssertionError(value)  # _parse_temporal accepted it


#: Query parameters that take one value (PS3.18 §8.3.4: limit, offset, fuzzymatching; the
#: TimezoneOffsetFromUTC of §8.3.4.1 by keyword or tag), by the name they are given with
#: (lower case for the parameters, whose names are matched case-insensitively) -> their name.
_SINGLE_VALUED = {"limit": "limit", "offset": "offset", "fuzzymatching": "fuzzymatching",
                  "TimezoneOffsetFromUTC": "TimezoneOffsetFromUTC", TIMEZONE_OFFSET: "TimezoneOffsetFromUTC"}


def _bool_param(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no", ""):
        return False
    raise QueryError(f"{name}: {value!r} is not true or false")


def _int_param(name: str, value: str, minimum: int) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise QueryError(f"{name}: {value!r} is not an integer") from None
    if n < minimum:
        raise QueryError(f"{name}: must be >= {minimum}")
    if n > 2**31:
        raise QueryError(f"{name}: {n} is too large")
    return n


def parse_query(
    level: Level,
    params: Iterable[tuple[str, str]],
    *,
    study_uid: str | None = None,
    series_uid: str | None = None,
    max_results: int = 1000,
) -> Query:
    """Parse QIDO-RS query parameters (PS3.18 §8.3.4) for a search at ``level``.

    Parameters
    ----------
    level
        ``study``, ``series`` or ``instance``: the level of the resource searched.
    params
        The query string as (name, value) pairs, repeats kept.
    study_uid, series_uid
        The scope given in the path (``/studies/{study}/series``), already validated.
    max_results
        Server maximum for ``limit``; a larger or missing limit is cut to it.

    Returns
    -------
    Query

    Raises
    ------
    QueryError
        Unknown attribute, an attribute not supported for matching at this level,
        malformed value, a key given twice, bad ``limit``/``offset``/``fuzzymatching``
        (HTTP 400).
    """
    matches: dict[str, Match] = {}
    includes: list[str] = []
    include_all = False
    fuzzy = False
    limit: int | None = None
    offset = 0
    rank = _level_rank(level)
    timezone_offset: int | None = None
    raws: dict[str, str] = {}
    given: set[str] = set()  # the single-valued parameters seen
    for name, value in params:
        if name == "":  # "?=x" (pydicom maps the keyword '' to 300A0782); "?&" and a trailing "&" give no pair
            raise QueryError(f"empty parameter name in {'=' + value!r}")
        if name in ("accept", "charset"):
            continue  # content negotiation (PS3.18 8.3.3), read by the web layer (api.deps.acceptable)
        lname = name.lower()
        single = _SINGLE_VALUED.get(lname) or _SINGLE_VALUED.get(name)
        if single is not None:
            if single in given:  # the last one winning would silently change the answer
                raise QueryError(f"{single} is given more than once")
            given.add(single)
        if lname == "includefield":
            for item in value.split(","):
                item = item.strip()
                if not item:
                    continue
                if item.lower() == "all":
                    include_all = True
                    continue
                try:
                    tag, _kw = resolve_attribute(item)
                except ValueError as e:
                    raise QueryError(f"includefield: {e}") from None
                includes.append(tag)
            continue
        if lname == "fuzzymatching":
            fuzzy = _bool_param(name, value)
            continue
        if lname == "limit":
            limit = _int_param(name, value, 0)
            continue
        if lname == "offset":
            offset = _int_param(name, value, 0)
            continue
        if name in ("TimezoneOffsetFromUTC", TIMEZONE_OFFSET):  # PS3.18 §8.3.4.1: the offset of the query's values
            timezone_offset = parse_offset(value)
            if timezone_offset is None and value.strip():
                hint = PLUS_HINT if parse_offset(value.replace(" ", "+")) is not None else ""
                raise QueryError(f"TimezoneOffsetFromUTC: {value!r} is not an offset +hhmm or -hhmm "
                                 f"(-1200 to +1400){hint}")
            if timezone_offset is not None:
                includes.append(TIMEZONE_OFFSET)
            continue
        # {attributeID}={value}: a keyword or tag, or a sequence's item attribute (PS3.18 §8.3.4.1
        # attribute path, one level: RequestAttributesSequence.RequestedProcedureID, 00400275.00401001)
        path, _, item_name = name.partition(".")
        try:
            tag, keyword = resolve_attribute(path)
        except ValueError as e:
            raise QueryError(str(e)) from None
        attribute = BY_TAG.get(tag)
        if item_name:
            _add_item_key(matches, attribute, keyword or tag, item_name, value, rank)
            continue
        if attribute is not None and level == "study" and attribute.keyword in _STUDY_ALIASES:
            attribute = BY_KEYWORD[_STUDY_ALIASES[attribute.keyword]]
        if attribute is None:
            raise QueryError(
                f"{keyword or tag} is not supported as a matching key; supported: "
                + ", ".join(a.keyword for a in BY_KEYWORD.values() if _level_rank(a.level) <= rank)
            )
        if _level_rank(attribute.level) > rank:
            raise QueryError(f"{attribute.keyword} is {level_article(attribute.level)} {attribute.level}-level attribute; "
                             f"it cannot be matched in a {level} search")
        if attribute.keyword in matches:
            if attribute.kind is Kind.SEQUENCE:  # the sequence named alone and by its items
                _parse_match(attribute, value)
                continue
            raise QueryError(f"{attribute.keyword} is given more than once")
        matches[attribute.keyword] = _parse_match(attribute, value)
        raws[attribute.keyword] = value
    includes += _derive(matches, raws, timezone_offset)
    limited = limit is None or limit > max_results
    return Query(
        level=level,
        study_uid=study_uid,
        series_uid=series_uid,
        matches=tuple(matches.values()),
        includefields=tuple(dict.fromkeys(includes)),
        include_all=include_all,
        fuzzy=fuzzy,
        limit=max_results if limited else limit,  # type: ignore[arg-type]
        offset=offset,
        limited=limited,
        timezone_offset=timezone_offset,
    )


def exact_study_query(values: dict[str, str], *, offset: int = 0, limit: int = 1000) -> Query:
    """A study search where each keyword's value is matched as written: single value
    matching only (PS3.4 C.2.2.2.1), never wildcard, range or list matching, whatever
    characters the value holds (``$merge`` names one patient: lifecycle/update.py).
    The values are compared with the indexes' normalised values: give them as
    :func:`normalize_stored` keeps them (a text stripped of its padding)."""
    matches = tuple(Match(BY_KEYWORD[k], "single", (v,)) for k, v in values.items())
    assert all(m.attribute.level == "study" and m.attribute.kind is Kind.TEXT for m in matches), values
    return Query(level="study", study_uid=None, series_uid=None, matches=matches, includefields=(),
                 include_all=False, fuzzy=False, limit=limit, offset=offset, limited=False)


# --- evaluation (in-memory index) --------------------------------------------------------


@lru_cache(maxsize=1024)
def wildcard_regex(pattern: str) -> re.Pattern[str]:
    """DICOM wildcard (``*`` any run, ``?`` one character, PS3.4 C.2.2.2.4) as an
    anchored regex that cannot backtrack catastrophically.

    The standard library's :func:`fnmatch.translate` (``[`` escaped, since DICOM
    has no character sets) puts every ``*segment`` but the last in an atomic group,
    ``(?>.*?segment)``: each segment is taken at its leftmost place and never
    retried, which is exact for globs. Matching is O(len(pattern) x len(value)),
    bounded by :data:`MAX_VALUE_CHARS` (a naive ``.*`` translation took ~30 s for
    ``*?*?*?*?*?*?*?*?*#``).
    """
    return re.compile(fnmatch.translate(pattern.replace("[", "[[]")))


def fuzzy_tokens(value: str) -> list[str]:
    """Words of a fuzzy PN query: each must start some word of the name."""
    return [t for t in _PN_SPLIT.split(value.replace("*", "").replace("?", "")) if t]


def fuzzy_pn_match(tokens: list[str], stored: str) -> bool:
    """Each token starts some word of ``stored`` (words split at :data:`PN_WORD_SEPARATORS`)."""
    words = _PN_SPLIT.split(stored)
    return all(any(w.startswith(t) for w in words) for t in tokens)


def match_value(match: Match, stored: object, fuzzy: bool = False) -> bool:
    """Does one stored (normalised) value satisfy ``match``? (PS3.4 C.2.2.2)

    ``stored`` is what :func:`normalize_stored` produced; for MULTI attributes it
    is a collection of values.
    """
    t = match.type
    if t == "universal":
        return True
    if stored is None:
        return False
    if t == "sequence":  # stored: the items (sequence_items); one must match every key
        return any(all(match_value(k, item.get(k.attribute.keyword)) for k in match.values)
                   for item in stored)  # type: ignore[union-attr]
    kind = match.attribute.kind
    if kind is Kind.MULTI:
        return any(v in stored for v in match.values)  # type: ignore[operator]
    if t == "single":
        if kind is Kind.PN and fuzzy:
            return fuzzy_pn_match(fuzzy_tokens(match.values[0]), stored)  # type: ignore[arg-type]
        return stored == match.values[0]
    if t == "list":
        return stored in match.values
    if t == "wildcard":
        if kind is Kind.PN and fuzzy:
            return fuzzy_pn_match(fuzzy_tokens(match.values[0]), stored)  # type: ignore[arg-type]
        return wildcard_regex(match.values[0]).match(stored) is not None  # type: ignore[arg-type]
    if t == "range":
        lo, hi = match.values
        s = stored
        if not isinstance(s, str) or not "0" <= s[:1] <= "9":  # as SQL's BETWEEN '0' AND '9'
            return False
        return (lo is None or s >= lo) and (hi is None or s <= hi)
    raise AssertionError(t)

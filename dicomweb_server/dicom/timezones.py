"""UTC offsets of DICOM dates and times: what an offset says and how a date-time moves
to UTC, for the date-time columns the indexes keep beside the values as stored
(attributes.DERIVED) and for queries that carry an offset.

References
----------
PS3.5 §6.2 (DT: optional ``&ZZXX`` suffix, the offset from UTC; DA and TM carry none);
PS3.3 C.12.1.1.8 (Timezone Offset From UTC (0008,0201): the offset of every DA and TM
of the instance, and of every DT without its own suffix; absent, the local time zone
is not known); PS3.4 C.4.1.1.3.1 and PS3.18 §8.3.4.1 (a query's Timezone Offset From
UTC: its date and time values are in that offset).
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timedelta

_OFFSET_RE = re.compile(r"^([+-])(\d{2})(\d{2})$")
#: DT's offset suffix: the last five characters of a value (PS3.5 §6.2)
_SUFFIX_RE = re.compile(r"([+-]\d{4})$")


def parse_offset(text: object) -> int | None:
    """``+hhmm`` / ``-hhmm`` in minutes east of UTC; None when absent or malformed.
    PS3.5 §6.2 bounds an offset to -1200..+1400."""
    m = _OFFSET_RE.match(str(text).strip()) if text is not None else None
    if not m:
        return None
    sign, hh, mm = m.groups()
    minutes = int(hh) * 60 + int(mm)
    if int(mm) >= 60 or not (-12 * 60 <= (minutes if sign == "+" else -minutes) <= 14 * 60):
        return None
    return minutes if sign == "+" else -minutes


def dt_offset(value: str) -> int | None:
    """The offset suffix of a DT value (minutes), None without one. A DT of 4 digits
    and a sign is ambiguous only for a bare year range (``2019-2020``): a year is at
    least 4 digits before it, so the suffix is what follows 8 or more characters."""
    v = value.strip()
    m = _SUFFIX_RE.search(v)
    return parse_offset(m.group(1)) if m and len(v) > 5 else None


def to_utc(value: str, minutes: int) -> str:
    """A fixed-width date-time ``YYYYMMDDHHMMSS.ffffff`` in an offset of ``minutes``,
    moved to UTC. Bounds past a month's last day (``20200231...``, an upper bound of
    ``202002``) are taken as that last day; a value that leaves the years 1-9999 (or
    is not a date-time) is returned unchanged."""
    if minutes == 0:
        return value
    try:
        y, mo = int(value[0:4]), min(max(int(value[4:6]), 1), 12)
        d = min(max(int(value[6:8]), 1), calendar.monthrange(y, mo)[1])
        t = datetime(y, mo, d, int(value[8:10]), int(value[10:12]), min(int(value[12:14]), 59),
                     int(value[15:21] or 0)) - timedelta(minutes=minutes)
    except (ValueError, OverflowError, IndexError, calendar.IllegalMonthError):
        return value
    return f"{t.year:04d}{t.month:02d}{t.day:02d}{t.hour:02d}{t.minute:02d}{t.second:02d}.{t.microsecond:06d}"

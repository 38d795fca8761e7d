"""The Basic Application Level Confidentiality Profile of DICOM PS3.15 Annex E and its
options, as data: Table E.1-1 ("Application Level Confidentiality Profile Attributes")
of PS3.15 **2024b**, every row, kept in ``table_e1_1.json`` beside this module (generated
by ``scripts/gen_deid_table.py``; how it was checked is said there).

Each row: the tag (``"00100010"``; repeating groups as ``"50XXXXXX"``, ``"60XX3000"``,
``"60XX4000"``; ``"private"`` for the row "Private Attributes (gggg,eeee) where gggg is
odd"), the attribute's name, the Basic Profile action and the action of each option
column that names one.

Action codes (PS3.15 Table E.1-1, legend): D replace with a non-zero length dummy value
consistent with the VR; Z replace with a zero length value (or a dummy); X remove;
K keep; C clean (replace with values of similar meaning known not to identify);
U replace a UID with a non-zero length UID, consistently within the set of instances.
Combinations ("X/Z", "X/D", "Z/D", "X/Z/D", "X/Z/U*") leave the choice to what the IOD
needs; without the IOD's attribute types at hand :func:`resolve` takes the choice that
keeps an IOD conformant whatever the attribute's Type is: X/Z -> Z, X/D and Z/D and
X/Z/D -> D, X/Z/U* -> U* (the sequence is kept and the UIDs inside it are replaced, so
that references resolve).

Options (PS3.15 E.3): each option column's action, where the row has one, replaces the
Basic Profile's. Two options naming one row: K (a retain option) wins over C.
Retain Longitudinal Temporal Information With Full Dates and With Modified Dates are
exclusive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("table_e1_1.json")


@dataclass(frozen=True, slots=True)
class Row:
    tag: str  # "00100010", "50XXXXXX", "60XX3000", "60XX4000" or "private"
    name: str
    basic: str  # the Basic Profile column: D, Z, X, U, X/Z, X/D, Z/D, X/Z/D, X/Z/U*
    options: dict[str, str]  # option field name (Options) -> K or C


@dataclass(frozen=True, slots=True)
class Options:
    """The options of PS3.15 E.3 (each a column of Table E.1-1) and their CID 7050 codes
    (PS3.16, De-identification Method, used in (0012,0064))."""

    retain_safe_private: bool = False  # E.3.10, 113111
    retain_uids: bool = False  # E.3.9, 113110
    retain_device_identity: bool = False  # E.3.8, 113109
    retain_institution_identity: bool = False  # E.3.11 (2024b), 113112
    retain_patient_characteristics: bool = False  # E.3.7, 113108
    retain_full_dates: bool = False  # E.3.6, 113106
    retain_modified_dates: bool = False  # E.3.6, 113107
    clean_descriptors: bool = False  # E.3.5, 113105
    clean_structured_content: bool = False  # E.3.4, 113104
    clean_graphics: bool = False  # E.3.3, 113103

    def __post_init__(self) -> None:
        if self.retain_full_dates and self.retain_modified_dates:
            raise ValueError("retain_full_dates and retain_modified_dates are exclusive (PS3.15 E.3.6)")

    def selected(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


#: CID 7050 (PS3.16 2024b) "De-identification Method": the profile and each option
BASIC_PROFILE_CODE = ("113100", "Basic Application Confidentiality Profile")
OPTION_CODES: dict[str, tuple[str, str]] = {
    "clean_graphics": ("113103", "Clean Graphics Option"),
    "clean_structured_content": ("113104", "Clean Structured Content Option"),
    "clean_descriptors": ("113105", "Clean Descriptors Option"),
    "retain_full_dates": ("113106", "Retain Longitudinal Temporal Information Full Dates Option"),
    "retain_modified_dates": ("113107", "Retain Longitudinal Temporal Information Modified Dates Option"),
    "retain_patient_characteristics": ("113108", "Retain Patient Characteristics Option"),
    "retain_device_identity": ("113109", "Retain Device Identity Option"),
    "retain_uids": ("113110", "Retain UIDs Option"),
    "retain_safe_private": ("113111", "Retain Safe Private Option"),
    "retain_institution_identity": ("113112", "Retain Institution Identity Option"),
}
OPTION_NAMES = tuple(OPTION_CODES)

#: profile names accepted by ``--deidentify`` and a destination's ``deidentify``
PROFILES = ("basic",)


def parse(spec: str, extra: list[str] | tuple[str, ...] = ()) -> Options:
    """``"basic"`` or ``"basic,retain_modified_dates,clean_descriptors"`` (and ``extra``
    option names) -> :class:`Options`; ValueError naming what is wrong."""
    name, *opts = [p.strip() for p in spec.split(",") if p.strip()] or [""]
    if name not in PROFILES:
        raise ValueError(f"unknown de-identification profile {name!r}; known: {', '.join(PROFILES)}")
    chosen = {}
    for o in [*opts, *extra]:
        o = o.replace("-", "_")
        if o not in OPTION_CODES:
            raise ValueError(f"unknown de-identification option {o!r}; known: {', '.join(OPTION_NAMES)}")
        chosen[o] = True
    return Options(**chosen)


@lru_cache(maxsize=1)
def table() -> dict[str, Row]:
    """Table E.1-1 by tag (``"00100010"``, ``"60XX3000"``, ``"private"``...)."""
    doc = json.loads(TABLE_FILE.read_text())
    return {r[0]: Row(r[0], r[1], r[2], r[3]) for r in doc["rows"]}


@lru_cache(maxsize=1)
def edition() -> str:
    return json.loads(TABLE_FILE.read_text())["edition"]


def row_for(tag: int) -> Row | None:
    """The row governing a (public) tag: exact, or its repeating group (curves 50xx,
    overlays 60xx: even groups only)."""
    t = table()
    hit = t.get(f"{tag:08X}")
    if hit is not None:
        return hit
    group, elem = tag >> 16, tag & 0xFFFF
    if 0x5000 <= group <= 0x50FF and group % 2 == 0:
        return t["50XXXXXX"]
    if 0x6000 <= group <= 0x60FF and group % 2 == 0 and elem in (0x3000, 0x4000):
        return t[f"60XX{elem:04X}"]
    return None


_COMBINATIONS = {"X/Z": "Z", "X/D": "D", "Z/D": "D", "X/Z/D": "D", "X/Z/U*": "U*"}


def resolve(row: Row, options: Options) -> str:
    """The one action for ``row`` under ``options``: K, C, D, Z, X, U or U* (keep the
    sequence, replace the UIDs in it). See the module's docstring for the rules."""
    acts = [row.options[o] for o in OPTION_NAMES if getattr(options, o) and o in row.options]
    if "K" in acts:
        return "K"
    if "C" in acts:
        return "C"
    return _COMBINATIONS.get(row.basic, row.basic)

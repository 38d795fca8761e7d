"""Human-readable tables of QIDO-RS results for the ``dicomweb`` command line.

Each level has its columns (PS3.18 Section 10.6.3, Tables 10.6.3-3 to -5 for
the attributes a server returns); values are read from DICOM JSON (PS3.18
Annex F) and shortened for a terminal, except UIDs, which are printed whole
so they can be copied into the next command.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["COLUMNS", "INCLUDE_FIELDS", "format_table"]


def _values(ds: dict, tag: str) -> list:
    return (ds.get(tag) or {}).get("Value") or []


def _text(tag: str) -> Callable[[dict], str]:
    return lambda ds: ", ".join(str(v) for v in _values(ds, tag))


def _person(tag: str) -> Callable[[dict], str]:
    """PN as "Family, Given" (the Alphabetic group, PS3.18 F.2.2)."""

    def get(ds: dict) -> str:
        names = []
        for v in _values(ds, tag):
            alphabetic = v.get("Alphabetic", "") if isinstance(v, dict) else str(v)
            family, _, rest = alphabetic.partition("^")
            names.append(family + (", " + " ".join(p for p in rest.split("^") if p) if rest.strip("^") else ""))
        return "; ".join(names)

    return get


def _date(tag: str) -> Callable[[dict], str]:
    def get(ds: dict) -> str:
        v = "".join(str(x) for x in _values(ds, tag)[:1])
        return f"{v[:4]}-{v[4:6]}-{v[6:8]}" if len(v) == 8 and v.isdigit() else v

    return get


def _patient(ds: dict) -> str:
    name, pid = _person("00100010")(ds), _text("00100020")(ds)
    return f"{name} ({pid})" if name and pid else name or pid


def _sop_class(ds: dict) -> str:
    from pydicom.uid import UID

    uid = "".join(str(v) for v in _values(ds, "00080016")[:1])
    name = UID(uid).name if uid else ""
    return name if name and name != uid else uid


def _size(ds: dict) -> str:
    rows, cols = _text("00280010")(ds), _text("00280011")(ds)
    frames = _text("00280008")(ds)
    size = f"{cols}x{rows}" if rows and cols else ""
    return f"{size} x{frames}" if frames and frames != "1" else size


Column = tuple[str, Callable[[dict], str], int]  # heading, value, maximum width (0: never cut)

#: Columns of each search level.
COLUMNS: dict[str, list[Column]] = {
    "studies": [
        ("Patient", _patient, 32),
        ("Date", _date("00080020"), 10),
        ("Modalities", lambda ds: "/".join(str(v) for v in _values(ds, "00080061")), 12),
        ("Description", _text("00081030"), 32),
        ("Series", _text("00201206"), 6),
        ("Instances", _text("00201208"), 9),
        ("StudyInstanceUID", _text("0020000D"), 0),
    ],
    "series": [
        ("Modality", _text("00080060"), 8),
        ("Number", _text("00200011"), 6),
        ("Description", _text("0008103E"), 32),
        ("Instances", _text("00201209"), 9),
        ("SeriesInstanceUID", _text("0020000E"), 0),
    ],
    "instances": [
        ("Number", _text("00200013"), 6),
        ("SOP Class", _sop_class, 32),
        ("Size", _size, 14),
        ("SOPInstanceUID", _text("00080018"), 0),
    ],
}

#: includefield values a table needs beyond the attributes servers return by default.
INCLUDE_FIELDS: dict[str, list[str]] = {
    "studies": ["StudyDescription", "NumberOfStudyRelatedSeries", "NumberOfStudyRelatedInstances"],
    "series": ["SeriesDescription", "NumberOfSeriesRelatedInstances"],
    "instances": ["Rows", "Columns", "NumberOfFrames"],
}


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())  # no line breaks inside a cell
    return text if not width or len(text) <= width else text[: width - 1] + "…"


def _extra_column(field: str) -> Column:
    """A column for an includefield given by keyword or tag (``AccessionNumber``, ``00080050``)."""
    from pydicom.datadict import tag_for_keyword

    tag = tag_for_keyword(field)
    key = f"{tag:08X}" if tag is not None else field.upper()
    return (field, _text(key), 32)


def format_table(results: Sequence[dict], level: str, extra: Sequence[str] = ()) -> str:
    """The results of a search at ``level`` (``studies``, ``series``, ``instances``) as
    aligned text columns, ending with a count line. ``extra``: more attributes (keywords
    or tags, e.g. the ``--field`` values), one column each before the UID."""
    columns = COLUMNS[level][:-1] + [_extra_column(f) for f in extra] + COLUMNS[level][-1:]
    rows = [[heading for heading, _, _ in columns]]
    rows += [[_cut(get(ds), width) for _, get, width in columns] for ds in results]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    noun = level if len(results) != 1 else {"studies": "study", "series": "series", "instances": "instance"}[level]
    return "\n".join(lines + [f"{len(results)} {noun}"]) + "\n"

"""The rejected instances (IHE RAD TF-3 Instance Availability / IOCM; PS3.4 Annex KK):
one row per SOP Instance UID a rejection note names, in the index's database (the
in-memory index's journal), written in the transaction that hides the instances.

A rejected instance that is stored has no row in the study/series/instance tables any
more: its row here keeps its file's path (``_path``), so that every search and
retrieve on every front door (which read only those tables) leaves it out, and the
study's and series' computed attributes are recomputed without it by the same code as
a DELETE. An instance rejected before it arrives has ``_path`` NULL: when it arrives it
is filed here, not in the searchable tables (IOCM: the rejection stays in force).

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

from dataclasses import dataclass

from .changes import Execute

_COLS = "SOPInstanceUID, StudyInstanceUID, SeriesInstanceUID, code, _time, _path"


def sqlite_schema() -> str:
    return """
CREATE TABLE IF NOT EXISTS rejection (
  SOPInstanceUID TEXT PRIMARY KEY,
  StudyInstanceUID TEXT NOT NULL,
  SeriesInstanceUID TEXT NOT NULL,
  code TEXT NOT NULL,
  _time REAL NOT NULL,
  _path TEXT
);
CREATE INDEX IF NOT EXISTS rejection_study ON rejection(StudyInstanceUID);
CREATE INDEX IF NOT EXISTS rejection_time ON rejection(_time);
"""


def postgresql_schema() -> list[str]:
    """The table in PostgreSQL (schema version 8, store/postgresql.py)."""
    text = 'TEXT COLLATE "C"'
    return [f"""
CREATE TABLE IF NOT EXISTS rejection (
  SOPInstanceUID {text} PRIMARY KEY,
  StudyInstanceUID {text} NOT NULL,
  SeriesInstanceUID {text} NOT NULL,
  code TEXT NOT NULL,
  _time DOUBLE PRECISION NOT NULL,
  _path TEXT
)""", "CREATE INDEX IF NOT EXISTS rejection_study ON rejection(StudyInstanceUID)",
        "CREATE INDEX IF NOT EXISTS rejection_time ON rejection(_time)"]


@dataclass(frozen=True, slots=True)
class Rejection:
    """A rejected instance: its UIDs, the rejection note title (``code^scheme``), when,
    and its file (None: not stored yet)."""

    sop_uid: str
    study_uid: str
    series_uid: str
    code: str
    timestamp: float
    path: str | None

    def entry(self) -> dict:
        return {"StudyInstanceUID": self.study_uid, "SeriesInstanceUID": self.series_uid,
                "SOPInstanceUID": self.sop_uid, "Reason": self.code, "Time": self.timestamp,
                "Stored": self.path is not None}


def record(x: Execute, refs: list[tuple[str, str, str, str | None]], code: str, now: float) -> int:
    """Rows for (study, series, sop, path) not rejected yet; returns how many were new."""
    n = 0
    for study, series, sop, path in refs:
        if x("SELECT 1 FROM rejection WHERE SOPInstanceUID = ?", (sop,)).fetchone() is None:
            x(f"INSERT INTO rejection ({_COLS}) VALUES (?, ?, ?, ?, ?, ?)", (sop, study, series, code, now, path))
            n += 1
    return n


#: an SQL expression (one ``?``: the SOP Instance UID), true when the instance is rejected:
#: for a query that asks it with other things (store/sql.py, one statement per instance)
REJECTED = "EXISTS (SELECT 1 FROM rejection WHERE SOPInstanceUID = ?)"


def is_rejected(x: Execute, sop: str) -> bool:
    return x("SELECT 1 FROM rejection WHERE SOPInstanceUID = ?", (sop,)).fetchone() is not None


def arrived(x: Execute, sop: str, path: str) -> None:
    """A rejected instance stored after its rejection: its file is kept here."""
    x("UPDATE rejection SET _path = ? WHERE SOPInstanceUID = ?", (path, sop))


def select(x: Execute, study: str | None = None, series: str | None = None,
           before: float | None = None) -> list[Rejection]:
    where, params = ["1 = 1"], []
    if study is not None:
        where.append("StudyInstanceUID = ?")
        params.append(study)
    if series is not None:
        where.append("SeriesInstanceUID = ?")
        params.append(series)
    if before is not None:
        where.append("_time < ?")
        params.append(before)
    rows = x(f"SELECT {_COLS} FROM rejection WHERE {' AND '.join(where)} ORDER BY _time, SOPInstanceUID",
             params).fetchall()
    return [Rejection(*r) for r in rows]


def drop(x: Execute, rows: list[Rejection]) -> None:
    forget(x, [r.sop_uid for r in rows])


def forget(x: Execute, sops: list[str]) -> None:
    """Drop the rows of these SOP Instance UIDs (none: nothing): the instances a restore
    indexed again, in the transaction that indexes them (store/sql.py, store/memory.py)."""
    for sop in sops:
        x("DELETE FROM rejection WHERE SOPInstanceUID = ?", (sop,))


def paths(x: Execute) -> list[tuple[str, str]]:
    return [tuple(r) for r in x("SELECT SOPInstanceUID, _path FROM rejection WHERE _path IS NOT NULL", ()).fetchall()]

"""The worklist table (scheduled procedure steps, dicom/worklist.py): one row per entry,
its whole DICOM JSON and the key columns the index filters on first; in the index's
database (SQLite, PostgreSQL schema version 10) or the in-memory index's journal.

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

import time

import orjson

from ..dicom.worklist import SPS_SEQUENCE, Entry
from .changes import Execute

SPS_STATUS = "00400020"  # Scheduled Procedure Step Status

_KEYS = ("StudyInstanceUID", "AccessionNumber", "PatientID", "Modality", "ScheduledStationAETitle", "StartDate")
_COLS = "ScheduledProcedureStepID, " + ", ".join(_KEYS) + ", _json, _time"


def sqlite_schema() -> str:
    return """
CREATE TABLE IF NOT EXISTS worklist (
  ScheduledProcedureStepID TEXT PRIMARY KEY,
""" + "".join(f"  {k} TEXT,\n" for k in _KEYS) + """  _json TEXT NOT NULL,
  _time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS worklist_station ON worklist(ScheduledStationAETitle, StartDate);
CREATE INDEX IF NOT EXISTS worklist_date ON worklist(StartDate);
CREATE INDEX IF NOT EXISTS worklist_patient ON worklist(PatientID);
"""


def postgresql_schema() -> list[str]:
    """The table in PostgreSQL (schema version 10, store/postgresql.py)."""
    text = 'TEXT COLLATE "C"'
    return [f"""
CREATE TABLE IF NOT EXISTS worklist (
  ScheduledProcedureStepID {text} PRIMARY KEY,
""" + "".join(f"  {k} {text},\n" for k in _KEYS) + """  _json TEXT NOT NULL,
  _time DOUBLE PRECISION NOT NULL
)""", "CREATE INDEX IF NOT EXISTS worklist_station ON worklist(ScheduledStationAETitle, StartDate)",
            "CREATE INDEX IF NOT EXISTS worklist_date ON worklist(StartDate)",
            "CREATE INDEX IF NOT EXISTS worklist_patient ON worklist(PatientID)"]


def put(x: Execute, entries: list[Entry]) -> None:
    """Add the entries, replacing those with the same Scheduled Procedure Step ID."""
    now = time.time()
    for i, e in enumerate(entries):  # (_time: the order they are listed in, a batch in its order)
        x("DELETE FROM worklist WHERE ScheduledProcedureStepID = ?", (e.sps_id,))
        x(f"INSERT INTO worklist ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
          (e.sps_id, e.study_uid, e.accession, e.patient_id, e.modality, e.station_ae, e.start_date,
           orjson.dumps(e.json).decode(), now + i * 1e-6))


def select(x: Execute, prefilter: dict[str, tuple]) -> list[dict]:
    """The entries the prefilter (dicom/worklist.py ``prefilter``) lets through, in the
    order they were added. A column without a value (absent or multi-valued) always
    passes: the caller matches every key on the JSON."""
    where, params = ["1 = 1"], []
    for column, how in prefilter.items():
        if column not in _KEYS:
            continue
        if how[0] == "eq":
            where.append(f"({column} IS NULL OR {column} = ?)")
            params.append(how[1])
        elif how[0] == "range":
            if how[1] is not None:
                where.append(f"({column} IS NULL OR {column} >= ?)")
                params.append(how[1])
            if how[2] is not None:
                where.append(f"({column} IS NULL OR {column} <= ?)")
                params.append(how[2])
    rows = x(f"SELECT _json FROM worklist WHERE {' AND '.join(where)} ORDER BY _time, ScheduledProcedureStepID",
             params).fetchall()
    return [orjson.loads(r[0]) for r in rows]


def get(x: Execute, sps_id: str) -> dict | None:
    row = x("SELECT _json FROM worklist WHERE ScheduledProcedureStepID = ?", (sps_id,)).fetchone()
    return orjson.loads(row[0]) if row else None


def drop(x: Execute, sps_id: str) -> bool:
    return x("DELETE FROM worklist WHERE ScheduledProcedureStepID = ?", (sps_id,)).rowcount > 0


def set_status(x: Execute, sps_id: str, status: str) -> bool:
    """Set the Scheduled Procedure Step Status (0040,0020) of the entry's first Scheduled
    Procedure Step Sequence item (the one its ID is), keeping its place in the order;
    False when there is no such entry."""
    entry = get(x, sps_id)
    if entry is None:
        return False
    entry[SPS_SEQUENCE]["Value"][0][SPS_STATUS] = {"vr": "CS", "Value": [status]}
    x("UPDATE worklist SET _json = ? WHERE ScheduledProcedureStepID = ?", (orjson.dumps(entry).decode(), sps_id))
    return True

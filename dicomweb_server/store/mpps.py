"""The ``mpps`` table: the Modality Performed Procedure Step instances (PS3.4 Annex F;
dicom/mpps.py, dimse/mpps.py), one row per SOP Instance UID with its DICOM JSON; in the
index's database (SQLite, PostgreSQL schema version 15) or the in-memory index's journal.

An N-CREATE or N-SET is one transaction of the index (:func:`create`, :func:`modify`): the
row, the status of the worklist entries the step names (their Scheduled Procedure Step
Status, store/worklist.py) and, once the step is COMPLETED, the instances its Performed
Series Sequence lists as a sender's declaration (store/arrivals.py: the operator's study
page counts them as it counts those of a storage commitment request).

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

import orjson

from ..dicom import mpps
from . import arrivals
from . import worklist as worklist_table
from .changes import Execute

_COLS = "SOPInstanceUID, PerformedProcedureStepStatus, requester, _json, _created, _updated"


def sqlite_schema() -> str:
    return """
CREATE TABLE IF NOT EXISTS mpps (
  SOPInstanceUID TEXT PRIMARY KEY,
  PerformedProcedureStepStatus TEXT NOT NULL,
  requester TEXT NOT NULL,
  _json TEXT NOT NULL,
  _created REAL NOT NULL,
  _updated REAL NOT NULL
);
"""


def postgresql_schema() -> list[str]:
    """Schema version 15 (store/postgresql.py)."""
    return ["""
CREATE TABLE IF NOT EXISTS mpps (
  SOPInstanceUID TEXT COLLATE "C" PRIMARY KEY,
  PerformedProcedureStepStatus TEXT NOT NULL,
  requester TEXT NOT NULL,
  _json TEXT NOT NULL,
  _created DOUBLE PRECISION NOT NULL,
  _updated DOUBLE PRECISION NOT NULL
)"""]


def get(x: Execute, sop_uid: str) -> dict | None:
    row = x("SELECT _json FROM mpps WHERE SOPInstanceUID = ?", (sop_uid,)).fetchone()
    return orjson.loads(row[0]) if row else None


def known(x: Execute, sop_uids: list[str]) -> set[str]:
    """Those of ``sop_uids`` that are performed procedure steps (the others: storage
    commitment Transaction UIDs, arrivals.py)."""
    return {u for u in sop_uids if x("SELECT 1 FROM mpps WHERE SOPInstanceUID = ?", (u,)).fetchone()}


def create(x: Execute, sop_uid: str, requester: str, attributes: dict, now: float) -> mpps.Performed:
    """An N-CREATE: a new row (:class:`mpps.MppsError` 0x0111 when the UID exists)."""
    step = mpps.create(attributes)
    if get(x, sop_uid) is not None:
        raise mpps.MppsError(mpps.DUPLICATE_SOP_INSTANCE, f"Performed Procedure Step {sop_uid} exists")
    x(f"INSERT INTO mpps ({_COLS}) VALUES (?, ?, ?, ?, ?, ?)",
      (sop_uid, step.status, requester, orjson.dumps(step.doc).decode(), now, now))
    _follow(x, sop_uid, requester, step, now)
    return step


def modify(x: Execute, sop_uid: str, requester: str, changes: dict, now: float) -> mpps.Performed:
    """An N-SET (:class:`mpps.MppsError` 0x0112 when there is no such instance)."""
    stored = get(x, sop_uid)
    if stored is None:
        raise mpps.MppsError(mpps.NO_SUCH_OBJECT_INSTANCE, f"no Performed Procedure Step {sop_uid}")
    step = mpps.modify(stored, changes)
    x("UPDATE mpps SET PerformedProcedureStepStatus = ?, _json = ?, _updated = ? WHERE SOPInstanceUID = ?",
      (step.status, orjson.dumps(step.doc).decode(), now, sop_uid))
    _follow(x, sop_uid, requester, step, now)
    return step


def _follow(x: Execute, sop_uid: str, requester: str, step: mpps.Performed, now: float) -> None:
    """The step's worklist entries take its status; a completed step's instances are declared."""
    for sps_id in step.sps_ids:
        worklist_table.set_status(x, sps_id, mpps.WORKLIST_STATUS[step.status])
    if step.status == mpps.COMPLETED and step.references:
        arrivals.declare(x, sop_uid, requester, step.references, now)

"""The change log: one row per instance per change, appended by the index inside the
transaction that makes the change (store/sql.py for SQLite and PostgreSQL, store/memory.py
for the in-memory index's journal), read by the change feed (api/changefeed.py) and
the webhooks (routing/webhook.py).

A row: ``seq`` (the Sequence: 1, 2, 3, ... with no gap, never reused, never removed),
``_time`` (when, seconds since the epoch, UTC), ``action`` (create | update | delete |
reject | restore | label), ``state`` (the instance's *current* state as this row's life of it
ends or goes on: current | replaced | deleted | rejected), the three UIDs, ``version``
(1 for an instance's first create; each later create of the same SOP Instance UID, once
the earlier one was deleted, is the next version; a delete carries the version it
removed). The field names and meanings are those of the change feed of Microsoft's
dicom-server (docs/changes.md). ``update`` and ``restore`` (lifecycle/update.py) make a new
version current: the version after the latest logged, the earlier rows of the instance
marked ``replaced``. ``reject`` (state rejected, the earlier current rows too) hides the
instance's version (lifecycle/reject.py, issue 27); a ``restore`` right after a reject
shows that same version again (state current; the earlier rows stay rejected).

Gapless to readers. A reader that has seen Sequence N must never later meet a row with
a lower Sequence: so sequence numbers are handed out in commit order.
- SQLite: every write transaction is serial (``BEGIN IMMEDIATE``); ``seq`` is
  max + 1 inside it.
- PostgreSQL: :func:`append` first takes a transaction advisory lock
  (:data:`CHANGES_LOCK`), then reads max + 1; the lock is held until the commit, so
  the transaction that holds Sequence N commits (or rolls back, freeing N) before any
  other can take N + 1: the change-log appends of all nodes are serialised from the
  append to the commit (only that part: the instance inserts before it run in parallel).
- Memory: under the index's lock, in one SQLite transaction of its journal file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..access.filter import UNRESTRICTED, Filter
from .labels import label_condition

ACTIONS = ("create", "update", "delete", "reject", "restore", "label")
STATES = ("current", "replaced", "deleted", "rejected")

#: pg_advisory_xact_lock key serialising change-log appends across nodes ("DCMC")
CHANGES_LOCK = 0x44434D43

_COLS = "seq, _time, action, state, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, version"


def sqlite_schema() -> str:
    """The table in SQLite (index.sqlite, or the in-memory index's journal)."""
    return """
CREATE TABLE IF NOT EXISTS changelog (
  seq INTEGER PRIMARY KEY,
  _time REAL NOT NULL,
  action TEXT NOT NULL,
  state TEXT NOT NULL,
  StudyInstanceUID TEXT NOT NULL,
  SeriesInstanceUID TEXT NOT NULL,
  SOPInstanceUID TEXT NOT NULL,
  version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS changelog_sop ON changelog(SOPInstanceUID);
CREATE INDEX IF NOT EXISTS changelog_time ON changelog(_time);
"""


def postgresql_schema() -> list[str]:
    """The table in PostgreSQL (schema version 5, store/postgresql.py)."""
    text = 'TEXT COLLATE "C"'
    return [f"""
CREATE TABLE changelog (
  seq BIGINT PRIMARY KEY,
  _time DOUBLE PRECISION NOT NULL,
  action TEXT NOT NULL,
  state TEXT NOT NULL,
  StudyInstanceUID {text} NOT NULL,
  SeriesInstanceUID {text} NOT NULL,
  SOPInstanceUID {text} NOT NULL,
  version INTEGER NOT NULL
)""", "CREATE INDEX changelog_sop ON changelog(SOPInstanceUID)",
        "CREATE INDEX changelog_time ON changelog(_time)"]


@dataclass(frozen=True, slots=True)
class Change:
    """One row of the change log."""

    sequence: int
    timestamp: float  # seconds since the epoch (UTC)
    action: str
    state: str
    study_uid: str
    series_uid: str
    sop_uid: str
    version: int

    def entry(self, metadata: object = None, include_metadata: bool = False) -> dict:
        """The change feed entry (field names of Microsoft dicom-server's ChangeFeedEntry);
        ``Metadata`` only when asked for (its DICOM JSON, or null when the instance is
        not current)."""
        out = {"Sequence": self.sequence, "StudyInstanceUid": self.study_uid,
               "SeriesInstanceUid": self.series_uid, "SopInstanceUid": self.sop_uid,
               "Action": self.action, "Timestamp": iso(self.timestamp), "State": self.state}
        if include_metadata:
            out["Metadata"] = metadata
        return out


def iso(t: float) -> str:
    """UTC time as ISO 8601 with microseconds and ``Z``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Each function takes ``x(sql, params)`` -> cursor: the caller's connection in its
# transaction, statements written with ``?`` (the caller translates placeholders).
Execute = Callable[[str, "list | tuple"], object]


def append(x: Execute, now: float | None, action: str, instances: Iterable[tuple[str, str, str]],
           postgresql: bool = False) -> list[Change]:
    """Append one row per instance (study, series, SOP Instance UID) for ``action``,
    in the caller's transaction; returns the rows. ``now`` None: the database's clock
    (PostgreSQL). A delete also marks the instance's earlier rows ``deleted`` (its
    state is always the current one). A create of an instance whose latest row is
    already a current create is not repeated (the in-memory index re-adds every
    instance at start-up)."""
    assert action in ACTIONS
    instances = list(instances)
    if not instances:
        return []
    if postgresql:
        x("SELECT pg_advisory_xact_lock(?)", (CHANGES_LOCK,))
        now = x("SELECT extract(epoch FROM clock_timestamp())::float8", ()).fetchone()[0]
    assert now is not None
    seq = x("SELECT coalesce(max(seq), 0) FROM changelog", ()).fetchone()[0]
    out: list[Change] = []
    for study, series, sop in instances:
        last = x("SELECT action, state, version FROM changelog WHERE SOPInstanceUID = ? ORDER BY seq DESC LIMIT 1",
                 (sop,)).fetchone()
        if action == "label":  # a label of its study put or taken away (store/labels.py): the
            # instance's version and state go on; its earlier rows are left as they are
            version = last[2] if last is not None else 1
            state = last[1] if last is not None else "current"
        elif action == "create":
            if last is not None and last[1] == "current":  # (a create, or an update's version)
                continue
            version = last[2] + 1 if last is not None else 1
            state = "current"
        elif action == "reject" or (action == "restore" and (last is None or last[1] == "rejected")):
            # the same version, hidden or shown again (lifecycle/reject.py)
            version = last[2] if last is not None else 1
            state = "rejected" if action == "reject" else "current"
            if action == "reject":  # (a restore leaves the earlier rows rejected: its own is current)
                x("UPDATE changelog SET state = 'rejected' WHERE SOPInstanceUID = ? AND state = 'current'", (sop,))
        elif action in ("update", "restore"):  # a new version: the earlier ones are replaced
            version = last[2] + 1 if last is not None else 2
            state = "current"
            x("UPDATE changelog SET state = 'replaced' WHERE SOPInstanceUID = ? AND state = 'current'", (sop,))
        else:  # delete
            version = last[2] if last is not None else 1
            state = "deleted"
            x("UPDATE changelog SET state = 'deleted' WHERE SOPInstanceUID = ? AND state != 'deleted'", (sop,))
        seq += 1
        x(f"INSERT INTO changelog ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
          (seq, now, action, state, study, series, sop, version))
        out.append(Change(seq, now, action, state, study, series, sop, version))
    return out


def now() -> float:
    return time.time()


def read(x: Execute, after: int = 0, limit: int = 10, start: float | None = None, end: float | None = None,
         skip: int = 0, allowed: Filter = UNRESTRICTED) -> list[Change]:
    """Rows with Sequence > ``after``, ``start`` <= time < ``end``, of the studies ``allowed``
    lets through (their labels now: store/labels.py), in Sequence order, the first ``skip``
    left out, at most ``limit``."""
    where, params = ["seq > ?"], [after]
    conds, label_params = label_condition(allowed, "changelog")
    where += conds
    params += label_params
    if start is not None:
        where.append("_time >= ?")
        params.append(start)
    if end is not None:
        where.append("_time < ?")
        params.append(end)
    rows = x(f"SELECT {_COLS} FROM changelog WHERE {' AND '.join(where)} ORDER BY seq LIMIT ? OFFSET ?",
             (*params, limit, skip)).fetchall()
    return [Change(*r) for r in rows]


def latest(x: Execute, allowed: Filter = UNRESTRICTED) -> Change | None:
    conds, params = label_condition(allowed, "changelog")
    where = f"WHERE {' AND '.join(conds)} " if conds else ""
    row = x(f"SELECT {_COLS} FROM changelog {where}ORDER BY seq DESC LIMIT 1", params).fetchone()
    return Change(*row) if row else None


def current(x: Execute) -> list[tuple[str, str, str]]:
    """(study, series, SOP Instance UID) of every instance whose latest row is current (a
    create, the version an update or restore made, or a version shown again after its
    rejection)."""
    return [tuple(r) for r in x("SELECT StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID FROM changelog "
                                "WHERE state = 'current' AND action != 'label' ORDER BY seq", ()).fetchall()]


def last(x: Execute, sop_uid: str) -> tuple[str, str, int] | None:
    """(action, state, version) of the instance's latest row, None when never logged;
    action is that of the row that made the version (create, update or restore), so a
    reject, or a restore that showed a rejected version again, names the file kept."""
    row = x("SELECT action, state, version FROM changelog WHERE SOPInstanceUID = ? ORDER BY seq DESC LIMIT 1",
            (sop_uid,)).fetchone()
    if row is None:
        return None
    made = x("SELECT action FROM changelog WHERE SOPInstanceUID = ? AND version = ? "
             "AND action IN ('create', 'update', 'restore') ORDER BY seq LIMIT 1", (sop_uid, row[2])).fetchone()
    return (made[0] if made else row[0], row[1], row[2])


def received(x: Execute, study_uid: str | None = None) -> dict[str, tuple[float, float]]:
    """Per study (or one study): when the first and the latest of its current instance
    versions arrived (the times of their current rows: a create, or the update or restore
    that made the version; a label put or taken away is not an arrival). Retention's arrival
    times (policy/retention.py), the operator's page (arrivals.py)."""
    where, params = ("AND StudyInstanceUID = ? ", (study_uid,)) if study_uid is not None else ("", ())
    rows = x("SELECT StudyInstanceUID, min(_time), max(_time) FROM changelog WHERE state = 'current' "
             "AND action != 'label' "
             + where + "GROUP BY StudyInstanceUID", params).fetchall()
    return {r[0]: (float(r[1]), float(r[2])) for r in rows}


def history(x: Execute, sop_uid: str) -> list[Change]:
    """Every row of one instance, in Sequence order."""
    return [Change(*r) for r in x(f"SELECT {_COLS} FROM changelog WHERE SOPInstanceUID = ? ORDER BY seq",
                                  (sop_uid,)).fetchall()]


def backfill(x: Execute, now: float) -> int:
    """An index that held instances before it had a change log: one create per
    instance (at ``now``: when each arrived is not known), in arrival order, so that a
    consumer reading the feed from the start meets every instance. Only into an
    empty change log."""
    if x("SELECT 1 FROM changelog LIMIT 1", ()).fetchone() is not None:
        return 0
    return x(f"INSERT INTO changelog ({_COLS}) SELECT row_number() OVER (ORDER BY i.pk), ?, 'create', 'current', "
             "s.StudyInstanceUID, se.SeriesInstanceUID, i.SOPInstanceUID, 1 FROM instance i "
             "JOIN series se ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk", (now,)).rowcount

"""What arrived, and what a sender declared would: the index's side of the operator's
study page (dicomweb_server/arrivals.py, docs/notes/sources.md).

- :class:`Arrived`: one (series, source) group of a study's stored instances, with their
  count and the sizes of their stored files summed (Index.arrived).
- The ``commitment_reference`` table: the instances each Storage Commitment request
  named (PS3.4 J.3.2, its Referenced SOP Sequence; dimse/commitment.py), kept so that the
  study page can say "arrived N of declared M" and name the missing ones. In the index's
  database (SQLite, PostgreSQL schema version 14) or the in-memory index's journal.
- The ``instance_source`` table of the in-memory index's journal: the source of each
  instance it holds, so that a restart (which indexes the files again) keeps it.

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .changes import Execute

#: SOP Instance UIDs per ``IN (...)`` of a look-up (well under SQLite's 32766 variables)
CHUNK = 500


@dataclass(frozen=True, slots=True)
class Arrived:
    """The stored instances of one series that came from one source."""

    series_uid: str
    source: str  # "" when not known (stored before sources were kept, or restored from a rejection)
    instances: int
    bytes: int  # the sizes of their stored files (or objects), summed


@dataclass(frozen=True, slots=True)
class Declared:
    """One instance a Storage Commitment request named."""

    transaction_uid: str
    requester: str  # the calling AE title of the request's association
    time: float  # when the request arrived (seconds since the epoch)
    sop_class_uid: str
    sop_uid: str


def sqlite_schema() -> str:
    return """
CREATE TABLE IF NOT EXISTS commitment_reference (
  TransactionUID TEXT NOT NULL,
  SOPInstanceUID TEXT NOT NULL,
  SOPClassUID TEXT NOT NULL,
  requester TEXT NOT NULL,
  _time REAL NOT NULL,
  PRIMARY KEY (TransactionUID, SOPInstanceUID)
);
CREATE INDEX IF NOT EXISTS commitment_reference_sop ON commitment_reference(SOPInstanceUID);
"""


def journal_schema() -> str:
    """The in-memory index's journal: the table above and the instances' sources."""
    return sqlite_schema() + """
CREATE TABLE IF NOT EXISTS instance_source (
  SOPInstanceUID TEXT PRIMARY KEY,
  source TEXT NOT NULL
);
"""


def postgresql_schema() -> list[str]:
    """Schema version 14 (store/postgresql.py): the table, and the instances' source column."""
    text = 'TEXT COLLATE "C"'
    return [f"""
CREATE TABLE IF NOT EXISTS commitment_reference (
  TransactionUID {text} NOT NULL,
  SOPInstanceUID {text} NOT NULL,
  SOPClassUID TEXT NOT NULL,
  requester TEXT NOT NULL,
  _time DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (TransactionUID, SOPInstanceUID)
)""", "CREATE INDEX IF NOT EXISTS commitment_reference_sop ON commitment_reference(SOPInstanceUID)",
            "ALTER TABLE instance ADD COLUMN IF NOT EXISTS _source TEXT NOT NULL DEFAULT ''"]


def declare(x: Execute, transaction_uid: str, requester: str, refs: list[tuple[str, str]], now: float) -> None:
    """Keep the (SOP Class, SOP Instance UID) pairs of one request; a request repeated with
    the same Transaction UID adds only the instances it did not name before."""
    for cls, sop in dict((sop, (cls, sop)) for cls, sop in refs).values():
        if x("SELECT 1 FROM commitment_reference WHERE TransactionUID = ? AND SOPInstanceUID = ?",
             (transaction_uid, sop)).fetchone() is None:
            x("INSERT INTO commitment_reference (TransactionUID, SOPInstanceUID, SOPClassUID, requester, _time) "
              "VALUES (?, ?, ?, ?, ?)", (transaction_uid, sop, cls, requester, now))


def declarations(x: Execute, sop_uids: Iterable[str]) -> list[Declared]:
    """Every instance named by the requests that named any of ``sop_uids`` (the missing ones
    of those requests too), oldest first, then by SOP Instance UID."""
    sop_uids = list(sop_uids)
    transactions: set[str] = set()
    for i in range(0, len(sop_uids), CHUNK):
        chunk = sop_uids[i:i + CHUNK]
        transactions.update(t for (t,) in x(
            "SELECT DISTINCT TransactionUID FROM commitment_reference WHERE SOPInstanceUID IN ("
            + ",".join("?" * len(chunk)) + ")", chunk).fetchall())
    out: list[Declared] = []
    for t in sorted(transactions):
        out += [Declared(*row) for row in x(
            "SELECT TransactionUID, requester, _time, SOPClassUID, SOPInstanceUID FROM commitment_reference "
            "WHERE TransactionUID = ? ORDER BY _time, SOPInstanceUID", (t,)).fetchall()]
    return sorted(out, key=lambda d: (d.time, d.transaction_uid))


def keep_sources(x: Execute, rows: list[tuple[str, str]]) -> None:
    """(the journal) Keep (SOP Instance UID, source) of new instances."""
    for sop, source in rows:
        x("INSERT OR REPLACE INTO instance_source (SOPInstanceUID, source) VALUES (?, ?)", (sop, source))


def kept_source(x: Execute, sop_uid: str) -> str:
    """(the journal) The source kept for an instance; "" when none."""
    row = x("SELECT source FROM instance_source WHERE SOPInstanceUID = ?", (sop_uid,)).fetchone()
    return row[0] if row else ""


def drop_sources(x: Execute, sop_uids: Iterable[str]) -> None:
    """(the journal) Forget the sources of deleted instances."""
    for sop in sop_uids:
        x("DELETE FROM instance_source WHERE SOPInstanceUID = ?", (sop,))

"""SQLite metadata index: WAL journal, ``synchronous=FULL`` (a commit survives
power loss), one table per query/retrieve level with a column per matching key,
computed study/series attributes kept current in the same transaction.

Safe with several worker processes: each thread of each process reads with its own
connection, ``Index.add`` writes with one connection per process (``_adding``) and the
other writes with the thread's; writers serialise on ``BEGIN IMMEDIATE`` (busy timeout 30 s).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.instance import InstanceRecord
from . import arrivals as arrivals_table
from . import changes as changelog
from . import labels as study_labels
from . import rejections
from . import shares as shares_table
from . import mpps as mpps_table
from . import worklist as worklist_table
from .base import Refused
from .connections import ThreadConnections, immediate
from .sql import (
    SQLITE, SQLIndex, backfill_derived, backfill_items, coldefs, derived_columns, derived_indexes, sequence_item_schema,
)


def _schema() -> str:
    return f"""
CREATE TABLE IF NOT EXISTS study (
  pk INTEGER PRIMARY KEY,
  StudyInstanceUID TEXT NOT NULL UNIQUE,
  {coldefs(SQLITE, "study", "StudyInstanceUID")},
  ModalitiesInStudy TEXT, SOPClassesInStudy TEXT,
  NumberOfStudyRelatedSeries INTEGER NOT NULL DEFAULT 0,
  NumberOfStudyRelatedInstances INTEGER NOT NULL DEFAULT 0,
  _json BLOB NOT NULL,
  {study_labels.COLUMN}
);
CREATE TABLE IF NOT EXISTS series (
  pk INTEGER PRIMARY KEY,
  study_pk INTEGER NOT NULL REFERENCES study(pk),
  SeriesInstanceUID TEXT NOT NULL UNIQUE,
  {coldefs(SQLITE, "series", "SeriesInstanceUID")},
  NumberOfSeriesRelatedInstances INTEGER NOT NULL DEFAULT 0,
  _json BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS instance (
  pk INTEGER PRIMARY KEY,
  series_pk INTEGER NOT NULL REFERENCES series(pk),
  SOPInstanceUID TEXT NOT NULL UNIQUE,
  {coldefs(SQLITE, "instance", "SOPInstanceUID")},
  _transfer_syntax TEXT NOT NULL,
  _path TEXT NOT NULL,
  _size INTEGER NOT NULL,
  _pixel BLOB,
  _metadata BLOB NOT NULL,
  _source TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS study_patient_id ON study(PatientID);
CREATE INDEX IF NOT EXISTS study_patient_name ON study(PatientName);
CREATE INDEX IF NOT EXISTS study_date ON study(StudyDate);
CREATE INDEX IF NOT EXISTS study_accession ON study(AccessionNumber);
CREATE INDEX IF NOT EXISTS series_study ON series(study_pk);
CREATE INDEX IF NOT EXISTS series_modality ON series(Modality);
CREATE INDEX IF NOT EXISTS instance_series ON instance(series_pk);
-- the landing page's bytes stored: sum(_size) from this index, not from the rows (with their JSON)
CREATE INDEX IF NOT EXISTS instance_size ON instance(_size);
-- The hierarchy is a constraint (store/base.py hierarchy_conflict): an instance's file
-- name is study/series/sop.dcm of its own UIDs, so a row whose series belongs to
-- another study (or that names another series) cannot be written. A later version of an
-- instance is study/series/sop.vN.dcm (lifecycle/versions.py): the trigger is made again
-- at every start, so that an index created before versions takes them.
DROP TRIGGER IF EXISTS instance_in_own_series;
CREATE TRIGGER instance_in_own_series BEFORE INSERT ON instance
WHEN NOT coalesce((SELECT NEW._path = p || '.dcm' OR (NEW._path GLOB p || '.v[1-9]*.dcm'
                                                      AND NEW._path NOT GLOB p || '.v*[^0-9]*.dcm')
                   FROM (SELECT s.StudyInstanceUID || '/' || se.SeriesInstanceUID || '/' || NEW.SOPInstanceUID AS p
                         FROM series se JOIN study s ON s.pk = se.study_pk WHERE se.pk = NEW.series_pk)), 0)
BEGIN SELECT RAISE(ABORT, 'instance filed under another series or study'); END;
-- Its file may change to another of its own names only: a version's, or the side file of a
-- re-encoding (policy/recompress.py: study/series/sop[.vN].recompressed.dcm).
DROP TRIGGER IF EXISTS instance_stays_in_series;
CREATE TRIGGER instance_stays_in_series BEFORE UPDATE OF series_pk, _path, SOPInstanceUID ON instance
WHEN NEW.series_pk != OLD.series_pk OR NEW.SOPInstanceUID != OLD.SOPInstanceUID OR NOT (NEW._path = OLD._path
  OR coalesce((SELECT NEW._path IN (p || '.dcm', p || '.recompressed.dcm')
                      OR ((NEW._path GLOB p || '.v[1-9]*.dcm' AND NEW._path NOT GLOB p || '.v*[^0-9]*.dcm')
                          OR (NEW._path GLOB p || '.v[1-9]*.recompressed.dcm'
                              AND NEW._path NOT GLOB p || '.v*[^0-9]*.recompressed.dcm'))
               FROM (SELECT s.StudyInstanceUID || '/' || se.SeriesInstanceUID || '/' || NEW.SOPInstanceUID AS p
                     FROM series se JOIN study s ON s.pk = se.study_pk WHERE se.pk = NEW.series_pk)), 0))
BEGIN SELECT RAISE(ABORT, 'an instance cannot move to another series or study'); END;
CREATE TRIGGER IF NOT EXISTS series_stays_in_study BEFORE UPDATE OF study_pk, SeriesInstanceUID ON series
BEGIN SELECT RAISE(ABORT, 'a series cannot move to another study'); END;
""" + changelog.sqlite_schema() + rejections.sqlite_schema() + worklist_table.sqlite_schema() + study_labels.sqlite_schema() + shares_table.sqlite_schema() + arrivals_table.sqlite_schema() + mpps_table.sqlite_schema() + ";\n".join(sequence_item_schema(SQLITE)) + ";\n"


def _statements(script: str) -> Iterator[str]:
    """The statements of a script, one by one (executescript would commit first: the schema
    and the migration of existing rows must be one transaction, so that two processes
    opening an old index together migrate it once)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            yield buf
            buf = ""


#: the oldest SQLite library the index runs on: ``INSERT ... RETURNING`` (3.35, store/sql.py)
MIN_SQLITE = (3, 35, 0)


class SQLiteIndex(SQLIndex):
    """The default, embedded index (``--index sqlite``): ``data_dir/index.sqlite``."""

    dialect = SQLITE

    def __init__(self, path: Path) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE:  # refused at start, not at the first store
            raise RuntimeError(f"the SQLite index needs SQLite {'.'.join(map(str, MIN_SQLITE))} or later; "
                               f"this Python uses {sqlite3.sqlite_version} (use --index postgresql, or a "
                               "Python built with a newer SQLite)")
        self.path = path
        self._connections = ThreadConnections(path, ("foreign_keys=ON", "cache_size=-32000"))
        self._adding_lock = threading.Lock()
        self._adder: sqlite3.Connection | None = None
        self._adder_pid = 0
        con = self._con()
        con.execute("BEGIN IMMEDIATE")
        try:
            tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for statement in _statements(_schema()):
                con.execute(statement)
            if "study" in tables and "sequence_item" not in tables:
                # an index made before sequence matching: its studies' and series' items
                backfill_items(SQLITE, con)
            self._add_derived_columns(con)
            if "_source" not in {row[1] for row in con.execute("PRAGMA table_info(instance)")}:
                # an index made before sources were kept: its instances' source is not known
                con.execute("ALTER TABLE instance ADD COLUMN _source TEXT NOT NULL DEFAULT ''")
            if "labels" not in {row[1] for row in con.execute("PRAGMA table_info(study)")}:
                # an index made before the study rows kept their labels (store/labels.py): the
                # column, filled from study_label (the triggers below keep it from now on)
                con.execute(f"ALTER TABLE study ADD COLUMN {study_labels.COLUMN}")
                con.execute(study_labels.backfill("sqlite"))
            for statement in _statements(study_labels.sqlite_triggers()):
                con.execute(statement)
            for statement in derived_indexes():
                con.execute(statement)
            changelog.backfill(con.execute, changelog.now())  # an index older than its change log
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise

    @staticmethod
    def _add_derived_columns(con: sqlite3.Connection) -> None:
        """An index made before the derived date-time columns (combined and UTC date-time
        matching) gets them, computed for its rows (in the opening transaction)."""
        added = []
        for level, attributes in derived_columns().items():
            have = {row[1] for row in con.execute(f"PRAGMA table_info({level})")}
            missing = [a.keyword for a in attributes if a.keyword not in have]
            for column in missing:
                con.execute(f"ALTER TABLE {level} ADD COLUMN {column} TEXT")
            if missing:
                added.append(level)
        if added:
            backfill_derived(SQLITE, con, added)

    def _con(self) -> sqlite3.Connection:
        return self._connections.get()

    @contextmanager
    def _adding(self) -> Iterator[sqlite3.Connection]:
        """The connection ``add`` writes with: one per process, whichever thread leads the
        group commit. SQLite drops a connection's page cache when another connection has
        changed the database since its last transaction, so with a connection per thread
        every commit began by reading its pages again (``pread`` ~8 per stored instance with
        8 STOW-RS connections, strace, issue 33); one connection keeps what it wrote. Writes
        are serial anyway (``BEGIN IMMEDIATE``, the group commit's writer lock)."""
        with self._adding_lock:
            if self._adder is None or self._adder_pid != os.getpid():  # a forked child opens its own
                self._adder, self._adder_pid = self._connections.dedicated(), os.getpid()
            con = self._adder
            try:
                yield con
            finally:
                if con.in_transaction:  # a failed ROLLBACK: never hand on a connection holding the write lock
                    self._adder, self._adder_pid = None, 0
                    self._connections.discard(con)

    def close(self) -> None:
        with self._adding_lock:
            self._adder, self._adder_pid = None, 0
            self._connections.close()

    # --- writes -----------------------------------------------------------------------

    def add(self, records: list[InstanceRecord], action: str = "create") -> list[bool | Refused]:
        """Index.add, serialised with every other writer by ``BEGIN IMMEDIATE``: the
        hierarchy check runs inside the write transaction, so two workers cannot
        both file one series under two studies, nor one study under two patients."""
        with self._adding() as con, immediate(con):
            added = self._add_rows(con, records, action)
            self._run_write_hooks(con, records, added)  # routing's outbox rows: same transaction
        return added

    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> list[str]:
        con = self._con()
        con.execute("BEGIN IMMEDIATE")
        try:
            paths = self._delete_rows(con, study_uid, series_uid, sop_uid)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:  # SQLite may have rolled back itself (e.g. SQLITE_FULL)
                con.execute("ROLLBACK")
            raise
        return paths

    def reject(self, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        with immediate(self._con()) as con:
            return self._reject_rows(con, refs, code, now)

    @contextmanager
    def _table_writing(self, keys: list[str]) -> Iterator:
        with immediate(self._con()) as con:
            yield self._execute(con)

    def unreject(self, rows: list[rejections.Rejection]) -> None:
        with immediate(self._con()) as con:
            rejections.drop(self._execute(con), rows)

    def purge(self, rows: list[rejections.Rejection]) -> list[rejections.Rejection]:
        with immediate(self._con()) as con:
            return self._purge_rows(con, rows)

    def replace(self, records: list[InstanceRecord], study_uid: str, series_uid: str | None = None,
                sop_uid: str | None = None, action: str = "update") -> None:
        with immediate(self._con()) as con:
            self._replace_rows(con, records, study_uid, series_uid, sop_uid, action)

    def refile(self, record: InstanceRecord, old_path: str) -> bool:
        with immediate(self._con()) as con:
            return self._refile_row(con, record, old_path)

    def set_label(self, study_uid: str, label: str, present: bool = True,
                  allowed: Filter = UNRESTRICTED) -> bool | None:
        with immediate(self._con()) as con:
            return self._label_rows(con, study_uid, label, present, allowed)

    # --- reads: store/sql.py SQLReads ------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        yield self._con()

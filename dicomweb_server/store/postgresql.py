"""PostgreSQL metadata index (``--index postgresql --database-url postgresql://...``):
the index several archive nodes share. Same tables, queries and statements as the
SQLite index (store/sql.py); what differs is here:

- Connections: psycopg 3 pools: reads, placement locks (see below), and one
  connection for writes (the group commit, store/commit.py, already makes one
  writer per process): at most 2 x ``pool_size`` + 1 per worker process.
- Durability (PS3.18 §10.5: a stored instance is acknowledged only when kept):
  every session runs with ``synchronous_commit = on`` (forced when the server's
  default is ``off``), and an archive refuses a server running with ``fsync = off``.
- Across nodes the ``flock`` files of one machine do not serialise anything:
  a write transaction first takes ``pg_advisory_xact_lock`` on every study, series
  and SOP Instance UID it touches (in ascending key order: no deadlock), so the
  hierarchy check (store/base.py ``hierarchy_conflict``: a study's patient, a
  series' study, an instance's series) and the inserts are atomic across nodes
  (two nodes storing one new study for two patients both lock its UID); the
  unique constraints on the UIDs stay as the last guard.
  :meth:`PostgreSQLIndex.locked` (session advisory locks) keeps two nodes from
  placing the file of one SOP Instance UID at the same time.
- Schema: created and migrated by the archive (table ``schema_version``, one
  migration step per version, under an advisory lock so that nodes starting
  together migrate once); ``dicomweb-server migrate`` runs it alone. Version 2
  adds routing's outbox table (its rows: routing/outbox_pg.py), version 4 an index of
  the instances' sizes (the landing page's bytes stored), version 5 the change
  log (store/changes.py; appends serialised by an advisory lock held to the commit,
  so that Sequence numbers commit in order) and the outbox's ``_change`` column,
  version 6 the items of the matchable sequences (store/sql.py sequence_item), version 7
  the derived date-time columns (local and UTC) of combined and time-zone matching,
  version 8 the rejected instances (store/rejections.py, IOCM), version 9 the
  de-identification projects and pseudonyms (deid/pseudonyms.py), version 10 the modality
  worklist (store/worklist.py) and the outbox's ``_payload`` (storage commitment reports),
  version 11 the study labels (store/labels.py), version 12 the share links
  (store/shares.py), version 13 the background jobs (jobs/store.py), version 14 the instances'
  sources and the instances Storage Commitment requests declared (store/arrivals.py), version
  15 the Modality Performed Procedure Step instances (store/mpps.py), version 16 the copy of
  each study's labels on its row (``study.labels``, a ``text[]`` with a GIN index, kept by
  triggers: store/labels.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.instance import InstanceRecord
from . import arrivals as arrivals_table
from . import changes as changelog
from . import labels as study_labels
from . import rejections
from . import shares as shares_table
from . import mpps as mpps_table
from . import worklist as worklist_table
from .base import IndexUnavailable, Refused
from .sql import (
    POSTGRESQL, SQLIndex, backfill_derived, backfill_items, coldefs, derived_columns, derived_indexes,
    sequence_item_schema,
)

log = logging.getLogger(__name__)

_MIGRATE_LOCK = 0x44434D57  # "DCMW": advisory lock key of the schema migration
_PLACE_LOCKS = 0x44434D50  # "DCMP": namespace of the per-instance placement locks
#: seconds a store may wait for a placement-lock connection while the pool is busy (back-pressure)
PLACE_WAIT = 600.0
#: seconds a search or a DELETE may wait for a connection while its pool is busy
READ_WAIT = 30.0
#: seconds between looks at whether the pool is busy or the database is unreachable
PLACE_LOOK = 2.0


def _v1() -> list[str]:
    pg = POSTGRESQL
    return [f"""
CREATE TABLE study (
  pk BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  StudyInstanceUID {pg.text} NOT NULL UNIQUE,
  {coldefs(pg, "study", "StudyInstanceUID")},
  ModalitiesInStudy {pg.text}, SOPClassesInStudy {pg.text},
  NumberOfStudyRelatedSeries BIGINT NOT NULL DEFAULT 0,
  NumberOfStudyRelatedInstances BIGINT NOT NULL DEFAULT 0,
  _json BYTEA NOT NULL
)""", f"""
CREATE TABLE series (
  pk BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  study_pk BIGINT NOT NULL REFERENCES study(pk),
  SeriesInstanceUID {pg.text} NOT NULL UNIQUE,
  {coldefs(pg, "series", "SeriesInstanceUID")},
  NumberOfSeriesRelatedInstances BIGINT NOT NULL DEFAULT 0,
  _json BYTEA NOT NULL
)""", f"""
CREATE TABLE instance (
  pk BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  series_pk BIGINT NOT NULL REFERENCES series(pk),
  SOPInstanceUID {pg.text} NOT NULL UNIQUE,
  {coldefs(pg, "instance", "SOPInstanceUID")},
  _transfer_syntax TEXT NOT NULL,
  _path TEXT NOT NULL,
  _size BIGINT NOT NULL,
  _pixel BYTEA,
  _metadata BYTEA NOT NULL
)""",
        "CREATE INDEX study_patient_id ON study(PatientID)",
        "CREATE INDEX study_patient_name ON study(PatientName)",
        "CREATE INDEX study_date ON study(StudyDate)",
        "CREATE INDEX study_accession ON study(AccessionNumber)",
        "CREATE INDEX series_study ON series(study_pk)",
        "CREATE INDEX series_modality ON series(Modality)",
        "CREATE INDEX instance_series ON instance(series_pk)",
    ]


def _v2() -> list[str]:
    """Routing's outbox (routing/outbox.py, routing/outbox_pg.py): in the index's
    database, so that its rows commit in the transaction of the instance rows and
    every node shares one queue. The same columns as the SQLite outbox; times are
    seconds since the epoch on the database server's clock."""
    return [f"""
CREATE TABLE outbox (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  destination TEXT NOT NULL,
  StudyInstanceUID {POSTGRESQL.text} NOT NULL,
  SeriesInstanceUID {POSTGRESQL.text} NOT NULL,
  SOPInstanceUID {POSTGRESQL.text} NOT NULL,
  _path TEXT NOT NULL,
  _rule TEXT,
  _state TEXT NOT NULL DEFAULT 'pending',
  _attempts INTEGER NOT NULL DEFAULT 0,
  _enqueued DOUBLE PRECISION NOT NULL,
  _due DOUBLE PRECISION NOT NULL,
  _solo INTEGER NOT NULL DEFAULT 0,
  _lease_owner TEXT,
  _lease_until DOUBLE PRECISION,
  _delivered DOUBLE PRECISION,
  _last_error TEXT
)""",
        "CREATE INDEX outbox_pending ON outbox(destination, _state, _due)",
        "CREATE INDEX outbox_sop ON outbox(SOPInstanceUID, destination)",
    ]


def _v3() -> list[str]:
    """Delivered outbox rows are removed after ``keep_delivered`` (``Outbox.prune``): found
    by this index, not by reading the whole table."""
    return ["CREATE INDEX outbox_delivered ON outbox(_state, _delivered)"]


def _v4() -> list[str]:
    """The landing page's bytes stored (``counts``): ``sum(_size)`` by an index-only scan,
    not a read of the instance rows."""
    return ["CREATE INDEX instance_size ON instance(_size)"]


def _v5() -> list[str]:
    """The change log (store/changes.py), with a create for every instance already
    stored (in arrival order, stamped with the migration's time); outbox rows that carry
    a change to a webhook (routing/webhook.py) name its Sequence."""
    return [*changelog.postgresql_schema(),
            "INSERT INTO changelog (seq, _time, action, state, StudyInstanceUID, SeriesInstanceUID, "
            "SOPInstanceUID, version) SELECT row_number() OVER (ORDER BY i.pk), extract(epoch FROM now())::float8, "
            "'create', 'current', s.StudyInstanceUID, se.SeriesInstanceUID, i.SOPInstanceUID, 1 FROM instance i "
            "JOIN series se ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk",
            "ALTER TABLE outbox ADD COLUMN _change BIGINT"]


def _v6() -> list:
    """Sequence matching (PS3.4 C.2.2.2.6): the items of the matchable sequences
    (store/sql.py sequence_item), filled for the studies and series already indexed."""
    return [*sequence_item_schema(POSTGRESQL), lambda con: backfill_items(POSTGRESQL, con)]


def _v7() -> list:
    """Combined and UTC date-time matching (PS3.4 C.2.2.2.5.1, C.4.1.1.3.1): the derived
    date-time columns (attributes.DERIVED), computed for the rows already indexed. A
    database created at version 1 by this archive already has them (coldefs): hence
    ``IF NOT EXISTS``."""
    steps: list = [f"ALTER TABLE {level} ADD COLUMN IF NOT EXISTS {a.keyword} {POSTGRESQL.text}"
                   for level, attributes in derived_columns().items() for a in attributes]
    return [*steps, *derived_indexes(),
            lambda con: backfill_derived(POSTGRESQL, con, ["study", "series", "instance"])]


def _v8() -> list[str]:
    """Rejected instances (IHE IOCM; store/rejections.py)."""
    return rejections.postgresql_schema()


def _v9() -> list[str]:
    """De-identification: project secrets and pseudonyms (deid/pseudonyms.py)."""
    from ..deid.pseudonyms import postgresql_schema

    return postgresql_schema()


def _v10() -> list[str]:
    """The modality worklist (store/worklist.py) and the outbox's payload of a job that is
    not an instance (a storage commitment report, dimse/commitment.py)."""
    return [*worklist_table.postgresql_schema(), "ALTER TABLE outbox ADD COLUMN IF NOT EXISTS _payload TEXT"]


def _v11() -> list[str]:
    """Study labels (store/labels.py; access/filter.py)."""
    return study_labels.postgresql_schema()


def _v12() -> list[str]:
    """Share links (store/shares.py; api/shares.py)."""
    return shares_table.postgresql_schema()


def _v13() -> list[str]:
    """Background jobs (jobs/store.py; their queue rows are the outbox's)."""
    from ..jobs.store import postgresql_schema

    return postgresql_schema()


def _v14() -> list[str]:
    """Where each instance came from (``instance._source``) and the instances Storage
    Commitment requests declared (store/arrivals.py; the operator's study page)."""
    return arrivals_table.postgresql_schema()


def _v15() -> list[str]:
    """Modality Performed Procedure Step instances (store/mpps.py; dimse/mpps.py)."""
    return mpps_table.postgresql_schema()


#: how long a migration step waits for a table lock it needs (``SET LOCAL lock_timeout``)
MIGRATION_LOCK_TIMEOUT = "10s"


def _lock_bounded(statements: list[str], what: str):
    """A migration step running ``statements`` with ``lock_timeout`` set for them alone:
    an ALTER TABLE waiting for its ACCESS EXCLUSIVE lock behind a long transaction would
    queue every later reader of the table behind it; the migration gives up instead,
    with a clear error (its transaction rolls back whole; nothing changed)."""
    def step(con) -> None:
        import psycopg

        (before,) = con.execute("SELECT current_setting('lock_timeout')").fetchone()
        con.execute(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'")
        try:
            for statement in statements:
                con.execute(statement)
        except psycopg.errors.LockNotAvailable as e:
            raise DatabaseRefused(f"the migration could not lock {what} within {MIGRATION_LOCK_TIMEOUT} (a long "
                                  "transaction holds it: see pg_stat_activity); nothing was changed, start "
                                  "again when it has ended") from e
        con.execute("SELECT set_config('lock_timeout', %s, true)", (before,))
    return step


def _v16() -> list:
    """Each study's labels on its row (``study.labels``, a ``text[]`` with a GIN index),
    kept by triggers on study_label and study, filled from study_label: a label filter
    tests the row (store/labels.py). The ALTER and the triggers wait at most
    :data:`MIGRATION_LOCK_TIMEOUT` for their locks."""
    before, locking, after = study_labels.postgresql_column()
    return [*before, _lock_bounded(locking, "the study and study_label tables"), *after]


# version -> the statements (or steps: callables given the connection) that bring the
# schema from version - 1 to it
MIGRATIONS = {1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5, 6: _v6, 7: _v7, 8: _v8, 9: _v9, 10: _v10, 11: _v11, 12: _v12,
              13: _v13, 14: _v14, 15: _v15, 16: _v16}
SCHEMA_VERSION = max(MIGRATIONS)


class DatabaseRefused(RuntimeError):
    """The database cannot keep the archive's promises (durability, schema version)."""


def _key(text: str) -> int:
    """A signed 64-bit advisory lock key for a UID (any stable hash does)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


def _key32(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big", signed=True)


def _configure(con) -> None:
    """Every session: durable commits (PS3.18 §10.5), whatever the server's default."""
    if con.execute("SHOW synchronous_commit").fetchone()[0] == "off":
        con.execute("SET synchronous_commit = on")


def migrate(con) -> tuple[int, int]:
    """Create or migrate the schema on ``con`` (autocommit). Returns (version before,
    version after); refuses a database migrated by a newer archive."""
    with con.transaction():
        con.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        before = row[0] or 0
        if before > SCHEMA_VERSION:
            raise DatabaseRefused(f"the database schema is version {before}; this archive knows up to "
                                  f"{SCHEMA_VERSION}: upgrade the archive")
        for version in range(before + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]():
                if callable(statement):
                    statement(con)
                else:
                    con.execute(statement)
            con.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
            log.info("index schema migrated to version %d", version)
    return before, SCHEMA_VERSION


def check_durable(con) -> None:
    """Refuse a server that acknowledges commits it may lose."""
    if con.execute("SHOW fsync").fetchone()[0] != "on":
        raise DatabaseRefused("PostgreSQL runs with fsync = off: a commit could be lost on power failure, "
                              "so the archive refuses it (set fsync = on)")
    if con.execute("SHOW synchronous_commit").fetchone()[0] == "off":
        raise DatabaseRefused("synchronous_commit is off for the archive's sessions")
    if con.execute("SHOW server_encoding").fetchone()[0] != "UTF8":
        raise DatabaseRefused("the database encoding must be UTF8 (createdb -E UTF8)")


class PostgreSQLIndex(SQLIndex):
    """Index on a PostgreSQL database shared by any number of archive nodes."""

    dialect = POSTGRESQL

    def __init__(self, url: str, pool_size: int = 8) -> None:
        from psycopg_pool import ConnectionPool

        kwargs = {"autocommit": True}
        # reads: no check per checkout (it would double every look-up's round trips); a connection
        # that broke (server restart) is dropped by the pool when its query fails
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, kwargs=kwargs, configure=_configure,
                                    open=True, name="dicomweb-read")
        # stores wait here for their placement locks' sessions (back-pressure, not errors), never taking
        # the readers' connections; writers never wait behind either
        self._placing = ConnectionPool(url, min_size=1, max_size=pool_size, kwargs=kwargs, configure=_configure,
                                       check=ConnectionPool.check_connection, open=True, name="dicomweb-place",
                                       timeout=600.0)
        self._writer = ConnectionPool(url, min_size=1, max_size=1, kwargs=kwargs, configure=_configure,
                                      check=ConnectionPool.check_connection, open=True, name="dicomweb-write")
        try:
            with self._writer.connection() as con:
                check_durable(con)
                migrate(con)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._pool.close()
        self._placing.close()
        self._writer.close()

    @contextmanager
    def _reading(self) -> Iterator:
        con = _pooled(self._pool, READ_WAIT)
        try:
            yield con
        finally:
            self._pool.putconn(con)  # (a broken connection is discarded by the pool)

    def _retried(self, read):
        """``read()``, tried again while it fails on a pooled connection the server closed
        (a PostgreSQL restart leaves every idle read connection dead; the pool discards
        each as its query fails: without this, the next pool_size reads failed with a 500).
        A read changes nothing, so trying it again is safe; a server still down makes the
        pool's own wait for a new connection fail (PoolTimeout)."""
        import psycopg

        for attempt in range(self._pool.max_size + 1):
            try:
                return read()
            except psycopg.OperationalError as e:
                if attempt == self._pool.max_size:
                    raise IndexUnavailable(f"the index database: {e}") from e
                log.info("index read on a lost connection, tried again: %s", e)

    def _rows(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        return self._retried(lambda: SQLIndex._rows(self, sql, params))

    def search(self, query, allowed: Filter = UNRESTRICTED):
        return self._retried(lambda: SQLIndex.search(self, query, allowed))

    def labels(self, study_uid: str, allowed: Filter = UNRESTRICTED):
        return self._retried(lambda: SQLIndex.labels(self, study_uid, allowed))

    def set_label(self, study_uid: str, label: str, present: bool = True,
                  allowed: Filter = UNRESTRICTED) -> bool | None:
        # the study lock: serialised with every add into the study and every delete of it
        with self._writing([study_uid]) as con:
            return self._label_rows(con, study_uid, label, present, allowed)

    def changes(self, after: int = 0, limit: int = 10, start: float | None = None, end: float | None = None,
                skip: int = 0, allowed: Filter = UNRESTRICTED):
        return self._retried(lambda: SQLIndex.changes(self, after, limit, start, end, skip, allowed))

    def latest_change(self, allowed: Filter = UNRESTRICTED):
        return self._retried(lambda: SQLIndex.latest_change(self, allowed))

    def received(self, study_uid=None):
        return self._retried(lambda: SQLIndex.received(self, study_uid))

    @contextmanager
    def _writing(self, uids: Iterable[str]) -> Iterator:
        """A write transaction holding the advisory locks of ``uids`` until it ends."""
        con = _pooled(self._writer, READ_WAIT)
        try:
            with con.transaction():
                keys = sorted({_key(u) for u in uids})
                con.cursor().executemany("SELECT pg_advisory_xact_lock(%s)", [(k,) for k in keys])
                yield con
        finally:
            self._writer.putconn(con)

    def add(self, records: list[InstanceRecord], action: str = "create") -> list[bool | Refused]:
        """Index.add in one transaction, atomic across nodes: the locks of every
        study, series and SOP Instance UID of ``records`` are held from before the
        hierarchy check until the (synchronous) commit."""
        uids = [u for r in records for u in (r.study_uid, r.series_uid, r.sop_uid)]
        with self._writing(uids) as con:
            added = self._add_rows(con, records, action)
            # routing's outbox rows (routing/outbox_pg.py): on this connection, in this
            # transaction: the instances and their forwards commit together
            self._run_write_hooks(con, records, added)
            return added

    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> list[str]:
        # every add into this study holds its study lock: they serialise with this
        with self._writing([study_uid]) as con:
            return self._delete_rows(con, study_uid, series_uid, sop_uid)

    def reject(self, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        # the locks an add of these instances takes: a rejected instance arriving meanwhile
        # is either hidden by this transaction or filed by its rejection row
        with self._writing([u for ref in refs for u in ref]) as con:
            return self._reject_rows(con, refs, code, now)

    def reject_in(self, con, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        # the locks reject() takes, added to those of the add's transaction (held to its end)
        keys = sorted({_key(u) for ref in refs for u in ref})
        con.cursor().executemany("SELECT pg_advisory_xact_lock(%s)", [(k,) for k in keys])
        return self._reject_rows(con, refs, code, now)

    def unreject(self, rows: list[rejections.Rejection]) -> None:
        with self._writing([r.sop_uid for r in rows]) as con:
            rejections.drop(self._execute(con), rows)

    def purge(self, rows: list[rejections.Rejection]) -> list[rejections.Rejection]:
        with self._writing([r.sop_uid for r in rows]) as con:
            return self._purge_rows(con, rows)

    @contextmanager
    def _table_writing(self, keys: list[str]) -> Iterator:
        with self._writing(keys) as con:
            yield self._execute(con)

    def worklist(self, prefilter):
        return self._retried(lambda: SQLIndex.worklist(self, prefilter))

    def mpps(self, sop_uid):
        return self._retried(lambda: SQLIndex.mpps(self, sop_uid))

    def share(self, share_id=None, token_sha256=None):
        return self._retried(lambda: SQLIndex.share(self, share_id, token_sha256))

    def rejections(self, study_uid=None, series_uid=None, before=None):
        return self._retried(lambda: SQLIndex.rejections(self, study_uid, series_uid, before))

    def replace(self, records: list[InstanceRecord], study_uid: str, series_uid: str | None = None,
                sop_uid: str | None = None, action: str = "update") -> None:
        # the study lock serialises with every add into the study and every delete of it
        uids = [study_uid, *(u for r in records for u in (r.series_uid, r.sop_uid))]
        with self._writing(uids) as con:
            self._replace_rows(con, records, study_uid, series_uid, sop_uid, action)

    def refile(self, record: InstanceRecord, old_path: str) -> bool:
        # the study's lock, as a delete of it takes; the instance's, as an update's switch
        with self._writing([record.study_uid, record.sop_uid]) as con:
            return self._refile_row(con, record, old_path)

    def history(self, sop_uid: str):
        return self._retried(lambda: SQLIndex.history(self, sop_uid))

    @contextmanager
    def locked(self, sop_uids: Iterable[str]) -> Iterator[None]:
        """Exclusive right, across nodes, to place the files of these instances
        (session advisory locks on a connection held meanwhile; a separate key
        space from the transactions' locks, so a holder's own commit never waits
        for it)."""
        import psycopg

        keys = sorted({_key32(u) for u in sop_uids})
        con = self._placing_connection()
        try:
            try:
                con.cursor().executemany("SELECT pg_advisory_lock(%s, %s)", [(_PLACE_LOCKS, k) for k in keys])
            except psycopg.OperationalError as e:  # the server went away since the pool's check
                raise IndexUnavailable(f"the index database: {e}") from e
            try:
                yield
            finally:
                try:
                    con.execute("SELECT pg_advisory_unlock_all()")
                except psycopg.OperationalError as e:
                    # the session is gone, and its locks with it; what the block did (a commit on
                    # the writer's connection) stands: this must not turn it into an error
                    log.warning("placement locks released by a lost session: %s", e)
        finally:
            self._placing.putconn(con)  # (a broken connection is discarded by the pool)

    def _placing_connection(self):
        """A placement-lock connection: waits (at most PLACE_WAIT) while the pool is busy
        (back-pressure), but fails at once when the database is unreachable (:func:`_pooled`):
        a store then fails instead of holding its request, worker thread and folder locks
        for ten minutes (the pool's wait)."""
        return _pooled(self._placing, PLACE_WAIT)


def _pooled(pool, wait: float):
    """A connection from ``pool``: waits at most ``wait`` seconds while the pool is busy,
    but raises IndexUnavailable as soon as the pool's connection attempts fail (the
    database is down or restarting), so that a search, a DELETE or a store answers 503
    (or its DIMSE failure status) at once instead of after the pool's own wait and a 500."""
    from psycopg_pool import PoolTimeout

    deadline = time.monotonic() + wait
    errors = pool.get_stats().get("connections_errors", 0)
    while True:
        try:
            return pool.getconn(timeout=max(0.05, min(PLACE_LOOK, deadline - time.monotonic())))
        except PoolTimeout:
            if pool.get_stats().get("connections_errors", 0) > errors:
                raise IndexUnavailable("the index database cannot be reached (connections refused "
                                       "or failing)") from None
            if time.monotonic() >= deadline:
                raise IndexUnavailable(f"the index database is busy: no connection free within {wait:g} s") from None

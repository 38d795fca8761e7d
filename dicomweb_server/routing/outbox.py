"""The durable outbox: one row per (instance, destination) owed a forward, or per
(change, webhook destination) owed a notification (``_change``: the change log's
Sequence, store/changes.py; inserted by :meth:`Outbox.insert_changes` from an index
change hook, in the transaction that logs the change: routing/webhook.py), or per
(study, webhook destination) owed a "study stable" event (``_change`` 0, the study's
UID in ``SOPInstanceUID``: :meth:`Outbox.defer_stable` pushes its due time back at each
new instance of the study).

Rows are inserted by an index write hook (:meth:`store.base.Index.add_write_hook`)
inside the transaction that indexes the instance: with the SQLite index they live in
``index.sqlite`` and commit atomically with the instance row; with the PostgreSQL
index in its database (table ``outbox``: schema versions 2 and 3, routing/outbox_pg.py),
committed in the same transaction, shared by every node; with the in-memory index
they live in ``outbox.sqlite`` in the data folder and are committed
(``synchronous=FULL``) before the index changes and before the STOW-RS answer. Once
an instance is acknowledged, its forwards are on disk; a crash at any moment neither
loses nor forgets them.

The statements are written once (:class:`Outbox`); a back end says how it gets a
connection, a transaction and the time (:class:`SQLiteOutbox` here, the
PostgreSQL one in routing/outbox_pg.py).

States: ``pending`` (owed; "in flight" while a worker holds its lease), ``delivered``,
``failed`` (dead letter, with the last error). Delivered rows are removed once
``keep_delivered`` seconds old (:meth:`Outbox.prune`): the table holds what is owed,
the dead letters and a window of recent deliveries, not every forward ever made.

A worker claims a batch by writing its lease (owner token and expiry) into the rows;
another worker (or a restart) may take them over only after the lease expired, so two
workers never send one instance to one destination at the same time. The number of
live leases per destination is bounded (``concurrency``), across all worker processes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from ..store.connections import ThreadConnections

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
  id INTEGER PRIMARY KEY,
  destination TEXT NOT NULL,
  StudyInstanceUID TEXT NOT NULL,
  SeriesInstanceUID TEXT NOT NULL,
  SOPInstanceUID TEXT NOT NULL,
  _path TEXT NOT NULL,
  _rule TEXT,
  _state TEXT NOT NULL DEFAULT 'pending',
  _attempts INTEGER NOT NULL DEFAULT 0,
  _enqueued REAL NOT NULL,
  _due REAL NOT NULL,
  _solo INTEGER NOT NULL DEFAULT 0,
  _lease_owner TEXT,
  _lease_until REAL,
  _delivered REAL,
  _last_error TEXT,
  _change INTEGER,
  _payload TEXT
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(destination, _state, _due);
CREATE INDEX IF NOT EXISTS outbox_sop ON outbox(SOPInstanceUID, destination);
CREATE INDEX IF NOT EXISTS outbox_delivered ON outbox(_state, _delivered);
"""
#: the in-memory index's ledger (outbox.sqlite only): instances whose forwards were decided
_LEDGER = """
CREATE TABLE IF NOT EXISTS routed (SOPInstanceUID TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS routing_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class Entry:
    """A forward owed: the instance and where it goes."""

    destination: str
    study_uid: str
    series_uid: str
    sop_uid: str
    path: str  # relative to the blob root
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """A claimed outbox row."""

    id: int
    destination: str
    study_uid: str
    series_uid: str
    sop_uid: str
    path: str
    attempts: int
    enqueued: float  # this process's clock (time.time())
    change: int | None = None  # the change log's Sequence: a webhook's notification, not a file
    payload: str | None = None  # a job that is neither (a storage commitment report: dimse/commitment.py)


@dataclass(slots=True)
class Settlement:
    """What became of a claimed batch (ids of rows)."""

    delivered: list[int]
    retry: list[tuple[int, float, str]]  # id, due (this process's clock), error
    failed: list[tuple[int, str]]  # id, error (dead letter)
    solo: list[int]  # send alone next time (a batch the receiver refused as a whole)


def _process_gone(owner: str, host: str) -> bool:
    owner_host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if owner_host != host or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's
        return False
    return False


_INSERT = ("INSERT INTO outbox (destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, _rule, "
           "_enqueued, _due) SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM outbox WHERE "
           "SOPInstanceUID = ? AND destination = ? AND _state = 'pending' AND "
           "(_lease_until IS NULL OR _lease_until < ?))")
_INSERT_MISSING = ("INSERT INTO outbox (destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, "
                   "_rule, _enqueued, _due) SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM outbox "
                   "WHERE SOPInstanceUID = ? AND destination = ?)")
_PENDING = ("FROM outbox WHERE destination = ? AND _state = 'pending' AND "
            "(_lease_until IS NULL OR _lease_until < ?)")
#: the suffix of the owner of jobs born leased (:meth:`Outbox.insert_job` with ``owner``)
HELD = ":held"
_ROWS = ("id", "destination", "SOPInstanceUID", "state", "attempts", "enqueued", "delivered", "last_error")


class Outbox(ABC):
    """The outbox's statements, written once for both SQL back ends (``?``
    placeholders, SQL that SQLite and PostgreSQL read alike). A back end gives
    connections, transactions, the time leases are measured on, and the lock that
    serialises claims of one destination.

    Times in the table are on the back end's clock (:meth:`_now`): the database's
    for PostgreSQL, so that nodes whose clocks differ still agree on when a lease
    ends. Times crossing this interface (:class:`Row`, :class:`Settlement`, the
    next due time :meth:`claim` returns) are on this process's ``time.time()``.
    """

    placeholder = "?"

    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    @abstractmethod
    def _reading(self) -> AbstractContextManager:
        """A connection for reads (no transaction)."""

    @abstractmethod
    def _transaction(self, hooked: bool = False) -> AbstractContextManager:
        """A connection in a write transaction, committed on exit. ``hooked``: the
        caller already holds the index writer lock (an index write hook)."""

    def _now(self, con) -> float:
        """The time on the clock leases are measured on."""
        return time.time()

    def _claim_lock(self, con, destination: str) -> None:
        """Serialise the claims of ``destination`` until the transaction ends (a
        back end whose write transactions are already serial needs nothing)."""

    def close(self) -> None:  # pragma: no cover - default no-op
        """Release connections."""

    @staticmethod
    def _many(con, sql: str, params: list) -> int:
        if not params:
            return 0
        cur = con.cursor()
        cur.executemany(sql, params)
        return max(cur.rowcount, 0)

    # --- enqueue ------------------------------------------------------------------------

    def insert(self, entries: Iterable[Entry], con=None, decided: Iterable[str] = ()) -> int:
        """Owe these forwards. With ``con`` (the index's open transaction, from its
        write hook) the rows commit with it; without, in a durable transaction of
        their own (the caller holds the index writer lock, as the in-memory index's
        hooks do). An entry equal to a pending row that no worker holds is not repeated.
        ``decided``: SOP Instance UIDs to enter in the ledger (:meth:`undecided`), in
        the same transaction."""
        entries, decided = list(entries), list(decided)
        if not entries and not decided:
            return 0
        if con is None:
            with self._transaction(hooked=True) as own:
                return self.insert(entries, own, decided)
        now = self._now(con)
        self._many(con, self._sql("INSERT INTO routed (SOPInstanceUID) VALUES (?) ON CONFLICT DO NOTHING"),
                   [(sop,) for sop in decided])
        return self._many(con, self._sql(_INSERT), [
            (e.destination, e.study_uid, e.series_uid, e.sop_uid, e.path, e.rule, now, now, e.sop_uid,
             e.destination, now) for e in entries])

    def insert_versions(self, entries: Iterable[Entry], current: Iterable[tuple[str, str]], con) -> int:
        """New versions made current (an update, merge or restore: lifecycle/update.py),
        in the index transaction ``con`` that switches them: ``current`` (SOP Instance
        UID, path of its new file) re-points every forward of the instance still owed (pending
        or a dead letter) and held by no worker at the new file (a destination owed the
        instance gets what is current when it is sent, not the version replaced); then ``entries`` (the
        rules with ``on = ["update"]``) are owed, unless such a pending row already
        carries the new version. Returns the rows added."""
        now = self._now(con)
        self._many(con, self._sql(
            "UPDATE outbox SET _path = ? WHERE SOPInstanceUID = ? AND _change IS NULL AND _state IN ('pending', 'failed') "
            "AND "
            "(_lease_until IS NULL OR _lease_until < ?)"), [(path, sop, now) for sop, path in current])
        return self.insert(entries, con)

    def insert_changes(self, destinations: Iterable[str], changes: Iterable, con) -> int:
        """Owe a notification of each change (store/changes.py ``Change``) to each
        destination, in the transaction ``con`` that logs the changes (an index change
        hook). Each change is new: nothing to compare with."""
        rows = [(d, c.study_uid, c.series_uid, c.sop_uid, c.sequence) for c in changes for d in destinations]
        if not rows:
            return 0
        now = self._now(con)
        return self._many(con, self._sql(
            "INSERT INTO outbox (destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, _rule, "
            "_enqueued, _due, _change) VALUES (?, ?, ?, ?, '', 'changefeed', ?, ?, ?)"),
            [(*r[:4], now, now, r[4]) for r in rows])

    def defer_stable(self, destination: str, study_uids: Iterable[str], delay: float, con) -> None:
        """Owe ``destination`` a "study stable" event for each study, due ``delay``
        seconds from now: a pending one not held by a worker is pushed back (one per
        study), else a new one is added. In the transaction ``con`` that logs the
        study's new instances (the index holds the study's lock: no two at once)."""
        now = self._now(con)
        sql = self._sql
        for study in dict.fromkeys(study_uids):
            pushed = con.execute(sql(
                "UPDATE outbox SET _due = ?, _enqueued = ? WHERE destination = ? AND SOPInstanceUID = ? AND "
                "_change = 0 AND _state = 'pending' AND (_lease_until IS NULL OR _lease_until < ?)"),
                (now + delay, now, destination, study, now)).rowcount
            if not pushed:
                con.execute(sql(
                    "INSERT INTO outbox (destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, "
                    "_rule, _enqueued, _due, _change) VALUES (?, ?, '', ?, '', 'stable', ?, ?, 0)"),
                    (destination, study, study, now, now + delay))

    def insert_job(self, destination: str, kind: str, key: str, payload: str, delay: float = 0.0,
                   con=None, owner: str | None = None, lease: float = 0.0) -> None:
        """Owe ``destination`` a job that is not an instance's forward (``_rule`` ``kind``,
        ``key`` in ``SOPInstanceUID``, what to do in ``_payload``; a storage commitment report,
        dimse/commitment.py; a background job, jobs/runner.py), due ``delay`` seconds from now,
        in a durable transaction of its own, or in ``con``'s (the caller's, which it commits).
        With ``owner`` (ending in :data:`HELD`), the job is born leased to it for ``lease`` seconds: no other worker
        claims it meanwhile; the owner takes it with :meth:`claim_held`, and it is claimable by
        all once the owner settles or releases it, the lease expires or :meth:`reap` frees it."""
        if con is None:
            with self._transaction() as own:
                self.insert_job(destination, kind, key, payload, delay, own, owner, lease)
            return
        now = self._now(con)
        con.execute(self._sql(
            "INSERT INTO outbox (destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, "
            "_rule, _enqueued, _due, _payload, _lease_owner, _lease_until) "
            "VALUES (?, '', '', ?, '', ?, ?, ?, ?, ?, ?)"),
            (destination, key, kind, now, now + delay, payload, owner, None if owner is None else now + lease))

    def insert_missing(self, entries: Iterable[Entry]) -> int:
        """Owe those of these forwards that have no row at all (of any state) for their
        instance and destination, in a durable transaction of their own: a duplicate
        store of an instance whose forward was never written (indexed by a process
        without the routes) owes it now. Returns the rows added."""
        entries = list(entries)
        if not entries:
            return 0
        with self._transaction() as con:
            now = self._now(con)
            return self._many(con, self._sql(_INSERT_MISSING), [
                (e.destination, e.study_uid, e.series_uid, e.sop_uid, e.path, e.rule, now, now, e.sop_uid,
                 e.destination) for e in entries])

    # --- the ledger of the in-memory index (outbox.sqlite) -------------------------------

    def undecided(self, sops: list[str]) -> set[str]:
        """Those of ``sops`` whose forwards were never decided (not in the ledger)."""
        found: set[str] = set()
        with self._reading() as con:
            for i in range(0, len(sops), 500):
                chunk = sops[i:i + 500]
                found.update(s for (s,) in con.execute(self._sql(
                    f"SELECT SOPInstanceUID FROM routed WHERE SOPInstanceUID IN ({','.join('?' * len(chunk))})"),
                    chunk))
        return set(sops) - found

    def armed(self) -> bool:
        """Whether the ledger covers every instance stored since it was started (see
        :class:`routing.Routing`); False for a new ledger, or after a process stored
        instances without the routes."""
        with self._reading() as con:
            row = con.execute("SELECT value FROM routing_state WHERE key = 'armed'").fetchone()
        return row is not None and row[0] == "1"

    def arm(self, armed: bool) -> None:
        with self._transaction() as con:
            con.execute(self._sql("INSERT INTO routing_state (key, value) VALUES ('armed', ?) "
                                  "ON CONFLICT (key) DO UPDATE SET value = excluded.value"), ("1" if armed else "0",))

    def enqueue(self, entries: Iterable[Entry]) -> int:
        """Owe these forwards (manual export): one durable transaction."""
        with self._transaction() as con:
            return self.insert(entries, con)

    # --- delivery -----------------------------------------------------------------------

    def claim(self, destination: str, limit: int, owner: str, lease: float, concurrency: int
              ) -> tuple[list[Row], float | None]:
        """Take up to ``limit`` due rows of ``destination`` under a lease held by
        ``owner`` (a token naming this worker and batch). Returns the rows and the
        earliest time another row of the destination becomes due (None if none).

        Nothing is claimed while ``concurrency`` leases of the destination are live
        (across all workers and nodes; jobs born leased, owners ending in :data:`HELD`,
        are not counted: they wait for their owner, not for a send). A row whose instance another live lease of
        the same destination holds is skipped. A row marked solo is claimed alone.
        """
        sql = self._sql
        with self._reading() as con:
            now = self._now(con)
            first = con.execute(sql(f"SELECT min(_due) {_PENDING}"), (destination, now)).fetchone()[0]
        skew = now - time.time()
        if first is None or first > now:
            return [], None if first is None else first - skew
        with self._transaction() as con:
            self._claim_lock(con, destination)
            now = self._now(con)
            skew = now - time.time()
            live = con.execute(sql(
                "SELECT count(DISTINCT _lease_owner) FROM outbox WHERE destination = ? AND _state = 'pending' "
                "AND _lease_until >= ? AND _lease_owner NOT LIKE ?"), (destination, now, f"%{HELD}")).fetchone()[0]
            if live >= concurrency:
                return [], first - skew
            rows = con.execute(sql(
                "SELECT id, destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, _attempts, "
                f"_enqueued, _solo, _change, _payload {_PENDING} AND _due <= ? AND SOPInstanceUID NOT IN (SELECT SOPInstanceUID FROM "
                "outbox WHERE destination = ? AND _state = 'pending' AND _lease_until >= ?) ORDER BY _solo DESC, id "
                "LIMIT ?"), (destination, now, now, destination, now, limit)).fetchall()
            if rows and rows[0][8]:
                rows = rows[:1]
            chosen, seen = [], set()
            for r in rows:  # one instance once per batch (an export may repeat a routed one)
                if r[4] not in seen and (not r[8] or not chosen):
                    seen.add(r[4])
                    chosen.append(Row(*r[:7], r[7] - skew, r[9], r[10]))
            # only rows still pending and free: a row settled meanwhile by the worker whose lease had
            # expired (PostgreSQL's settle does not wait for the claim lock) is not sent again
            if self._many(con, sql("UPDATE outbox SET _lease_owner = ?, _lease_until = ? WHERE id = ? AND "
                                   "_state = 'pending' AND (_lease_until IS NULL OR _lease_until < ?)"),
                          [(owner, now + lease, r.id, now) for r in chosen]) < len(chosen):
                held = {i for (i,) in con.execute(sql(
                    f"SELECT id FROM outbox WHERE _lease_owner = ? AND id IN ({','.join('?' * len(chosen))})"),
                    (owner, *(r.id for r in chosen))).fetchall()}
                chosen = [r for r in chosen if r.id in held]
        return chosen, None

    def claim_held(self, destination: str, owner: str, keys: list[str], lease: float) -> list[Row]:
        """The pending rows of ``destination`` with these keys (``SOPInstanceUID``) still leased
        to ``owner`` since :meth:`insert_job`, their leases renewed to ``lease`` seconds from
        now; the caller decides when they are due. A row whose lease expired is still taken
        while nobody claimed it since (a claim changes the owner)."""
        if not keys:
            return []
        sql = self._sql
        with self._transaction() as con:
            self._claim_lock(con, destination)
            now = self._now(con)
            skew = now - time.time()
            rows = con.execute(sql(
                "SELECT id, destination, StudyInstanceUID, SeriesInstanceUID, SOPInstanceUID, _path, _attempts, "
                "_enqueued, _change, _payload FROM outbox WHERE destination = ? AND _state = 'pending' AND "
                f"_lease_owner = ? AND SOPInstanceUID IN ({','.join('?' * len(keys))}) ORDER BY id"),
                (destination, owner, *keys)).fetchall()
            chosen = [Row(*r[:7], r[7] - skew, r[8], r[9]) for r in rows]
            self._many(con, sql("UPDATE outbox SET _lease_until = ? WHERE id = ? AND _lease_owner = ?"),
                       [(now + lease, r.id, owner) for r in chosen])
        return chosen

    def settle(self, s: Settlement, owner: str) -> None:
        """Record the outcome of a claimed batch and drop its lease (only rows this
        ``owner`` still holds: a lease taken over after expiry is not touched)."""
        sql = self._sql
        with self._transaction() as con:
            now = self._now(con)
            skew = now - time.time()
            own = "id = ? AND _lease_owner = ?"
            self._many(con, sql(f"UPDATE outbox SET _state = 'delivered', _delivered = ?, "
                                f"_attempts = _attempts + 1, _lease_owner = NULL, _lease_until = NULL WHERE {own}"),
                       [(now, i, owner) for i in s.delivered])
            self._many(con, sql(f"UPDATE outbox SET _due = ?, _last_error = ?, _attempts = _attempts + 1, "
                                f"_lease_owner = NULL, _lease_until = NULL WHERE {own}"),
                       [(due + skew, err, i, owner) for i, due, err in s.retry])
            self._many(con, sql(f"UPDATE outbox SET _state = 'failed', _last_error = ?, _attempts = _attempts + 1, "
                                f"_lease_owner = NULL, _lease_until = NULL WHERE {own}"),
                       [(err, i, owner) for i, err in s.failed])
            self._many(con, sql(f"UPDATE outbox SET _solo = 1, _lease_owner = NULL, _lease_until = NULL WHERE {own}"),
                       [(i, owner) for i in s.solo])

    def renew(self, owner: str, lease: float) -> int:
        """Extend the leases ``owner`` holds to ``lease`` seconds from now (a long job's
        heartbeat, jobs/runner.py). Returns the rows still held: 0 when another worker took
        them over after the lease expired."""
        with self._transaction() as con:
            now = self._now(con)
            return con.execute(self._sql("UPDATE outbox SET _lease_until = ? WHERE _lease_owner = ? AND "
                                         "_state = 'pending'"), (now + lease, owner)).rowcount

    def release(self, owner_prefix: str) -> None:
        """Drop the leases of a stopping worker (rows become claimable at once)."""
        with self._transaction() as con:
            con.execute(self._sql("UPDATE outbox SET _lease_owner = NULL, _lease_until = NULL WHERE "
                                  "_state = 'pending' AND substr(_lease_owner, 1, length(?)) = ?"),
                        (owner_prefix, owner_prefix))

    def reap(self, host: str) -> int:
        """Drop the leases held by forwarders of ``host`` whose process is gone (a
        crash or SIGKILL): their rows are claimable now rather than when the lease
        expires. Owner tokens are ``host:pid:...``; a pid that exists (even reused by
        another program) keeps its leases until they expire, and so do the leases
        of other hosts' forwarders (another node's process cannot be asked).
        Returns rows freed."""
        with self._reading() as con:
            owners = [o for (o,) in con.execute(
                "SELECT DISTINCT _lease_owner FROM outbox WHERE _state = 'pending' AND _lease_owner IS NOT NULL")]
        dead = [(o,) for o in owners if _process_gone(o, host)]
        if not dead:
            return 0
        with self._transaction() as con:
            return self._many(con, self._sql("UPDATE outbox SET _lease_owner = NULL, _lease_until = NULL WHERE "
                                             "_state = 'pending' AND _lease_owner = ?"), dead)

    # --- operations ----------------------------------------------------------------------

    def stats(self) -> dict[str, dict]:
        """Per destination: pending, in_flight, delivered, failed, oldest pending age
        (seconds), last error (of a pending or failed row), latest delivery time
        (this process's clock)."""
        sql = self._sql
        out: dict[str, dict] = {}
        with self._reading() as con:
            now = self._now(con)
            skew = now - time.time()
            for dest, pending, in_flight, delivered, failed, oldest, last in con.execute(sql(
                    "SELECT destination, "
                    "sum(CASE WHEN _state = 'pending' AND (_lease_until IS NULL OR _lease_until < ?) THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN _state = 'pending' AND _lease_until >= ? THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN _state = 'delivered' THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN _state = 'failed' THEN 1 ELSE 0 END), "
                    "min(CASE WHEN _state = 'pending' THEN _enqueued END), max(_delivered) "
                    "FROM outbox GROUP BY destination ORDER BY destination"), (now, now)).fetchall():
                err = con.execute(sql("SELECT _last_error FROM outbox WHERE destination = ? AND "
                                      "_state != 'delivered' AND _last_error IS NOT NULL ORDER BY id DESC LIMIT 1"),
                                  (dest,)).fetchone()
                out[dest] = {"pending": pending, "in_flight": in_flight, "delivered": delivered, "failed": failed,
                             "oldest_pending_age": round(now - oldest, 3) if oldest is not None else None,
                             "last_error": err[0] if err else None,
                             "last_delivered": last - skew if last is not None else None}
        return out

    def study_stats(self, study: str) -> dict[str, dict]:
        """Per destination, the rows of one study: pending, in_flight, delivered, failed,
        and the last error of a row not delivered (the operator's page, api/admin.py)."""
        sql = self._sql
        out: dict[str, dict] = {}
        with self._reading() as con:
            now = self._now(con)
            for dest, pending, in_flight, delivered, failed in con.execute(sql(
                    "SELECT destination, "
                    "sum(CASE WHEN _state = 'pending' AND (_lease_until IS NULL OR _lease_until < ?) THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN _state = 'pending' AND _lease_until >= ? THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN _state = 'delivered' THEN 1 ELSE 0 END), "
                    "sum(CASE WHEN _state = 'failed' THEN 1 ELSE 0 END) "
                    "FROM outbox WHERE StudyInstanceUID = ? GROUP BY destination ORDER BY destination"),
                    (now, now, study)).fetchall():
                err = con.execute(sql("SELECT _last_error FROM outbox WHERE destination = ? AND StudyInstanceUID = ? "
                                      "AND _state != 'delivered' AND _last_error IS NOT NULL ORDER BY id DESC LIMIT 1"),
                                  (dest, study)).fetchone()
                out[dest] = {"pending": pending, "in_flight": in_flight, "delivered": delivered, "failed": failed,
                             "last_error": err[0] if err else None}
        return out

    def retry_failed(self, destination: str | None = None) -> int:
        """Dead letters back to pending, due now, attempts reset. Returns how many."""
        with self._transaction() as con:
            now = self._now(con)
            sql = ("UPDATE outbox SET _state = 'pending', _attempts = 0, _due = ?, _enqueued = ?, _solo = 1 "
                   "WHERE _state = 'failed'")
            params: list = [now, now]
            if destination is not None:
                sql += " AND destination = ?"
                params.append(destination)
            return con.execute(self._sql(sql), params).rowcount

    def prune(self, keep: float, limit: int = 10_000) -> int:
        """Remove up to ``limit`` rows delivered more than ``keep`` seconds ago (the back
        end's clock), oldest first, in one short transaction. Pending (owed) and failed
        (dead letter) rows are never removed. Returns how many went."""
        with self._transaction() as con:
            cutoff = self._now(con) - keep
            return con.execute(self._sql(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE _state = 'delivered' AND "
                "_delivered < ? ORDER BY _delivered LIMIT ?)"), (cutoff, limit)).rowcount

    def undelivered(self, study_uid: str) -> dict[str, int]:
        """Destination -> forwards of the study's instances not delivered (pending, in
        flight or dead letters; a webhook's notifications not counted): retention's
        "only once delivered" (policy/retention.py)."""
        with self._reading() as con:
            cur = con.execute(self._sql(
                "SELECT destination, count(*) FROM outbox WHERE StudyInstanceUID = ? AND _change IS NULL "
                "AND _state != 'delivered' GROUP BY destination"), (study_uid,))
            return {d: int(n) for d, n in cur.fetchall()}

    def rows(self, destination: str | None = None) -> list[dict]:
        """Every row (for tests and the load test's reconciliation); times on the
        back end's clock."""
        with self._reading() as con:
            cur = con.execute(self._sql(
                "SELECT id, destination, SOPInstanceUID, _state, _attempts, _enqueued, _delivered, _last_error "
                "FROM outbox" + (" WHERE destination = ?" if destination else "") + " ORDER BY id"),
                (destination,) if destination else ())
            return [dict(zip(_ROWS, r)) for r in cur.fetchall()]


class SQLiteOutbox(Outbox):
    """The outbox table in one SQLite file (``index.sqlite`` or ``outbox.sqlite``).

    ``writer`` serialises this object's write transactions with the index's group
    commit (the same ``flock``), so they queue instead of meeting SQLite's
    sleep-and-retry busy handler; ``BEGIN IMMEDIATE`` makes every write
    transaction (claims included) serial across processes.
    """

    def __init__(self, path: Path, writer: Callable[[], AbstractContextManager] | None = None,
                 ledger: bool = False) -> None:
        self.path = Path(path)
        self._writer = writer or nullcontext
        self._connections = ThreadConnections(self.path)
        with self._writer():
            con = self._connections.get()
            con.executescript(_SCHEMA + (_LEDGER if ledger else ""))
            have = {row[1] for row in con.execute("PRAGMA table_info(outbox)")}
            if "_change" not in have:
                con.execute("ALTER TABLE outbox ADD COLUMN _change INTEGER")  # an outbox from before webhooks
            if "_payload" not in have:  # an outbox from before storage commitment
                con.execute("ALTER TABLE outbox ADD COLUMN _payload TEXT")

    def close(self) -> None:
        self._connections.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        yield self._connections.get()

    @contextmanager
    def _transaction(self, hooked: bool = False) -> Iterator[sqlite3.Connection]:
        with nullcontext() if hooked else self._writer():
            con = self._connections.get()
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise

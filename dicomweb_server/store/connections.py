"""One SQLite connection per thread (sqlite3 connections are not shared between
threads at once; ``dedicated`` gives one that its owner hands from thread to thread
under a lock of its own), all closed together. WAL journal, ``synchronous=FULL``: a
commit survives power loss; writers wait up to 30 s for the database lock.

A thread's connection goes back to an idle list when the thread ends, and the next
new thread takes it from there: the DIMSE listener runs every association on a new
thread, and a connection per thread that was never given back held three file
descriptors and a page cache per association ever served (730 descriptors after
~500 associations: the process would have run out of them).

The first connection of each process to a database opens under an exclusive ``flock`` of
``<database>.init-lock`` beside it: ``PRAGMA journal_mode=WAL`` on a new database needs the
exclusive lock and, when another process or thread converts it at the same moment, fails at
once with "database is locked" (SQLite does not wait on its busy handler there). Serve on a
new data folder starts two workers and two DIMSE listeners together: 11 of 160 such opens
failed when tried, taking a worker or listener down at start-up.

Used by the SQLite index (``store/sqlite.py``, with two more pragmas) and the routing outbox.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: idle connections kept for the next threads (more are closed)
MAX_IDLE = 16


class _Lease:
    """Held in a thread's ``threading.local``: dropped when the thread ends (CPython clears
    a finished thread's locals), which gives the connection back."""

    __slots__ = ("con", "owner")

    def __init__(self, con: sqlite3.Connection, owner: ThreadConnections) -> None:
        self.con = con
        self.owner = owner

    def __del__(self) -> None:
        try:
            self.owner._give_back(self.con)
        except Exception:  # interpreter shutdown: nothing left to give back to
            pass


class ThreadConnections:
    def __init__(self, path: Path, pragmas: tuple[str, ...] = ()) -> None:
        self.path = path
        self.pragmas = ("journal_mode=WAL", "synchronous=FULL", *pragmas)
        self._local = threading.local()
        self._all: set[sqlite3.Connection] = set()  # open connections, leased or idle
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._opened_once = False  # the first connection (journal mode set) is open
        self._init_lock = threading.Lock()  # not _lock: a _Lease.__del__ (GC) may take that one

    def get(self) -> sqlite3.Connection:
        """This thread's connection (autocommit mode: transactions are explicit)."""
        lease = getattr(self._local, "lease", None)
        if lease is not None:
            return lease.con
        with self._lock:
            con = self._idle.pop() if self._idle else None
            self._closed = False
        if con is None:
            con = self._open()
        self._local.lease = _Lease(con, self)
        return con

    def dedicated(self) -> sqlite3.Connection:
        """A connection of its own for the caller to keep (not leased to a thread, never
        given to another), closed by :meth:`close` with the others (or :meth:`discard`)."""
        with self._lock:
            self._closed = False
        return self._open()

    def _open(self) -> sqlite3.Connection:
        """A new connection, counted in ``_all``; the first of the process opens under the
        init lock (module docstring)."""
        if self._opened_once:
            con = self._connect()
        else:
            with self._init_lock, _exclusive(Path(f"{self.path}.init-lock")):
                con = self._connect()
                self._opened_once = True
        with self._lock:
            self._all.add(con)
        return con

    def discard(self, con: sqlite3.Connection) -> None:
        """Close ``con`` now and forget it (a dedicated connection its owner gives up)."""
        with self._lock:
            self._all.discard(con)
        try:
            con.close()
        except sqlite3.Error:
            pass

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        for pragma in self.pragmas:
            con.execute(f"PRAGMA {pragma}")
        return con

    def _give_back(self, con: sqlite3.Connection) -> None:
        with self._lock:
            if con not in self._all:  # closed by close() meanwhile
                return
            if not self._closed and len(self._idle) < MAX_IDLE and not con.in_transaction:
                self._idle.append(con)
                return
            self._all.discard(con)
        try:
            con.close()
        except sqlite3.Error:
            pass

    def open_connections(self) -> int:
        """Connections open now, leased to live threads or idle (for tests)."""
        with self._lock:
            return len(self._all)

    def close(self) -> None:
        with self._lock:
            cons, self._all, self._idle = list(self._all), set(), []
            self._closed = True
        for con in cons:
            try:
                con.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()


@contextmanager
def immediate(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction (``BEGIN IMMEDIATE``: the database's write lock from the
    start) committed when the block ends, rolled back when it raises."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:  # SQLite may have rolled back itself (e.g. SQLITE_FULL)
            con.execute("ROLLBACK")
        raise


class _exclusive:
    """An exclusive ``flock`` of ``path`` (made if missing) while in the block: blocking,
    released when the block ends or the process dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # releases the lock

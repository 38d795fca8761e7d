"""store/connections.ThreadConnections: a thread's SQLite connection is given back when the
thread ends (the DIMSE listener runs each association on a new thread: a connection per
thread ever seen leaked three file descriptors per association)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

from dicomweb_server.store.connections import MAX_IDLE, ThreadConnections
from dicomweb_server.store.sqlite import SQLiteIndex


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_connections_of_ended_threads_are_reused_not_leaked(tmp_path):
    index = SQLiteIndex(tmp_path / "index.sqlite")
    seen: list[int] = []

    def one():
        assert index.locate("1.2.3") is None  # a query: this thread's connection
        seen.append(id(index._con()))

    before = _fds()
    for _ in range(200):  # one after another, like sequential associations
        t = threading.Thread(target=one)
        t.start()
        t.join()
    assert index._connections.open_connections() <= 2  # the main thread's and one reused
    assert len(set(seen)) == 1  # every thread took the connection the previous one gave back
    assert _fds() - before <= 3  # at most one more connection's files (db, WAL, shm)
    index.close()
    assert index._connections.open_connections() == 0


def test_idle_connections_are_bounded(tmp_path):
    cons = ThreadConnections(tmp_path / "x.sqlite")
    go = threading.Event()
    ready = threading.Barrier(MAX_IDLE + 9, timeout=60)  # a thread that raised: a failure, not a hang

    def hold():
        cons.get().execute("SELECT 1")
        ready.wait()
        go.wait()

    threads = [threading.Thread(target=hold) for _ in range(MAX_IDLE + 8)]
    for t in threads:
        t.start()
    ready.wait()
    assert cons.open_connections() == MAX_IDLE + 8  # all leased at once
    go.set()
    for t in threads:
        t.join()
    assert cons.open_connections() == MAX_IDLE  # the rest were closed
    con = cons.get()  # an idle one, usable from this thread
    assert con.execute("SELECT 2").fetchone() == (2,)
    cons.close()
    assert cons.open_connections() == 0


def _open_new_database(path: str, start, errors) -> None:
    start.wait()
    try:
        SQLiteIndex(Path(path)).close()
    except Exception as e:  # noqa: BLE001 - what the test looks for
        errors.put(repr(e))


def test_processes_opening_a_new_database_together_all_succeed(tmp_path):
    """``serve`` on a new data folder starts workers and DIMSE listeners at once, each
    opening the new index: ``PRAGMA journal_mode=WAL`` then failed with "database is
    locked" in some of them (11 of 160 opens before the fix), without waiting."""
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for trial in range(20):
        start = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_new_database, args=(str(tmp_path / f"i{trial}.sqlite"), start, errors))
                 for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert errors.empty(), errors.get()


def test_threads_opening_a_new_database_together_all_succeed(tmp_path):
    errors: list[str] = []
    for trial in range(20):
        cons = ThreadConnections(tmp_path / f"t{trial}.sqlite")
        start = threading.Barrier(16, timeout=60)

        def one(cons=cons, start=start):
            start.wait()
            try:
                cons.get().execute("SELECT 1")
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cons.close()
    assert errors == []

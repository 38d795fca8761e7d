"""store/connections.ThreadConnections: a thread's SQLite connection is given back when the
thread ends (the DIMSE listener runs each association on a new thread: a connection per
thread ever seen leaked three file descriptors per association)."""

from __future__ import annotations

import os
import threading

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
    ready = threading.Barrier(MAX_IDLE + 9)

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

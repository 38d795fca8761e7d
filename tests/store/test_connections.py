"""store/connections.ThreadConnections: a thread's SQLite connection is given back when the
thread ends (the DIMSE listener runs each association on a new thread: a connection per
thread ever seen leaked three file descriptors per association)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.store.connections import MAX_IDLE, ThreadConnections
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.helpers import make_dataset


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


def _records(tmp_path: Path, n: int) -> list:
    out = []
    for k in range(n):
        ds = make_dataset(study="1.2.826.0.1.3680043.8.498.91", series="1.2.826.0.1.3680043.8.498.92",
                          sop=f"1.2.826.0.1.3680043.8.498.93.{k + 1}", PatientID="P1", InstanceNumber=k + 1)
        path = tmp_path / f"{k}.dcm"
        ds.save_as(path, enforce_file_format=True)
        out.append(describe_instance(path))
    return out


def test_index_add_from_many_threads_writes_with_one_connection(tmp_path, monkeypatch):
    """The group commit's leader is whichever request's thread comes first; a connection per
    thread began every commit with a cold page cache (SQLite drops it when another connection
    changed the database): ``add`` writes with one connection per process (issue 33)."""
    index = SQLiteIndex(tmp_path / "index.sqlite")
    used: list[int] = []
    real = SQLiteIndex._add_rows

    def spy(self, con, records, action):
        used.append(id(con))
        return real(self, con, records, action)

    monkeypatch.setattr(SQLiteIndex, "_add_rows", spy)
    records = _records(tmp_path, 16)
    pools = [ThreadPoolExecutor(1) for _ in range(8)]  # long-lived threads, as the web workers'
    for k, pool in enumerate(pools):  # in turn, as eight requests' threads lead commits
        pool.submit(index.add, records[2 * k : 2 * k + 2]).result()
    for pool in pools:
        pool.shutdown()
    assert len(used) == 8 and len(set(used)) == 1
    assert index.count() == 16
    index.close()  # closes the writing connection too
    assert index._connections.open_connections() == 0
    index2 = SQLiteIndex(tmp_path / "index.sqlite")
    assert index2.add(records[:1]) == [False]  # stored already: every batch was committed
    index2.close()


def test_a_forked_child_writes_with_a_connection_of_its_own(tmp_path):
    index = SQLiteIndex(tmp_path / "index.sqlite")
    records = _records(tmp_path, 4)
    assert index.add(records[:2]) == [True, True]  # the parent's writing connection is open
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put(index.add(records[2:]))  # the inherited index, in the child: not the parent's connection

    p = ctx.Process(target=child)  # (no other thread holds the index's locks at the fork)
    p.start()
    try:
        p.join(30)
        assert p.exitcode == 0 and q.get(timeout=5) == [True, True]
    finally:
        if p.is_alive():
            p.kill()
    assert index.add(records[:1]) == [False]  # the parent's connection still works
    assert index.count() == 4
    index.close()


def test_a_failed_rollback_does_not_keep_the_write_lock(tmp_path, monkeypatch):
    """The writing connection is shared by the process's threads: one left inside a transaction
    (its ROLLBACK failed, e.g. an I/O error) would hold the database's write lock for every
    process and fail every later add; it is closed and a new one opened (review, issue 33)."""

    class Flaky(sqlite3.Connection):
        fail = False

        def execute(self, sql, *args):
            if Flaky.fail and sql == "ROLLBACK":
                raise sqlite3.OperationalError("disk I/O error (test)")
            return super().execute(sql, *args)

    def connect(self):
        con = sqlite3.connect(self.path, timeout=1.0, isolation_level=None, check_same_thread=False, factory=Flaky)
        for pragma in self.pragmas:
            con.execute(f"PRAGMA {pragma}")
        return con

    monkeypatch.setattr(ThreadConnections, "_connect", connect)
    index = SQLiteIndex(tmp_path / "index.sqlite")
    other = SQLiteIndex(tmp_path / "index.sqlite")  # another process's index, as far as SQLite knows
    records = _records(tmp_path, 4)
    assert index.add(records[:1]) == [True]
    real = SQLiteIndex._add_rows

    def boom(self, con, records, action):
        raise RuntimeError("a record the index refuses (test)")

    monkeypatch.setattr(SQLiteIndex, "_add_rows", boom)
    Flaky.fail = True
    try:
        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            index.add(records[1:2])
    finally:
        Flaky.fail = False
        monkeypatch.setattr(SQLiteIndex, "_add_rows", real)
    assert other.add(records[2:3]) == [True]  # the write lock was released (1 s busy timeout here)
    assert index.add(records[1:2] + records[3:]) == [True, True]  # a new writing connection
    assert index.count() == 4
    index.close()
    other.close()
    assert index._connections.open_connections() == 0

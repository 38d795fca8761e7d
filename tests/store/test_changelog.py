"""The change log (store/changes.py) on the three indexes: one row per instance per
create and delete, in the index transaction of the change; Sequence numbers 1, 2, 3...
that a polling reader never sees out of order, also with concurrent writers (threads,
SQLite connections as worker processes have, PostgreSQL nodes)."""

from __future__ import annotations

import random
import threading
import time

import pytest
from pydicom.uid import generate_uid

from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.store.test_index_contract import index, open_index, record  # noqa: F401 - fixture

KINDS = ["memory", "sqlite", "postgresql"]


def summary(changes) -> list[tuple]:
    return [(c.sequence, c.action, c.state, c.sop_uid, c.version) for c in changes]


def test_creates_and_deletes_are_logged_with_current_state(index, tmp_path):
    st, se = generate_uid(), generate_uid()
    a, b, c = (record(tmp_path, study=st, series=se, PatientID="P", InstanceNumber=n) for n in (1, 2, 3))
    t0 = time.time()
    assert index.add([a, b]) == [True, True]
    assert index.add([a]) == [False]  # already stored: no change
    assert index.add([c]) == [True]
    t1 = time.time()
    got = index.changes(limit=100)
    assert summary(got) == [(1, "create", "current", a.sop_uid, 1), (2, "create", "current", b.sop_uid, 1),
                            (3, "create", "current", c.sop_uid, 1)]
    assert all(x.study_uid == st and x.series_uid == se for x in got)
    assert all(t0 - 1 <= x.timestamp <= t1 + 1 for x in got)

    assert len(index.delete(st, se, b.sop_uid)) == 1
    assert summary(index.changes(limit=100)) == [
        (1, "create", "current", a.sop_uid, 1), (2, "create", "deleted", b.sop_uid, 1),
        (3, "create", "current", c.sop_uid, 1), (4, "delete", "deleted", b.sop_uid, 1)]
    assert summary([index.latest_change()]) == [(4, "delete", "deleted", b.sop_uid, 1)]

    assert index.add([b]) == [True]  # stored again: its second version
    assert len(index.delete(st)) == 3  # the study: one row per instance, in arrival order
    assert summary(index.changes(after=4, limit=100)) == [
        (5, "create", "deleted", b.sop_uid, 2), (6, "delete", "deleted", a.sop_uid, 1),
        (7, "delete", "deleted", c.sop_uid, 1), (8, "delete", "deleted", b.sop_uid, 2)]
    assert {x.state for x in index.changes(limit=100)} == {"deleted"}
    assert index.delete(st) == [] and index.latest_change().sequence == 8  # nothing deleted: nothing logged


def test_paging_and_time_window(index, tmp_path):
    recs = [record(tmp_path, PatientID=f"P{i}") for i in range(7)]
    assert index.add(recs[:4]) == [True] * 4
    time.sleep(0.05)
    middle = time.time()
    time.sleep(0.05)
    assert index.add(recs[4:]) == [True] * 3
    assert [x.sequence for x in index.changes(after=2, limit=3)] == [3, 4, 5]
    assert [x.sequence for x in index.changes(skip=5, limit=10)] == [6, 7]
    assert [x.sequence for x in index.changes(start=middle, limit=10)] == [5, 6, 7]
    assert [x.sequence for x in index.changes(end=middle, skip=1, limit=2)] == [2, 3]
    assert index.changes(after=7) == []


def test_empty_log(index):
    assert index.latest_change() is None and index.changes() == []


def test_a_failing_change_hook_rolls_the_change_back(index, tmp_path):
    """The hook runs in the change's transaction: when it fails, neither the instance
    nor its change-log row stays (and a failed delete keeps the instance)."""
    a = record(tmp_path)
    calls = []

    def hook(con, changes):
        calls.append([c.action for c in changes])
        if fail:
            raise RuntimeError("hook failed")

    index.add_change_hook(hook)
    fail = True
    with pytest.raises(RuntimeError):
        index.add([a])
    assert index.locate(a.sop_uid) is None and index.latest_change() is None
    fail = False
    assert index.add([a]) == [True]
    fail = True
    with pytest.raises(RuntimeError):
        index.delete(a.study_uid)
    assert index.locate(a.sop_uid) is not None
    assert summary(index.changes()) == [(1, "create", "current", a.sop_uid, 1)]
    assert calls == [["create"], ["create"], ["delete"]]


def test_memory_journal_survives_restart_and_rebuild(tmp_path):
    """The in-memory index re-adds every stored file at start-up: the change log (on
    disk) gains nothing for those it holds as current, a create for one it never
    logged (a crash between the file and the commit), a delete for one gone."""
    journal = tmp_path / "outbox.sqlite"
    a, b, c = (record(tmp_path) for _ in range(3))
    idx = MemoryIndex(journal)
    assert idx.add([a, b]) == [True, True]
    idx.close()
    idx = MemoryIndex(journal)  # restart: the files of a and c are found
    assert idx.add([a, c]) == [True, True]
    assert idx.reconcile_changes() == 1
    assert summary(idx.changes(limit=10)) == [(1, "create", "current", a.sop_uid, 1),
                                              (2, "create", "deleted", b.sop_uid, 1),
                                              (3, "create", "current", c.sop_uid, 1),
                                              (4, "delete", "deleted", b.sop_uid, 1)]
    idx.close()


def test_sqlite_index_from_before_the_change_log_is_backfilled(tmp_path):
    idx = SQLiteIndex(tmp_path / "index.sqlite")
    a, b = record(tmp_path), record(tmp_path)
    assert idx.add([a, b]) == [True, True]
    con = idx._con()
    con.execute("DROP TABLE changelog")  # as an index written before this version
    idx.close()
    idx = SQLiteIndex(tmp_path / "index.sqlite")
    assert summary(idx.changes()) == [(1, "create", "current", a.sop_uid, 1), (2, "create", "current", b.sop_uid, 1)]
    idx.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_polling_reader_never_misses_a_change(kind, tmp_path, request):
    """Writers (threads; SQLite: one index connection each, as worker processes have;
    PostgreSQL: one node each, own pools) store and delete while a reader polls
    ``changes(after=last seen)``: it sees every Sequence from 1 to the end, in order,
    each once. A hook sleeping between the append and the commit widens the window in
    which a later Sequence could commit first."""
    n_writers, per_writer = 4, 12
    if kind == "memory":
        shared = MemoryIndex()
        writers = [shared] * n_writers
        reader = shared
    elif kind == "sqlite":
        writers = [SQLiteIndex(tmp_path / "index.sqlite") for _ in range(n_writers)]
        reader = SQLiteIndex(tmp_path / "index.sqlite")
    else:
        url = request.getfixturevalue("pg_url")
        writers = [PostgreSQLIndex(url, pool_size=2) for _ in range(n_writers)]
        reader = PostgreSQLIndex(url, pool_size=2)
    for w in set(writers):
        w.add_change_hook(lambda con, changes: time.sleep(random.uniform(0, 0.01)))
    recs = [[record(tmp_path, PatientID=f"W{w}") for _ in range(per_writer)] for w in range(n_writers)]
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i, r in enumerate(recs[w]):
                assert writers[w].add([r]) == [True]
                if i % 3 == 2:
                    writers[w].delete(r.study_uid)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(n_writers)]
    for t in threads:
        t.start()
    seen: list[int] = []
    actions: dict[str, list[str]] = {}
    while any(t.is_alive() for t in threads) or (reader.latest_change() or 0) and \
            reader.latest_change().sequence > (seen[-1] if seen else 0):
        for c in reader.changes(after=seen[-1] if seen else 0, limit=7):
            seen.append(c.sequence)
            actions.setdefault(c.sop_uid, []).append(c.action)
    for t in threads:
        t.join()
    assert not errors, errors
    total = n_writers * per_writer + n_writers * (per_writer // 3)
    assert seen == list(range(1, total + 1))
    assert len(actions) == n_writers * per_writer
    assert sorted(map(tuple, actions.values())) == sorted(
        [("create", "delete")] * (n_writers * (per_writer // 3))
        + [("create",)] * (n_writers * (per_writer - per_writer // 3)))
    for w in {*writers, reader}:
        w.close()


def test_postgresql_schema_5_logs_the_instances_already_stored(pg_url, tmp_path):
    """A database migrated from version 4 (no change log): version 5 logs a create for
    every stored instance, in arrival order, and adds the outbox's ``_change`` column."""
    import psycopg

    idx = PostgreSQLIndex(pg_url)
    a, b = record(tmp_path), record(tmp_path)
    assert idx.add([a, b]) == [True, True]
    idx.close()
    from tests.store.test_index_contract import _drop_derived

    with psycopg.connect(pg_url, autocommit=True) as con:  # back to version 4 (5: changelog; 6, 7: matching)
        con.execute("DROP TABLE changelog")
        con.execute("ALTER TABLE outbox DROP COLUMN _change")
        con.execute("DROP TABLE sequence_item")
        _drop_derived(con)
        con.execute("DELETE FROM schema_version WHERE version >= 5")
    idx = PostgreSQLIndex(pg_url)
    assert summary(idx.changes()) == [(1, "create", "current", a.sop_uid, 1), (2, "create", "current", b.sop_uid, 1)]
    c = record(tmp_path)
    assert idx.add([c]) == [True]
    assert summary([idx.latest_change()]) == [(3, "create", "current", c.sop_uid, 1)]
    idx.close()

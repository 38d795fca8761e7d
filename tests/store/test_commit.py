"""Group commit (store/commit.py): concurrent writers share commits, each gets its
own answer, and an index error reaches every request of the group."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dicomweb_server.store.commit import FolderSyncs, GroupCommitter
from dicomweb_server.store.memory import MemoryIndex
from tests.store.test_index_contract import record


class SlowIndex(MemoryIndex):
    """Commits take 20 ms, like an fsync on a slow disk."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.calls = 0
        self.fail = fail

    def add(self, records):
        self.calls += 1
        time.sleep(0.02)
        if self.fail:
            raise OSError(28, "No space left on device")
        return super().add(records)


def test_concurrent_commits_are_batched(tmp_path):
    index = SlowIndex()
    gc = GroupCommitter(index, tmp_path / "index.lock")
    recs = [record(tmp_path) for _ in range(16)]
    results: dict[int, list[bool]] = {}

    def writer(i):
        results[i] = gc.commit([recs[i]], {tmp_path})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: [True] for i in range(16)}
    assert index.count() == 16
    assert index.calls < 16  # requests that queued behind a commit shared the next one
    assert gc.commit([recs[0]], {tmp_path}) == [False]


def test_an_error_reaches_every_request_of_the_group(tmp_path):
    gc = GroupCommitter(SlowIndex(fail=True), tmp_path / "index.lock")
    errors = []

    def writer():
        try:
            gc.commit([record(tmp_path)], {tmp_path})
        except OSError as e:
            errors.append(e.errno)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [28] * 4


def test_missing_directory_fails_the_commit(tmp_path):
    gc = GroupCommitter(MemoryIndex(), tmp_path / "index.lock")
    with pytest.raises(FileNotFoundError):
        gc.commit([record(tmp_path)], {tmp_path / "gone"})


def test_announced_requests_join_the_commit_of_the_first(tmp_path):
    index = SlowIndex()
    gc = GroupCommitter(index, tmp_path / "index.lock")
    gc.MAX_WAIT = 5.0  # never reached: the second request queues within milliseconds
    recs = [record(tmp_path) for _ in range(2)]
    results = {}
    with gc.expecting() as first, gc.expecting() as second:
        t = threading.Thread(target=lambda: results.setdefault(0, gc.commit([recs[0]], {tmp_path}, first)))
        t.start()
        time.sleep(0.1)  # the first waits for the second, which is still writing its file
        assert 0 not in results
        results[1] = gc.commit([recs[1]], {tmp_path}, second)
        t.join(5)
    assert results == {0: [True], 1: [True]}
    assert index.calls == 1 and gc.batches == 1


def test_a_withdrawn_announcement_releases_the_waiting_commit(tmp_path):
    gc = GroupCommitter(SlowIndex(), tmp_path / "index.lock")
    gc.MAX_WAIT = 30.0
    done = threading.Event()
    with gc.expecting() as mine:
        with gc.expecting():  # another request, which then fails before its commit
            t = threading.Thread(target=lambda: (gc.commit([record(tmp_path)], {tmp_path}, mine), done.set()))
            t.start()
            time.sleep(0.1)
            assert not done.is_set()
        t0 = time.monotonic()
        assert done.wait(5)
        assert time.monotonic() - t0 < 2  # released at once, not after MAX_WAIT
        t.join(5)


def test_the_wait_for_announced_requests_is_bounded(tmp_path):
    gc = GroupCommitter(SlowIndex(), tmp_path / "index.lock")
    gc.MAX_WAIT = 0.2
    with gc.expecting():  # announced, never commits while we wait
        t0 = time.monotonic()
        assert gc.commit([record(tmp_path)], {tmp_path}) == [True]
        assert 0.15 < time.monotonic() - t0 < 3


# --- folder fsyncs outside the writer lock (FolderSyncs, issue 11) ---------------------


class _GatedSync:
    """A folder fsync that blocks until released, recording each call."""

    def __init__(self) -> None:
        self.calls: list[Path] = []
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.fail_next = False

    def __call__(self, folder: Path) -> None:
        self.calls.append(folder)
        self.started.release()
        assert self.release.wait(5)
        if self.fail_next:
            self.fail_next = False
            raise OSError(5, "Input/output error")


def test_a_folder_fsync_that_started_before_the_ask_does_not_count(tmp_path):
    """B asks while A's fsync runs: B's change (linked after that fsync started) is
    only durable after a second fsync, which B waits for."""
    sync = _GatedSync()
    folders = FolderSyncs(sync)
    done: list[str] = []
    a = threading.Thread(target=lambda: (folders.sync({tmp_path}), done.append("A")))
    a.start()
    assert sync.started.acquire(timeout=5)  # A's fsync is running
    b = threading.Thread(target=lambda: (folders.sync({tmp_path}), done.append("B")))
    b.start()
    time.sleep(0.1)
    assert len(sync.calls) == 1  # B waits for A's fsync to end, then leads its own
    sync.release.set()
    a.join(5)
    b.join(5)
    assert sorted(done) == ["A", "B"]
    assert sync.calls == [tmp_path, tmp_path]


def test_requests_that_ask_meanwhile_share_one_folder_fsync(tmp_path):
    sync = _GatedSync()
    folders = FolderSyncs(sync)
    first = threading.Thread(target=folders.sync, args=({tmp_path},))
    first.start()
    assert sync.started.acquire(timeout=5)
    waiting = [threading.Thread(target=folders.sync, args=({tmp_path},)) for _ in range(6)]
    for t in waiting:
        t.start()
    time.sleep(0.2)  # all six asked while the first fsync ran
    sync.release.set()
    for t in [first, *waiting]:
        t.join(5)
    assert len(sync.calls) == 2  # the first one, and one for the six
    assert folders.fsyncs == 2
    assert folders._states == {}  # nothing kept for idle folders


def test_a_failed_folder_fsync_fails_its_caller_and_the_others_sync_again(tmp_path):
    sync = _GatedSync()
    folders = FolderSyncs(sync)
    sync.fail_next = True
    errors: list[int] = []

    def run():
        try:
            folders.sync({tmp_path})
        except OSError as e:
            errors.append(e.errno)

    first = threading.Thread(target=run)
    first.start()
    assert sync.started.acquire(timeout=5)
    second = threading.Thread(target=run)
    second.start()
    time.sleep(0.1)
    sync.release.set()
    first.join(5)
    second.join(5)
    assert errors == [5]  # the second ran its own fsync, which succeeded
    assert len(sync.calls) == 2


def test_the_folder_fsync_is_not_made_under_the_writer_lock(tmp_path):
    """The index commit of one request does not wait for another request's folder fsync."""
    gc = GroupCommitter(MemoryIndex(), tmp_path / "index.lock")
    sync = _GatedSync()
    gc.folders = FolderSyncs(sync)
    slow = tmp_path / "slow"
    slow.mkdir()
    t = threading.Thread(target=gc.commit, args=([record(tmp_path)], {slow}))
    t.start()
    assert sync.started.acquire(timeout=5)  # the first request is in its folder fsync
    t0 = time.monotonic()
    assert gc.commit([record(tmp_path)], set()) == [True]  # no folder: straight to the index
    assert time.monotonic() - t0 < 2
    sync.release.set()
    t.join(5)
    assert gc.batches == 2


def test_a_request_committed_by_another_returns_without_taking_the_writer_lock(tmp_path):
    """B queues while A (the leader) waits for the cross-process lock; A's commit holds
    both. B then returns at once: before, B took the writer lock itself afterwards,
    waiting behind the other process's next commit too (issue 11)."""
    import fcntl
    import os

    gc = GroupCommitter(MemoryIndex(), tmp_path / "index.lock")
    entered = []
    real_writer = gc.writer

    def counting_writer():
        entered.append(threading.current_thread().name)
        return real_writer()

    gc.writer = counting_writer
    other = os.open(tmp_path / "index.lock", os.O_RDWR | os.O_CREAT)  # "the other process"
    fcntl.flock(other, fcntl.LOCK_EX)
    results = {}
    a = threading.Thread(target=lambda: results.setdefault("A", gc.commit([record(tmp_path)], set())), name="A")
    a.start()
    deadline = time.monotonic() + 5
    while not entered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert entered == ["A"]  # A leads, waiting for the flock
    b = threading.Thread(target=lambda: results.setdefault("B", gc.commit([record(tmp_path)], set())), name="B")
    b.start()
    time.sleep(0.1)
    fcntl.flock(other, fcntl.LOCK_UN)
    a.join(5)
    b.join(5)
    os.close(other)
    assert results == {"A": [True], "B": [True]}
    assert gc.batches == 1  # one commit for both
    assert entered == ["A"]  # B never took the writer lock


def test_a_request_queueing_does_not_wake_the_requests_waiting_for_a_commit(tmp_path, monkeypatch):
    """Issue 33: every announced request, as it queued, notified the one condition that the
    requests waiting for the leader's commit also waited on: each arrival woke them all to
    wait again (50 voluntary context switches per C-STORE'd instance at 16 associations,
    21 at 4). They now wake when a commit ends, once each."""
    import fcntl
    import os

    gc = GroupCommitter(MemoryIndex(), tmp_path / "index.lock")
    main = threading.get_ident()
    wakeups = []
    real_wait = threading.Condition.wait

    def counting_wait(self, timeout=None):
        got = real_wait(self, timeout)
        if threading.get_ident() != main:
            wakeups.append(got)
        return got

    monkeypatch.setattr(threading.Condition, "wait", counting_wait)
    other = os.open(tmp_path / "index.lock", os.O_RDWR | os.O_CREAT)  # "the other process"
    fcntl.flock(other, fcntl.LOCK_EX)
    results = []

    def request():
        with gc.expecting() as token:
            results.append(gc.commit([record(tmp_path)], set(), token))

    leader = threading.Thread(target=request)
    leader.start()  # leads, waits for the flock
    time.sleep(0.1)
    waiting = [threading.Thread(target=request) for _ in range(8)]
    for t in waiting:
        t.start()
    time.sleep(0.1)  # queued behind the leader, waiting for its commit
    arrivals = [threading.Thread(target=request) for _ in range(20)]
    for t in arrivals:  # one by one: each queues and waits too
        t.start()
        t.join(0.02)
    fcntl.flock(other, fcntl.LOCK_UN)
    for t in [leader, *waiting, *arrivals]:
        t.join(10)
    os.close(other)
    assert results == [[True]] * 29 and gc.index.count() == 29
    # each of the 28 waiting requests wakes once or twice (the first commit covers the 1st
    # request; the next leader the rest); each arrival waking every waiter made it 300+
    assert len(wakeups) < 100, len(wakeups)

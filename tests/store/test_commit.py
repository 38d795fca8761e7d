"""Group commit (store/commit.py): concurrent writers share commits, each gets its
own answer, and an index error reaches every request of the group."""

from __future__ import annotations

import threading
import time

import pytest

from dicomweb_server.store.commit import GroupCommitter
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

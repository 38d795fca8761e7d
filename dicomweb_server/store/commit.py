"""Group commit: the last step of every STOW-RS request (directory fsyncs, then the
index commit). The directory fsyncs are made by each request before it queues, shared
by the requests of a process that wait for the same folder (:class:`FolderSyncs`),
outside the writer lock; the index commit is done by whichever request holds the
writer lock, for every request queued behind it, in one transaction.

Why the folder fsyncs are outside the lock (issue 11, strace): inside it, each
commit held the lock for a folder fsync plus the WAL's fdatasync (two journal
commits of the file system, 2-3 ms each with 8 requests at once), the two worker
processes took turns on the ``flock``, and a request waited 6.7 ms on average for
it. Outside, they overlap with the other process's index commit and with other
requests' file syncs (ext4's journal merges concurrent syncs into one commit). The
order for one request is unchanged: file synced, linked, its folder fsynced (by a
fsync that started after the link), then the index commit that makes it visible.

Under load this turns N fsync+commit pairs into one, and it replaces SQLite's
sleep-and-retry busy handler (which gave STOW-RS p99 latencies of seconds) with a
blocking lock: a ``threading.Lock`` inside the process and an ``flock`` on
``data/index.lock`` across worker processes. A request returns only after its own
records are durable; an error fails every request of that group.

A request announces itself (:meth:`GroupCommitter.expecting`) once its instances are
described and their files are being written and synced. A request that reaches the
commit waits (a condition, at most :attr:`GroupCommitter.MAX_WAIT`) until every
announced request of this process has queued too, so one directory fsync per folder
and one index commit serve them all (PostgreSQL's ``commit_delay`` with
``commit_siblings``, bounded, and only while others are known to be on their way):
without it, the CPU-bound requests of a worker arrived one by one and most commits
held one instance (strace, issue 11).

Because every index write runs under this lock, checks made inside ``Index.add``
(a study filed under one patient only, a series under one study only, a SOP
Instance UID in one series only) are
atomic across threads and worker processes: of two requests that conflict, the
one committed second is refused (store/base.py ``hierarchy_conflict``).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..dicom.instance import InstanceRecord
from .base import Index, Refused
from .blobs import fsync_dir


class FolderSyncs:
    """fsync of folders, shared by the threads of a process that need the same folder
    synced at the same time: a thread that needs folder F synced after its change
    (a link) waits for a fsync of F that *started* after it asked; while one runs,
    the threads that ask meanwhile are served together by the next one (one fsync
    per folder per wave, as the group commit made one per folder per batch). A
    failed fsync is raised in the thread that ran it; the threads it would have
    served run their own (each then fails or succeeds on its own)."""

    class _State:
        __slots__ = ("asked", "done", "running")

        def __init__(self) -> None:
            self.asked = 0  # tickets given (a thread's change is covered by ticket n)
            self.done = 0  # every ticket up to this one is durable
            self.running = False

    def __init__(self, sync: Callable[[Path], None] | None = None) -> None:
        self._sync = sync
        self._cond = threading.Condition()
        self._states: dict[Path, FolderSyncs._State] = {}
        self.fsyncs = 0  # fsyncs made (tests and benchmarks)

    def sync(self, folders: set[Path]) -> None:
        """Return once every folder's entries as they were at the call are durable."""
        for folder in sorted(folders):
            self._sync_one(folder)

    def _sync_one(self, folder: Path) -> None:
        cond = self._cond
        with cond:
            st = self._states.get(folder)
            if st is None:
                st = self._states[folder] = FolderSyncs._State()
            st.asked += 1
            ticket = st.asked
            while st.done < ticket:
                if not st.running:  # lead the next fsync: it covers every ticket given so far
                    st.running = True
                    covers = st.asked
                    cond.release()
                    try:
                        (self._sync or fsync_dir)(folder)
                    except BaseException:
                        cond.acquire()
                        st.running = False
                        cond.notify_all()
                        self._forget(folder, st)
                        raise
                    cond.acquire()
                    st.running = False
                    st.done = max(st.done, covers)
                    self.fsyncs += 1
                    cond.notify_all()
                else:
                    cond.wait()
            self._forget(folder, st)

    def _forget(self, folder: Path, st: FolderSyncs._State) -> None:
        """Drop an idle folder's state (called holding the condition): the map stays
        as small as the folders being written now."""
        if not st.running and st.done >= st.asked and self._states.get(folder) is st:
            del self._states[folder]


class _Entry:
    __slots__ = ("dirs", "done", "error", "records", "result")

    def __init__(self, records: list[InstanceRecord], dirs: set[Path]) -> None:
        self.records = records
        self.dirs = dirs
        self.done = False
        self.result: list[bool | Refused] = []
        self.error: BaseException | None = None


class Expected:
    """A request announced to the group commit (see :meth:`GroupCommitter.expecting`)."""

    __slots__ = ("queued",)

    def __init__(self) -> None:
        self.queued = False


class GroupCommitter:
    """Serialises index writers (threads and processes) and batches their commits."""

    #: longest a request waits for announced requests to queue behind it (seconds):
    #: about one file fdatasync of a 132 KB instance with several at once on this disk
    MAX_WAIT = 0.002

    def __init__(self, index: Index, lock_path: Path, on_commit: Callable[[], object] | None = None) -> None:
        self.index = index
        self.on_commit = on_commit  # called after each durable commit (metrics)
        self.lock_path = lock_path
        self._lock = threading.Lock()
        self._queue: list[_Entry] = []
        self._queue_lock = threading.Lock()
        # Two conditions on the queue's lock, so that a wake-up reaches only threads that can
        # go on (issue 33: one condition for both, notified by every request as it queued,
        # woke every thread waiting for a leader's commit at each arrival, to wait again:
        # 50 voluntary context switches per C-STORE'd instance at 16 associations, 21 at 4)
        self._gathered = threading.Condition(self._queue_lock)  # the announced have all queued
        self._led = threading.Condition(self._queue_lock)  # a leader's commit ended
        self._expected = 0  # requests announced (expecting) and not yet queued
        self._leading = False  # a thread of this process is committing the queue
        self.batches = 0  # commits made (for tests and benchmarks)
        self._fd = -1  # the lock file, opened by the first writer of this process
        self._fd_pid = 0
        self.folders = FolderSyncs()

    @contextmanager
    def writer(self) -> Iterator[None]:
        """Exclusive right to write the index, across threads and worker processes."""
        with self._lock:
            if self._fd_pid != os.getpid():  # a forked child opens its own (a shared one shares the flock)
                self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._fd_pid = os.getpid()
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # kept open: one open+close fewer per commit
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock file's descriptor (at shutdown)."""
        with self._lock:
            if self._fd_pid == os.getpid():
                os.close(self._fd)
            self._fd, self._fd_pid = -1, 0

    @contextmanager
    def expecting(self) -> Iterator[Expected]:
        """Announce a request that will call :meth:`commit` (pass it the yielded
        token) soon: its files are being written. Leaving the block without having
        committed withdraws it."""
        token = Expected()
        with self._queue_lock:
            self._expected += 1
        try:
            yield token
        finally:
            if not token.queued:
                with self._queue_lock:
                    token.queued = True
                    self._expected -= 1
                    if not self._expected:
                        self._gathered.notify_all()

    def commit(self, records: list[InstanceRecord], dirs: set[Path],
               announced: Expected | None = None) -> list[bool | Refused]:
        """Make ``dirs`` (the folders the records' files were linked into) and the
        records' index rows durable; returns Index.add's answer for ``records``.
        ``announced``: this request's token from :meth:`expecting`.

        Raises whatever the directory fsync or the index commit raised.
        """
        if dirs:  # before queueing, outside the writer lock (module docstring)
            self.folders.sync(dirs)
        entry = _Entry(records, dirs)
        with self._queue_lock:
            self._queue.append(entry)
            if announced is not None and not announced.queued:
                announced.queued = True
                self._expected -= 1
                if not self._expected:  # the only change a gathering request waits for
                    self._gathered.notify_all()
            if self._expected > 0:  # others are on their way: let them join this group
                deadline = time.monotonic() + self.MAX_WAIT
                while self._expected > 0 and not entry.done:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._gathered.wait(left):
                        break
            # one leader per process at a time commits the queue; the others wait on the
            # condition, not on the writer lock, so a request whose entry a leader
            # committed returns at once (before, it first took the writer lock itself,
            # i.e. waited for the other process's commit too: 18-20 ms of a request's
            # 46 ms with 8 connections, issue 11)
            while not entry.done and self._leading:
                self._led.wait()
            if entry.done:
                lead = False
            else:
                lead = self._leading = True
        if lead:
            try:
                with self.writer():
                    with self._queue_lock:  # everything queued while the lock was awaited
                        batch, self._queue = self._queue, []
                    self._commit_batch(batch)
            finally:
                with self._queue_lock:
                    self._leading = False
                    self._led.notify_all()  # its requests return, one of the rest leads next
                    self._gathered.notify_all()  # a request still gathering was committed
        if entry.error is not None:
            raise entry.error
        return entry.result

    def _commit_batch(self, batch: list[_Entry]) -> None:
        try:
            added = self.index.add([r for e in batch for r in e.records])
        except BaseException as err:  # noqa: BLE001 - handed to every waiting request
            for e in batch:
                e.error, e.done = err, True
            return
        self.batches += 1
        if self.on_commit is not None:
            self.on_commit()
        i = 0
        for e in batch:
            e.result, e.done = added[i : i + len(e.records)], True
            i += len(e.records)

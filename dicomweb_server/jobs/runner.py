"""The durable runner of background jobs (jobs/__init__.py): each HTTP worker process of
the archive runs one (started and stopped with the app: app.py).

A submitted job is a row of the ``jobs`` table (jobs/store.py) and a row of the routing
outbox (routing/outbox.py, destination ``job:<kind>``), written in one durable
transaction before the caller is answered: ``202 Accepted`` means the job will run,
whatever happens next. The outbox gives what every queued thing here gets:

- **one runner at a time**: a runner claims the row under a lease, renewed every third of
  it while the handler works (:meth:`Outbox.renew`); a runner that lost its lease (it
  stalled past it, another took over) stops at the handler's next save;
- **resumption**: a runner killed with its lease (SIGKILL, power loss) leaves the row
  pending; a runner of the same host frees it at start (``reap``: the owner's pid is
  gone), any other when the lease expires; the job runs again from its last saved
  checkpoint (its handler makes each item's effect idempotent);
- **retries and dead letters**: a handler that raises (not :class:`JobError`) is tried
  again after ``jobs_retry`` seconds, doubled each attempt, up to
  ``jobs_max_attempts``; then the job is ``failed`` and its row a dead letter
  (``GET /admin/queue``); :class:`JobError` fails it at once;
- **a bound**: at most ``jobs_concurrency`` jobs of one kind run at once across every
  process and node (the outbox's live-lease bound per destination).

A shutdown stops a running job at its next save (:class:`JobStopped`): its lease is
released so that the next runner resumes it at once.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable

from ..routing.outbox import Outbox, Settlement
from . import KINDS, Context, JobError, JobStopped, Progress, handler
from .store import JobStore, destination

log = logging.getLogger("dicomweb_server.jobs")

class NotReady(RuntimeError):
    """The jobs' queue cannot be written yet (its database was down when the process started)."""


#: seconds between looks for jobs other processes queued (a job queued here wakes it at once)
POLL = 2.0


class _Running(Context):
    """A job run by :class:`Runner`: saves go to the ``jobs`` table."""

    def __init__(self, runner: Runner, job: dict, archive, lease_owner: str) -> None:
        p = job.get("progress") or {}
        super().__init__(job["id"], job["kind"], job["params"], job.get("checkpoint"), archive,
                         Progress(p.get("total"), p.get("done", 0), p.get("failed", 0), p.get("skipped", 0),
                                  p.get("detail") or {}))
        self._runner = runner
        self.lease_owner = lease_owner
        self.cancelled = False
        self.lost = False  # the lease went to another runner

    def _persist(self) -> None:
        if self.lost:  # another runner has the job now: write nothing more
            return
        cancelled, written = self._runner.store.save(self.id, self.checkpoint, self.progress.as_dict(),
                                                     self.lease_owner)
        self.cancelled = cancelled or self.cancelled
        self.lost = self.lost or not written

    def stopping(self) -> bool:
        return self.cancelled or self.lost or self._runner.stopping


class Runner:
    """Claims and runs the jobs of every kind (:data:`jobs.KINDS`) in threads of this
    process. ``outbox``: the archive's (routing's when it routes, else one opened for it)."""

    def __init__(self, archive, outbox: Outbox | Callable[[], Outbox], *, concurrency: int = 2,
                 lease: float = 120.0, retry: float = 30.0, max_attempts: int = 5, poll: float = POLL) -> None:
        self.archive = archive
        # an outbox, or how to open one: then opened by the runner's thread (a database that is
        # down at start delays the jobs, not the archive's start) and closed by stop()
        self._open = outbox if not isinstance(outbox, Outbox) else None
        self.outbox: Outbox | None = None if self._open is not None else outbox  # type: ignore[assignment]
        self.store: JobStore | None = JobStore(self.outbox) if self.outbox is not None else None
        self.concurrency = concurrency
        self.lease = lease
        self.retry = retry
        self.max_attempts = max_attempts
        self.poll = poll
        self.owner = f"{socket.gethostname()}:{os.getpid()}:jobs:{uuid.uuid4().hex[:8]}"
        self.stopping = False
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, tuple[str, _Running, threading.Thread]] = {}  # job id -> (lease owner, ctx, thread)
        # every job thread until its very end: a job leaves _running before it settles its
        # queue row, and stop() must not return (its caller then closes the outbox) while
        # a thread is still writing there (a closed SQLite connection under a running
        # statement crashed the process)
        self._threads: set[threading.Thread] = set()
        self._thread: threading.Thread | None = None
        self._batches = 0

    # --- the front door's side ----------------------------------------------------------

    def submit(self, kind: str, params: dict, owner: str | None = None, restricted: bool = False) -> str:
        """Queue a job durably; returns its id. ``owner``: the identity that asked (a
        restricted one sees only its own jobs: api/jobs.py)."""
        if kind not in KINDS:
            raise KeyError(kind)
        if self.store is None:
            raise NotReady("the jobs' queue is not open yet (its database cannot be reached)")
        job_id = self.store.submit(kind, params, owner, restricted)
        self._wake.set()
        return job_id

    # --- the worker's side --------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop: running jobs end at their next save and are resumed by the next runner."""
        self.stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        # each job's thread releases its own lease when it ends (_run); one still inside a long
        # step keeps it, so that no other runner takes the job while this one may still write:
        # its lease ends with it (freed by pid on this host at the next start, else when it expires)
        if still := [job_id for job_id, (_, _, t) in self._running.items() if t.is_alive()]:
            log.warning("job(s) %s still in a step at shutdown: resumed when their lease ends", ", ".join(still))
        elif any(t.is_alive() for t in threads):
            log.warning("a job thread is still settling its queue row at shutdown")
        elif self._open is not None and self.outbox is not None:
            self.outbox.close()

    def open(self) -> bool:
        """Open the outbox (when given how): False while its database cannot be reached."""
        if self.outbox is not None:
            return True
        try:
            outbox = self._open()
        except Exception as e:  # noqa: BLE001 - the database may be down: tried again
            log.warning("background jobs wait for their queue: %s", e)
            return False
        try:
            self.store = JobStore(outbox)
        except BaseException:
            outbox.close()
            raise
        self.outbox = outbox
        return True

    def _loop(self) -> None:
        while not self.open():
            self._wake.wait(max(self.poll, 5.0))
            self._wake.clear()
            if self.stopping:
                return
        try:  # jobs leased by a process of this host that died (SIGKILL): resumable now, not in minutes
            if freed := self.outbox.reap(socket.gethostname()):
                log.warning("%d outbox row(s) leased by a process that died are claimable again", freed)
        except Exception as e:  # noqa: BLE001 - the leases expire anyway
            log.warning("could not free the leases of dead processes: %s", e)
        renewed = time.monotonic()
        while not self.stopping:
            self._wake.clear()
            wait = self.poll
            try:
                if time.monotonic() - renewed >= self.lease / 3:
                    self._renew()
                    renewed = time.monotonic()
                for kind in KINDS:
                    if len(self._running) >= self.concurrency * len(KINDS) or self.stopping:
                        break
                    owner = f"{self.owner}:{self._batches}:"  # ":" ends it: release() takes a prefix
                    self._batches += 1
                    rows, next_due = self.outbox.claim(destination(kind), 1, owner, self.lease, self.concurrency)
                    for row in rows:
                        self._begin(row, owner)
                    if not rows and next_due is not None:
                        wait = min(wait, max(0.0, next_due - time.time()))
            except Exception as e:  # noqa: BLE001 - never dies; the database may be busy
                log.error("jobs: %s", e)
            self._wake.wait(min(wait, self.lease / 3))

    def _renew(self) -> None:
        for job_id, (owner, ctx, _) in list(self._running.items()):
            if self.outbox.renew(owner, self.lease) == 0:
                ctx.lost = True
                log.warning("job %s: its lease was taken over; it stops here", job_id)

    def _begin(self, row, owner: str) -> None:
        job = self.store.start(row.sop_uid)
        if job is None or job["state"] not in ("running",):  # unknown, or finished/cancelled already
            state = job["state"] if job else "unknown"
            self.outbox.settle(Settlement([row.id], [], [], []), owner)
            log.info("job %s is %s: its queue row settled", row.sop_uid, state)
            return
        ctx = _Running(self, job, self.archive, owner)
        thread = threading.Thread(target=self._run, args=(row, owner, ctx), name=f"job-{job['id']}", daemon=True)
        with self._lock:
            self._running[job["id"]] = (owner, ctx, thread)
            self._threads.add(thread)
        thread.start()

    def _run(self, row, owner: str, ctx: _Running) -> None:
        settle = Settlement([], [], [], [])
        try:
            if ctx.stopping():
                raise JobStopped(ctx.id)
            log.info("job %s (%s) runs from %s", ctx.id, ctx.kind, "its checkpoint" if ctx.checkpoint else "the start")
            result = handler(ctx.kind)(ctx)
            if ctx.lost or not self.store.finish(ctx.id, "done", result, None, ctx.progress.as_dict(), owner):
                ctx.lost = True  # another runner has it: its outcome, not this one's
                return
            settle.delivered.append(row.id)
            log.info("job %s (%s) done: %s", ctx.id, ctx.kind, ctx.progress.as_dict())
        except JobStopped:
            if ctx.lost:
                return  # another runner holds it: nothing to settle
            if ctx.cancelled or self.store.cancelled(ctx.id):
                if self.store.finish(ctx.id, "cancelled", None, None, ctx.progress.as_dict(), owner):
                    settle.delivered.append(row.id)
                    log.info("job %s (%s) cancelled", ctx.id, ctx.kind)
            else:  # a shutdown: the next runner resumes it (release below)
                self.store.requeue(ctx.id, None, owner)
                log.info("job %s (%s) stopped by the shutdown at its checkpoint", ctx.id, ctx.kind)
        except JobError as e:
            if self.store.finish(ctx.id, "failed", None, str(e), ctx.progress.as_dict(), owner):
                settle.failed.append((row.id, str(e)))
                log.warning("job %s (%s) failed: %s", ctx.id, ctx.kind, e)
        except Exception as e:  # noqa: BLE001 - a job's failure must not end the runner
            error = f"{type(e).__name__}: {e}"
            log.error("job %s (%s) raised: %s\n%s", ctx.id, ctx.kind, error, traceback.format_exc())
            if row.attempts + 1 < self.max_attempts:
                delay = min(3600.0, self.retry * 2 ** row.attempts) * random.uniform(0.9, 1.1)
                self.store.requeue(ctx.id, error, owner)
                settle.retry.append((row.id, time.time() + delay, error))
            elif self.store.finish(ctx.id, "failed", None, f"gave up after {row.attempts + 1} attempt(s): {error}",
                                   ctx.progress.as_dict(), owner):
                settle.failed.append((row.id, error))
        finally:
            with self._lock:
                self._running.pop(ctx.id, None)
            try:
                if settle.delivered or settle.retry or settle.failed:
                    self.outbox.settle(settle, owner)
                elif not ctx.lost:
                    self.outbox.release(owner)
            except Exception as e:  # noqa: BLE001 - the lease expires and the job is resumed
                log.error("job %s: could not settle its queue row: %s", ctx.id, e)
            with self._lock:
                self._threads.discard(threading.current_thread())
            self._wake.set()

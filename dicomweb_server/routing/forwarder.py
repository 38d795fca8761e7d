"""The forwarder: an asyncio task per destination lane in each worker's event loop
(started by the app's lifespan), delivering the outbox.

A lane claims a batch (a lease in the database), reads the files off the event loop,
sends them, and settles the rows: delivered, retried later (exponential backoff with
full jitter: ``uniform(0, min(backoff_max, backoff_base * 2**attempts))``), solo
(refused as a batch: each instance is tried alone) or dead-lettered (a permanent
refusal, or ``max_attempts``/``max_age`` reached; the last error is kept).

A destination with ``deidentify`` (routes file) is sent de-identified copies
(deid/export.py ``Deidentifier``: the profile, the project's consistent UIDs and
pseudonyms), made in this process's spool folder for the send and removed after it; an
instance the profile refuses (burned-in annotation) is dead-lettered with the reason.

Waking: a store in this process wakes the lanes of the destinations it owes
(:meth:`routing.Routing.committed`); rows committed by *other* worker processes,
retries coming due and expired leases are found by a bounded poll
(``poll_interval``, default 1 s): there is no cross-process signal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from itertools import count
from pathlib import Path

from .. import faults, metrics
from ..store.blobs import BlobStore
from . import Routing
from .destinations import DimseSender, StowSender, Verdict, item_for, sender_for
from .outbox import Row, Settlement
from .webhook import WebhookSender

log = logging.getLogger("dicomweb_server.routing")

#: delivered rows are removed (Outbox.prune) at start and then this often, in chunks of
#: PRUNE_CHUNK rows (one short transaction each, so stores and claims wait little)
PRUNE_EVERY = 600.0
PRUNE_CHUNK = 10_000


class Refused:
    """An instance a destination's de-identification refuses: dead-lettered, with why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Forwarder:
    def __init__(self, routing: Routing, blobs: BlobStore, pseudonyms: Callable[[], object] | None = None) -> None:
        self.routing = routing
        self.blobs = blobs
        self._pseudonyms = pseudonyms  # () -> deid.pseudonyms.Pseudonyms, for destinations with deidentify
        self._deid: dict[str, object] = {}  # destination -> deid.export.Deidentifier
        self.delivery = routing.routes.delivery
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:"
        self._batches = count()
        self._events: dict[str, asyncio.Event] = {}
        self._senders: dict[str, StowSender | DimseSender | WebhookSender] = {}
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        freed = await asyncio.to_thread(self.routing.outbox.reap, socket.gethostname())
        if freed:
            log.warning("%d forward(s) leased by a worker that died are claimable again", freed)
        for name, dest in self.routing.routes.destinations.items():
            if dest.deidentify is not None:
                self._deid[name] = await asyncio.to_thread(self._deidentifier, dest)
            self._events[name] = asyncio.Event()
            self._senders[name] = (WebhookSender(dest, self.delivery.timeout, self.routing)
                                   if dest.webhook is not None else sender_for(dest, self.delivery.timeout))
            for lane in range(self.delivery.concurrency):
                self._tasks.append(asyncio.create_task(self._lane(name), name=f"forward-{name}-{lane}"))
        self._tasks.append(asyncio.create_task(self._prune(), name="forward-prune"))
        self.routing.set_waker(self._wake_threadsafe)

    async def stop(self) -> None:
        self.routing.set_waker(None)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for s in self._senders.values():
            await s.aclose()
        try:  # what this worker held becomes claimable at once (else: after the lease)
            await asyncio.to_thread(self.routing.outbox.release, self.owner)
        except Exception as e:  # noqa: BLE001 - shutting down; the leases expire anyway
            log.warning("could not release the forwarder's leases: %s", e)

    async def _prune(self) -> None:
        """Delivered rows older than ``keep_delivered`` removed: the outbox holds what is
        owed, the dead letters and a window of deliveries, not every forward ever made (the
        queue's counts and ``/metrics`` gauges read the whole table)."""
        keep = self.delivery.keep_delivered
        while True:
            try:
                while await asyncio.to_thread(self.routing.outbox.prune, keep, PRUNE_CHUNK) == PRUNE_CHUNK:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - housekeeping never stops delivery; tried again later
                log.warning("could not remove delivered outbox rows: %s", e)
            await asyncio.sleep(min(PRUNE_EVERY, keep))

    def _wake_threadsafe(self, destinations: set[str]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._wake, destinations)

    def _wake(self, destinations: set[str]) -> None:
        for d in destinations:
            ev = self._events.get(d)
            if ev is not None:
                ev.set()

    async def _lane(self, name: str) -> None:
        d = self.delivery
        ev = self._events[name]
        while True:
            ev.clear()  # before the claim: a wake during the claim is not lost
            try:
                owner = f"{self.owner}{next(self._batches)}"
                rows, next_due = await asyncio.to_thread(
                    self.routing.outbox.claim, name, d.batch_size, owner, d.lease, d.concurrency)
                if rows:
                    await self._deliver(name, rows, owner)
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a lane never dies; the database may be busy or full
                log.error("forwarding to %s: %s", name, e)
                next_due = None
            wait = d.poll_interval
            if next_due is not None:
                wait = min(wait, max(0.0, next_due - time.time()))
            try:
                await asyncio.wait_for(ev.wait(), timeout=wait)
            except TimeoutError:
                pass

    def _deidentifier(self, dest):
        from ..deid.export import Deidentifier

        if self._pseudonyms is None:
            raise RuntimeError(f"destination {dest.name!r} de-identifies: the forwarder needs the pseudonym table")
        return Deidentifier(dest.deidentify, self._pseudonyms())

    def _item(self, copies: ExitStack, row: Row, name: str):
        """What the senders read for ``row``: the stored file, or (object storage,
        store/s3.py) a copy of the object in this process's spool folder, removed when
        ``copies`` closes; None when the instance is no longer stored; a de-identified
        copy for a destination that asks for one (a :class:`Refused` when the profile
        refuses the instance). A webhook's row (a change, routing/webhook.py) is sent as
        it is."""
        if row.change is not None:
            return row
        source = self.blobs.source(row.path)
        try:
            path = source if isinstance(source, Path) else copies.enter_context(self.blobs.local_copy(row.path))
        except FileNotFoundError:
            return None
        deid = self._deid.get(name)
        if deid is None:
            return item_for(path, row.sop_uid)
        from ..deid.apply import BurnedIn

        folder = Path(copies.enter_context(tempfile.TemporaryDirectory(dir=self.blobs.spool, prefix="deid-")))
        try:
            out = deid.file(path, folder)
        except FileNotFoundError:
            return None
        except BurnedIn as e:
            return Refused(f"refused by de-identification (PS3.15 E): {e}")
        except Exception as e:  # noqa: BLE001 - an unreadable stored file: this instance fails alone
            return Refused(f"cannot be de-identified: {type(e).__name__}: {e}")
        return item_for(out, out.stem)  # the NEW SOP Instance UID: the one the destination names

    async def _deliver(self, name: str, rows: list[Row], owner: str) -> None:
        d = self.delivery
        copies = ExitStack()  # object storage: local copies of the objects while they are sent
        items = await asyncio.to_thread(lambda: [self._item(copies, r, name) for r in rows])
        sendable = [(r, it) for r, it in zip(rows, items) if it is not None and not isinstance(it, Refused)]
        verdicts = dict.fromkeys((r.id for r, it in zip(rows, items) if it is None),
                                 (Verdict.FAILED, "the instance is no longer stored (deleted before delivery)"))
        verdicts.update((r.id, (Verdict.FAILED, it.reason)) for r, it in zip(rows, items) if isinstance(it, Refused))
        if sendable:
            try:
                # the send ends well before the lease does: no other worker may take these
                # rows over while this one is still sending them
                answers = await self._senders[name].send([it for _, it in sendable], d.lease / 2)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a sender bug or I/O error: retry later, keep the lane
                answers = [(Verdict.RETRY, f"{type(e).__name__}: {e}")] * len(sendable)
            finally:
                await asyncio.to_thread(copies.close)
            verdicts.update((r.id, v) for (r, _), v in zip(sendable, answers))
            faults.point("forwarded")  # crash tests: sent, not yet settled
        else:
            await asyncio.to_thread(copies.close)  # de-identified copies of refused instances
        now = time.time()
        s = Settlement([], [], [], [])
        for r in rows:
            verdict, error = verdicts[r.id]
            if verdict is Verdict.DELIVERED:
                s.delivered.append(r.id)
            elif verdict is Verdict.SOLO:
                s.solo.append(r.id)
            elif verdict is Verdict.RETRY and r.attempts + 1 < d.max_attempts and now - r.enqueued < d.max_age:
                delay = random.uniform(0, min(d.backoff_max, d.backoff_base * 2 ** r.attempts))
                s.retry.append((r.id, now + delay, error or "retry"))
            else:
                if verdict is Verdict.RETRY:
                    error = f"gave up after {r.attempts + 1} attempt(s), {now - r.enqueued:.0f} s: {error}"
                s.failed.append((r.id, error or "failed"))
                log.warning("forward of %s to %s failed for good: %s", r.sop_uid, name, error)
        await asyncio.to_thread(self.routing.outbox.settle, s, owner)
        # counted once recorded
        enqueued = {r.id: r.enqueued for r in rows}
        metrics.FORWARDED.labels(name).inc(len(s.delivered))
        for i in s.delivered:
            metrics.DELIVERY_LATENCY.labels(name).observe(max(0.0, now - enqueued[i]))
        metrics.FORWARD_RETRIES.labels(name).inc(len(s.retry))
        metrics.FORWARD_FAILED.labels(name).inc(len(s.failed))

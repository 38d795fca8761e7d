"""Blocking work off the event loop, with less per-call Python than
``starlette.concurrency.run_in_threadpool`` (anyio: a ``queue.Queue`` with a
``Condition``, a capacity limiter and cancel scopes per call: ~0.3 ms of CPU per
STOW-RS request, 15-18% of its GIL time under load, issue 11) and than
``concurrent.futures.ThreadPoolExecutor`` (a ``Future`` with its ``Condition``, a work
item, an idle ``Semaphore`` and a done callback per call, issue 33).

One pool of long-lived threads per worker process takes the calls from one queue (a C
``SimpleQueue``); each call is ``(fn, args, settle)`` and its outcome goes back to the
event loop with one ``call_soon_threadsafe``. A thread that finishes a call takes the
next one queued without sleeping; a new thread starts only when no thread is idle (up
to :data:`MAX_THREADS`, as anyio's default limiter). Like anyio's ``run_sync``, a
cancelled caller still waits for the thread to finish, so that nothing the function
uses (spool files) is cleaned up under it. At interpreter exit the pool runs every call
already queued before its threads end (as ``ThreadPoolExecutor`` does): a request whose
work was handed over is finished, never dropped half-done."""

from __future__ import annotations

import asyncio
import os
import threading
from _queue import SimpleQueue
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: as many threads as anyio's default limiter allows (40)
MAX_THREADS = 40
_STOP = None


class Pool:
    """Long-lived threads running ``(fn, args, settle)`` calls from one queue:
    ``settle(ok, value)`` is called in the thread with the result (ok) or the exception."""

    def __init__(self, max_threads: int = MAX_THREADS, name: str = "dicomweb-blocking") -> None:
        self.max_threads = max_threads
        self.name = name
        self._queue: SimpleQueue = SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call and not yet handed one
        self._unclaimed = 0  # calls queued while every thread was busy (at max_threads)
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable, args: tuple, settle: Callable[[bool, object], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker thread pool is shut down")
            self._queue.put((fn, args, settle))
            if self._idle > 0:  # an idle thread will take it (claimed: it is no longer idle)
                self._idle -= 1
                return
            if len(self._threads) >= self.max_threads:
                self._unclaimed += 1  # taken by the first thread to finish its call
                return
            thread = threading.Thread(target=self._run, name=f"{self.name}_{len(self._threads)}", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        get, lock = self._queue.get, self._lock
        while True:
            call = get()
            if call is _STOP:
                return
            fn, args, settle = call
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                settle(False, exc)
            else:
                settle(True, result)
            call = fn = args = settle = result = exc = None  # nothing of the call kept while idle
            with lock:
                if self._unclaimed > 0:
                    self._unclaimed -= 1  # the next get() returns one of them at once
                else:
                    self._idle += 1

    def shutdown(self, timeout: float | None = None) -> None:
        """Run every call already queued, then end the threads (at most ``timeout``
        seconds each); later :meth:`submit` calls fail."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(_STOP)  # after every call queued so far
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)


_pool: Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> Pool:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = Pool()
                # (as concurrent.futures registers its executors' shutdown: before the
                # interpreter stops its threads, after the main thread has returned)
                threading._register_atexit(_pool.shutdown)  # type: ignore[attr-defined]
    return _pool


def _forget_pool_in_child() -> None:
    """A forked child has none of its parent's threads: it starts a pool of its own."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


async def run_blocking(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a worker thread; its result or exception.

    One plain future per call, settled on the loop from the thread with one
    ``call_soon_threadsafe``: ``loop.run_in_executor`` + ``asyncio.shield`` chained three
    futures and four callbacks per call (~1.5% of a STOW-RS's GIL time, issue 33), and
    ``ThreadPoolExecutor.submit`` made a ``concurrent.futures.Future`` per call."""
    loop = asyncio.get_running_loop()
    box = [loop.create_future()]
    done = [False]

    def settle_on_loop(ok: bool, value: object) -> None:  # on the event loop
        done[0] = True
        waiter = box[0]
        if waiter.done():
            return  # the caller was cancelled and stopped waiting (or waits for done[0])
        if ok:
            waiter.set_result(value)
        else:
            waiter.set_exception(value)  # type: ignore[arg-type]

    def settle(ok: bool, value: object) -> None:  # in the worker thread
        try:
            loop.call_soon_threadsafe(settle_on_loop, ok, value)
        except RuntimeError:
            pass  # the loop is closed: no one waits any more

    _get_pool().submit(fn, args, settle)
    try:
        return await box[0]
    except asyncio.CancelledError:
        while not done[0]:  # the thread cannot be stopped: wait for it
            box[0] = loop.create_future()
            try:
                await box[0]
            except asyncio.CancelledError:
                pass
            except BaseException:  # noqa: BLE001 - its outcome is not wanted any more
                pass
        raise

"""Blocking work off the event loop, with less per-call Python than
``starlette.concurrency.run_in_threadpool`` (anyio: a ``queue.Queue`` with a
``Condition``, a capacity limiter and cancel scopes per call: ~0.3 ms of CPU per
STOW-RS request, 15-18% of its GIL time under load, issue 11). Here: one
``concurrent.futures.ThreadPoolExecutor`` per worker process (a C ``SimpleQueue``)
and ``loop.run_in_executor``. Like anyio's ``run_sync``, a cancelled caller still
waits for the thread to finish, so that nothing the function uses (spool files) is
cleaned up under it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: as many threads as anyio's default limiter allows (40)
MAX_THREADS = 40
_executor: ThreadPoolExecutor | None = None


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="dicomweb-blocking")
    return _executor


async def run_blocking(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a worker thread; its result or exception.

    One plain future per call, settled from the thread's done callback through
    ``call_soon_threadsafe``: ``loop.run_in_executor`` + ``asyncio.shield`` chained three
    futures and four callbacks per call (~1.5% of a STOW-RS's GIL time, issue 33)."""
    loop = asyncio.get_running_loop()
    box = [loop.create_future()]

    def settle(done: Future) -> None:  # on the event loop
        waiter = box[0]
        if waiter.done():
            return  # the caller was cancelled and stopped waiting
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def finished(done: Future) -> None:  # in the worker thread
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, done)

    work = _get_executor().submit(fn, *args)
    work.add_done_callback(finished)
    try:
        return await box[0]
    except asyncio.CancelledError:
        while not work.done():  # the thread cannot be stopped: wait for it
            box[0] = loop.create_future()
            try:
                await box[0]
            except asyncio.CancelledError:
                pass
            except BaseException:  # noqa: BLE001 - its outcome is not wanted any more
                pass
        raise

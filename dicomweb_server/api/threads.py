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
from concurrent.futures import ThreadPoolExecutor
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
    """``fn(*args)`` in a worker thread; its result or exception."""
    future = asyncio.get_running_loop().run_in_executor(_get_executor(), fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():  # the thread cannot be stopped: wait for it
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                pass
        raise

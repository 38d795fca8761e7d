"""api/threads.run_blocking: result, exception, and a cancelled caller that still
waits for its thread (nothing the function uses is cleaned up under it)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dicomweb_server.api.threads import run_blocking


def test_result_and_exception_and_thread():
    async def main():
        name = await run_blocking(lambda: threading.current_thread().name)
        assert name.startswith("dicomweb-blocking")
        assert await run_blocking(divmod, 7, 2) == (3, 1)
        with pytest.raises(ZeroDivisionError):
            await run_blocking(divmod, 1, 0)

    asyncio.run(main())


def test_cancelled_caller_waits_for_the_thread():
    started, release = threading.Event(), threading.Event()
    log = []

    def work():
        started.set()
        release.wait(10)
        log.append("thread done")

    async def caller():
        try:
            await run_blocking(work)
        except asyncio.CancelledError:
            log.append("caller cancelled")
            raise

    async def main():
        task = asyncio.create_task(caller())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the thread
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert log == ["thread done", "caller cancelled"]

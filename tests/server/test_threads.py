"""api/threads.run_blocking: result, exception, and a cancelled caller that still
waits for its thread (nothing the function uses is cleaned up under it)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dicomweb_server.api.threads import Pool, run_blocking


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


def test_failures_and_successes_answer_their_own_callers():
    """Many calls at once through the pool, every third raising: each caller gets its own
    outcome (a failing call does not disturb the others, issue 33's hand-off)."""

    def work(i):
        if i % 3 == 0:
            raise ValueError(f"bad {i}")
        return i * i

    async def one(i):
        try:
            return await run_blocking(work, i)
        except ValueError as e:
            return str(e)

    async def main():
        return await asyncio.gather(*(one(i) for i in range(60)))

    assert asyncio.run(main()) == [f"bad {i}" if i % 3 == 0 else i * i for i in range(60)]


def test_calls_queued_beyond_the_threads_are_taken_as_threads_finish():
    """At its thread limit the pool queues calls; each finishing thread takes the next
    without sleeping; no more threads start."""
    pool = Pool(max_threads=2, name="test-pool")
    done = []
    lock = threading.Lock()
    finished = threading.Event()

    def work(i):
        time.sleep(0.005)
        with lock:
            done.append(i)
            if len(done) == 20:
                finished.set()

    for i in range(20):
        pool.submit(work, (i,), lambda ok, value: None)
    assert finished.wait(10)
    assert sorted(done) == list(range(20))
    assert len(pool._threads) == 2
    pool.shutdown(10)


def test_shutdown_runs_every_queued_call_then_refuses_new_ones():
    """A worker process that shuts down with calls queued (requests handed over, not yet
    answered) runs every one of them before its threads end: nothing handed over is
    dropped half-done; a call after the shutdown is refused, not lost silently."""
    pool = Pool(max_threads=1, name="test-pool")
    release = threading.Event()
    outcomes = []

    def first():
        release.wait(10)
        return "first"

    pool.submit(first, (), lambda ok, value: outcomes.append((ok, value)))
    for i in range(5):
        pool.submit(divmod, (i, 0 if i == 2 else 1), lambda ok, value: outcomes.append((ok, value)))
    stopper = threading.Thread(target=pool.shutdown, args=(10,))
    stopper.start()
    time.sleep(0.05)
    with pytest.raises(RuntimeError):
        pool.submit(divmod, (1, 1), lambda ok, value: outcomes.append("late"))
    release.set()
    stopper.join(10)
    assert not stopper.is_alive() and not any(t.is_alive() for t in pool._threads)
    assert outcomes[0] == (True, "first")
    assert [o[1] for o in outcomes[1:] if o[0]] == [(0, 0), (1, 0), (3, 0), (4, 0)]
    assert [type(o[1]) for o in outcomes[1:] if not o[0]] == [ZeroDivisionError]
    assert len(outcomes) == 6



def test_a_forked_child_runs_calls_on_threads_of_its_own():
    """The pool's threads do not survive a fork: a child process that calls run_blocking
    (after its parent did) gets a pool of its own instead of waiting for ever."""
    import os

    async def once():
        return await run_blocking(os.getpid)

    assert asyncio.run(once()) == os.getpid()  # the parent's pool exists now
    from dicomweb_server.api import threads

    deadline = time.monotonic() + 5
    while threads._pool._idle < 1 and time.monotonic() < deadline:  # its thread waits for the next call
        time.sleep(0.01)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the call ran in this process
        try:
            code = 0 if asyncio.run(asyncio.wait_for(once(), 10)) == os.getpid() else 1
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    deadline = time.monotonic() + 20
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited[0] == 0:  # the child waits for a thread that does not exist in it
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's call never ran")
    assert os.waitstatus_to_exitcode(waited[1]) == 0

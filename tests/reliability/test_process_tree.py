"""``serve``'s processes end together (dicomweb_server/lifeline.py).

Seen: ``serve`` SIGKILLed; its DIMSE listeners ended, but its uvicorn workers kept
serving (a STOW-RS was stored 15 s later) and held the HTTP port: a new ``serve`` on the
same ports failed with "address already in use". Here the real ``serve`` (2 workers, 2
DIMSE listeners) is SIGKILLed: every process under it is gone within ``BOUND`` seconds,
nothing answers on its ports, and a new ``serve`` on the same ports starts and answers
HTTP and C-ECHO; its SIGTERM is still an orderly stop (exit 0, every child gone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import Verification

from tests.helpers import free_port

#: seconds within which every process of a killed serve must be gone
BOUND = 10


def _serve(data, port: int, dport: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data), "--index", "sqlite",
         "--port", str(port), "--workers", "2", "--dimse-port", str(dport), "--dimse-processes", "2"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "DICOMWEB_SHUTDOWN_TIMEOUT": "5"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _echo(dport: int) -> int | None:
    ae = AE(ae_title="TREE")
    ae.add_requested_context(Verification)
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 5
    assoc = ae.associate("127.0.0.1", dport, ae_title="DICOMWEB")
    if not assoc.is_established:
        return None
    try:
        status = assoc.send_c_echo()
        return status.Status if status else None
    finally:
        assoc.release()


def _up(proc: subprocess.Popen, port: int, dport: int) -> list[psutil.Process]:
    """Wait until HTTP and DIMSE answer with 2 workers and 2 listeners running; every
    process under ``serve``."""
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "serve did not come up"
        try:
            ok = httpx.get(f"http://127.0.0.1:{port}/studies", params={"limit": 1}, timeout=5).status_code == 200
        except httpx.HTTPError:
            ok = False
        tree = psutil.Process(proc.pid).children(recursive=True)
        cmds = []
        for p in tree:
            try:
                cmds.append(" ".join(p.cmdline()))
            except psutil.NoSuchProcess:
                pass
        workers = sum("spawn_main" in c for c in cmds)
        listeners = sum("dicomweb_server.dimse" in c for c in cmds)
        if ok and workers == 2 and listeners == 2 and _echo(dport) == 0:
            return tree
        time.sleep(0.2)


def _assert_all_gone(tree: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(tree, timeout=BOUND)
    left = [_describe(p) for p in alive]
    for p in alive:
        p.kill()  # no strays after the test
    assert not left


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}"
    except psutil.Error as e:
        return f"{p.pid} {type(e).__name__}"


def test_sigkill_of_serve_ends_every_process_and_a_new_serve_takes_the_ports(tmp_path):
    data, port, dport = tmp_path / "d", free_port(), free_port()
    proc = _serve(data, port, dport)
    try:
        tree = _up(proc, port, dport)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        _assert_all_gone(tree)
        assert time.monotonic() - killed < BOUND
        with pytest.raises(httpx.ConnectError):  # nothing serves the old port
            httpx.get(f"http://127.0.0.1:{port}/studies", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    again = _serve(data, port, dport)  # the same ports, at once
    try:
        tree = _up(again, port, dport)
        again.send_signal(signal.SIGTERM)  # the orderly stop is unchanged
        assert again.wait(60) == 0, again.stderr.read().decode()  # type: ignore[union-attr]
        _assert_all_gone(tree)
    finally:
        if again.poll() is None:
            again.kill()


_ORPHAN = """
import multiprocessing, os, sys, time

def worker(pdeathsig):
    from dicomweb_server import lifeline
    if not pdeathsig:
        lifeline.set_parent_death_signal = lambda *a: False  # the watchdog alone
    assert lifeline.end_worker_with_supervisor(1.0)
    print(os.getpid(), flush=True)
    time.sleep(60)  # SIGTERM (default action) ends it

if __name__ == "__main__":
    p = multiprocessing.get_context("spawn").Process(target=worker, args=(sys.argv[1] == "1",))
    p.start()
    p.join()
"""


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["pdeathsig", "watchdog-only"])
def test_a_spawned_worker_ends_when_its_supervisor_is_killed(tmp_path, pdeathsig):
    """Each of the two mechanisms alone ends a uvicorn-style (multiprocessing spawn) worker."""
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    parent = subprocess.Popen([sys.executable, str(script), "1" if pdeathsig else "0"], stdout=subprocess.PIPE)
    try:
        child = psutil.Process(int(parent.stdout.readline()))  # type: ignore[union-attr]
        parent.kill()
        parent.wait()
        child.wait(5)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()  # type: ignore[union-attr]


def test_a_listener_started_from_a_thread_outlives_that_thread(tmp_path):
    """PR_SET_PDEATHSIG fires when the *thread* that forked the child ends: a listener
    started from another thread than the main one must not get it (the parent pipe still
    ends it with its parent)."""
    from dicomweb_server.dimse.listeners import spawn_listener

    r, w = os.pipe()
    env = {**os.environ, "DICOMWEB_DATA_DIR": str(tmp_path / "d"), "DICOMWEB_DIMSE_PORT": str(free_port()),
           "DICOMWEB_LOG_LEVEL": "warning"}
    started: list[subprocess.Popen] = []
    t = threading.Thread(target=lambda: started.append(spawn_listener(r, env=env)))
    t.start()
    t.join()
    os.close(r)
    proc = started[0]
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(3)  # the forking thread has ended: the listener runs on
    finally:
        os.close(w)  # its parent "ends": end-of-file on the pipe
        assert proc.wait(30) == 0


_DECODING = """
import time
from dicomweb_server.dicom import decode_worker
decode_worker.configure(processes=1, timeout=120)
decode_worker.call(time.sleep, 120)  # a decoder that hangs
"""


def test_a_decode_worker_busy_in_a_call_ends_with_its_web_worker():
    """A decode worker (started from a thread of its web worker) hung in a call ends when
    the web worker is SIGKILLed; it used to run on until its call returned (the socket's
    end-of-file is only read between calls)."""
    parent = subprocess.Popen([sys.executable, "-c", _DECODING])
    kids: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not (kids := psutil.Process(parent.pid).children()):
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        (decoder,) = kids
        time.sleep(1)  # busy in time.sleep(120)
        parent.kill()
        parent.wait()
        decoder.wait(5)
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in kids:
            if p.is_running():
                p.kill()

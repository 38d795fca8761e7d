"""A DIMSE listener process of ``serve`` that dies is replaced (dicomweb_server/dimse/listeners.py).

Found by trying it: one of ``serve``'s listener processes SIGKILLed (or killed by the OOM
killer) stayed a zombie child of ``serve``, and the node ran on with one listener fewer until
``serve`` was restarted. Here the real ``serve`` (2 listener processes) loses one to SIGKILL: a
new one takes its place and its row of the association slot table, the dead one is reaped,
and many associations (C-ECHO, C-STORE) are served by both processes; the replacement ends
with ``serve``, by SIGTERM and by SIGKILL (it has no PR_SET_PDEATHSIG: its parent pipe ends
it). A listener that keeps ending at once is started again after growing pauses, and the
stop of ``serve`` (its own, or Ctrl-C to the whole group) starts none.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage, Verification

from dicomweb_server.dimse import listeners
from tests.helpers import free_port, make_dataset

#: seconds within which a process must be gone once its serve is
BOUND = 10


def _listening(dport: int) -> set[int]:
    return {c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == dport and c.pid}


def _children(proc: subprocess.Popen) -> set[int]:
    return {p.pid for p in psutil.Process(proc.pid).children()}


def _wait_for(what, timeout: float, why):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, why()
        time.sleep(0.05)
    return value


@contextlib.contextmanager
def _serve(tmp_path, **popen):
    """``serve`` with 2 DIMSE listener processes (SQLite index); yields (process, HTTP port,
    DIMSE port, listener pids, the path of its stderr) once both listen."""
    port, dport = free_port(), free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"), "--index",
         "sqlite", "--port", str(port), "--dimse-port", str(dport), "--workers", "1", "--dimse-processes", "2"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "DICOMWEB_SHUTDOWN_TIMEOUT": "5"},
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), **popen)
    try:
        pids = _wait_for(lambda: p if len(p := _listening(dport)) == 2 else None, 60,
                         lambda: f"{proc.poll()} {log.read_text()[-2000:]}")
        yield proc, port, dport, pids, log
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            p.kill()  # no strays after a failed test
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _descriptors(pid: int) -> dict[str, int]:
    """How many of each kind of descriptor (pipe, socket, memfd, file...) ``pid`` holds."""
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            kind = target.split(":", 1)[0] if ":[" in target else target.split(" ", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _slot_rows(serve_pid: int) -> dict[int, int]:
    """Which row of serve's association slot table each live listener holds: the byte
    (1 + row) of the memfd it keeps an fcntl lock on (dimse/slots.py), from /proc/locks."""
    table = next(os.stat(f"/proc/{serve_pid}/fd/{fd}") for fd in os.listdir(f"/proc/{serve_pid}/fd")
                 if os.readlink(f"/proc/{serve_pid}/fd/{fd}").startswith("/memfd:dicomweb-dimse-slots"))
    rows = {}
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields or fields[1] != "POSIX":
                continue  # a waiter, or another kind of lock
            pid, inode, start, end = int(fields[4]), int(fields[5].split(":")[2]), fields[6], fields[7]
            if inode == table.st_ino and start == end and int(start) >= 1:
                rows[pid] = int(start) - 1
    return rows


def _associate(dport: int):
    ae = AE(ae_title="RESPAWNSCU")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(Verification)
    ae.add_requested_context(CTImageStorage)
    return ae.associate("127.0.0.1", dport, ae_title="DICOMWEB")


def _established(proc: subprocess.Popen, dport: int) -> dict[int, int]:
    """Associations (TCP connections established) each listener of ``proc`` holds."""
    out = {}
    for child in psutil.Process(proc.pid).children():
        out[child.pid] = sum(1 for c in child.net_connections("tcp")
                             if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == dport)
    return out


def _kill_one(proc, dport, pids, log) -> tuple[int, int, int, float]:
    """SIGKILL one listener; (victim, survivor, replacement, seconds until it listens)."""
    victim = min(pids)
    (survivor,) = pids - {victim}
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    now = _wait_for(lambda: p if len(p := _listening(dport)) == 2 and victim not in p else None, 30,
                    lambda: f"listening: {_listening(dport)}; serve's children: {_children(proc)}\n"
                            f"{log.read_text()[-2000:]}")
    took = time.monotonic() - killed
    (new,) = now - {survivor}
    return victim, survivor, new, took


def test_a_killed_listener_is_replaced_and_both_serve_many_associations(tmp_path):
    with _serve(tmp_path) as (proc, port, dport, pids, log):
        rows = _slot_rows(proc.pid)
        assert sorted(rows[p] for p in pids) == [0, 1], rows
        fds = _descriptors(proc.pid)
        victim, survivor, new, took = _kill_one(proc, dport, pids, log)
        print(f"a new listener listened {took:.1f} s after the SIGKILL")
        # the dead one is reaped (no zombie child of serve), the new one is serve's child
        assert _children(proc) == {survivor, new}
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() != psutil.STATUS_ZOMBIE
        assert f"DIMSE listener {victim} ended (killed by SIGKILL); listener {new} started in its place" \
            in log.read_text()
        # the new one holds the dead one's row of the slot table, the survivor keeps its own
        assert _slot_rows(proc.pid) == {survivor: rows[survivor], new: rows[victim]}
        # the dead one's parent pipe is closed, the new one's opened: serve holds as many as before
        assert _descriptors(proc.pid) == fds

        # 16 associations at once: the kernel spreads them over both (all on one: 2 in 65,536)
        assocs = []
        try:
            with ThreadPoolExecutor(16) as pool:
                assocs = list(pool.map(lambda _: _associate(dport), range(16)))
            assert all(a.is_established for a in assocs)
            held = _established(proc, dport)
            assert set(held) == {survivor, new} and all(held.values()) and sum(held.values()) == 16, held
            sent = []
            for i, assoc in enumerate(assocs):
                assert assoc.send_c_echo().Status == 0
                ds = make_dataset(PatientID="RESPAWN", InstanceNumber=i + 1)
                assert assoc.send_c_store(ds).Status == 0
                sent.append(ds.SOPInstanceUID)
        finally:
            for a in assocs:
                if a.is_established:
                    a.release()
        hits = httpx.get(f"http://127.0.0.1:{port}/instances", params={"PatientID": "RESPAWN"}, timeout=30).json()
        assert sorted(h["00080018"]["Value"][0] for h in hits) == sorted(sent)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM  # the stop of serve --workers 1 (cli.py)
        gone, alive = psutil.wait_procs([psutil.Process(p) for p in (survivor, new) if psutil.pid_exists(p)],
                                        timeout=BOUND)
        assert not alive
        assert log.read_text().count("started in its place") == 1  # none at the stop


def test_a_replacement_ends_when_serve_is_killed(tmp_path):
    """The replacement is started by a thread of serve, so without PR_SET_PDEATHSIG (it would
    fire when that thread ends): the parent pipe ends it when serve is SIGKILLed."""
    with _serve(tmp_path) as (proc, port, dport, pids, log):
        victim, survivor, new, _ = _kill_one(proc, dport, pids, log)
        both = [psutil.Process(survivor), psutil.Process(new)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        _, alive = psutil.wait_procs(both, timeout=BOUND)
        assert not alive, [p.pid for p in alive]
        assert _listening(dport) == set()


def _stow_in_flight(port: int) -> socket.socket:
    """A STOW-RS whose body is still coming: uvicorn's graceful stop waits for it."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /studies HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
                 b'Content-Type: multipart/related; type="application/dicom"; boundary=b\r\n\r\n--b\r\n')
    return sock


def test_ctrl_c_to_the_group_stops_serve_and_starts_no_listener(tmp_path):
    """Ctrl-C (SIGINT to the whole process group; systemctl stop does the same with SIGTERM)
    stops the listeners at once, while serve's HTTP side still waits for a request in
    flight (up to shutdown_timeout, 5 s): the listeners' ends are no deaths, none is
    replaced."""
    with _serve(tmp_path, start_new_session=True) as (proc, port, dport, pids, log):
        tree = [psutil.Process(p) for p in pids]
        with _stow_in_flight(port):
            time.sleep(0.5)  # the request is in the application
            os.killpg(proc.pid, signal.SIGINT)
            asked = time.monotonic()
            _, alive = psutil.wait_procs(tree, timeout=BOUND)
            assert not alive
            proc.wait(60)
        assert time.monotonic() - asked > 2, "serve did not wait for its request: the test shows nothing"
        text = log.read_text()
        assert "started in its place" not in text and "another starts" not in text, text[-2000:]
        assert _listening(dport) == set()


# --- the supervision alone, with processes that end at once -----------------------------------------


def _supervised(monkeypatch, code: str, first=0.2, most=0.8, stable=10.0, on_spawn=None):
    """Listeners running ``python -c code PIPE`` (the read end of the parent pipe); the list
    of (time started, process) it fills."""
    monkeypatch.setattr(listeners, "BACKOFF_FIRST", first)
    monkeypatch.setattr(listeners, "BACKOFF_MAX", most)
    monkeypatch.setattr(listeners, "STABLE_AFTER", stable)
    started = []

    def spawn():
        r, w = os.pipe()
        proc = subprocess.Popen([sys.executable, "-c", code, str(r)], pass_fds=(r,))
        os.close(r)
        proc.parent_pipe = w
        started.append((time.monotonic(), proc))
        if on_spawn is not None:
            on_spawn(proc)
        return proc

    return listeners.Listeners(spawn, 1), started


def test_a_listener_that_keeps_ending_at_once_is_started_again_after_growing_pauses(monkeypatch, capfd):
    sup, started = _supervised(monkeypatch, "import sys; sys.exit(3)")
    try:
        _wait_for(lambda: len(started) >= 6, 30, lambda: len(started))
    finally:
        sup.stop(0)
    times = [t for t, _ in started]
    gaps = [b - a for a, b in zip(times, times[1:])]
    for gap, pause in zip(gaps, [0.2, 0.4, 0.8, 0.8, 0.8]):  # 1 s doubling up to 30 s, scaled down
        assert gap >= pause, gaps
    err = capfd.readouterr().err
    first = started[0][1].pid
    assert f"DIMSE listener {first} ended (exit status 3) " in err
    assert "another starts in" in err and f"listener {started[1][1].pid} started in its place" in err


def test_a_listener_that_lived_a_while_is_replaced_at_once(monkeypatch, capfd):
    sup, started = _supervised(monkeypatch, "import time; time.sleep(0.5); raise SystemExit(3)", stable=0.3)
    try:
        _wait_for(lambda: len(started) >= 3, 30, lambda: len(started))
    finally:
        sup.stop(0)
    assert "another starts in" not in capfd.readouterr().err


@pytest.mark.parametrize("at", [0.0, 0.01, 0.02, 0.03, 0.05, 0.08])
def test_stopping_starts_none_and_leaves_none(monkeypatch, at):
    """stop() at any moment of a cycle of deaths (each process is SIGKILLed 20 ms after it
    started) and replacements: once it returns, every process started has ended, and none is
    started afterwards. The processes end only when killed or at their parent pipe's end: one
    started after the stop began would be left running."""
    monkeypatch.setattr(listeners, "DIMSE_KILL_AFTER", 1)
    stopping = threading.Event()
    timers = []

    def kill_soon(proc):
        timer = threading.Timer(0.02, lambda: stopping.is_set() or proc.kill())
        timers.append(timer)
        timer.start()

    sup, started = _supervised(monkeypatch, "import os, sys; os.read(int(sys.argv[1]), 1)", first=0.01, most=0.02,
                               on_spawn=kill_soon)
    try:
        _wait_for(lambda: len(started) >= 5, 30, lambda: len(started))
        time.sleep(at)
        stopping.set()
        stopper = threading.Thread(target=sup.stop, args=(0,))
        stopper.start()
        stopper.join(10)
        assert not stopper.is_alive(), "stop() waits for a listener started after it began"
        n = len(started)
        assert all(p.returncode is not None for _, p in started)
        time.sleep(0.3)  # ten pauses' worth: no replacement comes any more
        assert len(started) == n
    finally:
        for timer in timers:
            timer.cancel()
        for _, p in started:
            if p.poll() is None:
                p.kill()
                p.wait()

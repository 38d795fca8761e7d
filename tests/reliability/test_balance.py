"""Keep-alive connections spread evenly over ``serve --workers N`` (api/balance.py, issue 33).

A worker made to sleep with SIGSTOP accepts nothing: every connection is accepted by the
other one, so the spread without hand-off is 8/0 every time, and with it the stopped worker
adopts its half when it wakes (the requests were sent before the hand-off)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import free_port, make_dataset, multipart, to_bytes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="memfd, SCM_RIGHTS, /proc")


def _serve(data: Path, port: int, workers: int, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data), "--index", "sqlite",
         "--workers", str(workers), "--port", str(port), "--dimse-port", "0"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "DICOMWEB_SHUTDOWN_TIMEOUT": "10", **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _workers(proc: subprocess.Popen) -> set[int]:
    out = set()
    for child in psutil.Process(proc.pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.add(child.pid)
    return out


def _table(pid: int) -> list[int] | None:
    """The pids in the rows of the connection table a worker holds (api/balance.py), or None."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:dicomweb-balance"):
                raw = Path(f"/proc/{pid}/fd/{fd}").read_bytes()
                (rows,) = struct.unpack_from("<I", raw, 8)
                return [struct.unpack_from("<iii", raw, 12 + 12 * r)[0] for r in range(rows)]
    return None


def _idle(pid: int, timeout: float = 30) -> None:
    """Wait until no row of the table counts a connection (held or on its way): the close of
    _ready's requests counted by the workers. A worker then stopped (SIGSTOP) keeps the count it
    had; a fixed 0.5 s wait was not enough on a loaded CI machine (5 against 4, 2026-12-07)."""
    deadline = time.monotonic() + timeout
    while True:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:dicomweb-balance"):
                    raw = Path(f"/proc/{pid}/fd/{fd}").read_bytes()
                    (rows,) = struct.unpack_from("<I", raw, 8)
                    counts = [struct.unpack_from("<iii", raw, 12 + 12 * r)[1:] for r in range(rows)]
                    if not any(held or incoming for held, incoming in counts):
                        return
        assert time.monotonic() < deadline, "connections still counted"
        time.sleep(0.05)


def _ready(proc: subprocess.Popen, port: int, workers: int, balanced: bool = True, timeout: float = 90) -> set[int]:
    """The worker pids, once each serves (with ``balanced``: has its row in the table)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "workers not ready"
        pids = _workers(proc)
        with contextlib.suppress(httpx.HTTPError, psutil.Error, OSError):
            httpx.get(f"http://127.0.0.1:{port}/studies", timeout=5)
            if len(pids) == workers:
                if not balanced:
                    return pids
                rows = _table(next(iter(pids)))
                if rows is not None and pids <= set(rows):
                    return pids
        time.sleep(0.1)


def _spread(port: int) -> dict[int, int]:
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return dict(collections.Counter(int(p) for p in re.findall(r"pid=(\d+)", out)))


def _response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 response from ``sock`` (content-length or chunked); ``buf``: bytes read ahead."""
    def fill() -> None:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        buf.extend(chunk)

    while b"\r\n\r\n" not in buf:
        fill()
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end]).decode("latin-1").lower()
    del buf[:end]
    status = int(head.split()[1])
    if m := re.search(r"content-length: *(\d+)", head):
        while len(buf) < int(m.group(1)):
            fill()
        body = bytes(buf[:int(m.group(1))])
        del buf[:int(m.group(1))]
        return status, body
    assert "transfer-encoding: chunked" in head, head
    body = b""
    while True:
        while b"\r\n" not in buf:
            fill()
        size = int(bytes(buf[:buf.index(b"\r\n")]), 16)
        while len(buf) < buf.index(b"\r\n") + 2 + size + 2:
            fill()
        start = buf.index(b"\r\n") + 2
        body += bytes(buf[start:start + size])
        del buf[:start + size + 2]
        if size == 0:
            return status, body


GET = b"GET /studies?limit=1 HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.contextmanager
def _server(tmp_path: Path, workers: int = 2, **env: str):
    port = free_port()
    proc = _serve(tmp_path / "data", port, workers, **env)
    try:
        yield proc, port
    finally:
        for pid in _workers(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _connect(port: int, n: int, request: bytes = GET) -> list[socket.socket]:
    """``n`` connections opened at once, each sending ``request`` right after connect."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(n)]
    for s in socks:
        s.sendall(request)
    return socks


def _wait_spread(port: int, n: int, timeout: float = 30) -> dict[int, int]:
    """The established connections per worker once there are ``n`` in all: more is waited
    out too (a CI run saw 17 of 16: a probe connection of ``_ready``'s still open on the
    server's side for a moment after the client had its answer)."""
    deadline = time.monotonic() + timeout
    while sum((spread := _spread(port)).values()) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    return spread


def test_keep_alive_connections_spread_evenly(tmp_path):
    """8 keep-alive connections opened at once, requests in flight: 4 per worker, every try."""
    with _server(tmp_path) as (proc, port):
        pids = _ready(proc, port, 2)
        for _ in range(6):
            socks = _connect(port, 8)
            try:
                for s in socks:
                    status, _ = _response(s, bytearray())
                    assert status == 200
                    s.sendall(GET)  # still open, and answered again
                    assert _response(s, bytearray())[0] == 200
                spread = _wait_spread(port, 8)
                assert sorted(spread.values()) == [4, 4] and set(spread) == pids, spread
            finally:
                for s in socks:
                    s.close()
            time.sleep(0.3)  # the closes counted


def test_a_sleeping_worker_gets_its_half_and_every_request_is_answered(tmp_path):
    """One worker stopped (SIGSTOP): the other accepts all 8 connections, each with a STOW-RS
    request already sent, and 2 pipelined QIDO-RS requests behind it; it hands 4 to the
    sleeping one, which answers them all when it wakes. Every instance comes back."""
    with _server(tmp_path) as (proc, port):
        sleeper, awake = sorted(_ready(proc, port, 2))
        datasets = [make_dataset(rows=8, columns=8, PatientID=f"bal-{i}") for i in range(8)]
        _idle(sleeper)  # the close of _ready's requests counted (a stopped worker's count stays)
        os.kill(sleeper, signal.SIGSTOP)
        socks = []
        for ds in datasets:
            body, ctype = multipart([to_bytes(ds)])
            stow = (f"POST /studies HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            qido = f"GET /instances?SOPInstanceUID={ds.SOPInstanceUID} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            socks += _connect(port, 1, stow + qido + GET)
        try:
            spread = _wait_spread(port, 4)
            assert spread == {awake: 4}, spread  # the other 4 wait in the sleeper's queue
            os.kill(sleeper, signal.SIGCONT)
            for s, ds in zip(socks, datasets):
                buf = bytearray()
                status, body = _response(s, buf)
                assert status == 200 and ds.SOPInstanceUID.encode() in body, body[:300]
                status, body = _response(s, buf)
                assert status == 200 and ds.SOPInstanceUID.encode() in body, body[:300]
                assert _response(s, buf)[0] == 200
            assert _wait_spread(port, 8) == {awake: 4, sleeper: 4}
        finally:
            for s in socks:
                s.close()
        found = httpx.get(f"http://127.0.0.1:{port}/instances", timeout=30).json()
        assert sorted(x["00080018"]["Value"][0] for x in found) == sorted(ds.SOPInstanceUID for ds in datasets)


def test_a_killed_worker_loses_no_connection_handed_to_it_and_its_replacement_takes_part(tmp_path):
    """Connections handed to a worker that is SIGKILLed before it adopted them (it was
    stopped) are adopted by the survivor and answered; the survivor's own connections go on;
    the replacement worker then takes its share of new connections."""
    with _server(tmp_path) as (proc, port):
        victim, survivor = sorted(_ready(proc, port, 2))
        _idle(victim)  # the close of _ready's requests counted (a stopped worker's count stays)
        os.kill(victim, signal.SIGSTOP)
        socks = _connect(port, 8)
        try:
            assert _wait_spread(port, 4) == {survivor: 4}
            os.kill(victim, signal.SIGKILL)
            for s in socks:  # the 4 sent to the victim: adopted by the survivor (within a second)
                assert _response(s, bytearray())[0] == 200
            assert _wait_spread(port, 8) == {survivor: 8}
            deadline = time.monotonic() + 120
            while True:
                # still open and served; and kept from uvicorn's 30 s keep-alive timeout while the
                # replacement starts (on a loaded CI machine that took long enough to close them)
                for s in socks:
                    s.sendall(GET)
                    assert _response(s, bytearray())[0] == 200
                with contextlib.suppress(AssertionError):
                    pids = _ready(proc, port, 2, timeout=5)
                    break
                assert time.monotonic() < deadline, "no replacement worker"
            (new,) = pids - {survivor, victim}
            more = _connect(port, 8)
            socks += more
            for s in more:
                assert _response(s, bytearray())[0] == 200
            assert _wait_spread(port, 16) == {survivor: 8, new: 8}
        finally:
            for s in socks:
                s.close()


def test_switched_off_connections_stay_where_accepted(tmp_path):
    """``DICOMWEB_BALANCE_CONNECTIONS=false``: uvicorn's own supervisor, no table; a sleeping
    worker gets nothing (8/0), and every request is answered by the other."""
    with _server(tmp_path, DICOMWEB_BALANCE_CONNECTIONS="false") as (proc, port):
        sleeper, awake = sorted(_ready(proc, port, 2, balanced=False))
        assert _table(awake) is None and _table(sleeper) is None
        os.kill(sleeper, signal.SIGSTOP)
        socks = _connect(port, 8)
        try:
            for s in socks:
                assert _response(s, bytearray())[0] == 200
            assert _wait_spread(port, 8) == {awake: 8}
        finally:
            for s in socks:
                s.close()


def test_rolling_restart_new_workers_balance(tmp_path):
    """SIGHUP (uvicorn's rolling restart): the new workers take rows of their own, the old
    ones give theirs back, and new connections spread over the new workers."""
    with _server(tmp_path) as (proc, port):
        old = _ready(proc, port, 2)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 120
        while (new := _workers(proc)) & old or len(new) != 2:
            assert time.monotonic() < deadline and proc.poll() is None, "no rolling restart"
            time.sleep(0.1)
        assert _ready(proc, port, 2) == new
        _idle(min(new))
        rows = _table(min(new))
        assert sorted(p for p in rows if p) == sorted(new), rows
        socks = _connect(port, 8)
        try:
            for s in socks:
                assert _response(s, bytearray())[0] == 200
            spread = _wait_spread(port, 8)
            assert set(spread) == new and sorted(spread.values()) == [4, 4], spread
        finally:
            for s in socks:
                s.close()

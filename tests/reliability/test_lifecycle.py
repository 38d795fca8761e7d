"""Start-up, restart and shutdown under traffic (case P6, issue 14 §1).

A worker that starts, restarts or stops must never disturb another worker's requests:
each process spools into its own folder under ``data/tmp`` and holds an ``flock`` on
it while alive; start-up sweeps only folders whose lock can be taken. SIGTERM lets the
requests in flight finish (uvicorn graceful shutdown, bounded) before the archive closes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.settings import Settings
from dicomweb_server.store.blobs import BlobStore
from tests.helpers import free_port, make_dataset, multipart, spool_files, to_bytes

REFERENCED, FAILED = "00081199", "00081198"


# --- the spool: deterministic ------------------------------------------------------------


def test_start_up_sweep_spares_live_processes_spool(tmp_path):
    """A second store (another process's start-up) removes nothing a live owner spools;
    once the owner is gone (its lock dropped as at process death) its folder goes."""
    live = BlobStore(tmp_path)
    part = live.spool / "part-1.tmp"
    part.write_bytes(b"being received")
    starting = BlobStore(tmp_path)
    assert starting.clean_spool() == 0
    assert part.read_bytes() == b"being received"
    assert starting.spool != live.spool
    os.close(live._spool_fd)  # the owner dies without cleaning up: the kernel drops its flock
    (tmp_path / "tmp" / "loose.tmp").write_bytes(b"left by the single-folder layout")
    assert BlobStore(tmp_path).clean_spool() == 2
    assert not part.exists() and not live.spool.exists()
    assert spool_files(tmp_path) == []


def test_close_waits_for_store_in_flight_then_removes_own_spool(tmp_path, monkeypatch):
    """Shutdown: close() lets a store transaction running in a worker thread finish
    (its instance is committed and readable afterwards), then removes the spool folder."""
    archive = Archive.open(Settings(data_dir=tmp_path, index="sqlite"))
    entered, release = threading.Event(), threading.Event()
    real_place = archive.blobs.place

    def slow_place(*a, **k):
        entered.set()
        release.wait(10)
        return real_place(*a, **k)

    monkeypatch.setattr(archive.blobs, "place", slow_place)
    ds = make_dataset()
    spooled = archive.blobs.spool / "p.tmp"
    spooled.write_bytes(to_bytes(ds))
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "out", archive.store([SpooledPart(headers={}, path=spooled, size=spooled.stat().st_size, complete=True)])))
    t.start()
    assert entered.wait(10)
    closer = threading.Thread(target=archive.close, kwargs={"timeout": 20})
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the store in flight
    release.set()
    t.join(10)
    closer.join(10)
    assert not closer.is_alive()
    assert [s.sop_instance_uid for s in result["out"].stored] == [ds.SOPInstanceUID]
    assert os.listdir(tmp_path / "tmp") == []
    reopened = Archive.open(Settings(data_dir=tmp_path, index="sqlite"))
    try:
        assert reopened.index.locate(ds.SOPInstanceUID) is not None
    finally:
        reopened.close()


# --- a real server with several workers ---------------------------------------------------


class Traffic:
    """Threads sending 6-instance STOW-RS requests until stopped; connection errors
    (server not yet up, worker killed, shutting down) are unacknowledged requests."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.url = url
        self.acked: dict[str, bytes] = {}
        self.bad: list[str] = []
        self.answers = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self, seed: int) -> None:
        while not self.stop.is_set():
            datas = {ds.SOPInstanceUID: to_bytes(ds) for ds in
                     (make_dataset(rows=96, columns=96, PatientID=f"p6-{seed}") for _ in range(6))}
            body, ctype = multipart(list(datas.values()))
            try:
                r = httpx.post(self.url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=15)
            except httpx.HTTPError:
                time.sleep(0.02)
                continue  # never acknowledged
            with self._lock:
                self.answers += 1
                refs = [x["00081155"]["Value"][0] for x in r.json().get(REFERENCED, {}).get("Value", [])] \
                    if r.headers.get("content-type", "").startswith("application/dicom+json") else []
                if r.status_code != 200 or sorted(refs) != sorted(datas):
                    self.bad.append(f"{r.status_code} {r.headers.get('warning', '')} {r.text[:300]}")
                for sop in refs:
                    self.acked[sop] = datas[sop]

    def wait_for(self, answers: int, proc: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.answers < answers:
            assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"only {self.answers} answers"
            time.sleep(0.05)


def _serve(data: Path, port: int, workers: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data), "--index", "sqlite",
         "--workers", str(workers), "--port", str(port)],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "DICOMWEB_SHUTDOWN_TIMEOUT": "20"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _workers(proc: subprocess.Popen) -> set[int]:
    """uvicorn's worker processes (multiprocessing spawn children, not its resource tracker)."""
    out = set()
    for child in psutil.Process(proc.pid).children():
        try:
            cmd = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "spawn_main" in cmd and child.status() != psutil.STATUS_ZOMBIE:
            out.add(child.pid)
    return out


def test_traffic_through_start_up_worker_restarts_and_shutdown(tmp_path):
    """Three workers; traffic from before the first answer, through three SIGKILLed
    workers (each replaced by uvicorn's supervisor) and SIGTERM. Every answer is a 200 naming all
    its instances or a connection error; every acknowledged instance comes back."""
    data = tmp_path / "data"
    port = free_port()
    traffic = Traffic(f"http://127.0.0.1:{port}")
    traffic.start()  # before the server exists: requests land the moment the first worker answers
    proc = _serve(data, port, workers=3)
    try:
        traffic.wait_for(8, proc)
        for _ in range(3):  # a worker dies; the supervisor starts a new one while the others serve
            before = _workers(proc)
            assert len(before) == 3, before
            os.kill(min(before), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not ((now := _workers(proc)) - before and len(now) == 3):
                assert time.monotonic() < deadline, "no replacement worker"
                time.sleep(0.05)
            traffic.wait_for(traffic.answers + 12, proc)
        proc.send_signal(signal.SIGTERM)  # shutdown under traffic
        assert proc.wait(60) == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        traffic.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert traffic.bad == [], traffic.bad[:3]
    assert os.listdir(data / "tmp") == []  # every worker removed its spool folder, the killed ones were swept
    assert len(traffic.acked) >= 6 * 40
    proc = _serve(data, port, workers=1)
    try:
        with httpx.Client(base_url=traffic.url, timeout=30) as c:
            deadline = time.monotonic() + 30
            while True:
                try:
                    c.get("/studies", params={"limit": 1})
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.05)
            listed: list = []
            while page := c.get("/instances", params={"offset": len(listed), "includefield": "00081190"}).json():
                listed += page  # pages of max_results (1000): a busy run acknowledges more than that
            urls = {x["00080018"]["Value"][0]: x["00081190"]["Value"][0] for x in listed}
            assert set(traffic.acked) <= set(urls)
            for sop, original in traffic.acked.items():
                r = c.get(urls[sop], headers={"Accept": "application/dicom; transfer-syntax=*"})
                assert r.status_code == 200 and r.content == original, sop
        assert spool_files(data) == []
    finally:
        proc.terminate()
        proc.wait(30)


def test_sigterm_lets_a_request_in_flight_finish(tmp_path):
    """SIGTERM while a STOW-RS body is half received (the app has started reading it:
    uvicorn answered ``100 Continue``): the worker finishes it, answers 200, and the
    instances are stored; the server then exits cleanly without spool files."""
    data = tmp_path / "data"
    port = free_port()
    proc = _serve(data, port, workers=2)
    url = f"http://127.0.0.1:{port}"
    datasets = [make_dataset(rows=64, columns=64) for _ in range(2)]
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/studies", timeout=2)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(f"POST /studies HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                      "Expect: 100-continue\r\n\r\n".encode())
            assert s.recv(100).startswith(b"HTTP/1.1 100")  # the worker is reading this request's body
            s.sendall(body[: len(body) // 2])
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the worker is shutting down (ordering only; nothing is timed)
            s.sendall(body[len(body) // 2 :])
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert all(ds.SOPInstanceUID.encode() in answer for ds in datasets)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert os.listdir(data / "tmp") == []
    archive = Archive.open(Settings(data_dir=data, index="sqlite"))
    try:
        for ds in datasets:
            loc = archive.index.locate(ds.SOPInstanceUID)
            assert loc is not None and archive.blobs.resolve(loc.path).read_bytes() == to_bytes(ds)
    finally:
        archive.close()

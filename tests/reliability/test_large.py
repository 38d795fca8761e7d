"""Case S4: large bodies in bounded server memory. A ~600 MB multi-frame instance
(1024x1024 uint16, 300 frames, generated frame by frame) sent chunked; 200 x 2 MB
instances in one request; then /frames/150, the whole instance and its pixel bulk
data streamed back; and the size cap."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import psutil
import pydicom
import pytest

from tests.helpers import free_port, make_dataset, to_bytes, spool_files

ROWS = COLS = 1024
FRAMES = 300
FRAME_BYTES = ROWS * COLS * 2
BOUNDARY = "s4-boundary"


def frame(k: int) -> bytes:
    return np.full((ROWS, COLS), k, np.uint16).tobytes()


def big_instance() -> tuple[pydicom.Dataset, bytes]:
    """Header bytes of the instance up to and including the Pixel Data element header."""
    ds = make_dataset(rows=ROWS, columns=COLS, pixels=False)
    ds.Rows, ds.Columns = ROWS, COLS
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    ds.NumberOfFrames = FRAMES
    head = to_bytes(ds) + b"\xe0\x7f\x10\x00OW\x00\x00" + (FRAME_BYTES * FRAMES).to_bytes(4, "little")
    return ds, head


def body(parts) -> iter:
    for p in parts:
        yield f"--{BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        yield from p
        yield b"\r\n"
    yield f"--{BOUNDARY}--\r\n".encode()


class Peak:
    """Samples the RSS of a process while a block runs."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


@pytest.fixture
def server(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--workers", "1", "--port", str(port)],
        env={**os.environ, "DICOMWEB_MAX_REQUEST_BYTES": str(1024**3), "DICOMWEB_LOG_LEVEL": "warning"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(url + "/studies")
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url, proc.pid
    proc.terminate()
    proc.wait(10)


def test_s4_large_bodies_in_bounded_memory(server):
    url, pid = server
    ds, head = big_instance()
    base = psutil.Process(pid).memory_info().rss
    with httpx.Client(base_url=url, timeout=300) as c:
        with Peak(pid) as peak:
            r = c.post("/studies", content=body([[head] + [frame(k) for k in range(1, FRAMES + 1)]]),
                       headers={"Content-Type": f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'})
        assert r.status_code == 200, r.text
        assert "content-length" not in r.request.headers  # sent chunked
        assert peak.peak - base < 150 * 1024**2, f"server grew by {(peak.peak - base) >> 20} MiB for a 600 MB body"

        small = [to_bytes(make_dataset(rows=1024, columns=1024)) for _ in range(200)]
        with Peak(pid) as peak:
            r = c.post("/studies", content=body([[d] for d in small]),
                       headers={"Content-Type": f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'})
        assert r.status_code == 200 and len(r.json()["00081199"]["Value"]) == 200
        assert peak.peak - base < 150 * 1024**2

        inst = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
        with Peak(pid) as peak:
            t = time.monotonic()
            r = c.get(inst + "/frames/150", headers={"Accept": "multipart/related; type=application/octet-stream"})
            elapsed = time.monotonic() - t
        assert r.status_code == 200
        assert frame(150) in r.content and len(r.content) < FRAME_BYTES + 500
        assert elapsed < 5  # a seek and a 2 MB read, not a decode of 600 MB

        want = hashlib.sha256(head)
        for k in range(1, FRAMES + 1):
            want.update(frame(k))
        with Peak(pid) as peak, c.stream("GET", inst, headers={"Accept": "application/dicom"}) as r:
            got = hashlib.sha256()
            for chunk in r.iter_bytes():
                got.update(chunk)
        assert got.hexdigest() == want.hexdigest()
        assert peak.peak - base < 150 * 1024**2, f"server grew by {(peak.peak - base) >> 20} MiB sending 600 MB"

        (meta,) = c.get(inst + "/metadata").json()
        with Peak(pid) as peak, c.stream("GET", meta["7FE00010"]["BulkDataURI"],
                                         headers={"Accept": "application/octet-stream"}) as r:
            n = sum(len(chunk) for chunk in r.iter_bytes())
        assert n == FRAME_BYTES * FRAMES
        assert peak.peak - base < 150 * 1024**2


def test_s4_size_cap(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--workers", "1", "--port", str(port)],
        env={**os.environ, "DICOMWEB_MAX_REQUEST_BYTES": str(50 * 1024**2)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(url + "/studies")
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        _ds, head = big_instance()
        r = httpx.post(url + "/studies", content=body([[head] + [frame(k) for k in range(1, 40)]]), timeout=120,
                       headers={"Content-Type": f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'})
        assert r.status_code == 413
        assert "52428800" in r.json()["detail"]
        assert spool_files(tmp_path / "data") == []
    finally:
        proc.terminate()
        proc.wait(10)

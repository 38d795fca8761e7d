"""Test data made with pydicom, and a real uvicorn server on a loopback socket."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pydicom
import uvicorn
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from dicomweb_server.api.limits import uvicorn_options
from dicomweb_server.app import create_app
from dicomweb_server.settings import Settings
from loadtests.common import wait_http

CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"
BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"


def sample_files() -> dict[str, Path]:
    """pydicom's bundled test files that parse as PS3.10 files with file meta and
    carry Study/Series/SOP Instance UIDs: the first file (sorted path order) for
    each SOP Instance UID. Computed, never hard-coded."""
    root = Path(pydicom.__file__).parent / "data" / "test_files"
    chosen: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
        except Exception:
            continue
        if "TransferSyntaxUID" not in getattr(ds, "file_meta", {}):
            continue
        if not all(k in ds for k in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID")):
            continue
        chosen.setdefault(str(ds.SOPInstanceUID), path)
    return chosen


def make_dataset(
    *,
    study: str | None = None,
    series: str | None = None,
    sop: str | None = None,
    sop_class: str = CT_IMAGE_STORAGE,
    modality: str = "CT",
    rows: int = 8,
    columns: int = 8,
    frames: int = 1,
    pixels: bool = True,
    transfer_syntax: str = ExplicitVRLittleEndian,
    **attrs,
) -> Dataset:
    """A small valid instance; extra keyword arguments become attributes."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = transfer_syntax
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = sop or generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.StudyInstanceUID = study or generate_uid()
    ds.SeriesInstanceUID = series or generate_uid()
    ds.Modality = modality
    ds.PatientName = attrs.pop("PatientName", "Test^Patient")
    ds.PatientID = attrs.pop("PatientID", "P1")
    ds.StudyDate = attrs.pop("StudyDate", "20240101")
    for k, v in attrs.items():
        setattr(ds, k, v)
    if pixels:
        ds.Rows, ds.Columns = rows, columns
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.BitsAllocated = ds.BitsStored = 16
        ds.HighBit = 15
        ds.PixelRepresentation = 0
        if frames > 1:
            ds.NumberOfFrames = frames
        arr = (np.arange(rows * columns * frames, dtype=np.uint16) % 4096).reshape(frames, rows, columns)
        ds.PixelData = arr.tobytes()
    return ds


def store_datasets(archive, datasets) -> None:
    """Store ``datasets`` through ``archive.store`` (as a STOW-RS would), all of them."""
    from dicomweb_server.dicom.multipart import SpooledPart

    parts = []
    for i, ds in enumerate(datasets):
        path = archive.blobs.spool / f"t{i}.dcm"
        ds.save_as(path, enforce_file_format=True)
        parts.append(SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True))
    assert len(archive.store(parts).stored) == len(datasets)


def to_bytes(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def multipart(parts: list[bytes | tuple[str, bytes]], boundary: str = "test-boundary.=1") -> tuple[bytes, str]:
    """A multipart/related body; a part is bytes (application/dicom) or
    (content type, bytes). Returns (body, Content-Type)."""
    out = []
    for p in parts:
        ctype, data = ("application/dicom", p) if isinstance(p, (bytes, bytearray)) else p
        out.append(f"--{boundary}\r\nContent-Type: {ctype}\r\n\r\n".encode() + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f'multipart/related; type="application/dicom"; boundary="{boundary}"'


def spool_files(data_dir: Path) -> list[str]:
    """Spool files under ``data_dir/tmp`` (received parts), without the per-process
    folders and their lock files, which live as long as their process."""
    root = Path(data_dir) / "tmp"
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _s, fs in os.walk(root)
                  for f in fs if not f.endswith(".lock"))


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_PICK = __import__("random").Random(os.getpid())


def free_port() -> int:
    """A port free now, chosen below the kernel's ephemeral range: a port the kernel hands
    out for bind(0) is also what it gives outgoing connections as their source port, and
    with the tests in parallel (pytest-xdist) one of those took a server's port between
    this check and the server's bind (EADDRINUSE)."""
    low = 20000 if _EPHEMERAL[0] > 21000 else 1024
    high = _EPHEMERAL[0] - 1 if _EPHEMERAL[0] > 21000 else 65535
    # each pytest-xdist worker picks from its own slice: two workers picked the same free port
    # and the second server's bind failed (EADDRINUSE; CI 2026-12-07, test_pdata.py)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    me = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    if workers > 1 and me.isdigit() and int(me) < workers:
        size = (high - low + 1) // workers
        low, high = low + int(me) * size, low + (int(me) + 1) * size - 1
    for _ in range(200):
        port = _PICK.randint(low, high)
        if _EPHEMERAL[0] <= port <= _EPHEMERAL[1]:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # (no luck: the kernel's choice)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PromptServer(uvicorn.Server):
    """uvicorn's server, stopped without its fixed waits: its main loop looks at
    ``should_exit`` every 0.1 s (here it also wakes when :meth:`wake` is called from another
    thread), its shutdown pauses 0.1 s for the open connections (here only when one is open).
    A stop took 0.2 s, and the tests stop 800-odd servers (the ``server`` fixture alone: 715)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 0.1)  # (uvicorn: asyncio.sleep(0.1))
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown, without its 0.1 s pause for the open connections to see theirs
        when none is open (the usual case: the test's client closed before the server stops)
        and no graceful-shutdown timeout is set (none is here): uvicorn's own otherwise."""
        if self.server_state.connections or self.config.timeout_graceful_shutdown is not None:
            return await super().shutdown(sockets)
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        await self._wait_tasks_to_complete()
        if not self.force_exit:
            await self.lifespan.shutdown()

    def wake(self) -> None:
        """Let the main loop look at ``should_exit`` now (from any thread)."""
        if self._loop is not None and self._woken is not None:
            with contextlib.suppress(RuntimeError):  # (the loop closed: it has exited already)
                self._loop.call_soon_threadsafe(self._woken.set)


class LiveServer:
    """uvicorn serving the archive on 127.0.0.1 in a thread."""

    def __init__(self, data_dir: Path, index: str = "sqlite", **settings) -> None:
        self.settings = Settings(data_dir=data_dir, index=index, port=free_port(), **settings)
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self._server: PromptServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def archive(self):
        """The running app's Archive (opened in its lifespan)."""
        return self.app.state.archive

    def start(self) -> "LiveServer":
        self.app = create_app(self.settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.settings.port,
                                log_level="warning", access_log=False, lifespan="on",
                                **uvicorn_options(self.settings))
        self._server = PromptServer(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.wake()
            self._thread.join(timeout=20)  # type: ignore[union-attr]
            self._server = None

    def restart(self) -> "LiveServer":
        self.stop()
        return self.start()


def serve_process(data_dir: Path, code: str) -> tuple[subprocess.Popen, str]:
    """``dicomweb-server serve --workers 1`` on ``data_dir`` in its own process (the
    code of the folder ``code``), once it answers; the process and its URL (the
    benchmarks that measure the server's memory)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": code, "DICOMWEB_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--workers", "1",
                             "--data-dir", str(data_dir), "--port", str(port)], env=env, cwd=code,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/studies", timeout=60, proc=proc)
    return proc, url


def stop_processes(procs) -> None:
    """Terminate each process still running (SIGTERM, then SIGKILL after 10 s)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def remove_stored(settings, rel: str) -> None:
    """Remove an instance's stored file (or S3 object) behind the archive's back, its
    index row left as it is: damaged storage (missing_data.py)."""
    if settings.storage:
        from tests.s3server import _client_for

        client, bucket, prefix = _client_for({"storage": settings.storage,
                                              "s3_endpoint_url": settings.s3_endpoint_url})
        client.delete_object(Bucket=bucket, Key=prefix + rel)
    else:
        (Path(settings.data_dir) / "blobs" / rel).unlink()


def rejection_note(targets: list[Dataset], code: str = "113001", study: str | None = None,
                   series: str | None = None) -> Dataset:
    """An IOCM rejection note (Key Object Selection, PS3.3 A.35.4; title from PS3.16
    CID 7011) naming ``targets`` in its CurrentRequestedProcedureEvidenceSequence."""
    ds = make_dataset(study=study or str(targets[0].StudyInstanceUID), series=series,
                      sop_class="1.2.840.10008.5.1.4.1.1.88.59", modality="KO", pixels=False,
                      PatientName=str(targets[0].PatientName), PatientID=str(targets[0].PatientID),
                      StudyDate=str(targets[0].StudyDate))
    title = Dataset()
    title.CodeValue, title.CodingSchemeDesignator, title.CodeMeaning = code, "DCM", "Rejected for Quality Reasons"
    ds.ConceptNameCodeSequence = [title]
    ds.ValueType = "CONTAINER"
    by_study: dict[str, dict[str, list[Dataset]]] = {}
    for t in targets:
        by_study.setdefault(str(t.StudyInstanceUID), {}).setdefault(str(t.SeriesInstanceUID), []).append(t)
    evidence = []
    for st, series_map in by_study.items():
        item = Dataset()
        item.StudyInstanceUID = st
        item.ReferencedSeriesSequence = []
        for se, insts in series_map.items():
            s = Dataset()
            s.SeriesInstanceUID = se
            s.ReferencedSOPSequence = []
            for t in insts:
                r = Dataset()
                r.ReferencedSOPClassUID, r.ReferencedSOPInstanceUID = t.SOPClassUID, t.SOPInstanceUID
                s.ReferencedSOPSequence.append(r)
            item.ReferencedSeriesSequence.append(s)
        evidence.append(item)
    ds.CurrentRequestedProcedureEvidenceSequence = evidence
    return ds

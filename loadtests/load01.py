"""LOAD-01: the reference C-STORE load test (described in docs/load-testing.md).

    python -m loadtests.load01 --host 127.0.0.1 --port 11112 --http http://127.0.0.1:8080 \\
        --associations 1,4,16,64 --images 200 [--peer orthanc] [--peer storescp] [--output DIR]

Per step (one association count) the generator sends ``--images`` images of the
reference mix (60 % CT 512x512, 37 % MR 256x256, 1.5 % CR 2500x2000, 1.3 % DX 3000x3000,
0.2 % XA 64 frames 512x512; 16-bit, Explicit VR Little Endian; ``--scale`` shrinks the
rows and columns) over N parallel associations, from several processes (pynetdicom SCU;
a few associations per process, so that the generator does not measure itself). Then
it checks what the reference checked: every SOP Instance UID sent is stored, no extra
or partial files, and the SHA-256 of the pixel data of every 100th image equals what
was sent. Each step's instances (and the generator's files) are removed after the last
step, not between steps (see :func:`run_step`).

Targets: ``ours`` (the archive at --host/--port, checked over DICOMweb at --http, its
spool at --data-dir) and, with ``--peer``, Orthanc and DCMTK's storescp, each started
by this tool with the configuration written into the results. The same run measures
the disk's durable-write rate for 512 KB files (temp file + fsync + rename + directory
fsync) and the one-image association latency (associate, C-STORE, release).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from . import load01_storescu
from .load01_rounds import RATIO_HEADERS, ratio_rows, step_name, step_order
from .common import CpuSampler, MachineCpu, fmt, process_tree, table, tree_rss_mb

#: (modality, SOP Class UID, rows, columns, frames, share of images) — the reference mix
MIX = [
    ("CT", "1.2.840.10008.5.1.4.1.1.2", 512, 512, 1, 0.60),
    ("MR", "1.2.840.10008.5.1.4.1.1.4", 256, 256, 1, 0.37),
    ("CR", "1.2.840.10008.5.1.4.1.1.1", 2500, 2000, 1, 0.015),
    ("DX", "1.2.840.10008.5.1.4.1.1.1.1", 3000, 3000, 1, 0.013),
    ("XA", "1.2.840.10008.5.1.4.1.1.12.1", 512, 512, 64, 0.002),
]
EXPLICIT_LE = "1.2.840.10008.1.2.1"
ROOT = "1.2.826.0.1.3680043.8.498.77"


def counts(images: int) -> list[int]:
    """Images per modality, largest remainder (the mix kept for any total)."""
    raw = [images * m[5] for m in MIX]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: images - sum(out)]:
        out[i] += 1
    return out


@dataclass
class Job:
    """One image to send: its index in the step and modality."""

    index: int
    modality: int


def plan(images: int) -> list[Job]:
    import random

    jobs = [Job(0, m) for m, n in enumerate(counts(images)) for _ in range(n)]
    random.Random(1).shuffle(jobs)  # the big ones among the small ones, the same order every run
    for i, j in enumerate(jobs):
        j.index = i
    return jobs


def _dataset(step: str, job: Job, scale: float, pixels: bytes):
    from pydicom.dataset import Dataset, FileMetaDataset

    mod, sop_class, rows, cols, frames, _ = MIX[job.modality]
    rows, cols = max(8, int(rows * scale)), max(8, int(cols * scale))
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = EXPLICIT_LE
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = f"{ROOT}.{step}.{job.index + 1}"
    ds.StudyInstanceUID = f"{ROOT}.{step}.0.{job.index % 10 + 1}"  # 10 studies per step
    ds.SeriesInstanceUID = f"{ROOT}.{step}.0.{job.index % 10 + 1}.{job.modality + 1}"
    ds.PatientID = f"LOAD01-{step}"
    ds.PatientName = "LOAD01^STEP" + step
    ds.StudyDate = "20260101"
    ds.Modality = mod
    ds.InstanceNumber = job.index + 1
    ds.Rows, ds.Columns = rows, cols
    if frames > 1:
        ds.NumberOfFrames = frames
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    n = rows * cols * frames * 2
    # distinct pixel data per image, cheaply: a shared random buffer with the index in front
    ds.PixelData = job.index.to_bytes(8, "little") + pixels[8:n] if len(pixels) >= n else \
        job.index.to_bytes(8, "little") + (pixels * (n // len(pixels) + 1))[8:n]
    return ds


def fast_scu() -> None:
    """The generator's pynetdicom SCU without its own latency: the listener's blocking
    reactors (no 1 ms polling sleeps, no 10 ms sleeps in ``Association.kill`` at every
    release) and TCP_NODELAY on its sockets (pynetdicom leaves Nagle on: a small last
    segment then waits for the server's delayed ACK). Process-wide; see
    ``dicomweb_server/dimse/reactor.py``. ``--scu-reactor pynetdicom`` keeps
    pynetdicom's own, for a before/after."""
    from dicomweb_server.dimse import reactor

    reactor.install()


def _association_worker(args) -> dict:
    """One association sending its share of the step (run in a generator process's thread)."""
    from pynetdicom import AE

    host, port, called, step, jobs, scale, pixels = args
    ae = AE(ae_title="LOAD01")
    # a stuck operation becomes an error of the step, not a hang
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 120
    ae.maximum_pdu_size = 0
    for m in MIX:
        ae.add_requested_context(m[1], [EXPLICIT_LE])
    out: dict = {"latencies": [], "errors": 0, "bytes": 0, "hashes": {}, "sent": [], "rejected": 0}
    assoc = ae.associate(host, port, ae_title=called)
    if not assoc.is_established:
        out["errors"] += len(jobs)
        out["rejected"] = int(assoc.is_rejected)
        return out
    try:
        for job in jobs:
            ds = _dataset(step, job, scale, pixels)
            t0 = time.perf_counter()
            try:
                rsp = assoc.send_c_store(ds)
                ok = rsp.get("Status") == 0
            except Exception:
                ok = False
            out["latencies"].append(time.perf_counter() - t0)
            if ok:
                out["sent"].append(ds.SOPInstanceUID)
                out["bytes"] += len(ds.PixelData)
                if job.index % 100 == 0:
                    out["hashes"][ds.SOPInstanceUID] = hashlib.sha256(ds.PixelData).hexdigest()
            else:
                out["errors"] += 1
            if not assoc.is_established:
                out["errors"] += len(jobs) - len(out["latencies"])
                break
    finally:
        if assoc.is_established:
            assoc.release()
    return out


def _process_worker(args) -> list[dict]:
    """A generator process: a few associations, one thread each."""
    host, port, called, step, shares, scale, fast = args
    if fast:
        fast_scu()
    pixels = np.random.default_rng(7).integers(0, 4096, size=max(_max_pixels(scale) // 2, 16),
                                                dtype=np.uint16).tobytes()
    results: list[dict] = [{} for _ in shares]

    def run(i, jobs):
        results[i] = _association_worker((host, port, called, step, jobs, scale, pixels))

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _max_pixels(scale: float) -> int:
    return max(max(8, int(r * scale)) * max(8, int(c * scale)) * f * 2 for _, _, r, c, f, _ in MIX)


# --- targets ---------------------------------------------------------------------------


#: ports for the peers (``--peer-ports``): taken in order, before any ephemeral one
PEER_PORTS: list[int] = []


def free_port() -> int:
    """The next of ``PEER_PORTS`` (a shared machine: each user keeps to a port range), else
    one the kernel picks."""
    if PEER_PORTS:
        return PEER_PORTS.pop(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_listening(port: int) -> list[int]:
    """Every process listening on ``port``: the archive's DIMSE listener processes share it
    (SO_REUSEPORT, ``dimse_processes``)."""
    import psutil

    return sorted({c.pid for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid})


def pid_listening(port: int) -> int | None:
    pids = pids_listening(port)
    return pids[0] if pids else None


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port}")


@dataclass
class Target:
    name: str
    host: str
    port: int
    called: str
    pid: int | None = None
    more_pids: list[int] = field(default_factory=list)  # further server processes (DIMSE listeners)
    config: str = ""
    proc: subprocess.Popen | None = None
    workdir: Path | None = None
    http: str | None = None
    data_dir: Path | None = None

    # stored SOP Instance UIDs of a step -> a way to read the pixel data
    def stored(self, step: str) -> dict[str, object]:
        raise NotImplementedError

    def pixel_data(self, ref) -> bytes:
        raise NotImplementedError

    def partial_files(self) -> list[str]:
        return []

    def remove(self, step: str, stored: dict) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


class Ours(Target):
    """The archive: checked over DICOMweb (QIDO-RS, WADO-RS, DELETE)."""

    def stored(self, step):
        out, offset = {}, 0
        with httpx.Client(base_url=self.http, timeout=120) as c:
            while True:
                page = c.get("/instances", params={"PatientID": f"LOAD01-{step}", "limit": 1000,
                                                   "offset": offset}).json()
                for i in page:
                    out[i["00080018"]["Value"][0]] = (i["0020000D"]["Value"][0], i["0020000E"]["Value"][0])
                if len(page) < 1000:
                    return out
                offset += len(page)

    def pixel_data(self, ref):
        import io

        import pydicom

        (study, series), sop = ref
        r = httpx.get(f"{self.http}/studies/{study}/series/{series}/instances/{sop}", timeout=120,
                      headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
        r.raise_for_status()
        return pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"DICM") - 128:])).PixelData

    def partial_files(self):
        return spool_leftovers(self.data_dir) if self.data_dir is not None else []

    def remove(self, step, stored):
        with httpx.Client(base_url=self.http, timeout=120) as c:
            for study in {v[0] for v in stored.values()}:
                c.delete(f"/studies/{study}")


def spool_leftovers(data_dir: Path) -> list[str]:
    """Received data sets left in the archive's spool (``data/tmp/<pid>-<token>/...``): a
    C-STORE or STOW-RS part that was neither stored nor removed. Not the
    ``tmp/<pid>-<token>.lock`` files beside the folders: each live process holds one as
    long as it runs (store/blobs.py), and counting them made every run report 2-3
    "partial" files (one per HTTP worker and the DIMSE listener)."""
    tmp = Path(data_dir) / "tmp"
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                  if p.is_file() and not (p.parent == tmp and p.suffix == ".lock"))


class Orthanc(Target):
    """Orthanc's DICOM server (Debian package), checked over its REST API."""

    @classmethod
    def start(cls) -> Orthanc:
        work = Path(tempfile.mkdtemp(prefix="load01-orthanc-"))
        port, http = free_port(), free_port()
        config = {"Name": "LOAD01", "StorageDirectory": str(work / "db"), "IndexDirectory": str(work / "db"),
                  "DicomAet": "ORTHANC", "DicomPort": port, "HttpPort": http, "RemoteAccessAllowed": False,
                  "AuthenticationEnabled": False, "DicomCheckCalledAet": False, "StorageCompression": False,
                  "DicomThreadsCount": 64, "MaximumStorageCacheSize": 0, "Plugins": [],
                  "SyncStorageArea": True, "StorageAccessOnFind": "Never", "HttpServerEnabled": True}
        (work / "orthanc.json").write_text(json.dumps(config, indent=1))
        # TCP_NODELAY=1: Orthanc's DICOM server is DCMTK's, which leaves Nagle on (as for storescp below)
        proc = subprocess.Popen(["Orthanc", str(work / "orthanc.json")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=dict(os.environ, TCP_NODELAY="1"))
        wait_port(port)
        wait_port(http)
        t = cls("orthanc", "127.0.0.1", port, "ORTHANC", pid=proc.pid, proc=proc, workdir=work,
                http=f"http://127.0.0.1:{http}",
                config="TCP_NODELAY=1 Orthanc " + subprocess.run(["Orthanc", "--version"], capture_output=True,
                                                                   text=True).stdout.splitlines()[0]
                + ", config " + json.dumps(config))
        return t

    def stored(self, step):
        r = httpx.post(f"{self.http}/tools/find", json={"Level": "Instance", "Expand": True,
                                                         "Query": {"PatientID": f"LOAD01-{step}"}}, timeout=300)
        return {i["MainDicomTags"]["SOPInstanceUID"]: i["ID"] for i in r.json()}

    def pixel_data(self, ref):
        import io

        import pydicom

        oid, _ = ref
        r = httpx.get(f"{self.http}/instances/{oid}/file", timeout=120)
        return pydicom.dcmread(io.BytesIO(r.content)).PixelData

    def remove(self, step, stored):
        for p in httpx.post(f"{self.http}/tools/find", json={"Level": "Patient", "Query": {
                "PatientID": f"LOAD01-{step}"}}, timeout=120).json():
            httpx.delete(f"{self.http}/patients/{p}", timeout=300)


def dcmtk(tool: str) -> str:
    """DCMTK's ``tool`` on PATH, skipping scripts: pynetdicom installs Python apps with the same
    names (``storescp``, ``storescu``...) in the venv's bin/, which comes first on PATH; with
    the venv active, ``--peer storescp`` started pynetdicom's, which refused DCMTK's options."""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(d, tool)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            with open(path, "rb") as f:
                if f.read(2) != b"#!":
                    return path
    return tool


class StoreSCP(Target):
    """DCMTK's storescp, one child process per association (--fork), files in a folder."""

    @classmethod
    def start(cls) -> StoreSCP:
        work = Path(tempfile.mkdtemp(prefix="load01-storescp-"))
        (work / "out").mkdir()
        port = free_port()
        # DCMTK tunings: the largest PDU, TCP buffers
        # left to the kernel by not setting TCP_BUFFER_LENGTH; --fork for parallel associations
        cmd = [dcmtk("storescp"), "--fork", "+xa", "--max-pdu", "131072", "-od", str(work / "out"), "-aet", "STORESCP",
               str(port)]
        # TCP_NODELAY=1: DCMTK >= 3.6.2 leaves Nagle on, and storescp writes a PDU in pieces:
        # each C-STORE-RSP then waited for the generator's 40 ms delayed ACK
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, TCP_NODELAY="1"))
        wait_port(port)
        version = subprocess.run([cmd[0], "--version"], capture_output=True, text=True).stdout.splitlines()
        return cls("storescp", "127.0.0.1", port, "STORESCP", pid=proc.pid, proc=proc, workdir=work,
                   config=f"{version[0] if version else 'storescp'}: `TCP_NODELAY=1 {' '.join(cmd)}` (files written, no fsync)")

    def stored(self, step):
        out = {}
        for p in (self.workdir / "out").iterdir():  # type: ignore[operator]
            m = re.match(r"^[A-Z]{2}\.(.+)$", p.name)
            if m and m.group(1).startswith(f"{ROOT}.{step}."):
                out[m.group(1)] = p
        return out

    def pixel_data(self, ref):
        import pydicom

        return pydicom.dcmread(ref[0]).PixelData

    def partial_files(self):
        return [p.name for p in (self.workdir / "out").iterdir()  # type: ignore[operator]
                if not re.match(r"^[A-Z]{2}\.\d", p.name)]

    def remove(self, step, stored):
        for p in stored.values():
            Path(p).unlink(missing_ok=True)


# --- one step ----------------------------------------------------------------------------


@dataclass
class StepResult:
    target: str
    associations: int
    round: int = 0  # with --rounds N: which of the step's rounds (the order reversed on odd ones)
    operations: int = 0
    seconds: float = 0.0
    bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    rejected: int = 0  # associations answered A-ASSOCIATE-RJ (their images are errors too)
    peak_mb: float | None = None
    server_cpu: float | None = None
    generator_cpu: float | None = None
    machine_cpu: float | None = None
    missing: int = 0
    extra: int = 0
    partial: int = 0
    hash_checked: int = 0
    hash_mismatch: int = 0

    def row(self) -> list:
        lat = sorted(self.latencies) or [0.0]

        def pct(p):
            return 1000 * lat[min(len(lat) - 1, int(p * len(lat)))]

        return [self.target, self.associations, self.operations,
                self.operations / self.seconds if self.seconds else None,
                self.bytes / 1e6 / self.seconds if self.seconds else None,
                pct(0.50), pct(0.95), pct(0.99), 1000 * lat[-1], self.errors, self.peak_mb,
                self.generator_cpu, self.server_cpu,
                f"{self.missing}/{self.extra}/{self.partial}", f"{self.hash_checked - self.hash_mismatch}/"
                                                               f"{self.hash_checked}"]


HEADERS = ["Target", "Step (assocs)", "Operations", "Ops/s", "MB/s", "p50 ms", "p95 ms", "p99 ms", "Max ms",
           "Errors", "Peak memory MB (server)", "Generator CPU %", "Server CPU %",
           "missing/extra/partial", "SHA-256 ok"]


def run_step(target: Target, associations: int, images: int, scale: float, processes: int, step: str,
             fast: bool = True, generator: str = "pynetdicom", cleanup: list | None = None) -> StepResult:
    """One step: ``images`` images over ``associations`` associations, then the checks.
    The stored images and the generator's files are removed at once, or, given
    ``cleanup`` (a list), by the callables added to it, which the caller runs after its
    last step: removed between steps, they made the next step measure the file system
    (on ext4 without a journal, a file created in a block group where thousands were just
    deleted costs up to ~0.8 ms of CPU: see ``benchmarks/file_create.py``)."""
    later: list = []
    jobs = plan(images)
    shares = [jobs[i::associations] for i in range(associations)]
    nproc = max(1, min(processes, associations))
    groups = [shares[i::nproc] for i in range(nproc)]
    res = StepResult(target.name, associations)
    cpu, gen_cpu, machine = CpuSampler(), CpuSampler(), MachineCpu()
    peak = [0.0]
    stop = threading.Event()
    if generator == "storescu":  # the files first, outside the timed window (load01_storescu.py)
        pixels = np.random.default_rng(7).integers(0, 4096, size=max(_max_pixels(scale) // 2, 16),
                                                    dtype=np.uint16).tobytes()
        files_root, file_shares = load01_storescu.write_shares(step, shares, scale, pixels, _dataset)
        os.sync()  # their writeback too: not the kernel's flusher competing with the step's syncs
        pool = None
    else:
        pool = mp.get_context("fork").Pool(nproc)
    if isinstance(target, Ours):  # every listener process, however late it started listening
        listeners = pids_listening(target.port)
        if listeners:
            target.pid, target.more_pids = listeners[0], listeners[1:]
    roots = [p for p in [target.pid, *target.more_pids] if p]
    server_procs = [q for r in roots for q in process_tree(r)]
    gen_procs = process_tree(os.getpid())  # this process and the pool's workers

    def sampler():
        while not stop.is_set():
            if roots:  # storescp --fork: a child per association, so the trees are re-read
                server_procs[:] = [q for r in roots for q in process_tree(r)]
            if pool is None:  # the storescu processes come and go (a peer started by us is not one)
                server_pids = {q.pid for q in server_procs}
                gen_procs[:] = [q for q in process_tree(os.getpid()) if q.pid not in server_pids]
            cpu.sample(server_procs, True)
            gen_cpu.sample([p for p in gen_procs], True)
            machine.sample(True)
            if roots:  # every listener process together
                rss = sum(tree_rss_mb(r) or 0 for r in roots)
                if rss:
                    peak[0] = max(peak[0], rss)
            stop.wait(0.25)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t0 = time.perf_counter()
    if pool is None:
        procs = load01_storescu.start(target.host, target.port, target.called, files_root, file_shares)
        out = [load01_storescu.collect(files_root, procs, file_shares)]
    else:
        out = pool.map(_process_worker, [(target.host, target.port, target.called, step, g, scale, fast)
                                         for g in groups])
    res.seconds = time.perf_counter() - t0
    stop.set()
    th.join()
    if pool is None:
        later.append(lambda: load01_storescu.remove(files_root))
    else:
        pool.close()
        pool.join()
    sent, hashes = [], {}
    for proc_results in out:
        for r in proc_results:
            res.latencies += r["latencies"]
            res.errors += r["errors"]
            res.rejected += r.get("rejected", 0)
            res.bytes += r["bytes"]
            sent += r["sent"]
            hashes.update(r["hashes"])
    res.operations = len(res.latencies)
    res.peak_mb = round(peak[0], 1) if peak[0] else None
    res.server_cpu = round(cpu.total_pct(), 1) if server_procs else None
    res.generator_cpu = round(gen_cpu.total_pct(), 1)
    res.machine_cpu = machine.busy_pct()
    # verification (the reference's checks), then clean up (also when a check fails)
    stored: dict = {}
    try:
        stored = target.stored(step)
        res.missing = len(set(sent) - set(stored))
        res.extra = len(set(stored) - set(sent))
        res.partial = len(target.partial_files())
        for sop, digest in hashes.items():
            if sop in stored:
                res.hash_checked += 1
                if hashlib.sha256(target.pixel_data((stored[sop], sop))).hexdigest() != digest:
                    res.hash_mismatch += 1
            else:
                res.hash_mismatch += 1
                res.hash_checked += 1
    finally:
        later.insert(0, lambda: target.remove(step, stored or target.stored(step)))
        if cleanup is None:
            for undo in later:
                undo()
        else:
            cleanup += later
    return res


# --- the disk and the association latency ---------------------------------------------------


def durable_write_rate(folder: Path, n: int = 100, size: int = 512 * 1024) -> dict:
    """Files/s and MB/s of temp file + fsync + rename + directory fsync, 512 KB each."""
    d = Path(tempfile.mkdtemp(prefix="load01-disk-", dir=folder))
    data = os.urandom(size)
    t0 = time.perf_counter()
    for i in range(n):
        tmp = d / f"{i}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, d / f"{i}.dcm")
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    s = time.perf_counter() - t0
    shutil.rmtree(d, ignore_errors=True)
    return {"files_per_s": round(n / s, 1), "MB_per_s": round(n * size / 1e6 / s, 1), "files": n, "bytes": size,
            "folder": str(folder)}


#: the step name of the one-image associations (its SOP Instance UIDs' component): no
#: association count is 0, so they never meet a step's
LATENCY_STEP = "0"


def association_latency(target: Target, n: int = 50, fast: bool = True) -> dict:
    """Associate + one 512 KB CT C-STORE + release, sequentially: ms p50/p99 (in a child
    process, so that ``fast`` applies to it alone)."""
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        return pool.apply(_association_latency, (target.host, target.port, target.called, n, fast))


def _association_latency(host: str, port: int, called: str, n: int, fast: bool) -> dict:
    from pynetdicom import AE

    if fast:
        fast_scu()

    pixels = np.random.default_rng(1).integers(0, 4096, size=512 * 512, dtype=np.uint16).tobytes()
    ae = AE(ae_title="LOAD01")
    ae.add_requested_context(MIX[0][1], [EXPLICIT_LE])
    times, sops = [], []
    for i in range(n):
        ds = _dataset(LATENCY_STEP, Job(i, 0), 1.0, pixels)
        t0 = time.perf_counter()
        assoc = ae.associate(host, port, ae_title=called)
        ok = assoc.is_established and assoc.send_c_store(ds).get("Status") == 0
        if assoc.is_established:
            assoc.release()
        times.append(time.perf_counter() - t0)
        if ok:
            sops.append(ds.SOPInstanceUID)
    times.sort()
    return {"n": n, "ok": len(sops), "p50_ms": round(1000 * statistics.median(times), 2),
            "p99_ms": round(1000 * times[min(n - 1, int(0.99 * n))], 2)}


# --- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.load01", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11112, help="the archive's DIMSE port")
    p.add_argument("--ae-title", default="DICOMWEB", help="the archive's AE title")
    p.add_argument("--http", default="http://127.0.0.1:8080", help="the archive's DICOMweb root (checks)")
    p.add_argument("--data-dir", type=Path, help="the archive's data folder (spool check, disk rate)")
    p.add_argument("--associations", default="1,4,16,64")
    p.add_argument("--images", type=int, default=200, help="images per step (reference: 10,000)")
    p.add_argument("--scale", type=float, default=1.0, help="rows/columns factor (reference: 1.0)")
    p.add_argument("--processes", type=int, default=max(2, os.cpu_count() or 2), help="generator processes")
    p.add_argument("--peer", action="append", choices=["orthanc", "storescp"], default=[])
    p.add_argument("--no-ours", action="store_true", help="only the peers")
    p.add_argument("--latency", type=int, default=50, help="one-image associations for the latency (0: skip)")
    p.add_argument("--output", type=Path, default=Path("loadtests/results/load01"))
    p.add_argument("--scu-reactor", choices=["blocking", "pynetdicom"], default="blocking",
                   help="the generator SCU's reactors: blocking + TCP_NODELAY (default), or pynetdicom's polling ones")
    p.add_argument("--generator", choices=["pynetdicom", "storescu"], default="pynetdicom",
                   help="the SCU: pynetdicom processes (default), or one DCMTK storescu process per association "
                        "(files written before each step; loadtests/load01_storescu.py)")
    p.add_argument("--rounds", type=int, default=1,
                   help="each step this many times (1 or an even number), the order of the targets reversed "
                        "on every other round; the ratio is the geometric mean of the rounds' ratios")
    p.add_argument("--peer-ports", type=int, metavar="FIRST",
                   help="give the peers ports FIRST, FIRST+1, ... (Orthanc DICOM and HTTP, then storescp); "
                        "default: ports the kernel picks")
    args = p.parse_args(argv)
    if args.peer_ports:
        PEER_PORTS[:] = range(args.peer_ports, args.peer_ports + 16)
    fast = args.scu_reactor == "blocking"
    steps = [int(x) for x in args.associations.split(",")]
    if len(set(steps)) != len(steps) or min(steps) < 1:
        # a step's SOP Instance UIDs are named by its association count, and nothing is deleted
        # before the last step: a repeated step would resend instances still stored
        p.error(f"--associations: each step once, each >= 1 (not {args.associations})")
    if args.rounds < 1 or (args.rounds > 1 and args.rounds % 2):
        p.error(f"--rounds: 1 or an even number (each order as often as the other), not {args.rounds}")

    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    targets: list[Target] = []
    if not args.no_ours:
        wait_port(args.port)
        listeners, deadline = pids_listening(args.port), time.monotonic() + 5
        while time.monotonic() < deadline:  # the listener processes start one after the other
            time.sleep(0.5)
            now = pids_listening(args.port)
            if now == listeners:
                break
            listeners = now
        targets.append(Ours("ours", args.host, args.port, args.ae_title, pid=listeners[0] if listeners else None,
                            more_pids=listeners[1:],
                            http=args.http.rstrip("/"), data_dir=args.data_dir,
                            config=f"dicomweb-server at {args.host}:{args.port} ({args.ae_title}), "
                                   f"{len(listeners)} DIMSE listener process(es); CPU and memory are theirs together"))
    cleanup: list = []  # every step's images and files, removed after the last step (run_step)
    try:
        for peer in args.peer:
            targets.append(Orthanc.start() if peer == "orthanc" else StoreSCP.start())
        disk = durable_write_rate(args.data_dir or Path(tempfile.gettempdir()))
        print(f"disk durable-write rate (512 KB files): {disk['files_per_s']} files/s, {disk['MB_per_s']} MB/s",
              flush=True)
        results: list[StepResult] = []
        latency: dict[str, dict] = {}
        failures: list[str] = []
        failed: set[str] = set()
        for n, rnd, order in step_order(targets, steps, args.rounds):
            for target in order:
                if target.name in failed:
                    continue
                try:
                    r = run_step(target, n, args.images, args.scale, args.processes,
                                 step_name(n, rnd, args.rounds), fast, args.generator, cleanup)
                except Exception as e:  # report the other targets anyway
                    failed.add(target.name)
                    failures.append(f"{target.name}: {type(e).__name__}: {e}")
                    print(failures[-1], flush=True)
                    continue
                r.round = rnd
                results.append(r)
                print(table(HEADERS, [r.row()]).splitlines()[-1] + (f" (round {rnd})" if args.rounds > 1 else ""),
                      flush=True)
        for target in targets:
            if args.latency and target.name not in failed:
                try:
                    latency[target.name] = association_latency(target, args.latency, fast)
                    cleanup.append(lambda t=target, stored=target.stored(LATENCY_STEP): t.remove(LATENCY_STEP, stored))
                    print(f"{target.name}: one-image association {latency[target.name]}", flush=True)
                except Exception as e:  # noqa: BLE001 - reported with the others
                    failures.append(f"{target.name}: latency: {type(e).__name__}: {e}")
                    print(failures[-1], flush=True)
    finally:
        for undo in cleanup:  # (also after a failure or Ctrl-C)
            try:
                undo()
            except Exception as e:  # noqa: BLE001 - a target that stopped: its folder goes with it
                print(f"cleanup: {type(e).__name__}: {e}", flush=True)
        for t in targets:
            if t.proc is not None:
                t.stop()
    mix = dict(zip([m[0] for m in MIX], counts(args.images)))
    md = ["# LOAD-01 (C-STORE) results", "",
          f"- images per step: {args.images} ({mix}), scale {args.scale}, generator processes {args.processes}, "
          f"generator {args.generator}, SCU reactors {args.scu_reactor}; load average at start/end {load0} / {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
          f"- disk durable-write rate, 512 KB files (temp + fsync + rename + dir fsync): "
          f"{disk['files_per_s']} files/s = {disk['MB_per_s']} MB/s ({disk['folder']})",
          f"- order: each step's targets back to back{', every step ' + str(args.rounds) + ' times, the order reversed on every other round (the round after the step count)' if args.rounds > 1 else ''}",
          "", table(HEADERS, [[r.row()[0], f"{r.associations}" + (f" ({r.round})" if args.rounds > 1 else ""),
                               *r.row()[2:]] for r in results]), "",
          *(["Ours / peer (images/s; with rounds: the geometric mean of the rounds' ratios; server CPU per image "
             "= its CPU % x the step's seconds / images):", "", table(RATIO_HEADERS, ratio_rows(results)), ""]
            if any(r.target != "ours" for r in results) and any(r.target == "ours" for r in results) else []),
          "Associations rejected (A-ASSOCIATE-RJ) in each step: "
          + ", ".join(f"{r.target}@{r.associations}: {r.rejected}" for r in results)
          + (" (the generator is one peer, one address and one calling AE title: a rejection "
             "local-limit-exceeded from the archive means dimse_max_associations_per_peer is below the step)"
             if any(r.rejected for r in results) else ""), "",
          "Machine busy CPU during each step (% of one core): "
          + ", ".join(f"{r.target}@{r.associations}: {fmt(r.machine_cpu)}" for r in results), "",
          "One-image association (associate + 512 KB CT C-STORE + release), ms: "
          + "; ".join(f"{k}: p50 {v['p50_ms']}, p99 {v['p99_ms']} (n={v['n']})" for k, v in latency.items()), "",
          "Targets:", *[f"- {t.name}: {t.config}" for t in targets], "",
          *(["Failed runs:", *[f"- {f}" for f in failures], ""] if failures else [])]
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.md").write_text("\n".join(md))
    (args.output / "results.json").write_text(json.dumps({
        "images": args.images, "scale": args.scale, "mix": mix, "disk": disk, "latency": latency,
        "rounds": args.rounds, "targets": {t.name: t.config for t in targets},
        "steps": [dict(zip(HEADERS, r.row()), machine_cpu=r.machine_cpu, rejected=r.rejected, round=r.round)
                  for r in results],
        "ratios": [dict(zip(RATIO_HEADERS, row)) for row in ratio_rows(results)]},
        indent=1))
    print("\n".join(md))
    return 0 if not failures and all(r.errors == 0 and r.missing == 0 and r.extra == 0 and r.partial == 0
                                     and r.hash_mismatch == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

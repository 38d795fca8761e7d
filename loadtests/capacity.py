"""Server capacity without a Python load generator in the way: wrk (C) with a Lua
script, against our archive and, with ``--peer orthanc``, against Orthanc on the
same data set in the same run.

    python -m loadtests.capacity --host http://127.0.0.1:8080 [--server-pid PID] [--peer orthanc]
        [--static] [--connections 8,32] [--duration 15] [--studies 400 --instances 10000] [--output DIR]

Start our archive with the render cache off (``DICOMWEB_RENDER_CACHE_BYTES=0``,
Orthanc has none) so that ``rendered`` measures rendering. Each step reports the
server's CPU per operation (ms: the CPU seconds of the server's process tree over
the step / the requests; steadier than a rate on a shared machine) and the CPU the
rest of the machine used meanwhile ("other"). STOW-RS steps count the load patient's
instances on the server before and after: "stored" must equal the requests.
``study`` is the whole-study retrieve (WADO-RS, ``--study-sample`` studies cycled);
with ``--static`` nginx (Debian's ``nginx-light``) serves the same bytes, fetched
once from our archive, as static files: the practical ceiling of a study retrieve.

For each server: make the manifest if missing, preload what the server lacks
(STOW-RS), check it (every query of the QIDO mix returns its expected study count,
a sample of instances has the original pixel data, a sample of rendered answers
are complete JPEGs of the right size), then run wrk for qido, wado and rendered
(paths cycled from a shuffled list of the whole data set / the query mix) and stow
(a new SOP Instance UID per request, made in Lua, each wrk thread its own study) at
every connection count, ``--threads`` wrk threads (default 2), the servers taking
turns step by step. wrk checks every
answer lightly (JSON array / size / JPEG markers / ReferencedSOPSequence) and counts
non-2xx answers and socket errors. Prints requests/s per step; with a peer, both
tables and the ratio ours/peer per step.

``--peer orthanc`` starts Orthanc with its DICOMweb plugin from Debian's packages
(``apt-get install -y orthanc orthanc-dicomweb``) by hand, ``Orthanc --no-jobs
CONFIG.json``, with the config made from ``loadtests/peers/orthanc.json``: HTTP on a
free port, ``RemoteAccessAllowed`` false and every request to 127.0.0.1, no DICOM
port, the DICOMweb plugin only (no GDCM plugin: it crashes Orthanc on some
transcodings). Its data stays in ``--peer-data-dir`` (so a rerun skips the
preload); it is stopped at the end. Orthanc does not percent-decode query values,
so the QIDO mix uses only characters that need no encoding and is sent as is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from . import common, dataset, preload
from . import study as study_check

OPS = ("qido", "wado", "study", "rendered", "stow")
LUA = common.HERE / "wrk" / "load03.lua"
#: WADO-RS instance and whole-study retrieve: answers of sizes measured and validated
#: before the step, no response() function, so wrk does not copy the bodies into Lua
SIZED_LUA = common.HERE / "wrk" / "sized.lua"
#: the operations run with SIZED_LUA (their answers checked by loadtests.study)
SIZED = ("wado", "study")
PEER_TEMPLATE = common.HERE / "peers" / "orthanc.json"
WADO_ACCEPT = 'multipart/related; type="application/dicom"; transfer-syntax=*'


# ----------------------------------------------------------------------------- peer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen | None, sig: int, grace: float) -> None:
    """Send ``sig``; kill the process if it has not ended after ``grace`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class Orthanc:
    """Orthanc + DICOMweb plugin started by hand on 127.0.0.1 (HTTP only)."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}/dicom-web"

    def config(self) -> dict:
        text = PEER_TEMPLATE.read_text()
        text = text.replace("@STORAGE@", str(self.data_dir / "storage")).replace("@HTTP_PORT@", str(self.port))
        plugin = next((p for p in ("/usr/share/orthanc/plugins/libOrthancDicomWeb.so",
                                   "/usr/lib/orthanc/libOrthancDicomWeb.so.1.7") if Path(p).exists()), None)
        if plugin is None:
            raise RuntimeError("the Orthanc DICOMweb plugin is not installed: apt-get install -y orthanc-dicomweb")
        text = text.replace("@DICOMWEB_PLUGIN@", plugin)
        return json.loads(text)

    def start(self, timeout: float = 60.0) -> "Orthanc":
        exe = shutil.which("Orthanc")
        if exe is None:
            raise RuntimeError("Orthanc is not installed: apt-get update && apt-get install -y orthanc orthanc-dicomweb")
        (self.data_dir / "storage").mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "orthanc-load03.json"
        cfg.write_text(json.dumps(self.config(), indent=1))
        log = open(self.data_dir / "orthanc.log", "ab")
        self.proc = subprocess.Popen([exe, "--no-jobs", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        try:
            common.wait_http(f"{self.url}/studies?limit=1", timeout=timeout, proc=self.proc)
        except Exception:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM, 30)


class StaticFiles:
    """nginx-light serving the whole-study answers of our archive as static files
    (one file per study, fetched once): the ceiling of a study retrieve."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder.resolve()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def fill(self, source: str, study_paths: list[str]) -> int:
        """Fetch each study from ``source`` into the tree; returns the bytes stored."""
        root_path = httpx.URL(source).path.rstrip("/")
        total = 0
        with httpx.Client(timeout=300) as c:
            for sp in study_paths:
                dest = self.folder / "www" / (root_path + sp).lstrip("/") / "_.dcm"
                if dest.exists():
                    total += dest.stat().st_size
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                with c.stream("GET", source + sp, headers={"Accept": WADO_ACCEPT}) as r:
                    r.raise_for_status()
                    with open(dest.with_suffix(".tmp"), "wb") as f:
                        f.writelines(r.iter_bytes(1 << 20))
                dest.with_suffix(".tmp").rename(dest)
                total += dest.stat().st_size
        return total

    def start(self) -> StaticFiles:
        exe = "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else shutil.which("nginx")
        if exe is None:
            raise RuntimeError("nginx is not installed: apt-get install -y nginx-light")
        user = "user root;\n" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
        conf = self.folder / "nginx.conf"
        conf.write_text(f"""{user}daemon off;
worker_processes 2;
pid {self.folder}/nginx.pid;
error_log {self.folder}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    sendfile on;
    client_body_temp_path {self.folder}/body;
    types {{ "multipart/related; type=\\"application/dicom\\"" dcm; }}
    server {{
        listen 127.0.0.1:{self.port};
        root {self.folder / "www"};
        location / {{ try_files $uri/_.dcm =404; }}
    }}
}}
""")
        self.proc = subprocess.Popen([exe, "-p", str(self.folder), "-e", str(self.folder / "error.log"), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"nginx did not start: {(self.folder / 'error.log').read_text()[-500:]}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGQUIT, 10)  # SIGQUIT: nginx's graceful stop


def study_sample(manifest: dict, n: int) -> list[str]:
    """``n`` study paths (``/studies/UID``), the same for every server."""
    studies = sorted({i["path"].split("/series/")[0] for i in manifest["instances"]})
    random.Random(20261201).shuffle(studies)
    return studies[:n]


# ----------------------------------------------------------------------------- checks


def precheck(manifest: dict, host: str, samples: int = 20, seed: int = 1) -> list[str]:
    """Validate the server before the load: all queries, a sample of WADO-RS
    instances (pixel SHA-256) and rendered JPEGs. Returns the problems found."""
    import io

    from PIL import Image

    problems = []
    rnd = random.Random(seed)
    with httpx.Client(timeout=60) as c:
        for q in manifest["queries"]:
            r = c.get(f"{host}/studies?{q['query']}", headers={"Accept": "application/dicom+json"})
            n = 0 if r.status_code == 204 else (len(r.json()) if r.status_code == 200 else -1)
            if n != q["expected"]:
                problems.append(f"QIDO {q['query']}: HTTP {r.status_code}, {n} studies, expected {q['expected']}")
        for inst in rnd.sample(manifest["instances"], min(samples, len(manifest["instances"]))):
            r = c.get(host + inst["path"], headers={"Accept": WADO_ACCEPT})
            ok = False
            if r.status_code == 200:
                body = r.content
                i = body.rfind(b"\xe0\x7f\x10\x00O")
                if i >= 0:
                    n = int.from_bytes(body[i + 8:i + 12], "little")
                    ok = n == inst["pixel_bytes"] and hashlib.sha256(body[i + 12:i + 12 + n]).hexdigest() == inst["sha256"]
            if not ok:
                problems.append(f"WADO {inst['sop']}: HTTP {r.status_code}, pixel data not the original")
            r = c.get(host + inst["path"] + "/rendered", headers={"Accept": "image/jpeg"})
            try:
                im = Image.open(io.BytesIO(r.content))
                im.load()
                if im.size != (inst["columns"], inst["rows"]):
                    problems.append(f"rendered {inst['sop']}: {im.size}, expected {inst['columns']}x{inst['rows']}")
            except Exception as e:
                problems.append(f"rendered {inst['sop']}: HTTP {r.status_code}, not a JPEG ({e})")
    return problems


# ----------------------------------------------------------------------------- wrk


def write_inputs(manifest: dict, host: str, workdir: Path) -> dict[str, list[str]]:
    """Per operation, the wrk script arguments (files under ``workdir``); ``wado.txt``:
    the order in which the ``wado`` steps ask for the instances (their script and
    arguments: :func:`sized_answers`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    root = httpx.URL(host).path.rstrip("/")
    rnd = random.Random(20261130)
    inst = list(manifest["instances"])
    rnd.shuffle(inst)
    queries = [q["query"] for q in manifest["queries"]]
    (workdir / "qido.txt").write_text("".join(f"{root}/studies?{q}\n" for q in queries))
    (workdir / "wado.txt").write_text("".join(f"{root}{i['path']}\n" for i in inst))
    (workdir / "rendered.txt").write_text("".join(f"{root}{i['path']}/rendered\n" for i in inst))
    data, (_, _, ph_sop) = dataset.stow_template(int(manifest["stow"]["size"]))
    head = f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    tail = f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode()
    (workdir / "stow.bin").write_bytes(head + data + tail)
    return {
        "qido": ["qido", str(workdir / "qido.txt"), "application/dicom+json", "1"],
        "rendered": ["rendered", str(workdir / "rendered.txt"), "image/jpeg", "1"],
        "stow": ["stow", str(workdir / "stow.bin"), f"{root}/studies", ph_sop],
        "_stow_body": [str(len(head + data + tail))],
    }


class InvalidAnswers(RuntimeError):
    """An answer failed its full validation before a WADO-RS or whole-study step."""


def sized_answers(name: str, host: str, op: str, manifest: dict, studies: list[str], workdir: Path,
                  measured: dict[str, dict[str, study_check.StudyAnswer]]) -> dict[str, study_check.StudyAnswer]:
    """The answers a ``wado`` or ``study`` step of server ``name`` asks for, each fetched and
    fully validated (loadtests.study), and ``workdir/{op}-sizes.txt`` for wrk/sized.lua: one
    "path<TAB>bytes" line per request, in the order of the step. Whole studies are measured
    before every step (a study's answer is ~10 MB: a few dozen), the data set's instances once
    per server and run (``measured``: up to 1,000 answers)."""
    if op == "study":
        answers, problems = study_check.measure(host, studies, manifest, WADO_ACCEPT, static=name == "static")
        order = list(answers)
    else:
        root = httpx.URL(host).path.rstrip("/")
        by_path = {root + i["path"]: i for i in manifest["instances"]}
        order = [ln for ln in (workdir / "wado.txt").read_text().splitlines() if ln]
        if name not in measured:
            measured[name], problems = study_check.measure_instances(host, [by_path[p] for p in order], WADO_ACCEPT)
        else:
            problems = []
        answers = measured[name]
    if problems:
        raise InvalidAnswers(f"{name}: {op} answers invalid before the step ({len(problems)}): "
                             + "; ".join(problems[:3]))
    (workdir / f"{op}-sizes.txt").write_text("".join(f"{p}\t{answers[p].total}\n" for p in order))
    return answers


def validated_summary(manifest: dict, ops: list[str], studies: list[str], name: str, skipped: bool,
                      problems: list[str], instances: int) -> str:
    """One sentence under a server's table: what was checked of its answers outside wrk's light
    checks (:func:`precheck`, and the full validation of the sized steps' answers)."""
    parts = []
    if name != "static":
        n = min(20, len(manifest["instances"]))
        parts.append("precheck skipped" if skipped else
                     f"before the load, all {len(manifest['queries'])} query counts, {n} instances' pixel SHA-256 "
                     f"and {n} rendered JPEGs: {len(problems)} problem(s)")
    if "wado" in ops and instances:
        parts.append(f"WADO-RS: the answers of all {instances} instances fully validated before the first step "
                     "(SOP Instance UID, pixel data length and SHA-256), their sizes the window for wrk's byte count")
    if "study" in ops:
        parts.append(f"whole-study: {len(studies)} studies fully validated before each step, their sizes the "
                     "window for wrk's byte count")
    return ("Checked: " + "; ".join(parts) + ".") if parts else ""


def run_wrk(host: str, args: list[str], connections: int, duration: float, threads: int,
            server_pid: int | None, lua: Path = LUA) -> dict:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: apt-get update && apt-get install -y wrk")
    origin = str(httpx.URL(host).copy_with(path="/", query=None))
    cmd = ["wrk", "-t", str(min(threads, connections)), "-c", str(connections), "-d", f"{duration:g}s",
           "--timeout", "30s", "-s", str(lua), origin, "--", *args, str(random.randrange(1_000_000))]
    cpu_before = tree_cpu_seconds(server_pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cpu = common.CpuSampler()
    server_cpu = common.CpuSampler()
    machine_cpu = common.MachineCpu()
    peak = None
    t0 = time.monotonic()
    while proc.poll() is None:
        el = time.monotonic() - t0
        if el > duration + 60:  # bounded: wrk stops itself after `duration`
            proc.kill()
            raise RuntimeError("wrk did not stop")
        in_window = 1.0 <= el <= duration
        cpu.sample(common.process_tree(proc.pid), in_window)
        machine_cpu.sample(in_window)
        if server_pid:
            server_cpu.sample(common.process_tree(server_pid), in_window)
            rss = common.tree_rss_mb(server_pid)
            if rss is not None:
                peak = rss if peak is None else max(peak, rss)
        time.sleep(0.2)
    cpu_after = tree_cpu_seconds(server_pid)
    loadavg = load_average()
    out = proc.stdout.read() if proc.stdout else ""
    line = next((ln for ln in out.splitlines() if ln.startswith("LOAD03 ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary: {out[-1500:]}")
    s = json.loads(line[len("LOAD03 "):])
    s["wrk_cpu_pct"] = round(cpu.total_pct(), 1)
    s["server_cpu_pct"] = round(server_cpu.total_pct(), 1) if server_pid else None
    m = machine_cpu.busy_pct()
    s["other_cpu_pct"] = (round(max(0.0, m - s["wrk_cpu_pct"] - (s["server_cpu_pct"] or 0)), 1)
                          if m is not None and server_pid else None)
    s["peak_server_mb"] = round(peak, 1) if peak is not None else None
    s["loadavg"] = loadavg
    s["server_cpu_s"] = (cpu_after - cpu_before) if cpu_before is not None and cpu_after is not None else None
    return s


def load_average() -> str | None:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``), as ``uptime`` shows them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None


def tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process and its children (psutil)."""
    if not pid:
        return None
    import psutil

    total = 0.0
    for p in common.process_tree(pid):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def step_row(op: str, conns: int, s: dict, stow_body: int,
             answers: dict[str, study_check.StudyAnswer] | None = None) -> dict:
    """One step's row. ``answers``: for ``wado`` and ``study``, the validated answers
    (loadtests.study) that wrk's counts are checked against."""
    secs = s["duration_us"] / 1e6
    if op in SIZED:
        detail, notes = study_check.step_errors(s, answers or {})
    else:
        detail = {k: s[k] for k in ("connect", "read", "write", "status", "timeout", "invalid") if s[k]}
        notes = {}
    errors = sum(detail.values())
    nbytes = s["requests"] * stow_body if op == "stow" else s["bytes"]
    return {
        "operation": op, "connections": conns, "requests": s["requests"],
        "req_s": round(s["requests"] / secs, 1) if secs else 0.0,
        "mb_s": round(nbytes / 1e6 / secs, 2) if secs else 0.0,
        "p50_ms": s["p50_us"] / 1000, "p90_ms": s["p90_us"] / 1000, "p99_ms": s["p99_us"] / 1000,
        "max_ms": s["max_us"] / 1000, "errors": errors, "error_detail": detail, "notes": notes,
        "peak_server_mb": s["peak_server_mb"], "wrk_cpu_pct": s["wrk_cpu_pct"],
        "server_cpu_pct": s["server_cpu_pct"], "other_cpu_pct": s["other_cpu_pct"],
        "cpu_ms_per_op": (round(s["server_cpu_s"] * 1000 / s["requests"], 2)
                          if s.get("server_cpu_s") is not None and s["requests"] else None),
        "stored": None,
        "loadavg": s.get("loadavg"),
    }


def run_servers(servers: list[tuple[str, str, int | None]], manifest: dict, ops: list[str], conns: list[int],
                duration: float, threads: int, workdir: Path, quiet: bool, settle: float = 0,
                studies: list[str] | None = None, rounds: int = 1, keep_stow: bool = False,
                measured: dict[str, dict[str, study_check.StudyAnswer]] | None = None) -> dict[str, list[dict]]:
    """Every step on every server, interleaved (ours, then the peer, for each step), so
    that drifting load on a shared machine hits both sides of each ratio alike. The
    server named "static" (nginx) only serves ``study``.

    With ``rounds`` > 1 every step runs again at once, the servers in the reverse order on
    every other round (each row notes its ``round``): on this machine the server measured first
    of a pair gained ~1.17x in STOW-RS with 8 connections whichever build it was
    (loadtests/results/stow-balance-2026-12-07/), and :func:`ratio_table` takes the
    geometric mean of the rounds' ratios, in which that effect cancels.

    The instances a STOW-RS step stores stay until every step has run, then are deleted
    (``remove_stow_patient``): deleted between steps, they made the next STOW-RS step
    measure the file system, not the server. On ext4 without a journal a new file's inode
    is looked for past every inode of its block group deleted in the last minutes
    (``recently_deleted`` in the kernel's inode allocator): creating a file there cost
    0.2-0.8 ms of CPU for minutes after ~6,000 deletions, against ~20 us otherwise
    (``benchmarks/file_create.py``), a quarter to a third of a stored instance's cost, paid
    by whichever server's files landed in those groups."""
    inputs = {name: write_inputs(manifest, host, workdir / name) for name, host, _ in servers}
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in servers}
    measured = {} if measured is None else measured  # the WADO-RS instance answers validated, per server
    stow_patient = manifest["stow"]["PatientID"]
    if "wado" in ops:  # every instance's answer validated before any load: a wrong one stops the run first
        for name, host, _ in servers:
            if name != "static":
                sized_answers(name, host, "wado", manifest, studies or [], workdir / name, measured)
    # each step's rounds back to back (A B, B A: the ABBA order, which also cancels a steady
    # drift), so that STOW-RS's steps stay the last (main: a read step after them would see
    # the data set larger than its reference size)
    for op, c, rnd in ((op, c, rnd) for op in ops for c in conns for rnd in range(rounds)):
        for name, host, pid in (servers if rnd % 2 == 0 else servers[::-1]):
            if name == "static" and op != "study":
                continue
            if settle:
                common.wait_quiet(settle)
            before = common.stow_patient_count(host, stow_patient) if op == "stow" else None
            answers = None
            if op in SIZED:  # every answer the step asks for fetched and validated, its size noted
                answers = sized_answers(name, host, op, manifest, studies or [], workdir / name, measured)
                s = run_wrk(host, [str(workdir / name / f"{op}-sizes.txt"), WADO_ACCEPT], c, duration,
                            threads, pid, SIZED_LUA)
            else:
                s = run_wrk(host, inputs[name][op], c, duration, threads, pid)
            row = step_row(op, c, s, int(inputs[name]["_stow_body"][0]), answers)
            row["round"] = rnd
            if before is not None:  # (deleted after the run's last step: see the docstring)
                after = common.stow_patient_count(host, stow_patient)
                row["stored"] = after - before if after is not None else None
            rows[name].append(row)
            if not quiet:
                print(f"  {name:7s} round {rnd} {op:8s} {c:3d} conns: {row['req_s']:9.1f} req/s "
                      f"{row['mb_s']:8.1f} MB/s cpu {row['cpu_ms_per_op']} ms/op  stored {row['stored']}  "
                      f"p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms  errors {row['errors']} "
                      f"{row['error_detail'] or ''} {row['notes'] or ''}  peak {row['peak_server_mb']} MB",
                      file=sys.stderr, flush=True)
    if "stow" in ops and not keep_stow:
        for name, host, _ in servers:  # back to the reference size for the next run
            if name != "static":
                common.remove_stow_patient(host, stow_patient)
    return rows


def server_table(rows: list[dict]) -> str:
    rounds = len({r.get("round", 0) for r in rows}) > 1  # a column for it only when there are several
    headers = ["operation", "conns"] + (["round"] if rounds else []) + [
        "requests", "req/s", "MB/s", "server CPU ms/op", "stored (counted)", "p50 ms", "p90 ms", "p99 ms", "max ms",
        "errors", "peak server MB", "wrk CPU%", "server CPU%", "other CPU%", "load avg"]

    def pct(v):
        return "-" if v is None else f"{v:.0f}%"

    return common.table(headers, [[r["operation"], r["connections"]] + ([r.get("round", 0)] if rounds else []) +
                                  [r["requests"], r["req_s"], r["mb_s"],
                                   "-" if r.get("cpu_ms_per_op") is None else r["cpu_ms_per_op"],
                                   "-" if r.get("stored") is None else r["stored"],
                                   r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"], r["errors"],
                                   r["peak_server_mb"], pct(r["wrk_cpu_pct"]), pct(r.get("server_cpu_pct")),
                                   pct(r.get("other_cpu_pct")), r.get("loadavg") or "-"] for r in rows])


#: the bar per operation (issue 11): ours / Orthanc
BARS = {"wado": 2.0}


def ratio_table(ours: list[dict], peer: list[dict], bar: float | None = 1.5) -> tuple[str, list[dict]]:
    """Per step: the servers' requests/s (the mean over the rounds) and the ratio ours/peer
    (the geometric mean of the rounds' ratios, in which the order effect cancels when the
    rounds alternate the order: :func:`run_servers`); CPU ms/op the mean over the rounds.
    A step whose rounds do not pair up (a round missing on one side, or twice) has no ratio:
    one round alone would carry the order effect."""
    def steps(rows):
        by: dict[tuple, list[dict]] = {}
        for r in rows:
            by.setdefault((r["operation"], r["connections"]), []).append(r)
        return by

    def mean(vals):
        vals = [v for v in vals if v is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    by_peer = steps(peer)
    out, cmp = [], []
    for key, rs in steps(ours).items():
        ps = by_peer.get(key)
        if not ps:
            continue
        r_rounds, p_rounds = [r.get("round", 0) for r in rs], [p.get("round", 0) for p in ps]
        paired = sorted(r_rounds) == sorted(p_rounds) and len(set(r_rounds)) == len(r_rounds)
        ratios = []
        if paired:
            by_round = {p.get("round", 0): p for p in ps}
            ratios = [r["req_s"] / by_round[r.get("round", 0)]["req_s"] for r in rs
                      if r["req_s"] and by_round[r.get("round", 0)]["req_s"]]
        ratio = math.prod(ratios) ** (1 / len(ratios)) if paired and ratios and len(ratios) == len(rs) else None
        r_req, p_req = mean(r["req_s"] for r in rs), mean(p["req_s"] for p in ps)
        r_cpu, p_cpu = mean(r.get("cpu_ms_per_op") for r in rs), mean(p.get("cpu_ms_per_op") for p in ps)
        b = BARS.get(key[0], bar) if bar is not None else None
        cmp.append({"operation": key[0], "connections": key[1], "ours_req_s": r_req, "peer_req_s": p_req,
                    "ratio": round(ratio, 2) if ratio else None,
                    "round_ratios": [round(x, 3) for x in ratios],
                    "ours_cpu_ms_per_op": r_cpu, "peer_cpu_ms_per_op": p_cpu})
        verdict = "-" if ratio is None or b is None else ("meets" if ratio >= b else "below")

        def ms(v):
            return "-" if v is None else f"{v:.2f}"

        out.append([key[0], key[1], r_req, p_req, mean(r["mb_s"] for r in rs), mean(p["mb_s"] for p in ps),
                    f"{ratio:.2f}x" if ratio else ("-" if paired else "rounds differ"),
                    " / ".join(f"{x:.2f}" for x in ratios) if len(ratios) > 1 else "-",
                    f"{verdict} {b}x" if b is not None else "-", ms(r_cpu), ms(p_cpu)])
    return common.table(["operation", "conns", "ours req/s", "peer req/s", "ours MB/s", "peer MB/s", "ours/peer",
                         "per round", "bar", "ours CPU ms/op", "peer CPU ms/op"], out), cmp


def static_table(ours: list[dict], static: list[dict]) -> str:
    """Whole-study retrieve against nginx serving the same bytes (bar: half of it)."""
    by = {(r["connections"], r.get("round", 0)): r for r in static if r["operation"] == "study"}
    out = []
    for r in ours:  # each round's step against nginx's step of the same round
        s = by.get((r["connections"], r.get("round", 0))) if r["operation"] == "study" else None
        if s and s["mb_s"]:
            f = r["mb_s"] / s["mb_s"]
            out.append([r["connections"], r.get("round", 0), r["mb_s"], s["mb_s"], f"{f:.2f}",
                        "meets 0.5" if f >= 0.5 else "below 0.5"])
    return common.table(["conns", "round", "ours MB/s", "nginx static MB/s", "ours/nginx", "bar"], out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True, help="our archive's DICOMweb root, e.g. http://127.0.0.1:8080")
    p.add_argument("--server-pid", type=int, help="our server's process (RSS of its tree is sampled)")
    p.add_argument("--peer", choices=["orthanc"], help="also start and measure this peer")
    p.add_argument("--peer-data-dir", type=Path, default=Path("/tmp/loadtests-orthanc"),
                   help="the peer's storage, kept between runs (default %(default)s)")
    p.add_argument("--peer-port", type=int, help="the peer's HTTP port (default: a free one)")
    p.add_argument("--connections", default="8,32", help="default %(default)s")
    p.add_argument("--duration", type=float, default=15, help="seconds per step (default %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="wrk threads (default %(default)s)")
    p.add_argument("--operations", default=",".join(OPS), help="default %(default)s")
    p.add_argument("--manifest", type=Path, help="manifest (default: made from the sizes under loadtests/data)")
    p.add_argument("--output", type=Path, help="write capacity.json and capacity.md here")
    p.add_argument("--skip-precheck", action="store_true")
    p.add_argument("--settle", type=float, default=0, metavar="S",
                   help="before each step wait up to S seconds for the machine to be quiet (shared machines)")
    p.add_argument("--static", action="store_true",
                   help="also serve the sampled studies' bytes with nginx-light (the study retrieve ceiling)")
    p.add_argument("--study-sample", type=int, default=40, help="studies cycled by 'study' (default %(default)s)")
    p.add_argument("--static-dir", type=Path, default=Path("/tmp/loadtests-static"),
                   help="nginx's files, kept between runs (default %(default)s)")
    p.add_argument("--static-port", type=int, help="nginx's port (default: a free one)")
    p.add_argument("--baseline-host", help="another build of our archive (e.g. the commit before a change), "
                                           "measured step by step beside ours, with the ratio ours/baseline")
    p.add_argument("--baseline-pid", type=int, help="the baseline server's process")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every step N times, the servers in the reverse order on every other round; the "
                        "ratio is the geometric mean of the rounds' (default %(default)s; an even number cancels "
                        "the advantage of being measured first)")
    p.add_argument("--keep-stow", action="store_true",
                   help="leave the STOW-RS steps' instances on the servers at the end (for servers started on new "
                        "data folders for this run: the deletion only makes file creation slower for the next "
                        "minutes, run_servers)")
    p.add_argument("--quiet", action="store_true")
    dataset.add_spec_args(p)
    a = p.parse_args(argv)
    if a.rounds < 1 or (a.rounds > 1 and a.rounds % 2):
        p.error("--rounds: 1, or an even number (with an odd one a server is measured first more often)")
    if a.keep_stow and a.peer and not any(x.startswith("--peer-data-dir") for x in (argv or sys.argv[1:])):
        print("--keep-stow: the peer keeps its data in the default --peer-data-dir between runs; the next run "
              "deletes what this one leaves there just before its first step (give a new --peer-data-dir)",
              file=sys.stderr)
    # STOW-RS last: what its steps store stays until the end (run_servers), and a read step
    # after it would see the data set larger than its reference size
    ops = sorted((o for o in a.operations.split(",") if o), key=lambda o: o == "stow")
    conns = [int(c) for c in a.connections.split(",") if c]
    if a.manifest and a.manifest.exists():
        manifest, path = dataset.load_manifest(a.manifest), a.manifest
    else:
        spec = dataset.spec_from_args(a)
        path = a.manifest or dataset.default_manifest_path(spec)
        manifest = dataset.ensure_manifest(path, spec, progress=not a.quiet)
    host = a.host.rstrip("/")
    workdir = Path(a.output or "/tmp") / "capacity-inputs"
    peer = static = None
    studies = study_sample(manifest, a.study_sample)
    results: dict = {"machine": common.machine(), "dataset": manifest["summary"], "duration": a.duration,
                     "threads": a.threads, "servers": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        servers = [("ours", host, a.server_pid)]
        if a.baseline_host:
            servers.append(("baseline", a.baseline_host.rstrip("/"), a.baseline_pid))
        if a.peer == "orthanc":
            peer = Orthanc(a.peer_data_dir, a.peer_port).start()
            servers.append(("orthanc", peer.url, peer.pid))
            if not a.quiet:
                print(f"peer: Orthanc at {peer.url} (pid {peer.pid}, data in {a.peer_data_dir})", file=sys.stderr)
        preload.preload(manifest, [h for _, h, _ in servers], progress=not a.quiet)
        for name, h, pid in servers:
            missing = preload.verify(manifest, h)
            if missing:
                print(f"{name}: data set incomplete: {missing[:3]}", file=sys.stderr)
                return 1
            problems = [] if a.skip_precheck else precheck(manifest, h)
            results["servers"][name] = {"url": h, "pid": pid, "precheck_problems": problems}
            if problems:
                print(f"{name}: {len(problems)} validation problem(s) before the load, e.g.:", file=sys.stderr)
                for pr in problems[:5]:
                    print(f"    {pr}", file=sys.stderr)
        if a.static and "study" in ops:
            static = StaticFiles(a.static_dir, a.static_port)
            nbytes = static.fill(host, studies)
            static.start()
            servers.append(("static", static.url, static.pid))
            results["servers"]["static"] = {"url": static.url, "pid": static.pid, "bytes": nbytes,
                                            "precheck_problems": []}
            if not a.quiet:
                print(f"static: nginx at {static.url} ({len(studies)} studies, {nbytes:,} B)", file=sys.stderr)
        for name, h, _ in servers:  # what earlier runs' STOW-RS steps left: the data set at its reference size
            if name != "static":
                n = common.remove_stow_patient(h, manifest["stow"]["PatientID"])
                if n and not a.quiet:
                    print(f"{name}: {n} study/studies of the STOW-RS load patient left by earlier runs deleted",
                          file=sys.stderr)
        measured: dict[str, dict] = {}
        try:
            by_server = run_servers(servers, manifest, ops, conns, a.duration, a.threads, workdir, a.quiet,
                                    a.settle, studies, a.rounds, a.keep_stow, measured)
        except InvalidAnswers as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for name, rows in by_server.items():
            results["servers"][name]["rows"] = rows
            results["servers"][name]["validated"] = validated_summary(
                manifest, ops, studies, name, a.skip_precheck, results["servers"][name]["precheck_problems"],
                len(measured.get(name, {})))
    finally:
        if peer is not None:
            peer.stop()
        if static is not None:
            static.stop()
    text = []
    for name in results["servers"]:
        text += [f"## {name} ({results['servers'][name]['url']})", "", server_table(results["servers"][name]["rows"]), "",
                 results["servers"][name].get("validated", ""), ""]
    if "orthanc" in results["servers"]:
        t, cmp = ratio_table(results["servers"]["ours"]["rows"], results["servers"]["orthanc"]["rows"])
        results["ratio"] = cmp
        text += ["## ours / orthanc (requests/s)", "", t, ""]
    if "baseline" in results["servers"]:
        t, cmp = ratio_table(results["servers"]["ours"]["rows"], results["servers"]["baseline"]["rows"], None)
        results["ratio_baseline"] = cmp
        text += ["## ours / baseline (requests/s: this build against the baseline build, same run)", "", t, ""]
    if "static" in results["servers"]:
        text += ["## whole-study retrieve: ours / nginx-light static files (same bytes)", "",
                 static_table(results["servers"]["ours"]["rows"], results["servers"]["static"]["rows"]), ""]
    others = [r["other_cpu_pct"] for srv in results["servers"].values() for r in srv["rows"]
              if r.get("other_cpu_pct") is not None]
    if others:
        results["other_cpu_pct_range"] = [min(others), max(others)]
        text += [f"How quiet: the rest of the machine (neither wrk nor the server measured) used "
                 f"{min(others):.0f}-{max(others):.0f} % of one core during the steps (median "
                 f"{sorted(others)[len(others) // 2]:.0f} %).", ""]
    print("\n".join(text))
    if a.output:
        a.output.mkdir(parents=True, exist_ok=True)
        (a.output / "capacity.json").write_text(json.dumps(results, indent=1) + "\n")
        s = manifest["summary"]
        md = [
            "# LOAD-03 capacity (wrk)", "",
            f"{results['started']}; wrk {a.threads} threads, {a.duration:g} s per step; "
            f"data set {s['studies']} studies / {s['instances']} images (CT {s['by_modality']['CT']} x "
            f"{s['object_sizes']['CT']}, MR {s['by_modality']['MR']} x {s['object_sizes']['MR']}); STOW-RS: one "
            f"{manifest['stow']['size']}x{manifest['stow']['size']} MR image per request, a new SOP Instance UID "
            "each, 'stored' = the load patient's instances counted on the server after the step minus before "
            + ("(they stay on the servers after the last step: --keep-stow; any left by an earlier run were deleted "
               "before the first step) " if a.keep_stow else
               "(they stay until the last step has run, then are deleted, as are any left by an earlier run before "
               "the first step: file creation right after mass deletion measures the file system, not the server); ")
            + (f"every step {a.rounds} times, the servers in the reverse order on every other round, the ratio the "
               "geometric mean of the rounds' ratios; " if a.rounds > 1 else "") +
            f"'study': whole-study retrieve of {len(studies)} studies cycled. "
            "Server CPU ms/op = CPU seconds of the server's processes over the step / requests. "
            "Errors: non-2xx, socket errors and answers failing wrk's light check; for 'wado' and 'study' "
            "(wrk/sized.lua, no body copied into Lua): status >= 400, socket errors, answers not complete by their "
            "framing, and wrk's byte count outside the window the sizes of the answers allow, each answer (every "
            "instance of the data set, once per server; every sampled study, before each step) fully validated "
            "first (loadtests/study.py); answers ended by the server closing the connection "
            "(Orthanc's multipart answers have no Content-Length) are noted as 'closed', not errors. "
            "CPU in % of one core; "
            "'other' = the rest of the machine (neither wrk nor the server), the noise of a shared machine; "
            "'load avg' = /proc/loadavg (1, 5, 15 min) at the end of the step.", "",
            *text, "## Machine", "", common.machine_md(results["machine"])]
        (a.output / "capacity.md").write_text("\n".join(md))
        print(f"wrote {a.output / 'capacity.json'} and {a.output / 'capacity.md'}")
    bad = any(r["errors"] for srv in results["servers"].values() for r in srv["rows"])
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

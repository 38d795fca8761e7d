"""Server CPU and context switches per stored STOW-RS instance at several connection
counts (issue 33): does the cost of one instance grow with the connections?

wrk (``loadtests/wrk/load03.lua``, mode stow: the capacity runner's body, a 256x256 MR
image of 132.5 KB, a new SOP Instance UID per request) drives a fresh archive
(``dicomweb-server serve --workers W``, sqlite) for ``--seconds`` per step; the
server's processes are read from /proc before and after the step: utime+stime of
every process, and voluntary/nonvoluntary context switches of every thread
(``/proc/PID/task/TID/status``), divided by the instances the server counted.

    python benchmarks/stow_cpu_concurrency.py [--conns 8,32] [--seconds 5] [--rounds 3]
        [--code DIR]... [--workers 2] [--py-spy DIR] [--output FILE.md]

Several ``--code DIR`` (e.g. ``git archive`` of the commit before a change unpacked in
DIR, and this checkout) are run in turn, step after step (A/B alternating), each
round with a fresh data folder per server. ``--one-server``: as the capacity runner, one server per code and round runs the steps
in turn. Nothing is deleted before the run's last step: set ``TMPDIR`` to a folder of the
archive's disk where nothing was deleted in the last minutes (benchmarks/file_create.py). ``--py-spy DIR`` records a profile
(``py-spy record --gil``: the samples holding the GIL, raw format, one worker) of each code and
connection count in the first round.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from loadtests import dataset  # noqa: E402
from tests.helpers import free_port  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
LUA = ROOT / "loadtests" / "wrk" / "load03.lua"
TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc/*/stat's parent field)."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            parents[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parents.items() if pp == p]
    return out


def snapshot(pid: int) -> dict[str, float]:
    """CPU seconds (utime+stime, children reaped included), minor page faults and context
    switches of the tree."""
    cpu = vol = invol = loop = minflt = 0.0
    threads = 0
    for p in _tree(pid):
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            cpu += (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / TICK
            minflt += int(f[7])
            for t in os.listdir(f"/proc/{p}/task"):
                threads += 1
                for line in open(f"/proc/{p}/task/{t}/status"):
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
                        if t == str(p):  # a process's main thread: a worker's event loop
                            loop += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol += int(line.split()[1])
        except OSError:
            continue
    return {"cpu": cpu, "vol": vol, "invol": invol, "loop": loop, "threads": threads, "minflt": minflt}


def _count(url: str) -> int:
    r = httpx.get(url + "/studies", params={"PatientID": dataset.STOW_PATIENT_ID, "includefield": "00201208"},
                  headers={"Accept": "application/dicom+json"}, timeout=60)
    if r.status_code == 204:
        return 0
    return sum(int(s.get("00201208", {}).get("Value", [0])[0]) for s in r.json())


#: data folders of stopped servers, removed after the last step: on ext4 without a journal a
#: file created in a block group where thousands were just deleted costs up to ~0.8 ms of CPU
#: for minutes (benchmarks/file_create.py), which the next step would have measured
LEFT: list[str] = []


class Server:
    def __init__(self, code: pathlib.Path, workers: int) -> None:
        self.code, self.workers = code, workers
        self.tmp = tempfile.mkdtemp(prefix="stow-cpu-")
        self.port = free_port()
        env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "PYTHONPATH": str(code)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", self.tmp, "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", str(workers), "--dimse-port", "0"],
            env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(self.url + "/studies?limit=1", timeout=1)
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server from {code} did not start")
                time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        LEFT.append(self.tmp)  # removed at the end of the run, not before the next step



def wrk(url: str, body: pathlib.Path, ph_sop: str, conns: int, seconds: float) -> dict:
    cmd = ["wrk", "-t", str(min(2, conns)), "-c", str(conns), "-d", f"{seconds:g}s", "--timeout", "30s",
           "-s", str(LUA), url + "/", "--", "stow", str(body), "/studies", ph_sop, str(random.randrange(1_000_000))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 90).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("LOAD03 ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary: {out[-1000:]}")
    return json.loads(line[len("LOAD03 "):])


def step(srv: Server, body: pathlib.Path, ph_sop: str, conns: int, seconds: float,
         spy: pathlib.Path | None = None) -> dict:
    before_n = _count(srv.url)
    spy_proc = None
    if spy is not None:
        worker = [p for p in _tree(srv.proc.pid) if b"spawn_main" in open(f"/proc/{p}/cmdline", "rb").read()]
        target = min(worker) if worker else srv.proc.pid
        spy_proc = subprocess.Popen(
            [str(pathlib.Path(sys.executable).parent / "py-spy"), "record", "--pid", str(target), "--format", "raw",
             "-o", str(spy), "--duration", str(int(seconds)), "--rate", "200", "--gil", "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    s0 = snapshot(srv.proc.pid)
    t0 = time.monotonic()
    w = wrk(srv.url, body, ph_sop, conns, seconds)
    wall = time.monotonic() - t0
    s1 = snapshot(srv.proc.pid)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    if spy_proc is not None:
        spy_proc.wait(60)
    stored = _count(srv.url) - before_n
    n = max(stored, 1)
    return {"conns": conns, "stored": stored, "requests": w["requests"], "errors": w["status"] + w["invalid"],
            "rate": round(stored / wall, 1), "cpu_ms": round((s1["cpu"] - s0["cpu"]) * 1000 / n, 3),
            "vol_per": round((s1["vol"] - s0["vol"]) / n, 2),
            "loop_vol_per": round((s1["loop"] - s0["loop"]) / n, 2), "invol_per": round((s1["invol"] - s0["invol"]) / n, 2),
            "minflt_per": round((s1["minflt"] - s0["minflt"]) / n, 1),
            "threads": s1["threads"], "p50_ms": round(w["p50_us"] / 1000, 1), "p99_ms": round(w["p99_us"] / 1000, 1),
            "load": load}


def run() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conns", default="8,32")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--code", type=pathlib.Path, action="append")
    p.add_argument("--py-spy", type=pathlib.Path)
    p.add_argument("--one-server", action="store_true",
                   help="as the capacity runner: one server per code and round runs the steps in turn "
                        "(nothing deleted before the last step)")
    p.add_argument("--output", type=pathlib.Path)
    a = p.parse_args()
    codes = a.code or [ROOT]
    conns = [int(c) for c in a.conns.split(",")]
    work = pathlib.Path(tempfile.mkdtemp(prefix="stow-cpu-body-"))
    data, (_, _, ph_sop) = dataset.stow_template(256)
    head = f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    tail = f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode()
    body = work / "stow.bin"
    body.write_bytes(head + data + tail)
    rows = []
    for rnd in range(a.rounds if a.one_server else 0):
        for code in codes:
            srv = Server(code, a.workers)
            try:
                wrk(srv.url, body, ph_sop, conns[0], 1)
                for c in conns:  # (nothing deleted between steps: see Server.stop)
                    r = {"round": rnd + 1, "code": code.name, **step(srv, body, ph_sop, c, a.seconds)}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
            finally:
                srv.stop()
    for rnd in range(0 if a.one_server else a.rounds):
        for c in conns:
            for code in codes:
                srv = Server(code, a.workers)
                try:
                    wrk(srv.url, body, ph_sop, c, 1)  # warm: connections, first folders, pool threads
                    spy = None
                    if a.py_spy is not None and rnd == 0:
                        a.py_spy.mkdir(parents=True, exist_ok=True)
                        spy = a.py_spy / f"{code.name}-{c}.txt"
                    r = {"round": rnd + 1, "code": code.name, **step(srv, body, ph_sop, c, a.seconds, spy)}
                finally:
                    srv.stop()
                rows.append(r)
                print(json.dumps(r), flush=True)
    lines = ["| round | code | conns | stored | inst/s | CPU ms/inst | vol cs/inst (loop threads) | invol cs/inst | "
             "minor faults/inst | threads | p50 ms | p99 ms | errors | load |", "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r['round']} | {r['code']} | {r['conns']} | {r['stored']} | {r['rate']} | {r['cpu_ms']} | "
                     f"{r['vol_per']} ({r['loop_vol_per']}) | {r['invol_per']} | {r.get('minflt_per', '')} | {r['threads']} | {r['p50_ms']} | {r['p99_ms']} | "
                     f"{r['errors']} | {r['load']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.output:
        a.output.write_text(text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    try:
        return run()
    finally:  # the stopped servers' data folders, after the last step (also after a failure)
        for folder in LEFT:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Server CPU and context switches per C-STORE'd instance, two builds A/B (issue 33).

Starts two archives (``serve``, one DIMSE listener process each), one from each source tree
given (``--a``, ``--b``: folders put first on ``PYTHONPATH``, e.g. ``git archive`` of the commit
before a change and the worktree), and alternates runs against them: per run, ``--images``
new instances (one modality of LOAD-01's mix, ``--modality``/``--scale``) sent by DCMTK
``storescu`` over N associations (:mod:`.load01_storescu`; files written before the timed
window). Per run it reads, from ``/proc``, the listener processes' utime+stime and every
thread's voluntary/involuntary context switches (sampled every 50 ms and kept per thread:
an association's threads end with it; what a thread does after its last sample, its
A-RELEASE, is not counted), and divides by the instances acknowledged with Success.
Rates are printed but are noise on a shared machine; CPU per instance is the figure.

    python -m loadtests.cstore_cpu --a /tmp/base --b . --associations 4,16 --rounds 3 --images 1200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import load01_storescu as gen
from .load01 import Job, _dataset, free_port, pids_listening, wait_port

TICK = os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the whole thread group."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK  # utime, stime


def minor_faults(pid: int) -> int:
    """Minor page faults of the whole thread group (each fresh page of a large buffer)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def cpu_seconds(pid: int) -> float:
    return sum(cpu_split(pid))


def thread_switches(pid: int) -> dict[int, tuple[int, int]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        vol = invol = 0
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol = int(line.split()[1])
        out[int(tid)] = (vol, invol)
    return out


class Switches:
    """Context switches of every thread of ``pids`` between start() and stop()."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.first: dict[int, tuple[int, int]] = {}
        self.last: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()

    def _sample(self) -> None:
        for pid in self.pids:
            self.last.update(thread_switches(pid))

    def start(self) -> None:
        for pid in self.pids:
            self.first.update(thread_switches(pid))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        self._sample()
        vol = invol = 0
        for tid, (v, i) in self.last.items():
            v0, i0 = self.first.get(tid, (0, 0))
            vol += v - v0
            invol += i - i0
        return vol, invol


def start_server(src: Path, data: Path) -> tuple[subprocess.Popen, int]:
    port, dimse = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from dicomweb_server.cli import main; main()", "serve", "--data-dir", str(data), "--port", str(port),
         "--dimse-port", str(dimse), "--dimse-processes", "1", "--workers", "1",
         "--dimse-max-associations", "64", "--dimse-max-associations-per-peer", "64"],
        env=env, cwd=src, stdout=subprocess.DEVNULL, stderr=open(data.parent / f"{data.name}.log", "w"),
        start_new_session=True)
    wait_port(port)
    wait_port(dimse)
    return proc, dimse


def one_run(dimse: int, step: str, associations: int, images: int, modality: int, scale: float,
            pixels: bytes, profile: Path | None = None) -> dict:
    jobs = [Job(i, modality) for i in range(images)]
    shares = [jobs[i::associations] for i in range(associations)]
    root, shares_out = gen.write_shares(step, shares, scale, pixels, _dataset)
    size = os.path.getsize(next(iter(shares_out[0]["files"])))
    try:
        pids = pids_listening(dimse)
        cpu0 = sum(cpu_seconds(p) for p in pids)
        sys0 = sum(cpu_split(p)[1] for p in pids)
        flt0 = sum(minor_faults(p) for p in pids)
        sw = Switches(pids)
        sw.start()
        spy = None
        if profile is not None:  # py-spy's own CPU is not the listener's; --nonblocking: no pauses
            spy = subprocess.Popen(["py-spy", "record", "--gil", "--idle", "--nonblocking", "-r", "250", "-f", "raw",
                                    "-o", str(profile), "--pid", str(pids[0])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        t0 = time.monotonic()
        procs = gen.start("127.0.0.1", dimse, "DICOMWEB", root, shares_out)
        results = gen.collect(root, procs, shares_out)
        wall = time.monotonic() - t0
        vol, invol = sw.stop()
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        system = sum(cpu_split(p)[1] for p in pids) - sys0
        faults = sum(minor_faults(p) for p in pids) - flt0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    finally:
        gen.remove(root)
    stored = sum(len(r["sent"]) for r in results)
    errors = sum(r["errors"] for r in results)
    return {"associations": associations, "stored": stored, "errors": errors, "file_bytes": size,
            "wall_s": round(wall, 2), "rate": round(stored / wall, 1),
            "cpu_ms_per_instance": round(1000 * cpu / max(stored, 1), 3),
            "sys_ms_per_instance": round(1000 * system / max(stored, 1), 3),
            "minflt_per_instance": round(faults / max(stored, 1), 1),
            "vol_cs_per_instance": round(vol / max(stored, 1), 2),
            "invol_cs_per_instance": round(invol / max(stored, 1), 2),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="source tree A (before)")
    ap.add_argument("--b", type=Path, required=True, help="source tree B (after)")
    ap.add_argument("--associations", default="4,16")
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modality", type=int, default=1, help="index in load01.MIX (1: MR 256x256)")
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--output", type=Path, default=None, help="JSON of every run")
    ap.add_argument("--py-spy", type=Path, default=None, dest="profile",
                    help="folder: a py-spy profile (raw, --gil) of the listener per run")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cstore-cpu-"))
    servers = {}
    runs = []
    try:
        for name, src in (("A", args.a.resolve()), ("B", args.b.resolve())):
            servers[name] = start_server(src, tmp / name)
        pixels = os.urandom(2 * 512 * 512)
        for rnd in range(args.rounds):
            for n in [int(x) for x in args.associations.split(",")]:
                order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
                for name in order:
                    step = f"{int(time.time())}{rnd}{n}{ord(name)}"
                    profile = None
                    if args.profile is not None:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        profile = args.profile / f"{name}-{n}-{rnd}.txt"
                    r = one_run(servers[name][1], step, n, args.images, args.modality, args.scale, pixels,
                                profile)
                    r.update(build=name, round=rnd)
                    runs.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)
    print("\nbuild assoc  runs  CPU ms/instance (median, each)  vol cs/inst  invol cs/inst")
    for n in sorted({r["associations"] for r in runs}):
        for name in ("A", "B"):
            rs = [r for r in runs if r["build"] == name and r["associations"] == n]
            cpu = [r["cpu_ms_per_instance"] for r in rs]
            print(f"{name:5} {n:5} {len(rs):5}  {statistics.median(cpu):.3f} {cpu}"
                  f"  {statistics.median(r['vol_cs_per_instance'] for r in rs):.2f}"
                  f"  {statistics.median(r['invol_cs_per_instance'] for r in rs):.2f}")
    if args.output:
        args.output.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

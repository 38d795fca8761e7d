"""Run LOAD-03 and print the reference table: each operation at each client count.

    python -m loadtests.run --host http://127.0.0.1:8080 --clients 1,8,32,64 --duration 15 \
        --studies 400 --instances 10000 --output DIR [--server-pid PID] [--processes N]

Steps: make the manifest if missing (``loadtests.dataset``), preload what the server
lacks (``loadtests.preload``, STOW-RS), then for every operation (qido, wado,
rendered, stow) and every client count, run ``locust -f loadtests/load03.py
--headless`` with that many users of the operation's class for ``--duration``
seconds (``--processes N``: N locust worker processes; locust's FastHttpUser).

Measured per step: ops (requests, failed ones included), ops/s over the step's
first-to-last request, MB/s (response bytes; request bytes for STOW), exact p50,
p95, p99 and max latency, errors (validation or HTTP failures, with their
reasons), the peak RSS of the server's process tree (``--server-pid``, sampled
with psutil; omitted without it), and the load generator's CPU (all its processes,
% of one core). A step where a locust process used >= 90 % of a core is marked
"generator saturated": its numbers measure the client as much as the server.
The CPU used by everything else on the machine during each step ("other CPU") is
measured too (the server found by its port when the host is local, else
``--server-pid``); a step where it passes 25 % of one core prints a warning and is
recorded as ``machine_busy`` (its numbers are from a machine that was not quiet).
For STOW the server's own count of the load patient's instances is checked
before and after (success means durable, so both clocks must agree).

Writes ``DIR/results.json`` (one row per step: operation, clients, ops, ops_s,
mb_s, p50_ms, p95_ms, p99_ms, max_ms, errors, peak_server_mb), ``DIR/steps.json``
(the same plus generator CPU, saturation, failure reasons, STOW server counts)
and ``DIR/results.md`` (the table and the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import common, dataset

OPERATIONS = {"qido": "QidoUser", "wado": "WadoUser", "rendered": "RenderedUser", "stow": "StowUser"}
LOCUSTFILE = common.HERE / "load03.py"
SATURATED_PCT = 90.0
BUSY_OTHER_PCT = 25.0  # other processes' CPU (% of one core) above which a step ran on a busy machine
ROW_KEYS = ("operation", "clients", "ops", "ops_s", "mb_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "errors",
            "peak_server_mb")


def run_step(host: str, manifest_path: Path, operation: str, clients: int, duration: float, workdir: Path,
             server_pid: int | None = None, processes: int = 1, stow_patient: str | None = None,
             extra_env: dict | None = None, quiet: bool = False, settle: float = 0) -> dict:
    """One locust run; returns the step's row plus details."""
    raw = workdir / f"{operation}-{clients}"
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir(parents=True)
    procs = max(1, min(processes, clients))
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(clients),
           "-r", str(clients), "-t", f"{duration:g}s", "--host", host, "--manifest", str(manifest_path),
           "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "10", "--exit-code-on-error", "0",
           "--csv", str(raw / "locust")]
    if procs > 1:
        cmd += ["--processes", str(procs)]
    cmd.append(OPERATIONS[operation])
    env = dict(os.environ, LOAD03_RESULTS_DIR=str(raw), PYTHONUNBUFFERED="1", **(extra_env or {}))
    before = common.stow_patient_count(host, stow_patient) if operation == "stow" and stow_patient else None
    waited = common.wait_quiet(settle) if settle else None
    log = open(raw / "locust.log", "w")
    t0 = time.monotonic()
    seen: dict[int, object] = {}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    cpu = common.CpuSampler()
    server_cpu = common.CpuSampler()
    machine_cpu = common.MachineCpu()
    peak = None
    limit = duration + 90  # bounded: locust stops itself after `duration`; this is the backstop
    try:
        while proc.poll() is None:
            el = time.monotonic() - t0
            if el > limit:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise RuntimeError(f"locust did not stop within {limit:.0f} s (see {raw / 'locust.log'})")
            # measure the generator in the steady part of the step (after start-up and spawn;
            # a short step starts its window earlier: locust may quit ~3.3 s after a 3 s step began,
            # leaving a fixed 2.5 s start too little window to measure the machine's CPU)
            in_window = min(2.5, duration / 3) <= el <= duration + 1.5
            tree = common.process_tree(proc.pid)
            seen.update((p.pid, p) for p in tree[1:])
            cpu.sample(tree, in_window)
            machine_cpu.sample(in_window)
            if server_pid:
                server_cpu.sample(common.process_tree(server_pid), in_window)
                rss = common.tree_rss_mb(server_pid)
                if rss is not None:
                    peak = rss if peak is None else max(peak, rss)
            time.sleep(0.2)
    finally:
        log.close()
    # the worker processes write their files when they quit, possibly after the master
    import psutil

    psutil.wait_procs(list(seen.values()), timeout=20)
    if proc.returncode not in (0, None):
        raise RuntimeError(f"locust exited with {proc.returncode}: {(raw / 'locust.log').read_text()[-2000:]}")
    after = common.stow_patient_count(host, stow_patient) if operation == "stow" and stow_patient else None

    lat: list[float] = []
    nbytes = ok = fail = 0
    first, last = None, None
    reasons: dict[str, int] = {}
    for f in raw.glob("proc-*.json"):
        d = json.loads(f.read_text())
        lat += d["lat"]
        nbytes += d["bytes"]
        ok += d["ok"]
        fail += d["fail"]
        first = d["first"] if first is None else min(first, d["first"])
        last = d["last"] if last is None else max(last, d["last"])
        for k, v in d["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    ops = ok + fail
    window = (last - first) if ops and last and first and last > first else None
    a = np.asarray(lat, dtype=float)
    pct = (lambda q: round(float(np.percentile(a, q)), 2)) if ops else (lambda q: None)
    row = {
        "operation": operation, "clients": clients, "ops": ops,
        "ops_s": round(ops / window, 1) if window else 0.0,
        "mb_s": round(nbytes / 1e6 / window, 2) if window else 0.0,
        "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
        "max_ms": round(float(a.max()), 2) if ops else None,
        "errors": fail,
        "peak_server_mb": round(peak, 1) if peak is not None else None,
    }
    details = {
        **row,
        "generator_cpu_pct": round(cpu.total_pct(), 1),
        "generator_max_process_pct": round(cpu.max_pct(), 1),
        "generator_processes": procs,
        "generator_saturated": cpu.max_pct() >= SATURATED_PCT,
        "server_cpu_pct": round(server_cpu.total_pct(), 1) if server_pid else None,
        "machine_cpu_pct": round(m, 1) if (m := machine_cpu.busy_pct()) is not None else None,
        "window_s": round(window, 2) if window else None,
        "settle_wait_s": waited[0] if waited else None,
        "bytes": nbytes,
        "failure_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:10]),
    }
    if details["machine_cpu_pct"] is not None and server_pid:
        # CPU used by processes that are neither the server nor the load generator
        details["other_cpu_pct"] = round(max(0.0, details["machine_cpu_pct"] - details["server_cpu_pct"]
                                             - details["generator_cpu_pct"]), 1)
    else:
        details["other_cpu_pct"] = None
    details["machine_busy"] = busy_machine(details["other_cpu_pct"])
    if operation == "stow":
        details["server_count_before"] = before
        details["server_count_after"] = after
        details["server_counted"] = (after - before) if before is not None and after is not None else None
    if not quiet:
        flag = " GENERATOR SATURATED" if details["generator_saturated"] else ""
        print(f"  {operation:8s} {clients:3d} clients: {ops:7,d} ops {row['ops_s']:8.1f}/s  p50 {row['p50_ms']} ms"
              f"  p99 {row['p99_ms']} ms  errors {fail}  gen CPU {details['generator_cpu_pct']:.0f}%{flag}",
              file=sys.stderr, flush=True)
        for k, v in list(details["failure_reasons"].items())[:3]:
            print(f"      {v} x {k}", file=sys.stderr)
    if details["machine_busy"]:
        print(f"  WARNING: {busy_text(details)}", file=sys.stderr, flush=True)
    return details


def busy_machine(other_cpu_pct: float | None) -> bool | None:
    """Whether other processes used the machine during a step (None: not measured)."""
    return None if other_cpu_pct is None else other_cpu_pct > BUSY_OTHER_PCT


def busy_text(step: dict) -> str:
    return (f"the machine was busy during {step['operation']} {step['clients']}: other processes used "
            f"{step['other_cpu_pct']:.0f}% of a core (server {step['server_cpu_pct']:.0f}%, load generator "
            f"{step['generator_cpu_pct']:.0f}%); its numbers understate the server")


def busy_summary(steps: list[dict]) -> str:
    """One line for the end of a run and for results.md."""
    busy = [s for s in steps if s.get("machine_busy")]
    if any(s.get("machine_busy") is None for s in steps):
        unknown = "; other CPU not measured for some steps (server not found: pass --server-pid)"
    else:
        unknown = ""
    if not busy:
        return f"machine quiet (other CPU <= {BUSY_OTHER_PCT:.0f}% of a core) in every measured step{unknown}"
    return (f"WARNING: machine busy (other CPU > {BUSY_OTHER_PCT:.0f}% of a core) in {len(busy)} of {len(steps)} "
            "step(s): " + ", ".join(f"{s['operation']} {s['clients']} ({s['other_cpu_pct']:.0f}%)" for s in busy)
            + f"; rerun on a quiet machine (or with --settle) before comparing numbers{unknown}")


def table_rows(steps: list[dict], server_mem: bool = True) -> tuple[list[str], list[list]]:
    headers = ["operation", "clients", "ops", "ops/s", "MB/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors",
               "peak server MB", "generator CPU%", "server CPU%", "other CPU%"]
    rows = []
    for s in steps:
        gen = f"{s['generator_cpu_pct']:.0f}% ({s['generator_processes']} proc)"
        if s["generator_saturated"]:
            gen += " SATURATED"
        pct = (lambda v: "-" if v is None else f"{v:.0f}%")
        rows.append([s["operation"], s["clients"], s["ops"], s["ops_s"], s["mb_s"], s["p50_ms"], s["p95_ms"],
                     s["p99_ms"], s["max_ms"], s["errors"], s["peak_server_mb"], gen,
                     pct(s.get("server_cpu_pct")), pct(s.get("other_cpu_pct"))])
    return headers, rows


def compare_md(steps: list[dict], other_dir: Path) -> list[str]:
    """A section comparing these steps with another run's (``--compare DIR``)."""
    other = json.loads((other_dir / "steps.json").read_text())
    name = other["meta"].get("label") or other["meta"]["host"]
    by = {(s["operation"], s["clients"]): s for s in other["steps"]}
    rows = []
    for s in steps:
        o = by.get((s["operation"], s["clients"]))
        if not o:
            continue
        ratio = f"{s['ops_s'] / o['ops_s']:.2f}x" if o["ops_s"] else "-"
        sat = "yes" if s["generator_saturated"] or o["generator_saturated"] else "no"
        rows.append([s["operation"], s["clients"], s["ops_s"], o["ops_s"], ratio, s["p99_ms"], o["p99_ms"],
                     s["errors"], o["errors"], s["peak_server_mb"], o["peak_server_mb"], sat])
    headers = ["operation", "clients", "ops/s here", f"ops/s {name}", "ratio", "p99 here", f"p99 {name}",
               "errors here", f"errors {name}", "peak MB here", f"peak MB {name}", "generator saturated"]
    return [f"## Side by side with {name} (same data set, same runner; its table: `{other_dir.name}/results.md`)",
            "", common.table(headers, rows), ""]


def write_results(out: Path, steps: list[dict], meta: dict, compare: Path | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = [{k: s[k] for k in ROW_KEYS} for s in steps]
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "steps.json").write_text(json.dumps({"meta": meta, "steps": steps}, indent=1) + "\n")
    headers, trows = table_rows(steps)
    summary = meta["dataset"]
    notes = []
    for s in steps:
        if s["operation"] == "stow" and s.get("server_counted") is not None:
            ok = s["ops"] - s["errors"]
            notes.append(f"- STOW {s['clients']} clients: {ok} reported stored, the server counts "
                         f"{s['server_counted']} new instances of the load patient"
                         + ("" if s["server_counted"] == ok else " (MISMATCH)"))
        for reason, n in list(s["failure_reasons"].items())[:3]:
            notes.append(f"- {s['operation']} {s['clients']}: {n} x {reason}")
    sat = [f"{s['operation']} {s['clients']}" for s in steps if s["generator_saturated"]]
    md = [
        f"# LOAD-03 results: {meta.get('label') or meta['host']}",
        "",
        f"{meta['started']}; host `{meta['host']}`; {meta['duration']:g} s per step; "
        f"locust FastHttpUser, {meta['processes']} process(es) per step; no wait time between requests.",
        "",
        f"Data set: {summary['studies']} studies, {summary['instances']} images of {summary['patients']} patients "
        f"(CT {summary['by_modality']['CT']} x {summary['object_sizes']['CT']}; "
        f"MR {summary['by_modality']['MR']} x {summary['object_sizes']['MR']}), Explicit VR Little Endian, "
        f"{summary['pixel_bytes'] / 1e9:.2f} GB of pixel data. STOW-RS sends one "
        f"{meta['stow_size']}x{meta['stow_size']} MR image ({meta['stow_body_bytes']:,} B body) per request.",
        "",
        common.table(headers, trows),
        "",
        "Latencies are exact (every request), in ms. MB/s: response bytes (STOW: request bytes). "
        "Peak server MB: RSS of the server's process tree during the step"
        + ("" if meta.get("server_pid") else " (not measured: no --server-pid)") + ". "
        "Generator CPU: all locust processes, % of one core; SATURATED = a locust process at >= 90 % "
        "of a core, so the step measures the client as much as the server. Server CPU: the server's process "
        "tree. Other CPU: the rest of the machine (processes that are neither), % of one core: on a shared "
        "machine, a step with much 'other' CPU measured a server that did not have the cores to itself.",
        "",
        "Generator saturated in: " + (", ".join(sat) if sat else "no step") + ".",
        "",
        busy_summary(steps) + ".",
        "",
    ]
    if notes:
        md += ["Checks and failures:", "", *notes, ""]
    if compare:
        md += compare_md(steps, compare)
    md += ["## Machine", "", common.machine_md(meta["machine"])]
    (out / "results.md").write_text("\n".join(md))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True, help="DICOMweb root URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--clients", default="1,8,32,64", help="client counts (default %(default)s)")
    p.add_argument("--duration", type=float, default=15, help="seconds per step (default %(default)s)")
    p.add_argument("--operations", default="qido,wado,rendered,stow", help="default %(default)s")
    p.add_argument("--output", type=Path, required=True, help="folder for results.json / results.md")
    p.add_argument("--server-pid", type=int, help="server process (its tree's RSS is sampled)")
    p.add_argument("--processes", type=int, default=1, help="locust worker processes per step (default 1)")
    p.add_argument("--manifest", type=Path, help="manifest (default: made from the sizes under loadtests/data)")
    p.add_argument("--no-preload", action="store_true", help="do not check/preload the data set")
    p.add_argument("--settle", type=float, default=0, metavar="S",
                   help="before each step wait up to S seconds for the machine to be quiet (shared machines)")
    p.add_argument("--label", help="name of the server in the report")
    p.add_argument("--compare", type=Path, help="another run's output folder: add a side-by-side table")
    p.add_argument("--quiet", action="store_true")
    dataset.add_spec_args(p)
    a = p.parse_args(argv)
    ops = [o.strip() for o in a.operations.split(",") if o.strip()]
    for o in ops:
        if o not in OPERATIONS:
            p.error(f"unknown operation {o!r} (one of {', '.join(OPERATIONS)})")
    clients = [int(c) for c in a.clients.split(",") if c.strip()]
    if a.manifest and a.manifest.exists():
        manifest = dataset.load_manifest(a.manifest)
        path = a.manifest
    else:
        spec = dataset.spec_from_args(a)
        path = a.manifest or dataset.default_manifest_path(spec)
        manifest = dataset.ensure_manifest(path, spec, progress=not a.quiet)
    host = a.host.rstrip("/")
    if not a.no_preload:
        from . import preload

        preload.preload(manifest, [host], progress=not a.quiet)
        problems = preload.verify(manifest, host)
        if problems:
            print(f"{host}: data set incomplete after preload: {problems[:3]}", file=sys.stderr)
            return 1
    stow_size = int(manifest["stow"]["size"])
    pieces, _ = dataset.stow_body_pieces(stow_size)
    body_bytes = sum(map(len, pieces)) + 44 * (len(pieces) - 1)
    meta = {
        "host": host, "label": a.label, "duration": a.duration, "processes": a.processes,
        "server_pid": a.server_pid, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "dataset": manifest["summary"], "spec": manifest["spec"], "stow_size": stow_size,
        "stow_body_bytes": body_bytes, "machine": common.machine(),
    }
    if a.server_pid is None:
        a.server_pid = common.local_server_pid(host)
        meta["server_pid"] = a.server_pid
        if a.server_pid and not a.quiet:
            print(f"server: process {a.server_pid} (listening on {host}); its CPU and memory are measured",
                  file=sys.stderr)
    workdir = a.output / "raw"
    steps = []
    for o in ops:
        for c in clients:
            steps.append(run_step(host, path, o, c, a.duration, workdir, a.server_pid, a.processes,
                                  stow_patient=manifest["stow"]["PatientID"], quiet=a.quiet, settle=a.settle))
            write_results(a.output, steps, meta, a.compare)  # keep what is done if a later step fails
    headers, rows = table_rows(steps)
    print(common.table(headers, rows))
    sat = [f"{s['operation']} {s['clients']}" for s in steps if s["generator_saturated"]]
    print("generator saturated in: " + (", ".join(sat) if sat else "no step"))
    print(busy_summary(steps))
    print(f"wrote {a.output / 'results.json'} and {a.output / 'results.md'}")
    return 0 if all(s["errors"] == 0 for s in steps) else 3


if __name__ == "__main__":
    sys.exit(main())

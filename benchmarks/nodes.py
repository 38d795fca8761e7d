"""STOW-RS and QIDO-RS throughput with 1, 2 and 3 archive nodes on one PostgreSQL
index and one folder, behind nginx (issue 13, "Scale, measured").

Everything runs on this machine: PostgreSQL (tests/postgres.py: fsync on,
synchronous_commit on), N ``dicomweb-server serve --index postgresql --workers 1``
processes sharing one data folder, nginx-light as the load balancer (round robin,
keep-alive to the nodes, bodies buffered in memory), and wrk. Each node is one
process, so "N nodes" is N archive processes competing for the same 2 cores with
PostgreSQL, nginx and wrk: the table shows where the cores go, not how a real
cluster of N machines would scale.

Steps (every configuration runs both, 10 s each, 16 connections, 2 wrk threads):
- ``qido``: study searches from the scale benchmark's four lists (PatientID,
  PatientName wildcard, StudyDate month, ModalitiesInStudy; ``limit=100``) over
  10,000 instances (1,000 studies) loaded in bulk (benchmarks/scale_rows.py);
- ``stow``: one new 256x256 MR instance per request (~129 KiB; loadtests.dataset's
  STOW template), each request a new study (benchmarks/wrk/stow_studies.lua);
  instances in the index are counted before and after: ``stored`` must equal the
  good answers.
Plus ``1 node, direct``: the same without nginx (what the balancer costs).

CPU: seconds of user+system CPU of each group of processes over the step (nodes,
PostgreSQL, nginx, wrk) as % of one core; ``other`` is what the rest of the machine
(the other engineers' work) used meanwhile. 200 % is both cores.

    PYTHONPATH=. python benchmarks/nodes.py [--nodes 1 2 3] [--duration 10] [--connections 16]
        [--output benchmarks/results/nodes.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg

from benchmarks import scale_rows as sr
from benchmarks.scale import loadavg, query_lists
from loadtests import capacity, common, dataset

HERE = Path(__file__).resolve().parent
STOW_LUA = HERE / "wrk" / "stow_studies.lua"
QIDO_LUA = common.HERE / "wrk" / "load03.lua"


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        for p in common.process_tree(pid):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def machine_busy() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def nginx_conf(work: Path, port: int, upstreams: list[int]) -> Path:
    conf = work / f"nginx-{len(upstreams)}.conf"
    servers = "".join(f"    server 127.0.0.1:{p};\n" for p in upstreams)
    conf.write_text(f"""user root;
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {work}/nginx-body;
  proxy_temp_path {work}/nginx-proxy;
  upstream nodes {{
{servers}    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 0;
    client_body_buffer_size 1m;
    location / {{
      proxy_pass http://nodes;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffers 16 64k;
    }}
  }}
}}
""")
    return conf


def start_node(data: Path, url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "DICOMWEB_DATABASE_URL": url}
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--index", "postgresql", "--port", str(port), "--workers", "1", "--dimse-port", "0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    common.wait_http(f"http://127.0.0.1:{port}/studies?limit=1", proc=proc, timeout=120)
    return proc


def run_step(host: str, lua: Path, args: list[str], connections: int, duration: float, groups: dict[str, list[int]],
             marker: str) -> dict:
    cmd = ["wrk", "-t", "2", "-c", str(connections), "-d", f"{duration:g}s", "--timeout", "30s", "-s", str(lua),
           host, "--", *args]
    before = {g: tree_cpu(p) for g, p in groups.items()}
    busy0, t0 = machine_busy(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wrk_cpu = 0.0
    wrk_proc = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            t = wrk_proc.cpu_times()
            wrk_cpu = t.user + t.system
        except psutil.Error:
            pass
        if time.monotonic() - t0 > duration + 60:
            proc.kill()
            raise RuntimeError("wrk did not stop")
        time.sleep(0.2)
    wall = time.monotonic() - t0
    busy = machine_busy() - busy0
    out = proc.stdout.read() if proc.stdout else ""
    line = next((ln for ln in out.splitlines() if ln.startswith(marker + " ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary: {out[-1500:]}")
    s = json.loads(line[len(marker) + 1:])
    cpu = {g: 100.0 * (tree_cpu(p) - before[g]) / wall for g, p in groups.items()}
    cpu["wrk"] = 100.0 * wrk_cpu / wall
    cpu["other"] = max(0.0, 100.0 * busy / wall - sum(cpu.values()))
    s["cpu_pct"] = {k: round(v, 1) for k, v in cpu.items()}
    s["rps"] = s["requests"] / (s["duration_us"] / 1e6)
    return s


def instances(url: str) -> int:
    with psycopg.connect(url) as con:
        return con.execute("SELECT count(*) FROM instance").fetchone()[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/nodes.json"))
    args = ap.parse_args()
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        raise SystemExit("nginx is not installed: apt-get install -y nginx-light")
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    from tests.postgres import PostgresServer

    pg = PostgresServer()
    work = Path(tempfile.mkdtemp(prefix="dicomweb-nodes-"))
    nodes: list[tuple[int, subprocess.Popen]] = []
    rows = []
    nginx = None
    try:
        url = pg.fresh_url()
        data = work / "data"
        template = sr.template_record(work / "template")
        rows_src = sr.Rows(template, 1)
        sr.load_postgresql(url, rows_src, 1000)  # 10,000 instances for the searches
        lists = query_lists(1000, 1, work)
        mix = [ln for p in lists.values() for ln in p.read_text().splitlines()]
        random.Random(9).shuffle(mix)
        (work / "qido.txt").write_text("".join(q + "\n" for q in mix))
        body, (ph_study, ph_series, ph_sop) = dataset.stow_template(256)
        head = f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        tail = f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode()
        (work / "stow.bin").write_bytes(head + body + tail)
        postmaster = int((pg.dir / "data" / "postmaster.pid").read_text().split()[0])
        nginx_port = capacity.free_port()

        def steps(host: str, label: str, n: int, with_nginx: bool) -> None:
            groups = {"nodes": [p.pid for _, p in nodes], "postgresql": [postmaster]}
            if with_nginx:
                groups["nginx"] = [nginx.pid]  # type: ignore[union-attr]
            q = run_step(host, QIDO_LUA, ["qido", str(work / "qido.txt"), "application/dicom+json", "1"],
                         args.connections, args.duration, groups, "LOAD03")
            before = instances(url)
            s = run_step(host, STOW_LUA, [str(work / "stow.bin"), "/studies", ph_study, ph_series, ph_sop,
                                          str(random.randrange(1_000_000))],
                         args.connections, args.duration, groups, "STOW")
            s["stored"] = instances(url) - before
            row = {"config": label, "nodes": n, "nginx": with_nginx, "load": loadavg(), "qido": q, "stow": s,
                   "stow_bytes": len(head + body + tail)}
            rows.append(row)
            print(json.dumps({"config": label, "qido_rps": round(q["rps"]), "stow_rps": round(s["rps"]),
                              "stored": s["stored"], "load": row["load"], "cpu_qido": q["cpu_pct"],
                              "cpu_stow": s["cpu_pct"]}), file=sys.stderr, flush=True)

        for n in sorted(args.nodes):
            while len(nodes) < n:
                port = capacity.free_port()
                nodes.append((port, start_node(data, url, port)))
            if n == 1:
                steps(f"http://127.0.0.1:{nodes[0][0]}", "1 node, direct", 1, False)
            conf = nginx_conf(work, nginx_port, [p for p, _ in nodes])
            nginx = subprocess.Popen([nginx_bin, "-c", str(conf), "-p", str(work)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            common.wait_http(f"http://127.0.0.1:{nginx_port}/studies?limit=1", proc=nginx, timeout=30)
            try:
                steps(f"http://127.0.0.1:{nginx_port}", f"{n} node(s), nginx", n, True)
            finally:
                nginx.send_signal(signal.SIGQUIT)
                nginx.wait(30)
    finally:
        for _, p in nodes:
            capacity.stop_process(p, signal.SIGTERM, 30)
        if nginx is not None and nginx.poll() is None:
            nginx.kill()
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": common.machine(), "rows": rows}, indent=1))
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """Per step: rate, latency, per-node efficiency (rate / (N x the 1-node rate behind
    nginx)), the archive side's CPU per request (nodes + PostgreSQL + nginx: steadier
    than a rate on a shared machine) and where the CPU went."""
    base = {op: next((r[op]["rps"] for r in rows if r["nodes"] == 1 and r["nginx"]), None) for op in ("qido", "stow")}
    head = ["configuration"]
    for op, name in (("qido", "QIDO-RS req/s"), ("stow", "STOW-RS instances/s")):
        head += [name] + (["answered / stored"] if op == "stow" else []) + [
            "p50 / p99 ms", "per-node efficiency", "CPU ms / request", "CPU % nodes / PG / nginx / wrk / other"]
    head.append("load avg")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["config"]]
        for op in ("qido", "stow"):
            s = r[op]
            eff = f"{s['rps'] / (r['nodes'] * base[op]):.2f}" if base[op] and r["nginx"] else "-"
            c = s["cpu_pct"]
            cpu = " / ".join(f"{c[k]:.0f}" if k in c else "-" for k in ("nodes", "postgresql", "nginx", "wrk", "other"))
            ours = sum(c.get(k, 0.0) for k in ("nodes", "postgresql", "nginx"))
            ms = 10.0 * ours / s["rps"] if s["rps"] else float("nan")  # % of a core x 10 / (req/s) = ms per request
            bad = s["status"] + s["invalid"] + s["timeout"]
            cells.append(f"{s['rps']:,.0f}" + (f" ({bad} bad)" if bad else ""))
            if op == "stow":
                cells.append(f"{s['requests'] - bad:,} / {s['stored']:,}")
            cells += [f"{s['p50_us'] / 1000:.1f} / {s['p99_us'] / 1000:.1f}", eff, f"{ms:.1f}", cpu]
        cells.append(r["load"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""QIDO-RS latency and WADO-RS instance rate over HTTP with 10k, 100k and 1M instances
in the index, SQLite vs PostgreSQL (issue 13, "Scale, measured").

For each size the index is built in bulk (benchmarks/scale_rows.py: the archive's
tables, rows as ``Index.add`` writes them, 1,000 real files spread over the index),
then a real archive (``dicomweb-server serve``, 2 workers, access log off) serves it
and wrk (loadtests/wrk/load03.lua, which checks every answer lightly) measures:

- QIDO-RS study searches, one connection (latency, not throughput), 5 s each, every
  request a different value from a list of 500 (``limit=100``, a result page):
  PatientID exact, PatientName wildcard (``FAMILY*``: one of 2,000 family names),
  StudyDate one-month range, ModalitiesInStudy (one of CT, MR, US, CR, XA);
- WADO-RS instance retrieve (``multipart/related; type="application/dicom"``, the
  1,000 files in random order: ~129 KiB each), 8 connections, 8 s.

    PYTHONPATH=. python benchmarks/scale.py [--sizes 10000 100000 1000000] [--database-url URL]
        [--output benchmarks/results/scale-http.json]

Without --database-url a throw-away PostgreSQL is started as the tests do
(tests/postgres.py: fsync on, synchronous_commit on, shared_buffers 32 MB). Each row
records the load average (``/proc/loadavg``) before and after and the CPU the rest of
the machine used during the step (``other``): the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import scale_rows as sr
from loadtests import capacity, common

QUERIES = ("PatientID", "PatientName wildcard", "StudyDate month", "ModalitiesInStudy")
WADO_ACCEPT = 'multipart/related; type="application/dicom"'


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def query_lists(n_studies: int, run: int, workdir: Path) -> dict[str, Path]:
    rnd = random.Random(11)
    picks = [sr.study(rnd.randrange(n_studies), run) for _ in range(500)]
    lists = {
        "PatientID": [f"/studies?PatientID={s.patient_id}&limit=100" for s in picks],
        "PatientName wildcard": [f"/studies?PatientName={s.patient_name.split('^')[0]}*&limit=100" for s in picks],
        "StudyDate month": [f"/studies?StudyDate={s.study_date[:6]}01-{s.study_date[:6]}31&limit=100" for s in picks],
        "ModalitiesInStudy": [f"/studies?ModalitiesInStudy={rnd.choice(['CT', 'MR', 'US', 'CR', 'XA'])}&limit=100"
                              for _ in picks],
    }
    out = {}
    for name, paths in lists.items():
        out[name] = workdir / (name.replace(" ", "_") + ".txt")
        out[name].write_text("".join(p + "\n" for p in paths))
    return out


def serve(data: Path, kind: str, url: str | None, port: int) -> subprocess.Popen:
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "DICOMWEB_DATABASE_URL": url or ""}
    if url is None:
        env.pop("DICOMWEB_DATABASE_URL")
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--index", kind, "--port", str(port), "--workers", "2", "--dimse-port", "0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    common.wait_http(f"http://127.0.0.1:{port}/studies?limit=1", proc=proc, timeout=120)
    return proc


def measure(host: str, pid: int, lists: dict[str, Path], wado: Path) -> dict:
    res = {}
    for name in QUERIES:
        s = capacity.run_wrk(host, ["qido", str(lists[name]), "application/dicom+json", "1"], 1, 5, 1, pid)
        res[name] = s
    res["wado"] = capacity.run_wrk(host, ["wado", str(wado), WADO_ACCEPT, "100000"], 8, 8, 2, pid)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--kinds", nargs="+", default=["sqlite", "postgresql"])
    ap.add_argument("--database-url")
    ap.add_argument("--sample", type=int, default=1000, help="instances with a real file (WADO-RS)")
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/scale-http.json"))
    ap.add_argument("--table", type=Path, help="only print the table of an earlier run's JSON")
    args = ap.parse_args()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())["rows"]))
        return 0
    server = None
    if args.database_url is None and "postgresql" in args.kinds:
        from tests.postgres import PostgresServer

        server = PostgresServer()
    results = []
    run = 1
    try:
        with tempfile.TemporaryDirectory(prefix="dicomweb-scale-") as tmp:
            root = Path(tmp)
            template = sr.template_record(root / "template")
            for n in args.sizes:
                n_studies = n // 10
                rows = sr.Rows(template, run)
                data = root / f"data-{n}"
                wado_urls = sr.sample_files(rows, data / "blobs", n_studies, args.sample)
                random.Random(5).shuffle(wado_urls)
                wado = root / f"wado-{n}.txt"
                wado.write_text("".join(u + "\n" for u in wado_urls))
                lists = query_lists(n_studies, run, root)
                for kind in args.kinds:
                    url = None
                    t0 = time.perf_counter()
                    if kind == "sqlite":
                        sr.load_sqlite(data / "index.sqlite", rows, n_studies)
                        size = (data / "index.sqlite").stat().st_size
                    else:
                        url = args.database_url or server.fresh_url()  # type: ignore[union-attr]
                        sr.load_postgresql(url, rows, n_studies)
                        import psycopg

                        with psycopg.connect(url) as con:
                            size = int(con.execute("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                                               "JOIN pg_namespace n ON n.oid = c.relnamespace "
                                               "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
                                               ).fetchone()[0])
                    build = time.perf_counter() - t0
                    port = capacity.free_port()
                    before = loadavg()
                    proc = serve(data, kind, url, port)
                    try:
                        m = measure(f"http://127.0.0.1:{port}", proc.pid, lists, wado)
                    finally:
                        capacity.stop_process(proc, 15, 30)
                    row = {"instances": n, "index": kind, "build_s": round(build, 1), "index_bytes": size,
                           "load_before": before, "load_after": loadavg(), "results": m}
                    results.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "results"}), file=sys.stderr, flush=True)
                    if kind == "sqlite":
                        for f in data.glob("index.sqlite*"):
                            f.unlink()
                    elif server is not None:
                        import psycopg

                        with psycopg.connect(server.url, autocommit=True) as con:  # free the disk
                            schema = url.rsplit("%3D", 1)[1]
                            con.execute(f"DROP SCHEMA {schema} CASCADE")
                shutil.rmtree(data, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": common.machine(), "rows": results}, indent=1))
    print(table(results))
    return 0


def table(results: list[dict]) -> str:
    head = ("| instances | index | build (s) | index size | "
            + " | ".join(f"{q} p50 / p99 ms (answer KiB)" for q in QUERIES)
            + " | WADO-RS instances/s (MB/s) | server CPU / other CPU % (WADO) | load avg before / after |")
    lines = [head, "|" + "---|" * (len(QUERIES) + 7)]
    for r in results:
        m = r["results"]
        w = m["wado"]
        secs = w["duration_us"] / 1e6
        bad = sum(m[q]["status"] + m[q]["invalid"] for q in QUERIES) + w["status"] + w["invalid"]
        lines.append(
            f"| {r['instances']:,} | {r['index']} | {r['build_s']:.0f} | {r['index_bytes'] / 2**20:,.0f} MiB | "
            + " | ".join(f"{m[q]['p50_us'] / 1000:.1f} / {m[q]['p99_us'] / 1000:.1f} "
                         f"({m[q]['bytes'] / max(1, m[q]['requests']) / 1024:.0f})" for q in QUERIES)
            + f" | {w['requests'] / secs:,.0f} ({w['bytes'] / secs / 1e6:,.0f}) | {w['server_cpu_pct']:.0f} / "
            f"{w['other_cpu_pct'] if w['other_cpu_pct'] is not None else '-'} | {r['load_before']} / "
            f"{r['load_after']} |" + (f" {bad} bad answers |" if bad else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

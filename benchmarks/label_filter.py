"""What an access-rules label filter costs QIDO-RS and WADO-RS (issue 28: "the filter must
cost under 10%"), with 100k instances, SQLite and PostgreSQL.

The index is built in bulk (benchmarks/scale_rows.py: the archive's tables, the rows
``Index.add`` writes; 10 instances per study) and every study labelled in ``study_label``:
``site`` on every study, ``a`` or ``b`` on alternate studies. ``sample`` instances (spread
over the index, half of them in ``a`` studies) get a real file for WADO-RS. A real archive
(``dicomweb-server serve``, one worker) serves it with three API keys:

- ``none``: a key no access rule names (everything, the SQL unchanged);
- ``site``: a key allowed label ``site``: the filter is applied (a test of the study
  row's ``labels`` copy, store/labels.py) and lets every study through: the same answers as ``none``,
  so the difference is the filter's cost alone;
- ``half``: a key allowed label ``a``: half the studies; QIDO-RS then reads about twice
  the rows to fill a page (a cost of selectivity, not of the check), WADO-RS retrieves
  only the files of ``a`` studies.

One client, one connection, requests one after the other (latency, not throughput). The
machine is shared and noisy, so the modes alternate: each round runs every request list
once per mode, the modes' order reversed every other round (A B C, C B A, ...); a rate is
requests / seconds of one list in one round; the table gives the median over the rounds
and the ratio of the medians (and the median of the per-round ratios).

    PYTHONPATH=. python benchmarks/label_filter.py [--instances 100000] [--kinds sqlite postgresql]
        [--rounds 7] [--output benchmarks/results/label_filter.md]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from benchmarks import scale_rows as sr
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sqlite import SQLiteIndex
from benchmarks.scale import loadavg, query_lists
from loadtests import capacity, common

TOKENS = {"none": "bench-none", "site": "bench-site", "half": "bench-half"}
MODES = tuple(TOKENS)
WADO_ACCEPT = 'multipart/related; type="application/dicom"'


def key_name(token: str) -> str:
    return f"key-{hashlib.sha256(token.encode()).hexdigest()[:8]}"


def label_rows(n_studies: int, run: int) -> list[tuple[str, str]]:
    """(label, StudyInstanceUID): ``site`` on every study, ``a`` / ``b`` alternately."""
    out = []
    for n in range(n_studies):
        uid = sr.study(n, run).uid
        out += [("site", uid), ("a" if n % 2 == 0 else "b", uid)]
    return out


def label_sqlite(path: Path, rows: list[tuple[str, str]]) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN")
    con.executemany("INSERT INTO study_label (label, StudyInstanceUID) VALUES (?, ?)", rows)
    con.execute("COMMIT")
    con.execute("ANALYZE")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def label_postgresql(url: str, rows: list[tuple[str, str]]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        with con.cursor() as cur, cur.copy("COPY study_label (label, StudyInstanceUID) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)
        # (the triggers rewrote each labelled study row: VACUUM as autovacuum would, before measuring)
        con.execute("VACUUM ANALYZE study_label")
        con.execute("VACUUM ANALYZE study")


def serve(data: Path, kind: str, url: str | None, port: int) -> subprocess.Popen:
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning",
           "DICOMWEB_API_KEYS": orjson.dumps({t: ["read"] for t in TOKENS.values()}).decode(),
           "DICOMWEB_ACCESS_RULES": orjson.dumps({"identities": {
               f"key:{key_name(TOKENS['site'])}": ["site"], f"key:{key_name(TOKENS['half'])}": ["a"]}}).decode()}
    env.pop("DICOMWEB_DATABASE_URL", None)
    if url is not None:
        env["DICOMWEB_DATABASE_URL"] = url
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--index", kind, "--port", str(port), "--workers", "1", "--dimse-port", "0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    common.wait_http(f"http://127.0.0.1:{port}/studies?limit=1", proc=proc, timeout=120)
    return proc


def run_list(client: httpx.Client, token: str, paths: list[str], accept: str) -> tuple[float, int]:
    """Seconds to GET every path in turn; how many answers were not 200 (a WADO-RS of a
    study the key may not see: 404, counted)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": accept}
    bad = 0
    t0 = time.perf_counter()
    for p in paths:
        r = client.get(p, headers=headers)
        if r.status_code != 200:
            bad += 1
        r.read()
    return time.perf_counter() - t0, bad


def measure(base: str, lists: dict[str, tuple[list[str], str, set[str]]], rounds: int, pid: int) -> dict:
    """{list: {mode: [rate per round]}}, {list: {mode: [server CPU ms per request, per
    round]}} (the server's user + system CPU: less disturbed by the other users of the
    machine than the wall clock) and the non-200 answers."""
    rates: dict[str, dict[str, list[float]]] = {name: {m: [] for m in MODES} for name in lists}
    cpu: dict[str, dict[str, list[float]]] = {name: {m: [] for m in MODES} for name in lists}
    bad: dict[str, dict[str, int]] = {name: {m: 0 for m in MODES} for name in lists}
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, (paths, accept, _modes) in lists.items():  # warm up (page cache, plans)
            run_list(client, TOKENS["none"], paths[: len(paths) // 4], accept)
        for r in range(rounds):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for name, (paths, accept, modes) in lists.items():
                for mode in order:
                    if mode not in modes:
                        continue
                    c0 = capacity.tree_cpu_seconds(pid)
                    seconds, n_bad = run_list(client, TOKENS[mode], paths, accept)
                    c1 = capacity.tree_cpu_seconds(pid)
                    rates[name][mode].append(len(paths) / seconds)
                    cpu[name][mode].append((c1 - c0) * 1000 / len(paths))  # type: ignore[operator]
                    bad[name][mode] += n_bad
    return {"rates": rates, "cpu": cpu, "bad": bad}


def plans(kind: str, index, url: str | None, qido: dict[str, list[str]], sops: list[str]) -> list[str]:
    """The query plan of the first search of each QIDO-RS list and of one ``locate``,
    unfiltered and with the ``site`` filter: SQLite's EXPLAIN QUERY PLAN, PostgreSQL's
    EXPLAIN ANALYZE (its times: on the server, the median of 5 executions)."""
    from urllib.parse import parse_qsl, urlsplit

    from dicomweb_server.access.filter import UNRESTRICTED, only
    from dicomweb_server.dicom.matching import parse_query
    from dicomweb_server.store.labels import label_condition
    from dicomweb_server.store.sql import _LOC, compile_search

    d = index.dialect
    todo = []
    for name, paths in qido.items():
        q = parse_query("study", parse_qsl(urlsplit(paths[0]).query))
        for mode, f in (("none", UNRESTRICTED), ("site", only({"site"}))):
            sql, params = compile_search(d, q, f)
            todo.append((f"{name} ({paths[0]}), {mode}", sql, params))
    for mode, f in (("none", UNRESTRICTED), ("site", only({"site"}))):
        conds, params = label_condition(f, engine=d.name)
        todo.append((f"locate, {mode}", _LOC + "WHERE " + " AND ".join(["i.SOPInstanceUID = ?", *conds]),
                     [sops[0], *params]))
    out = []
    if kind == "sqlite":
        con = index._con()
        for title, sql, params in todo:
            steps = [r[3] for r in con.execute("EXPLAIN QUERY PLAN " + d.sql(sql), params)]
            out.append(f"- {title}: " + "; ".join(f"`{x}`" for x in steps))
        return out
    import psycopg

    with psycopg.connect(url) as con:  # type: ignore[arg-type]
        for title, sql, params in todo:
            con.execute(d.sql(sql), params).fetchall()  # warm
            # the median of 5 executions by execution time (one can be descheduled on a busy machine)
            runs = [[r[0] for r in con.execute("EXPLAIN (ANALYZE, COSTS OFF) " + d.sql(sql), params)]
                    for _ in range(5)]
            runs.sort(key=lambda rows: float(rows[-1].split()[-2]))  # "Execution Time: 0.038 ms"
            out += [f"- {title} (the median of 5 executions):", "", *["      " + x for x in runs[2]], ""]
    return out


def index_level(index, qido: dict[str, list[str]], sops: list[str], rounds: int) -> dict:
    """The filter in the index alone (no HTTP): ``Index.search`` of each QIDO-RS list and
    ``Index.locate`` of the sampled instances (what a WADO-RS instance retrieve asks the
    index), unfiltered and with the ``site`` filter, alternating; ms per call, per round."""
    from urllib.parse import parse_qsl, urlsplit

    from dicomweb_server.access.filter import UNRESTRICTED, only
    from dicomweb_server.dicom.matching import parse_query

    filters = {"none": UNRESTRICTED, "site": only({"site"}), "half": only({"a"})}
    calls = {f"search: {name}": [(index.search, parse_query("study", parse_qsl(urlsplit(p).query))) for p in paths]
             for name, paths in qido.items()}
    calls["locate (WADO-RS instance)"] = [(index.locate, sop) for sop in sops]
    out: dict[str, dict[str, list[float]]] = {name: {m: [] for m in filters} for name in calls}
    for r in range(rounds):
        order = list(filters) if r % 2 == 0 else list(reversed(filters))
        for name, todo in calls.items():
            for mode in order:
                f = filters[mode]
                t0 = time.perf_counter()
                for _ in range(5):
                    for fn, arg in todo:
                        fn(arg, f)
                out[name][mode].append((time.perf_counter() - t0) * 1000 / (5 * len(todo)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=100_000)
    ap.add_argument("--kinds", nargs="+", default=["sqlite", "postgresql"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--queries", type=int, default=60, help="requests per QIDO-RS list and round")
    ap.add_argument("--sample", type=int, default=200, help="instances with a real file (WADO-RS)")
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/label_filter.md"))
    args = ap.parse_args()
    server = None
    if "postgresql" in args.kinds:
        from tests.postgres import PostgresServer

        server = PostgresServer()
    run, n_studies = 1, args.instances // 10
    results = []
    t_start = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="dicomweb-labels-") as tmp:
            root = Path(tmp)
            template = sr.template_record(root / "template")
            rows = sr.Rows(template, run)
            data = root / "data"
            wado_all = sr.sample_files(rows, data / "blobs", n_studies, args.sample)
            random.Random(5).shuffle(wado_all)
            in_a = {sr.study(n, run).uid for n in range(0, n_studies, 2)}
            wado_a = [u for u in wado_all if u.split("/")[2] in in_a]
            qido = {name: p.read_text().split()[: args.queries]
                    for name, p in query_lists(n_studies, run, root).items()}
            lists: dict[str, tuple[list[str], str, set[str]]] = {
                f"QIDO-RS {name}": (paths, "application/dicom+json", set(MODES)) for name, paths in qido.items()}
            lists["WADO-RS instance, all sampled files"] = (wado_all, WADO_ACCEPT, {"none", "site"})
            lists["WADO-RS instance, files of a studies"] = (wado_a, WADO_ACCEPT, set(MODES))
            lists["WADO-RS study metadata, a studies"] = (
                [f"/studies/{u.split('/')[2]}/metadata" for u in wado_a], "application/dicom+json", set(MODES))
            labels = label_rows(n_studies, run)
            for kind in args.kinds:
                url = None
                t0 = time.perf_counter()
                if kind == "sqlite":
                    sr.load_sqlite(data / "index.sqlite", rows, n_studies)
                    label_sqlite(data / "index.sqlite", labels)
                else:
                    url = server.fresh_url()  # type: ignore[union-attr]
                    sr.load_postgresql(url, rows, n_studies)
                    label_postgresql(url, labels)
                build = time.perf_counter() - t0
                port = capacity.free_port()
                before = loadavg()
                proc = serve(data, kind, url, port)
                try:
                    m = measure(f"http://127.0.0.1:{port}", lists, args.rounds, proc.pid)
                finally:
                    capacity.stop_process(proc, 15, 30)
                index = (SQLiteIndex(data / "index.sqlite") if kind == "sqlite"
                         else PostgreSQLIndex(url))  # type: ignore[arg-type]
                try:
                    sops = [u.rsplit("/", 1)[1] for u in wado_all]
                    m["index_level"] = index_level(index, qido, sops, args.rounds)
                    m["plans"] = plans(kind, index, url, qido, sops)
                finally:
                    index.close()
                row = {"index": kind, "build_s": round(build, 1), "load_before": before, "load_after": loadavg(),
                       **m}
                results.append(row)
                print(orjson.dumps({k: row[k] for k in ("index", "build_s", "load_before", "load_after")}).decode(),
                      file=sys.stderr, flush=True)
                if kind == "sqlite":
                    for f in data.glob("index.sqlite*"):
                        f.unlink()
            shutil.rmtree(data, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
    text = report(args, results, lists, n_studies, len(labels), time.time() - t_start)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


def report(args, results: list[dict], lists: dict, n_studies: int, n_labels: int, seconds: float) -> str:
    m = common.machine()
    out = [f"# Label filter cost, QIDO-RS and WADO-RS, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
           f"Machine: {m['cpu_model']}, {m['nproc']} cores (shared with other engineers), Python {m['python']}. "
           f"Total run {seconds:.0f} s.", "",
           f"Index: {args.instances:,} instances ({n_studies:,} studies of 2 series x 5 instances, "
           f"benchmarks/scale_rows.py), {n_labels:,} study_label rows (`site` on every study, `a`/`b` on "
           f"alternate ones); {args.sample} real files for WADO-RS. One worker, one client connection, "
           f"{args.rounds} rounds, modes alternating (A B C, C B A, ...); QIDO-RS lists of {args.queries} "
           "searches (limit=100).", "",
           f"    PYTHONPATH=. python benchmarks/label_filter.py --instances {args.instances} "
           f"--kinds {' '.join(args.kinds)} --rounds {args.rounds}", "",
           "Modes: `none` no filter; `site` the filter, every study allowed (same answers: the filter's own "
           "cost); `half` the filter, label `a` (half of the studies).", ""]
    for row in results:
        out += [f"## {row['index']}", "",
                f"Load average before: {row['load_before']}; after: {row['load_after']}. Build {row['build_s']} s.",
                "", "| request list | requests | none req/s | site req/s | half req/s | site/none | "
                "median per-round site/none | half/none |", "|---|---|---|---|---|---|---|---|"]
        for name, (paths, _accept, _modes) in lists.items():
            r = row["rates"][name]
            med = {k: statistics.median(v) if v else None for k, v in r.items()}

            def cell(x):
                return f"{x:,.1f}" if x is not None else "-"

            def ratio(a, b):
                return f"{a / b:.3f}" if a is not None and b else "-"

            per_round = [s / n for s, n in zip(r["site"], r["none"])] if r["site"] and r["none"] else []
            out.append(f"| {name} | {len(paths)} | {cell(med['none'])} | {cell(med['site'])} | {cell(med['half'])} | "
                       f"{ratio(med['site'], med['none'])} | "
                       f"{f'{statistics.median(per_round):.3f}' if per_round else '-'} | "
                       f"{ratio(med['half'], med['none'])} |")
        out += ["", "Server CPU (user + system) per request, ms, median over the rounds:", "",
                "| request list | none | site | half | site/none | half/none |", "|---|---|---|---|---|---|"]
        for name in lists:
            out.append(_ratios_row(name, row["cpu"][name], "{:.2f}"))
        out += ["", "The index alone (no HTTP; `Index.search` of the same QIDO-RS lists, `Index.locate` of the "
                "sampled instances), ms per call, median over the rounds:", "",
                "| call | none | site | half | site/none | half/none |", "|---|---|---|---|---|---|"]
        for name, d in row["index_level"].items():
            out.append(_ratios_row(name, d, "{:.3f}"))
        bad = {f"{n} ({mode})": c for n, d in row["bad"].items() for mode, c in d.items() if c}
        out += ["", f"Non-200 answers: {bad or 'none'}.", "", "Query plans:", "", *row["plans"], ""]
    return "\n".join(out) + "\n"


def _ratios_row(name: str, d: dict[str, list[float]], fmt: str) -> str:
    med = {k: statistics.median(v) if v else None for k, v in d.items()}
    cells = [fmt.format(med[m]) if med.get(m) is not None else "-" for m in MODES]
    ratios = [f"{med[m] / med['none']:.3f}" if med.get(m) is not None and med["none"] else "-"
              for m in ("site", "half")]
    return f"| {name} | " + " | ".join(cells + ratios) + " |"


if __name__ == "__main__":
    sys.exit(main())

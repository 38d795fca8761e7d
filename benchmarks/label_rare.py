"""A RARE label on PostgreSQL (a research cohort of 50 studies in a big archive): what the
access-rules filter costs a user allowed only that label, in three forms of the filter:

- ``exists``: ``EXISTS (SELECT 1 FROM study_label ...)`` per candidate study (schema 15,
  the archive before the study row kept its labels; commit 5de6d1a);
- ``strpos``: ``strpos(s.labels, '\\cohort\\') > 0`` on a text copy on the study row (the
  first schema 16; commit 6bd537a): no index can serve it;
- ``array``: ``s.labels && ARRAY['cohort']::text[]`` on a ``text[]`` copy with a GIN index
  (this tree's schema 16): a bitmap scan of the index for a rare label.

One index is built in bulk (benchmarks/scale_rows.py; 10 instances per study) with this
tree's schema, ``cohort`` on 50 studies spread evenly over it and ``site`` on every study
(the common case, which must stay cheap); its database is copied twice (``CREATE DATABASE
... TEMPLATE``) and each copy changed to the other forms' schema (``strpos``: the column
made text ``\\a\\b\\``; ``exists``: no column, schema version 15), then ``VACUUM FULL
ANALYZE`` of all three (same table layout). Each form is measured by its own code (the
``--trees``: a checkout of each commit, first on the path of a subprocess), the index
alone, no HTTP: ``Index.search`` of ``/studies?limit=100`` and of PatientName wildcard
searches, and ``Index.counts`` (the landing page), as ``cohort`` and as ``site``; ms per
call. The forms alternate (a b c, c b a, ...); the table gives the median over the rounds.

    PYTHONPATH=. python benchmarks/label_rare.py --studies 100000 \\
        --trees exists=/path/to/5de6d1a strpos=/path/to/6bd537a array=.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RARE, COMMON, N_RARE = "cohort", "site", 50


def measure(url: str, rounds: int, names: list[str], plans: bool) -> dict:
    """In the subprocess (the tree under test first on the path): ms per call of each
    call, as each user; and EXPLAIN ANALYZE of the limit=100 search as ``cohort``."""
    from dicomweb_server.access.filter import only
    from dicomweb_server.dicom.matching import parse_query
    from dicomweb_server.store.postgresql import PostgreSQLIndex
    from dicomweb_server.store.sql import compile_search

    index = PostgreSQLIndex(url)
    calls = {
        "search /studies?limit=100": [(index.search, parse_query("study", [("limit", "100")]))],
        "search PatientName=FAMILY* (limit=100)": [
            (index.search, parse_query("study", [("PatientName", f"{n}*"), ("limit", "100")])) for n in names],
        "counts (landing page)": [(lambda _arg, f: index.counts(f), None)],
    }
    users = {RARE: only({RARE}), COMMON: only({COMMON})}
    out: dict = {"ms": {}, "rows": {}}
    try:
        for name, todo in calls.items():
            for user, f in users.items():
                for fn, arg in todo:  # warm (page cache, psycopg's prepared statements)
                    for _ in range(3):
                        got = fn(arg, f)
                out["rows"][f"{name}, {user}"] = len(got) if isinstance(got, list) else got.studies
                t0 = time.perf_counter()
                for _ in range(rounds):
                    for fn, arg in todo:
                        fn(arg, f)
                out["ms"][f"{name}, {user}"] = (time.perf_counter() - t0) * 1000 / (rounds * len(todo))
        if plans:
            import psycopg

            d = index.dialect
            out["plan"] = {}
            with psycopg.connect(url) as con:
                for user, f in users.items():
                    sql, params = compile_search(d, parse_query("study", [("limit", "100")]), f)
                    for _ in range(2):  # (the second: the session's catalog caches warm)
                        out["plan"][user] = [r[0] for r in con.execute("EXPLAIN (ANALYZE, COSTS OFF) "
                                                                       + d.sql(sql), params)]
    finally:
        index.close()
    return out


def build(server, n_studies: int) -> str:
    """The index with this tree's schema (the array form) in a database of its own; its URL."""
    import psycopg

    from benchmarks import scale_rows as sr

    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute("CREATE DATABASE rare_array")
    url = server.url.rsplit("/", 1)[0] + "/rare_array"
    with tempfile.TemporaryDirectory(prefix="dicomweb-rare-") as tmp:
        rows = sr.Rows(sr.template_record(Path(tmp) / "template"), 1)
        sr.load_postgresql(url, rows, n_studies)
    step = n_studies // N_RARE
    labels = [(COMMON, sr.study(n, 1).uid) for n in range(n_studies)]
    labels += [(RARE, sr.study(n, 1).uid) for n in range(step // 2, n_studies, step)][:N_RARE]
    with psycopg.connect(url, autocommit=True) as con:
        with con.cursor() as cur, cur.copy("COPY study_label (label, StudyInstanceUID) FROM STDIN") as copy:
            for r in labels:
                copy.write_row(r)
        assert con.execute("SELECT count(*) FROM study WHERE labels @> ARRAY[%s]::text[]", (RARE,)).fetchone()[0] \
            == N_RARE
    return url


FORMS = {
    "strpos": ["DROP INDEX study_labels", "ALTER TABLE study ALTER labels DROP DEFAULT",
               "ALTER TABLE study ALTER labels TYPE TEXT COLLATE \"C\" USING CASE WHEN cardinality(labels) = 0 "
               "THEN '' ELSE '\\' || array_to_string(labels, '\\') || '\\' END",
               "ALTER TABLE study ALTER labels SET DEFAULT ''"],
    "exists": ["ALTER TABLE study DROP COLUMN labels", "DELETE FROM schema_version WHERE version = 16",
               *[f"DROP TRIGGER {n} ON {t}" for n, t in (("study_label_added", "study_label"),
                                                         ("study_label_removed", "study_label"),
                                                         ("study_label_changed", "study_label"),
                                                         ("study_takes_labels", "study"))]],
}


def copies(server, url: str) -> dict[str, str]:
    import psycopg

    base = url.rsplit("/", 1)[0]
    urls = {"array": url}
    with psycopg.connect(server.url, autocommit=True) as con:
        for form in FORMS:
            con.execute(f"CREATE DATABASE rare_{form} TEMPLATE rare_array")
            urls[form] = f"{base}/rare_{form}"
    for form, statements in FORMS.items():
        with psycopg.connect(urls[form], autocommit=True) as con:
            for s in statements:
                con.execute(s)
    for u in urls.values():
        with psycopg.connect(u, autocommit=True) as con:
            con.execute("VACUUM FULL ANALYZE study")
            con.execute("VACUUM ANALYZE")
    return urls


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the three forms")
    ap.add_argument("--calls", type=int, default=5, help="repetitions of each call per round")
    ap.add_argument("--names", type=int, default=10, help="PatientName wildcard searches")
    ap.add_argument("--trees", nargs=3, required=True, help="exists=DIR strpos=DIR array=DIR")
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/label_rare.md"))
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # (the subprocess: URL)
    ap.add_argument("--plans", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name-list", help=argparse.SUPPRESS)
    if "--measure" in sys.argv:
        args, _ = ap.parse_known_args()
        print(json.dumps(measure(args.measure, args.calls, json.loads(args.name_list), args.plans)))
        return 0
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees)
    from benchmarks import scale_rows as sr
    from benchmarks.scale import loadavg
    from loadtests import common
    from tests.postgres import PostgresServer

    rnd = random.Random(11)
    names = [sr.study(rnd.randrange(args.studies), 1).patient_name.split("^")[0] for _ in range(args.names)]
    server = PostgresServer()
    t_start = time.time()
    try:
        t0 = time.perf_counter()
        urls = copies(server, build(server, args.studies))
        build_s = time.perf_counter() - t0
        before = loadavg()
        forms = ["exists", "strpos", "array"]
        ms: dict[str, dict[str, list[float]]] = {f: {} for f in forms}
        rows: dict[str, dict] = {}
        plans: dict[str, list[str]] = {}
        for r in range(args.rounds):
            for form in (forms if r % 2 == 0 else list(reversed(forms))):
                tree = str(Path(trees[form]).resolve())
                env = {**os.environ, "PYTHONPATH": tree}
                proc = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--trees", "x", "x", "x", "--measure", urls[form],
                     "--calls", str(args.calls), "--name-list", json.dumps(names), *(["--plans"] if r == 0 else [])],
                    env=env, cwd=tree, capture_output=True, text=True, check=True)
                got = json.loads(proc.stdout)
                for k, v in got["ms"].items():
                    ms[form].setdefault(k, []).append(v)
                rows[form] = got["rows"]
                if "plan" in got:
                    plans[form] = got["plan"]
                print(form, r, {k: round(v, 2) for k, v in got["ms"].items()}, file=sys.stderr, flush=True)
        after = loadavg()
    finally:
        server.stop()
    m = common.machine()
    out = [f"# A rare label on PostgreSQL, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
           f"Machine: {m['cpu_model']}, {m['nproc']} cores (shared with other engineers), Python {m['python']}. "
           f"Load average before: {before}; after: {after}. Build (and copies) {build_s:.0f} s; total "
           f"{time.time() - t_start:.0f} s.", "",
           f"Index: {args.studies:,} studies ({10 * args.studies:,} instances, benchmarks/scale_rows.py); label "
           f"`{RARE}` on {N_RARE} studies spread evenly, `{COMMON}` on every study. The index alone (no HTTP), "
           f"ms per call, median of {args.rounds} rounds (forms alternating), {args.calls} calls per round after "
           f"a warm-up; PatientName: {args.names} wildcard searches (`FAMILY*`).", "",
           f"    PYTHONPATH=. python benchmarks/label_rare.py --studies {args.studies} --rounds {args.rounds} "
           "--trees exists=<5de6d1a> strpos=<6bd537a> array=.", "",
           "Forms: (a) `exists` the EXISTS probe of study_label (5de6d1a); (b) `strpos` the text copy on the "
           "study row (6bd537a); (c) `array` the `text[]` copy with a GIN index, `&&` (this tree).", "",
           "| call, user | (a) exists | (b) strpos | (c) array | rows | c/a | c/b |", "|---|---|---|---|---|---|---|"]
    for k in ms["array"]:
        med = {f: statistics.median(ms[f][k]) for f in forms}
        out.append(f"| {k} | {med['exists']:.2f} | {med['strpos']:.2f} | {med['array']:.2f} | {rows['array'][k]} | "
                   f"{med['array'] / med['exists']:.2f} | {med['array'] / med['strpos']:.3f} |")
    same = all(rows[f] == rows["array"] for f in forms)
    out += ["", f"Same answers (rows/studies) in the three forms: {same}.", "",
            "Plans of `/studies?limit=100` (EXPLAIN ANALYZE, COSTS OFF, first round, the second execution in "
            "its session):", ""]
    for user in (RARE, COMMON):
        for f in forms:
            out += [f"- {f}, `{user}`:", "", *["      " + x for x in plans.get(f, {}).get(user, [])], ""]
    text = "\n".join(out) + "\n"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

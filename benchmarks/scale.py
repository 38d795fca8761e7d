"""QIDO-RS search latency and WADO-RS index look-up rate with 10k and 100k instances
in the index, SQLite vs PostgreSQL (issue 13, "Scale, measured").

The rows are inserted directly through ``Index.add`` in batches of 1000 (no files,
no HTTP): 10 instances per series, 1 series per study, patient names, IDs and
dates varied; every row carries one template's JSON (the index does not read it).
What is timed is the index only: ``search`` of typical QIDO-RS queries, and the
look-ups a WADO-RS instance / study retrieve makes (``locate``; ``instances`` +
``metadata`` of a study). HTTP, file reads and the event loop are not in it.

    PYTHONPATH=. python benchmarks/scale.py [--sizes 10000 100000] [--database-url URL]

Without --database-url a throw-away PostgreSQL is started as the tests do
(tests/postgres.py: fsync on, synchronous_commit on, shared_buffers 32 MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pydicom.uid import generate_uid

from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sqlite import SQLiteIndex

NAMES = ["DOE^JOHN", "ROE^JANE", "MILLER^ANNA", "SMITH^PAT", "NGUYEN^MAI", "GARCIA^LUIS"]


def template(tmp: Path):
    from tests.helpers import make_dataset

    ds = make_dataset(PatientName="Doe^John", PatientID="P0", StudyDate="20200101")
    path = tmp / "t.dcm"
    ds.save_as(path, enforce_file_format=True)
    return describe_instance(path)


def records(t, n: int, seed: int = 1):
    rnd = random.Random(seed)
    out = []
    for s in range(n // 10):
        study, series = generate_uid(), generate_uid()
        st = dict(t.study, StudyInstanceUID=study, PatientID=f"P{s}", PatientName=rnd.choice(NAMES) + f"^{s}",
                  StudyDate=f"20{rnd.randint(10, 24):02d}{rnd.randint(1, 12):02d}{rnd.randint(1, 28):02d}",
                  AccessionNumber=f"A{s}")
        se = dict(t.series, SeriesInstanceUID=series, Modality=rnd.choice(["CT", "MR", "US"]))
        for i in range(10):
            sop = generate_uid()
            out.append(dataclasses.replace(t, study_uid=study, series_uid=series, sop_uid=sop, study=st, series=se,
                                           instance=dict(t.instance, SOPInstanceUID=sop, InstanceNumber=i + 1),
                                           path=f"{study}/{series}/{sop}.dcm"))
    return out


QUERIES = {
    "study PatientID=P123 (exact)": ("study", [("PatientID", "P123")]),
    "study PatientName=MILLER* limit 100": ("study", [("PatientName", "MILLER*"), ("limit", "100")]),
    "study StudyDate range (1 month) limit 100": ("study", [("StudyDate", "20200101-20200131"), ("limit", "100")]),
    "series Modality=CT limit 100": ("series", [("Modality", "CT"), ("limit", "100")]),
    "study fuzzy PatientName=anna limit 100": ("study", [("PatientName", "anna"), ("fuzzymatching", "true"),
                                                         ("limit", "100")]),
    "study all, offset 5000 limit 100": ("study", [("limit", "100"), ("offset", "5000")]),
}


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(index, recs) -> dict:
    t0 = time.perf_counter()
    for i in range(0, len(recs), 1000):
        index.add(recs[i:i + 1000])
    load = time.perf_counter() - t0
    res = {"load_s": load}
    for name, (level, params) in QUERIES.items():
        q = parse_query(level, params)
        ms = timed(lambda q=q: index.search(q), 20)
        res[name] = (statistics.median(ms), max(ms))
    rnd = random.Random(2)
    sops = [r.sop_uid for r in rnd.sample(recs, min(2000, len(recs)))]
    t0 = time.perf_counter()
    for s in sops:
        index.locate(s)
    res["locate/s"] = len(sops) / (time.perf_counter() - t0)
    studies = [r.study_uid for r in rnd.sample(recs, min(300, len(recs)))]
    t0 = time.perf_counter()
    for s in studies:
        index.instances(s)
        index.metadata(s)
    res["study retrieve look-ups/s"] = len(studies) / (time.perf_counter() - t0)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--database-url")
    args = ap.parse_args()
    server = None
    url = args.database_url
    if url is None:
        from tests.postgres import PostgresServer

        server = PostgresServer()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t = template(Path(tmp))
            for n in args.sizes:
                recs = records(t, n)
                for kind in ("sqlite", "postgresql"):
                    if kind == "sqlite":
                        index = SQLiteIndex(Path(tmp) / f"{n}.sqlite")
                    else:
                        index = PostgreSQLIndex(url or server.fresh_url())  # type: ignore[union-attr]
                    try:
                        r = measure(index, recs)
                    finally:
                        index.close()
                    rows.append((n, kind, r))
                    print(n, kind, r, file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    print("| instances | index | load (s) | " + " | ".join(f"{k} ms (median / max)" for k in QUERIES)
          + " | locate/s | study look-ups/s |")
    print("|" + "---|" * (len(QUERIES) + 5))
    for n, kind, r in rows:
        print(f"| {n:,} | {kind} | {r['load_s']:.0f} | "
              + " | ".join(f"{r[k][0]:.1f} / {r[k][1]:.1f}" for k in QUERIES)
              + f" | {r['locate/s']:.0f} | {r['study retrieve look-ups/s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per instance of ``Index.add`` as the STOW-RS group commit calls it (issue 33):
batches of ``--batch`` new instances spread over ``--studies`` studies (one series
each, as wrk's threads send them), into a fresh SQLite index (or PostgreSQL with
``--pg URL``), ``time.process_time()`` per instance, best and median of the rounds.

    PYTHONPATH=DIR python benchmarks/index_add_cpu.py [--instances 2000] [--batch 4] [--studies 2] [--rounds 5]
        [--threads 1]

``--threads N``: the batches are added by N threads in turn (batch k by thread k % N, one at a
time), as the group commit's leader is whichever STOW-RS request's thread comes first.

Run it once per build (``PYTHONPATH``) to compare them; the records are described once,
before the clock starts (a new SOP Instance UID each)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydicom.uid import generate_uid

sys.path.append(str(Path(__file__).resolve().parents[1]))  # (PYTHONPATH first: the build measured)

from dicomweb_server.dicom.instance import describe_instance  # noqa: E402
from dicomweb_server.store.sqlite import SQLiteIndex  # noqa: E402
from tests.helpers import make_dataset  # noqa: E402


def records(folder: Path, n: int, studies: int) -> list:
    uids = [(generate_uid(), generate_uid()) for _ in range(studies)]
    out = []
    for k in range(n):
        study, series = uids[k % studies]
        ds = make_dataset(study=study, series=series, modality="MR", PatientID=f"P{k % studies}",
                          PatientName="Load^Test", InstanceNumber=k + 1)
        path = folder / f"{k}.dcm"
        ds.save_as(path, enforce_file_format=True)
        out.append(describe_instance(path))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--instances", type=int, default=2000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--studies", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pg")
    a = p.parse_args()
    per = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            folder = Path(tmp) / str(r)
            folder.mkdir()
            recs = records(folder, a.instances, a.studies)
            if a.pg:
                from dicomweb_server.store.postgresql import PostgreSQLIndex
                index = PostgreSQLIndex(a.pg)
            else:
                index = SQLiteIndex(folder / "index.sqlite")
            batches = [recs[i:i + a.batch] for i in range(0, len(recs), a.batch)]
            pools = [ThreadPoolExecutor(1) for _ in range(a.threads)]
            for pool in pools:  # each thread's connection opened before the clock starts
                pool.submit(index.count).result()
            t = time.process_time()
            for k, batch in enumerate(batches):
                assert all(x is True for x in pools[k % a.threads].submit(index.add, batch).result())
            per.append((time.process_time() - t) / len(recs) * 1e6)
            for pool in pools:
                pool.shutdown()
            index.close()
    print(f"index add: {a.instances} instances, batches of {a.batch}, {a.studies} studies, "
          f"{a.threads} thread(s): "
          f"best {min(per):.0f} us, median {statistics.median(per):.0f} us per instance "
          f"({', '.join(f'{x:.0f}' for x in per)})")


if __name__ == "__main__":
    main()

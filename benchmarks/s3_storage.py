"""What object storage costs per operation: the same archive (SQLite index, one worker)
with instances in ``data/blobs/`` and in an S3 bucket, in one run (issue 13, "Blobs").

The object store is moto's server (``moto_server``, a Python process on this machine:
the same 2 cores as the archive and the client), so the S3 numbers bound the overhead
from above: a real MinIO or S3 answers faster per request but over a network. The
S3 requests each operation makes are fixed by the code and asserted in
tests/store/test_s3.py (STOW-RS: one PUT per instance; an instance or a frame: one
ranged GET; a rendered picture adds a HEAD for the render cache's key).

    PYTHONPATH=. python benchmarks/s3_storage.py [--requests 200] [--clients 1 4]

Operations, each on its own new or stored MR 256x256 16-bit instance (~131 KB):
STOW-RS of one new instance per request, WADO-RS of one instance (as stored), WADO-RS
of frame 1. The client is httpx in threads (it tops out near 1,000 req/s: docs/performance.md), so only ratios in the same run mean anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.helpers import MR_IMAGE_STORAGE, free_port, make_dataset, multipart, to_bytes

AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_EC2_METADATA_DISABLED": "true"}


def _wait(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.1)


def _archive(data: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--index", "sqlite", "--workers", "1", "--port", str(port), "--dimse-port", "0",
                             *extra], env={**os.environ, **AWS, "DICOMWEB_LOG_LEVEL": "warning"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/studies?limit=1", proc, "the archive")
    return proc, url


def _timed(url: str, clients: int, jobs: list, run) -> dict:
    """Run ``run(client, job)`` for every job, ``clients`` threads; ops/s and latency."""
    lat: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    it = iter(jobs)

    def worker():
        with httpx.Client(base_url=url, timeout=60) as c:
            while not errors:
                with lock:
                    job = next(it, None)
                if job is None:
                    return
                t = time.perf_counter()
                try:
                    run(c, job)
                except BaseException as e:  # noqa: BLE001 - a wrong answer ends the row: reported below
                    errors.append(e)
                    return
                d = time.perf_counter() - t
                with lock:
                    lat.append(d)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"a request failed: {errors[0]!r}")
    lat.sort()
    return {"ops": len(lat), "ops_s": len(lat) / wall, "p50": statistics.median(lat) * 1000,
            "p95": lat[int(0.95 * (len(lat) - 1))] * 1000}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--out", default="benchmarks/results/s3_storage.md")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="s3bench-"))
    moto_port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)],
                            env={**os.environ, **AWS}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    moto_url = f"http://127.0.0.1:{moto_port}"
    rows = []
    size = len(to_bytes(make_dataset(sop_class=MR_IMAGE_STORAGE, modality="MR", rows=256, columns=256)))
    try:
        _wait(moto_url, moto, "moto")
        import boto3

        boto3.client("s3", endpoint_url=moto_url, **{k.lower(): v for k, v in AWS.items()
                                                   if k.startswith("AWS_ACCESS") or k.startswith("AWS_SECRET")},
                     region_name="us-east-1").create_bucket(Bucket="bench")
        for clients in args.clients:
            for name, extra in (("files", []), ("s3 (moto)", ["--storage", f"s3://bench/c{clients}",
                                                               "--s3-endpoint-url", moto_url])):
                proc, url = _archive(tmp / f"{name[:2]}-{clients}", extra)
                try:
                    study = make_dataset().StudyInstanceUID
                    datasets = [make_dataset(study=study, sop_class=MR_IMAGE_STORAGE, modality="MR", rows=256,
                                             columns=256) for _ in range(args.requests)]
                    bodies = [multipart([to_bytes(ds)]) for ds in datasets]
                    sizes = {ds.SOPInstanceUID: len(to_bytes(ds)) for ds in datasets}

                    def stow(c, job):
                        body, ctype = job
                        r = c.post("/studies", content=body, headers={"Content-Type": ctype})
                        assert r.status_code == 200, r.text

                    def instance(c, ds):
                        u = f"/studies/{study}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
                        r = c.get(u, headers={"Accept": "application/dicom; transfer-syntax=*"})
                        assert r.status_code == 200 and len(r.content) == sizes[ds.SOPInstanceUID]

                    def frame(c, ds):
                        u = f"/studies/{study}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}/frames/1"
                        r = c.get(u, headers={"Accept": 'multipart/related; type="application/octet-stream"'})
                        assert r.status_code == 200 and len(r.content) > 256 * 256 * 2

                    for op, jobs, fn in (("STOW-RS 1 instance", bodies, stow), ("WADO-RS instance", datasets, instance),
                                         ("WADO-RS frame", datasets, frame)):
                        load = os.getloadavg()[0]
                        res = _timed(url, clients, jobs, fn)
                        rows.append((op, clients, name, res, load))
                        print(op, clients, name, f"{res['ops_s']:.0f}/s p50 {res['p50']:.1f} ms load {load:.2f}",
                              flush=True)
                finally:
                    proc.terminate()
                    proc.wait(30)
    finally:
        moto.terminate()
        moto.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    by = {(op, c, n): r for op, c, n, r, _l in rows}
    lines = [
        "# Object storage vs files, one run (benchmarks/s3_storage.py)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores shared with other work; "
        f"archive: SQLite index, 1 worker; object store: moto's server (Python) on the same machine; "
        f"instances: MR 256x256 16-bit, about {size} bytes (a frame: 131072); {args.requests} requests per row; "
        "client: httpx threads. Load average (1 min) at the start of each row.",
        "",
        "| operation | clients | storage | ops/s | p50 ms | p95 ms | s3/files ops/s | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for op, c, n, r, load in rows:
        ratio = "" if n == "files" else f"{r['ops_s'] / by[(op, c, 'files')]['ops_s']:.2f}"
        lines.append(f"| {op} | {c} | {n} | {r['ops_s']:.0f} | {r['p50']:.1f} | {r['p95']:.1f} | {ratio} | {load:.2f} |")
    lines += ["", "S3 requests per operation (fixed by the code, asserted in tests/store/test_s3.py): STOW-RS one "
              "conditional PUT per instance (plus a streamed GET only for a duplicate); instance and frame one "
              "ranged GET each. moto is a Python server sharing the 2 cores: these ratios bound the cost "
              "from above on this machine and say nothing about MinIO or AWS latency.", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

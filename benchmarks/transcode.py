"""Transcode on retrieve (issue 30): encode cost per syntax for a 512x512 16-bit CT, and
WADO-RS frames per second of a transcoded frame, cold (cache off, a different instance
each request) and cached (one frame over and over), against a real server.

    python benchmarks/transcode.py [--seconds 5] [--instances 40] [--repeat 10] [--ingest 20]

Also the STOW-RS ingest rate and bytes stored per ``store_as`` (compress on ingest,
encoded and verified before the acknowledgement: policy/ingest.py).

Encode cost: policy/transcode.encode_native_frame in this process (the encoder alone)
and transcode_frame through the decode worker processes (what a request pays: the
native frame to the worker and the codestream back), median of --repeat. Retrieve
rate: one client, sequential requests (httpx), one server worker; a shared machine, so
compare rows of one run, not runs. Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dicomweb_server.policy import transcode  # noqa: E402
from tests.helpers import free_port, make_dataset, multipart, to_bytes  # noqa: E402

NAMES = {
    "1.2.840.10008.1.2.1": "Explicit VR LE (decode only)",
    "1.2.840.10008.1.2.4.80": "JPEG-LS Lossless",
    "1.2.840.10008.1.2.4.90": "JPEG 2000 Lossless",
    "1.2.840.10008.1.2.4.201": "HTJ2K Lossless",
    "1.2.840.10008.1.2.5": "RLE Lossless",
    "1.2.840.10008.1.2.4.91": "JPEG 2000 lossy (10:1)",
}
MEDIA = {"1.2.840.10008.1.2.4.80": "image/jls", "1.2.840.10008.1.2.4.90": "image/jp2",
         "1.2.840.10008.1.2.4.201": "image/jphc", "1.2.840.10008.1.2.5": "image/dicom-rle"}


def ct(seed: int):
    """A 512x512 CT, 12 bits stored in 16 (smooth anatomy-like pattern plus noise)."""
    rng = np.random.default_rng(seed)
    ds = make_dataset(rows=512, columns=512, BitsStored=12, HighBit=11, RescaleSlope="1", RescaleIntercept="-1024")
    yy, xx = np.mgrid[0:512, 0:512]
    img = 1000 + 800 * np.sin(xx / 17.0 + seed) * np.cos(yy / 23.0) + rng.normal(0, 30, (512, 512))
    ds.PixelData = img.clip(0, 4095).astype(np.uint16).tobytes()
    return ds


def encode_costs(repeat: int) -> list[tuple[str, float, float, int]]:
    ds = ct(1)
    native = ds.PixelData
    desc = {"Rows": 512, "Columns": 512, "SamplesPerPixel": 1, "BitsAllocated": 16, "BitsStored": 12,
            "PixelRepresentation": 0, "PhotometricInterpretation": "MONOCHROME2", "PlanarConfiguration": 0}
    header = ds
    rows = []
    for ts in NAMES:
        if ts == "1.2.840.10008.1.2.1":
            continue
        here, worker = [], []
        size = 0
        for _ in range(repeat):
            t = time.perf_counter()
            data, _ = transcode.encode_native_frame(native, desc, ts)
            here.append(time.perf_counter() - t)
            size = len(data)
            t = time.perf_counter()
            transcode.transcode_frame(header, native, "1.2.840.10008.1.2.1", ts)
            worker.append(time.perf_counter() - t)
        rows.append((NAMES[ts], statistics.median(here) * 1000, statistics.median(worker) * 1000, size))
    return rows


def ingest_costs(n: int) -> list[tuple[str, float, int]]:
    """STOW-RS of ``n`` 512x512 CTs (one request each, in-process server) without and
    with each ``store_as``: instances per second and bytes stored."""
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app
    from dicomweb_server.archive import Archive
    from dicomweb_server.settings import Settings

    rows = []
    for value in (None, "jpeg-ls-lossless", "j2k-lossless", "rle-lossless"):
        work = Path(tempfile.mkdtemp())
        extra = {}
        if value:
            (work / "routes.toml").write_text(f'[[store_as]]\nstore_as = "{value}"\n')
            extra["routes_file"] = work / "routes.toml"
        archive = Archive.open(Settings(data_dir=work / "data", index="sqlite", **extra))
        bodies = [multipart([to_bytes(ct(100 + i))]) for i in range(n)]
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            c.post("/studies", content=multipart([to_bytes(ct(99))])[0],
                   headers={"Content-Type": bodies[0][1]})  # warm-up (decode workers)
            t = time.perf_counter()
            for body, ctype in bodies:
                assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
            elapsed = time.perf_counter() - t
        stored = sum(f.stat().st_size for f in (work / "data").rglob("*.dcm"))
        archive.close()
        rows.append((value or "as received", n / elapsed, stored))
    return rows


def start(data: Path, cache: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}
    if not cache:
        env["DICOMWEB_TRANSCODE_CACHE_BYTES"] = "0"
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--workers", "1", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(url + "/studies?limit=1", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def rate(url: str, paths: list[str], accept: str, seconds: float) -> float:
    n = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get(paths[0], headers={"Accept": accept}).status_code == 200  # warm-up (workers, cache)
        end = time.perf_counter() + seconds
        t0 = time.perf_counter()
        while time.perf_counter() < end:
            r = c.get(paths[n % len(paths)], headers={"Accept": accept})
            assert r.status_code == 200, r.text
            n += 1
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--instances", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--ingest", type=int, default=20, help="instances stored per store_as value")
    args = ap.parse_args()

    print("## Encode cost, 512x512 16-bit CT (12 bits stored), one frame\n")
    print("| syntax | encoder alone, ms | through a decode worker, ms | codestream bytes | ratio |")
    print("|---|---|---|---|---|")
    for name, here, worker, size in encode_costs(args.repeat):
        print(f"| {name} | {here:.1f} | {worker:.1f} | {size:,} | {512 * 512 * 2 / size:.2f} |")

    print(f"\n## STOW-RS ingest, {args.ingest} CTs 512x512 one per request, in-process server\n")
    print("| store_as | instances/s | bytes stored (incl. the warm-up instance) |")
    print("|---|---|---|")
    for name, per_s, size in ingest_costs(args.ingest):
        print(f"| {name} | {per_s:.1f} | {size:,} |")

    work = Path(tempfile.mkdtemp())
    data = work / "data"
    proc, url = start(data, True)
    items = [ct(i) for i in range(args.instances)]
    with httpx.Client(base_url=url, timeout=120) as c:
        for i in range(0, len(items), 20):
            body, ctype = multipart([to_bytes(ds) for ds in items[i : i + 20]])
            assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    proc.terminate()
    proc.wait()
    paths = [f"/studies/{d.StudyInstanceUID}/series/{d.SeriesInstanceUID}/instances/{d.SOPInstanceUID}/frames/1"
             for d in items]
    rows = []
    for cache in (False, True):
        proc, url = start(data, cache)
        try:
            if not cache:
                rows.append(("as stored (octet-stream)", "-",
                             rate(url, paths, "multipart/related; type=application/octet-stream", args.seconds)))
            for ts, media in MEDIA.items():
                subset = paths if not cache else paths[:1]
                rows.append((NAMES[ts], "cached" if cache else "cold",
                             rate(url, subset, f'multipart/related; type="{media}"', args.seconds)))
        finally:
            proc.terminate()
            proc.wait()
    print(f"\n## WADO-RS frame retrieve, uncompressed CT stored, 1 client, 1 worker, {args.seconds:g} s each\n")
    print("| frames asked as | cache | frames/s |")
    print("|---|---|---|")
    for name, cache, rps in rows:
        print(f"| {name} | {cache} | {rps:,.0f} |")


if __name__ == "__main__":
    main()

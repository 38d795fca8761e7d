"""Rendered JPEG requests per second for a 512x512 16-bit CT and a 256x256 MR,
cache miss and cache hit, measured with wrk (C) against a real server.

    python benchmarks/rendered.py [--seconds 10] [--connections 8] [--workers 2] [--kinds CT,MR,CTJ2K]

Cache miss: wrk cycles through 200 different instances with the render cache off
(DICOMWEB_RENDER_CACHE_BYTES=0), so every request reads, decodes, windows and
encodes. Cache hit: one instance requested over and over with the default cache.
Needs wrk (apt-get install wrk). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import free_port, make_dataset, multipart, to_bytes  # noqa: E402

LUA = """
local paths = {}
for line in io.lines(os.getenv("PATHS")) do paths[#paths + 1] = line end
local i = 0
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i], {["Accept"] = "image/jpeg"})
end
"""


def make_instances(kind: str, n: int) -> list:
    """CT 512x512, MR 256x256 (16-bit native); CTJ2K: the CT as JPEG 2000 Lossless
    (decoded in the isolated decode worker processes)."""
    if kind == "CTJ2K":
        from pydicom.uid import JPEG2000Lossless

        items = make_instances("CT", n)
        for ds in items:
            ds.compress(JPEG2000Lossless, encoding_plugin="pylibjpeg")
        return items
    rng = np.random.default_rng(7)
    size = 512 if kind == "CT" else 256
    out = []
    for _ in range(n):
        ds = make_dataset(rows=size, columns=size, modality=kind,
                          sop_class="1.2.840.10008.5.1.4.1.1.2" if kind == "CT" else "1.2.840.10008.5.1.4.1.1.4",
                          WindowCenter="40" if kind == "CT" else "600", WindowWidth="400" if kind == "CT" else "1200",
                          RescaleSlope="1", RescaleIntercept="-1024" if kind == "CT" else "0")
        yy, xx = np.mgrid[0:size, 0:size]
        img = (1000 + 800 * np.sin(xx / 17.0) * np.cos(yy / 23.0) + rng.normal(0, 30, (size, size)))
        ds.PixelData = img.clip(0, 4095).astype(np.uint16).tobytes()
        out.append(ds)
    return out


def start(data: Path, workers: int, cache: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}
    if not cache:
        env["DICOMWEB_RENDER_CACHE_BYTES"] = "0"
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--workers", str(workers), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(url + "/studies?limit=1", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def wrk(url: str, paths: list[str], seconds: int, connections: int, workdir: Path) -> float:
    (workdir / "paths.txt").write_text("\n".join(paths) + "\n")
    (workdir / "r.lua").write_text(LUA)
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(workdir / "r.lua"), url],
                         env={**os.environ, "PATHS": str(workdir / "paths.txt")}, capture_output=True, text=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("Requests/sec"))
    errors = [ln for ln in out.splitlines() if "Non-2xx" in ln or "Socket errors" in ln]
    if errors:
        raise RuntimeError(errors)
    return float(line.split()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kinds", default="CT,MR", help="comma-separated: CT, MR, CTJ2K")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    work = Path(tempfile.mkdtemp())
    data = work / "data"
    paths: dict[str, list[str]] = {}
    proc, url = start(data, 1, True)
    with httpx.Client(base_url=url, timeout=120) as c:
        for kind in kinds:
            items = make_instances(kind, 200)
            for i in range(0, len(items), 50):
                body, ctype = multipart([to_bytes(ds) for ds in items[i : i + 50]])
                assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
            paths[kind] = [f"/studies/{d.StudyInstanceUID}/series/{d.SeriesInstanceUID}/instances/"
                           f"{d.SOPInstanceUID}/rendered" for d in items]
    proc.terminate()
    proc.wait()
    rows = []
    for cache in (False, True):
        proc, url = start(data, args.workers, cache)
        try:
            for kind in kinds:
                subset = paths[kind] if not cache else paths[kind][:1]
                httpx.get(url + subset[0], timeout=30)  # warm up
                rows.append((kind, "hit" if cache else "miss", wrk(url, subset, args.seconds, args.connections, work)))
        finally:
            proc.terminate()
            proc.wait()
    print(f"| image | cache | rendered JPEG req/s ({args.connections} connections, {args.workers} workers) |")
    print("|---|---|---|")
    for kind, cache, rps in rows:
        label = {"CT": "CT 512x512 16-bit", "MR": "MR 256x256 16-bit",
                 "CTJ2K": "CT 512x512 16-bit JPEG 2000 Lossless"}[kind]
        print(f"| {label} | {cache} | {rps:,.0f} |")


if __name__ == "__main__":
    main()

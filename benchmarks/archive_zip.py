"""A ~2 GB study downloaded as a ZIP (``GET /studies/{study}/archive``, issue 29):
the server's peak RSS while it streams, against its RSS before, and the download's
MB/s. The study: ``--instances`` multi-frame CT instances of ``--frames`` 512x512
16-bit frames each (default 10 x 400 frames = 10 x 210 MB), made with pydicom and
stored one STOW-RS request each into a server in its own process (``serve
--workers 1``, SQLite index).

    PYTHONPATH=. python benchmarks/archive_zip.py [--instances 10] [--frames 400] [--out FILE]

The ZIP is written to a temporary file by this client (not the server) and checked
afterwards: zipfile's CRC-32 test of every member, and the DICOMDIR's record count.
Then, for comparison, the ZIP once more and WADO-RS's study retrieve of the same files
(as stored), each read and dropped by the client.
RSS is sampled every 20 ms (the server process and its children, psutil).
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import shutil
import tempfile
import threading
import time
import zipfile

import httpx
import numpy as np
import psutil
import pydicom
from pydicom.uid import generate_uid

from tests.helpers import make_dataset, multipart, serve_process, to_bytes

SIDE = 512


def _rss(pid: int) -> int:
    p = psutil.Process(pid)
    return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss(self.pid))
            time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=10)
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--out", type=pathlib.Path, help="append the result (markdown) to this file")
    args = ap.parse_args()
    code = str(pathlib.Path(__file__).resolve().parent.parent)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="archive-zip-"))
    proc, url = serve_process(tmp / "data", code)
    try:
        study, series = generate_uid(), generate_uid()
        frame = (np.arange(SIDE * SIDE, dtype=np.uint16) % 4096).tobytes()
        stored = 0
        t0 = time.monotonic()
        for i in range(args.instances):
            ds = make_dataset(study=study, series=series, rows=SIDE, columns=SIDE, frames=1, InstanceNumber=i + 1,
                              SeriesNumber=1, StudyTime="120000", StudyID="1")
            ds.NumberOfFrames = args.frames
            ds.PixelData = frame * args.frames
            data = to_bytes(ds)
            del ds
            body, ctype = multipart([data])
            stored += len(data)
            del data
            r = httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=600)
            assert r.status_code == 200, r.text
            del body
        store_s = time.monotonic() - t0
        time.sleep(1)
        before = _rss(proc.pid)
        sampler = Sampler(proc.pid)
        sampler.start()
        zpath = tmp / "study.zip"
        got = 0
        t0 = time.monotonic()
        first = None
        with httpx.stream("GET", f"{url}/studies/{study}/archive", timeout=600) as r, open(zpath, "wb") as f:
            assert r.status_code == 200, r.read()
            for piece in r.iter_raw():
                if first is None:
                    first = time.monotonic() - t0
                got += len(piece)
                f.write(piece)
        seconds = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        after = _rss(proc.pid)
        with zipfile.ZipFile(zpath) as zf:
            bad = zf.testzip()
            names = zf.namelist()
            records = pydicom.dcmread(io.BytesIO(zf.read("DICOMDIR"))).DirectoryRecordSequence
        images = sum(r.DirectoryRecordType == "IMAGE" for r in records)
        zpath.unlink()
        # for comparison, read and dropped by the client: the ZIP again, and WADO-RS's study
        # retrieve as stored (multipart/related, the same files)
        rates = {}
        for name, path, accept in (
                ("ZIP, dropped by the client", f"/studies/{study}/archive", "*/*"),
                ("WADO-RS study retrieve as stored", f"/studies/{study}",
                 'multipart/related; type="application/dicom"; transfer-syntax=*')):
            n, t1 = 0, time.monotonic()
            with httpx.stream("GET", url + path, headers={"Accept": accept}, timeout=600) as resp:
                assert resp.status_code == 200
                for piece in resp.iter_raw():
                    n += len(piece)
            rates[name] = f"{n / 1e6 / (time.monotonic() - t1):.0f} MB/s"
        assert bad is None and len(names) == args.instances + 1 and images == args.instances
        lines = [
            f"## archive_zip: {args.instances} instances x {args.frames} frames of {SIDE}x{SIDE} 16-bit "
            f"({stored / 1e9:.2f} GB stored), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            "",
            f"- machine: {os.cpu_count()} cores, shared (other sessions' tests running: state of the load "
            f"{os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f} / {os.getloadavg()[2]:.1f}, 1/5/15 min)",
            f"- stored by STOW-RS (one instance per request) in {store_s:.1f} s",
            f"- ZIP: {got / 1e9:.3f} GB in {seconds:.1f} s = {got / 1e6 / seconds:.0f} MB/s "
            f"(first byte after {first * 1000:.0f} ms), {len(names)} members, CRC-32 of each checked, "
            f"DICOMDIR lists {images} IMAGE records",
            "- for comparison: " + "; ".join(f"{k} {v}" for k, v in rates.items()),
            f"- server RSS (process and children): {before / 1e6:.1f} MB before, peak {sampler.peak / 1e6:.1f} MB "
            f"while streaming (+{(sampler.peak - before) / 1e6:.1f} MB), {after / 1e6:.1f} MB after",
            "",
        ]
        text = "\n".join(lines)
        print(text)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

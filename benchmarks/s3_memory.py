"""Peak memory of one large object PUT and one streamed GET through store/s3.py
(``S3BlobStore._put`` as ``place`` uses it; ``S3Reader.iter_range`` as a large
instance retrieve uses it), against moto's server in its own process.

    PYTHONPATH=. python benchmarks/s3_memory.py [--mb 300]

Prints this process's peak RSS (ru_maxrss) before and after each: a body read whole
into memory would raise it by the object's size.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from dicomweb_server.store.s3 import S3BlobStore
from tests.helpers import free_port


def peak_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300)
    args = ap.parse_args()
    os.environ.update({"AWS_ACCESS_KEY_ID": "m", "AWS_SECRET_ACCESS_KEY": "m", "AWS_DEFAULT_REGION": "us-east-1"})
    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="s3mem-"))
    try:
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        store = S3BlobStore(tmp, "s3://memtest/p", endpoint_url=f"http://127.0.0.1:{port}")
        store.client.create_bucket(Bucket="memtest")
        big = tmp / "big"
        with open(big, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        print(f"peak RSS before: {peak_mb()} MB")
        store._put(big, store.key("a/b/c.dcm"), conditional=True)
        print(f"peak RSS after a {args.mb} MB PUT: {peak_mb()} MB")
        reader = store.source("a/b/c.dcm").open("rb", size=args.mb << 20)
        n = sum(len(piece) for piece in reader.iter_range(0, None))
        assert n == args.mb << 20
        print(f"peak RSS after a {args.mb} MB streamed GET: {peak_mb()} MB")
    finally:
        moto.terminate()
        moto.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

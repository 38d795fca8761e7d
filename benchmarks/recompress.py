"""Compress before or after the acknowledgement (issue 30): STOW-RS ingest rate of 512x512
16-bit CTs (one per request, in-process server, SQLite) under one ``[[store_as]]`` rule with
``when = "before_ack"`` and ``when = "after_ack"``, the time the background pass then takes
to re-encode what arrived (policy/recompress.py), and the bytes stored at the end.

    python benchmarks/recompress.py [--instances 30] [--store-as jpeg-ls-lossless]

A shared machine: compare the rows of one run, not runs. Prints Markdown.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.transcode import ct  # noqa: E402
from tests.helpers import multipart, to_bytes  # noqa: E402


def measure(when: str, n: int, value: str) -> tuple[float, float | None, int, int]:
    """(instances/s acknowledged, background re-encoding instances/s or None, bytes received,
    bytes stored at the end)."""
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app
    from dicomweb_server.archive import Archive
    from dicomweb_server.jobs import run_inline
    from dicomweb_server.settings import Settings

    work = Path(tempfile.mkdtemp())
    (work / "routes.toml").write_text(f'[[store_as]]\nstore_as = "{value}"\nwhen = "{when}"\n')
    archive = Archive.open(Settings(data_dir=work / "data", index="sqlite", routes_file=work / "routes.toml"))
    parts = [to_bytes(ct(100 + i)) for i in range(n)]
    bodies = [multipart([p]) for p in parts]
    background = None
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            warm, ctype = multipart([to_bytes(ct(99))])
            c.post("/studies", content=warm, headers={"Content-Type": ctype})  # the decode workers started
            t = time.perf_counter()
            for body, ctype in bodies:
                assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
            acked = n / (time.perf_counter() - t)
        if when == "after_ack":  # the pass the server makes every few seconds, timed alone
            t = time.perf_counter()
            result, _ = run_inline("recompress", {"after_ack": True, "quiet": 0}, archive)
            background = result["done"] / (time.perf_counter() - t)
        stored = sum(f.stat().st_size for f in (work / "data" / "blobs").rglob("*.dcm"))
    finally:
        archive.close()
    return acked, background, sum(len(p) for p in parts) + len(to_bytes(ct(99))), stored


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=30)
    ap.add_argument("--store-as", dest="store_as", default="jpeg-ls-lossless")
    args = ap.parse_args()
    print(f"## STOW-RS of {args.instances} CTs 512x512 (16-bit, 12 stored), one per request; "
          f'store_as = "{args.store_as}"\n')
    print("| when | acknowledged instances/s | background re-encoding instances/s | bytes received | bytes stored |")
    print("|---|---|---|---|---|")
    for when in ("before_ack", "after_ack"):
        acked, background, received, stored = measure(when, args.instances, args.store_as)
        print(f"| {when} | {acked:.1f} | {'-' if background is None else f'{background:.1f}'} | "
              f"{received:,} | {stored:,} |")


if __name__ == "__main__":
    main()

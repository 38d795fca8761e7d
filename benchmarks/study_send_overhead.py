"""Python CPU of a whole-study answer without the socket: the app called as ASGI,
its body messages dropped, over the studies of an existing archive folder. What it
measures is the app's own work per answer (index look-up, opening/mapping or reading
the files, thread hops, the middleware per body message), not the kernel's socket copy.

    python benchmarks/study_send_overhead.py DATA_DIR [N_STUDIES] [ROUNDS]

Run with a code tree on PYTHONPATH to measure another build. Prints CPU ms per answer
(process time: every thread), body messages per answer and bytes per answer."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings

ACCEPT = b'multipart/related; type="application/dicom"; transfer-syntax=*'


async def get(app, path: str, stats: dict) -> None:
    done = {"request": False}

    async def receive():
        if not done["request"]:
            done["request"] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()

    async def send(message):
        if message["type"] == "http.response.body":
            stats["messages"] += 1
            stats["bytes"] += len(message.get("body", b""))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench"), (b"accept", ACCEPT)], "client": ("127.0.0.1", 1),
             "server": ("bench", 80)}
    await app(scope, receive, send)


async def main(data_dir: Path, n: int, rounds: int) -> None:
    archive = Archive.open(Settings(data_dir=data_dir, index="sqlite"))
    app = create_app(archive.settings, archive=archive)
    import sqlite3
    con = sqlite3.connect(f"file:{data_dir}/index.sqlite?mode=ro", uri=True)
    studies = [r[0] for r in con.execute("SELECT StudyInstanceUID FROM study ORDER BY pk LIMIT ?", (n,))]
    con.close()
    stats = {"messages": 0, "bytes": 0}
    for s in studies:  # warm: page cache, imports
        await get(app, f"/studies/{s}", stats)
    stats = {"messages": 0, "bytes": 0}
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        for s in studies:
            await get(app, f"/studies/{s}", stats)
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    k = rounds * len(studies)
    print(f"{k} answers: CPU {1000 * cpu / k:.3f} ms/answer (wall {1000 * wall / k:.3f} ms), "
          f"{stats['messages'] / k:.1f} body messages/answer, {stats['bytes'] / k / 1e6:.2f} MB/answer")
    archive.close()


if __name__ == "__main__":
    import os

    if os.environ.get("READ_BATCH"):  # e.g. READ_BATCH=4194304: bytes read per thread hop
        from dicomweb_server import retrieve

        retrieve.READ_BATCH = int(os.environ["READ_BATCH"])
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40,
                     int(sys.argv[3]) if len(sys.argv) > 3 else 5))

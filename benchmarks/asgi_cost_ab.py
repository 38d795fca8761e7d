"""CPU per request of the app itself, without the HTTP server and the network: two or
more builds side by side, alternating (issue 33, the hot path).

Each round, for each ``--code DIR`` in turn (the first one alternating), a fresh process
(``PYTHONPATH=DIR``) opens an archive (sqlite, a temporary folder), builds the app with
``create_app`` and calls it directly as an ASGI app (a scope, one ``http.request``
message, a ``send`` that keeps the status) from ``--tasks`` concurrent tasks, like
connections: STOW-RS of the capacity runner's 256x256 MR image (a new SOP Instance UID
per request; the file and folder fsyncs and the index commit included), then WADO-RS
instance, WADO-RS frames, WADO-RS rendered (image/jpeg; the render cache is the
environment's ``DICOMWEB_RENDER_CACHE_BYTES``: 0 times the rendering) and QIDO-RS of what it
stored. CPU = the process's
``time.process_time()`` (every thread) / requests, per batch (50 STOW-RS, 100 reads);
the best batch and the lower quartile are the figures least disturbed by other work on a
shared machine (as ``timeit`` takes the minimum). No uvicorn, no wrk, no network: it
measures what a change of the app's request path saves, not the server's capacity.

    python benchmarks/asgi_cost_ab.py --code BASE --code NEW [--rounds 5] [--stow 300] [--reads 1500]
        [--tasks 8] [--output FILE.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


async def _call(app, method: str, path: str, query: bytes, headers: list, body: bytes) -> int:
    sent = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive():
        if sent:
            return sent.pop()
        await asyncio.get_running_loop().create_future()  # no disconnect: waits until cancelled

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080),
             "state": {}}
    await app(scope, receive, send)
    return status


async def _run(app, requests: list, tasks: int, batch: int) -> tuple[list[float], int]:
    """CPU seconds per request of this process while ``tasks`` coroutines share each
    batch of ``batch`` requests, one figure per batch; errors."""
    bad = 0
    per: list[float] = []

    async def worker(todo):
        nonlocal bad
        for method, path, query, headers, body in todo:
            status = await _call(app, method, path, query, headers, body)
            bad += not 200 <= status < 300

    for start in range(0, len(requests), batch):
        todo = iter(requests[start:start + batch])
        t0 = time.process_time()
        await asyncio.gather(*(worker(todo) for _ in range(tasks)))
        per.append((time.process_time() - t0) / len(requests[start:start + batch]))
    return per, bad


def child(stow_n: int, reads: int, tasks: int) -> None:
    """In the process of one build (its folder: the working directory): the measurements,
    one JSON line on stdout."""
    sys.path.insert(0, os.getcwd())  # that build's code, not this file's
    from loadtests import dataset

    from dicomweb_server.app import create_app
    from dicomweb_server.archive import Archive
    from dicomweb_server.settings import Settings

    data, (st_ph, se_ph, sop_ph) = dataset.stow_template(256)
    head = f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    tail = f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode()
    ctype = f'multipart/related; type="application/dicom"; boundary={dataset.STOW_BOUNDARY}'.encode()
    study, series = "2.25.9" + "1" * 38, "2.25.9" + "2" * 38
    data = data.replace(st_ph.encode(), study.encode()).replace(se_ph.encode(), series.encode())
    host = [(b"host", b"127.0.0.1:8080")]

    def sop_of(k: int) -> str:
        return f"2.25.8{os.getpid():07d}{k:031d}"  # 44 characters, as the placeholder

    def stow(k: int) -> tuple:
        body = head + data.replace(sop_ph.encode(), sop_of(k).encode()) + tail
        return ("POST", "/studies", b"", host + [(b"content-type", ctype), (b"accept", b"application/dicom+json"),
                                                (b"content-length", str(len(body)).encode())], body)

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        archive = Archive.open(Settings(data_dir=tmp, index="sqlite"))
        try:
            app = create_app(archive.settings, archive=archive)

            async def main():
                await _run(app, [stow(k) for k in range(20)], tasks, 20)  # warm
                out["stow"] = await _run(app, [stow(k) for k in range(20, 20 + stow_n)], tasks, 50)
                sops = [sop_of(k) for k in range(20, 20 + min(200, stow_n))]
                inst = [f"/studies/{study}/series/{series}/instances/{s}" for s in sops]
                accept = {"wado": b'multipart/related; type="application/dicom"; transfer-syntax=*',
                          "frames": b'multipart/related; type="application/octet-stream"; transfer-syntax=*',
                          "rendered": b"image/jpeg", "qido": b"application/dicom+json"}
                paths = {"wado": [(p, b"") for p in inst], "frames": [(p + "/frames/1", b"") for p in inst],
                         "rendered": [(p + "/rendered", b"") for p in inst],
                         "qido": [("/studies", b"PatientID=" + dataset.STOW_PATIENT_ID.encode()),
                                  (f"/studies/{study}/series", b""), (f"/studies/{study}/instances", b"limit=10")]}
                for op, ps in paths.items():
                    reqs = [("GET", *ps[i % len(ps)], host + [(b"accept", accept[op])], b"") for i in range(reads)]
                    await _run(app, reqs[:100], tasks, 100)  # warm
                    out[op] = await _run(app, reqs, tasks, 100)

            asyncio.run(main())
        finally:
            archive.close()
    print("RESULT " + json.dumps(out), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--code", type=pathlib.Path, action="append")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--stow", type=int, default=300)
    p.add_argument("--reads", type=int, default=1500)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--output", type=pathlib.Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.stow, a.reads, a.tasks)
        return 0
    codes = a.code or [ROOT]
    rows = []
    for rnd in range(a.rounds):
        for code in (codes[::-1] if rnd % 2 else codes):
            env = {**os.environ, "PYTHONPATH": str(code), "DICOMWEB_LOG_LEVEL": "warning"}
            proc = subprocess.run([sys.executable, __file__, "--child", "--stow", str(a.stow), "--reads", str(a.reads),
                                   "--tasks", str(a.tasks)], env=env, cwd=code, capture_output=True, text=True,
                                  timeout=1200)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{code}: {proc.stderr[-2000:]}")
            load = " ".join(open("/proc/loadavg").read().split()[:3])
            for op, (per, bad) in json.loads(line[7:]).items():
                us = sorted(x * 1e6 for x in per)
                r = {"round": rnd + 1, "code": code.name, "op": op, "batches": len(us), "best": round(us[0], 1),
                     "q1": round(us[len(us) // 4], 1), "median": round(statistics.median(us), 1), "errors": bad,
                     "load": load}
                rows.append(r)
                print(json.dumps(r), flush=True)
    lines = ["| code | op | rounds | best batch, µs/request: median of rounds (range) | "
             "lower quartile of batches: median of rounds | batch median: median of rounds | errors |",
             "|---|---|---|---|---|---|---|"]
    for code in codes:
        for op in ("stow", "wado", "frames", "rendered", "qido"):
            mine = [r for r in rows if r["code"] == code.name and r["op"] == op]
            if mine:
                best = [r["best"] for r in mine]
                lines.append(f"| {code.name} | {op} | {len(mine)} | {statistics.median(best):.0f} "
                             f"({min(best):.0f}-{max(best):.0f}) | {statistics.median(r['q1'] for r in mine):.0f} | "
                             f"{statistics.median(r['median'] for r in mine):.0f} | {sum(r['errors'] for r in mine)} |")
    lines += ["", "| round | code | op | batches | best µs/request | lower quartile | median | errors | load after |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['code']} | {r['op']} | {r['batches']} | {r['best']} | {r['q1']} | {r['median']} | "
              f"{r['errors']} | {r['load']} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.output:
        a.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

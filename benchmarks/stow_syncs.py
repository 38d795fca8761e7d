"""Sync calls per STOW-RS instance (issue 11): ``strace -f -c`` on the archive's
worker processes while N clients store ``--requests`` new 256x256 MR images (the
capacity runner's STOW-RS body, 132.5 KB, a new SOP Instance UID each).

Two placements of the new instances: ``client`` (each client its own study and
series, as the wrk runner sends) and ``request`` (a new study and series for every
request: every instance needs new folders in a study/series layout).

    python benchmarks/stow_syncs.py [--clients 4,8] [--requests 200] [--workers 2]
        [--code DIR] [--output FILE.md]

``--code DIR`` runs the server from another checkout (e.g. ``git archive`` of an older
commit unpacked in DIR) to compare before/after in one run. Counts are what the
server's processes called; the load average (``/proc/loadavg``) is printed with each row.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import psutil

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from loadtests import dataset  # noqa: E402
from tests.helpers import free_port  # noqa: E402

SYSCALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs", "mkdir", "mkdirat", "link", "linkat",
            "rename", "renameat2", "unlink", "unlinkat", "openat", "flock")
SHOWN = ("fsync", "fdatasync", "sync_file_range", "mkdir", "linkat", "openat", "unlink", "flock")


def _bodies(n: int, clients: int, placement: str) -> list[list[bytes]]:
    data, (ph_study, ph_series, ph_sop) = dataset.stow_template(256)
    head = f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    tail = f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode()
    per: list[list[bytes]] = [[] for _ in range(clients)]
    ids = {c: (dataset.fixed_length_uid(), dataset.fixed_length_uid()) for c in range(clients)}
    for i in range(n):
        c = i % clients
        study, series = ids[c] if placement == "client" else (dataset.fixed_length_uid(), dataset.fixed_length_uid())
        body = data.replace(ph_study.encode(), study.encode()).replace(ph_series.encode(), series.encode())
        body = body.replace(ph_sop.encode(), dataset.fixed_length_uid().encode())
        per[c].append(head + body + tail)
    return per


def _post_all(url: str, per_client: list[list[bytes]]) -> tuple[int, float]:
    ctype = f'multipart/related; type="application/dicom"; boundary={dataset.STOW_BOUNDARY}'
    ok = [0] * len(per_client)

    def run(k: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            for body in per_client[k]:
                r = c.post("/studies", content=body, headers={"Content-Type": ctype})
                if r.status_code == 200:
                    ok[k] += 1

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(per_client))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return sum(ok), time.monotonic() - t0


def _parse_strace(text: str) -> dict[str, int]:
    counts = {}
    for line in text.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


def _commits(url: str) -> float | None:
    """dicomweb_index_commits_total from /metrics (None for a build without it)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(r"^dicomweb_index_commits_total\s+([\d.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def measure(code: pathlib.Path, clients: int, requests: int, workers: int, placement: str,
            trace: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="stow-syncs-") as tmp:
        port = free_port()
        env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning", "PYTHONPATH": str(code)}
        srv = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", tmp,
                                "--port", str(port), "--workers", str(workers), "--dimse-port", "0"],
                               env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(url + "/studies?limit=1", timeout=1)
                    break
                except httpx.HTTPError:
                    if srv.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("server did not start")
                    time.sleep(0.1)
            _post_all(url, _bodies(4 * clients, clients, placement))  # warm: connections, first folders
            pids = [p.pid for p in psutil.Process(srv.pid).children(recursive=True)] or [srv.pid]
            out = pathlib.Path(tmp) / "strace.txt"
            args = ["strace", "-f", "-c", "-o", str(out), "-e", "trace=" + ",".join(SYSCALLS)]
            for p in pids:
                args += ["-p", str(p)]
            commits0 = _commits(url)
            st = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if trace else None
            time.sleep(1.0)  # attached
            ok, secs = _post_all(url, _bodies(requests, clients, placement))
            load = open("/proc/loadavg").read().split()[:3]
            counts = {}
            if st is not None:
                st.send_signal(signal.SIGINT)
                st.wait(30)
                counts = _parse_strace(out.read_text())
            commits1 = _commits(url)
        finally:
            os.killpg(srv.pid, signal.SIGTERM)
            try:
                srv.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(srv.pid, signal.SIGKILL)
    commits = commits1 - commits0 if commits0 is not None and commits1 is not None else None
    return {"clients": clients, "placement": placement, "stored": ok, "seconds": round(secs, 2),
            "loadavg": " ".join(load), "counts": counts, "commits": commits, "traced": trace}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="4,8")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--placement", default="client,request")
    p.add_argument("--code", type=pathlib.Path, action="append",
                   help="checkout(s) to run the server from (default: this one); repeat to compare")
    p.add_argument("--output", type=pathlib.Path)
    p.add_argument("--no-strace", action="store_true",
                   help="count only the index commits (/metrics): strace's stops slow the server down")
    a = p.parse_args()
    codes = a.code or [pathlib.Path(__file__).resolve().parents[1]]
    rows = []
    for placement in a.placement.split(","):
        for c in [int(x) for x in a.clients.split(",")]:
            for code in codes:  # taking turns, so drifting load hits each alike
                r = measure(code.resolve(), c, a.requests, a.workers, placement, not a.no_strace)
                r["code"] = str(code)
                rows.append(r)
                print(r, file=sys.stderr, flush=True)
    head = ["code", "placement", "clients", "strace", "stored", "s", "load avg", *SHOWN, "syncs/instance",
            "index commits/instance"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        n = r["stored"] or 1
        syncs = sum(r["counts"].get(k, 0) for k in ("fsync", "fdatasync", "syncfs"))
        lines.append("| " + " | ".join([r["code"], r["placement"], str(r["clients"]), "yes" if r["traced"] else "no",
                                         str(r["stored"]),
                                         str(r["seconds"]), r["loadavg"],
                                         *[str(r["counts"].get(k, 0) + (r["counts"].get("mkdirat", 0)
                                                                        if k == "mkdir" else 0)) for k in SHOWN],
                                         f"{syncs / n:.2f}" if r["traced"] else "-",
                                         "-" if r["commits"] is None else f"{r['commits'] / n:.2f}"]) + " |")
    text = "\n".join(lines)
    print(text)
    if a.output:
        a.output.write_text(f"# STOW-RS sync calls (strace -f -c), {a.requests} requests, "
                            f"{a.workers} workers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                            "One 256x256 MR image (132.5 KB body) per request. fsync + fdatasync = syncs.\n\n"
                            + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

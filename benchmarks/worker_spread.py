"""How wrk's keep-alive connections are spread over the archive's worker processes
(issue 33): uvicorn's workers accept from one shared listening socket, so which worker
takes which connection is up to the kernel and to who is awake first.

Starts ``dicomweb-server serve --workers W`` on a fresh data folder, then ``--tries``
times: wrk opens ``--conns`` connections (2 threads, 2 s of QIDO-RS ``/studies``), and
1 s in, ``ss -tnp`` counts the established connections of each worker process. Prints
one line per try (connections per worker, fewest first) and a summary.

    python benchmarks/worker_spread.py [--conns 8] [--tries 20] [--workers 2] [--env K=V]...

``--env UV_TCP_SINGLE_ACCEPT=1`` (uvloop: accept one connection per wake-up) was tried
with it on 2026-12-07: no change (loadtests/results/stow-threads-ab-2026-12-07/).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from loadtests.capacity import free_port  # noqa: E402
from loadtests.common import wait_http  # noqa: E402


def spread(port: int) -> list[int]:
    """Established connections on ``port`` per owning process, fewest first."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    counts = collections.Counter(re.findall(r"pid=(\d+)", out))
    return sorted(counts.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conns", type=int, default=8)
    p.add_argument("--tries", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--env", action="append", default=[], help="K=V for the server's environment")
    a = p.parse_args(argv)
    env = dict(os.environ) | dict(kv.split("=", 1) for kv in a.env)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="worker-spread-", dir=os.environ.get("TMPDIR")) as data:
        server = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--port", str(port),
                                   "--workers", str(a.workers), "--data-dir", data, "--dimse-port", "0"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(f"http://127.0.0.1:{port}/studies", proc=server)
            fewest = []
            for _ in range(a.tries):
                wrk = subprocess.Popen(["wrk", "-t2", f"-c{a.conns}", "-d2s", f"http://127.0.0.1:{port}/studies"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)
                counts = spread(port)
                wrk.wait()
                counts = [0] * (a.workers - len(counts)) + counts
                fewest.append(counts[0])
                print("/".join(map(str, counts)), flush=True)
                time.sleep(0.5)
        finally:
            server.terminate()
            server.wait(30)
    even = a.conns // a.workers
    print(f"{a.conns} connections over {a.workers} workers, {a.tries} tries: the emptiest worker had "
          f"median {statistics.median(fewest):g}, least {min(fewest)} (even: {even}); "
          f"uneven in {sum(f < even for f in fewest)} tries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Listener CPU per received image, and one association's throughput, with DCMTK's
``storescu`` as the sender (it costs the machine little), for two builds side by side.

    python -m benchmarks.dimse_store_cpu --files DIR --port 18250 --build base=../other-checkout --build new=. \
        [--rounds 2]

Each build (a source tree put first on ``PYTHONPATH``) runs as ``python -m
dicomweb_server.dimse`` (SQLite, its own fresh data folder, one process), then one
``storescu`` association sends every file of ``DIR``; the listener's CPU time (user + system,
``/proc/PID/stat``) over that association divided by the files is "CPU ms/image", the
association's wall time gives images/s and MB/s. Builds are interleaved per round
(base, new, base, new, ...), so a change in the machine's load hits both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while subprocess.run(["/usr/bin/echoscu", "-aec", "DICOMWEB", "127.0.0.1", str(port)],
                         check=False, capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("listener did not start")
        time.sleep(0.2)


def run_one(tree: Path, files: list[Path], port: int, data: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "DICOMWEB_DATA_DIR": str(data), "DICOMWEB_INDEX": "sqlite",
           "DICOMWEB_DIMSE_PORT": str(port), "DICOMWEB_DIMSE_PROCESSES": "1", "DICOMWEB_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.dimse"], env=env, cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        subprocess.run(["/usr/bin/storescu", "-aec", "DICOMWEB", "127.0.0.1", str(port), *map(str, files)],
                       check=True, env={**os.environ, "TCP_NODELAY": "1"}, capture_output=True)
        wall, cpu = time.monotonic() - t0, _cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(60)
    size = sum(f.stat().st_size for f in files)
    return {"images_s": len(files) / wall, "mb_s": size / wall / 1e6, "cpu_ms_image": 1000 * cpu / len(files)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--files", type=Path, required=True)
    p.add_argument("--port", type=int, default=18250)
    p.add_argument("--build", action="append", required=True, help="NAME=SOURCE_TREE")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    files = sorted(a.files.glob("*.dcm"))
    builds = [(b.split("=", 1)[0], Path(b.split("=", 1)[1]).resolve()) for b in a.build]
    print(f"{len(files)} files, {sum(f.stat().st_size for f in files) / len(files) / 1024:.0f} KiB each; "
          f"load average {os.getloadavg()}")
    print("| round | build | images/s | MB/s | listener CPU ms/image |\n|---|---|---|---|---|")
    # Every run's folder is removed only at the end: on ext4 without a journal (this VM's root
    # file system) each file created within minutes of many deletions in its block group pays
    # a scan past the recently deleted inodes (ext4 find_inode_bit -> recently_deleted; perf:
    # 17 % of the listener's CPU in openat right after an rm -rf of the previous run's 1,200
    # files), which would bill one build for the other's clean-up.
    folders = []
    try:
        for r in range(a.rounds):
            for name, tree in builds:
                folders.append(Path(tempfile.mkdtemp(prefix="dimse-cpu-")))
                m = run_one(tree, files, a.port, folders[-1])
                print(f"| {r + 1} | {name} | {m['images_s']:.1f} | {m['mb_s']:.1f} | {m['cpu_ms_image']:.2f} |",
                      flush=True)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

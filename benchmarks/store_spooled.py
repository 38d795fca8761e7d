"""Wall time of ``Archive.store`` for one spooled file (what a DIMSE C-STORE, or
``import``, hands the archive), one new 512x512 16-bit CT per call (525 KB, a new
study each: new folders, as a one-image association makes), SQLite index, fsyncs on.
Wall time follows the disk's fsyncs (noisy: compare builds by pairs, several times); the
CPU per store (process time) is the steadier figure. Beside it, the disk's floor for the same bytes: write + fdatasync + folder fsync.

    PYTHONPATH=. python benchmarks/store_spooled.py [-n 150] [--code DIR] [--output FILE]

``--code DIR`` measures another checkout (its ``dicomweb_server`` first on the path),
so that two builds can be compared in one sitting. Prints p50/p90 in ms."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import os, statistics, sys, tempfile, time
from pathlib import Path
from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, to_bytes

n = int(sys.argv[1])
root = Path(tempfile.mkdtemp(dir=sys.argv[2]))
archive = Archive.open(Settings(data_dir=root / "data", index="sqlite"))
files = [to_bytes(make_dataset(rows=512, columns=512)) for _ in range(n)]
store, disk = [], []
WARM = 20  # first stores not counted: lazy imports, the index's first connection
paths = []
for i, data in enumerate(files):
    path = archive.blobs.spool / f"part{i}"
    path.write_bytes(data)
    paths.append(path)
for i, data in enumerate(files[:WARM]):
    archive.store([SpooledPart(path=paths[i], size=len(data), complete=True)])
c = os.times()  # around the whole loop: os.times counts in clock ticks (10 ms)
for i, data in enumerate(files[WARM:], WARM):
    t = time.perf_counter()
    outcome = archive.store([SpooledPart(path=paths[i], size=len(data), complete=True)])
    store.append(time.perf_counter() - t)
    assert outcome.stored and not outcome.failed, outcome.failed
e = os.times()
user, system = e.user - c.user, e.system - c.system
for i, data in enumerate(files):
    t = time.perf_counter()
    fd = os.open(root / f"floor{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, data)
    os.fdatasync(fd)
    os.close(fd)
    dfd = os.open(root, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    disk.append(time.perf_counter() - t)
archive.close()
print(f"Archive.store  CPU user {1000 * user / len(store):5.2f} ms  system {1000 * system / len(store):5.2f} ms"
      " per file (every thread; system time follows the fsyncs)")
for name, xs in (("Archive.store", store), ("disk floor", disk)):
    xs.sort()
    print(f"{name:14s} p50 {1000 * statistics.median(xs):6.2f} ms  p90 {1000 * xs[int(0.9 * len(xs))]:6.2f} ms"
          f"  ({len(files)} files of {len(files[0]):,} B)")
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=300)
    p.add_argument("--code", type=Path, help="another checkout to measure")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the archive goes (the disk measured)")
    p.add_argument("--output", type=Path)
    args = p.parse_args()
    here = Path(__file__).resolve().parent.parent
    path = [str(args.code.resolve())] if args.code else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [str(here)])}
    # -P: the working directory is not put first on sys.path, so --code decides what is measured
    out = subprocess.run([sys.executable, "-P", "-c", CHILD, str(args.n), args.dir], env=env, check=True,
                         capture_output=True, text=True).stdout
    line = f"{args.code or here} (load average {os.getloadavg()[0]:.2f})\n{out}"
    print(line, end="")
    if args.output:
        with open(args.output, "a") as f:
            f.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

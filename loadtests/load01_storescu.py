"""LOAD-01's generator as DCMTK ``storescu`` processes (``--generator storescu``).

The pynetdicom generator took 75-84 % of one of this machine's two cores from 4 associations
on (``loadtests/results/load01-quiet.md``): on 2 cores it competes with the server it
measures. Here each association is one ``/usr/bin/storescu`` process (C++) sending its share
of the step's images, written beforehand (outside the timed window) as PS3.10 files with the
same data sets as the pynetdicom generator (``load01._dataset``). The checks are the same:
every SOP Instance UID acknowledged with Success is stored, SHA-256 of every 100th image's
pixel data. Per-operation latency is read from storescu's log, timestamped to the millisecond
by a log4cplus configuration: "Sending Store Request" to "Received Store Response".
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

LOG_CONFIG = """log4cplus.rootLogger = INFO, console
log4cplus.appender.console = log4cplus::ConsoleAppender
log4cplus.appender.console.layout = log4cplus::PatternLayout
log4cplus.appender.console.layout.ConversionPattern = %D{%s.%q} %m%n
"""
_LINE = re.compile(r"^(\d+\.\d+) (.*)$")


def write_shares(step: str, shares, scale: float, pixels: bytes, dataset) -> tuple[Path, list[dict]]:
    """Each association's files in a folder of its own; per share: paths, SOP UIDs, bytes, hashes."""
    root = Path(tempfile.mkdtemp(prefix="load01-storescu-"))
    (root / "log.cfg").write_text(LOG_CONFIG)
    out = []
    for i, jobs in enumerate(shares):
        folder = root / f"a{i}"
        folder.mkdir()
        share: dict = {"files": {}, "bytes": {}, "hashes": {}}
        for job in jobs:
            ds = dataset(step, job, scale, pixels)
            ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
            ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
            path = folder / f"{job.index:06d}.dcm"
            ds.save_as(path, enforce_file_format=True)
            share["files"][str(path)] = ds.SOPInstanceUID
            share["bytes"][ds.SOPInstanceUID] = len(ds.PixelData)
            if job.index % 100 == 0:
                share["hashes"][ds.SOPInstanceUID] = hashlib.sha256(ds.PixelData).hexdigest()
        out.append(share)
    return root, out


def command_dictionary(root: Path) -> Path | None:
    """A data dictionary of the command and file meta groups only (0000,xxxx and 0002,xxxx),
    cut from DCMTK's: storescu loads its whole dictionary (~5,000 entries) at start, about
    half of the ~25 ms of CPU one process costs, and the 64-association step starts 64 of
    them inside the timed window on the server's cores. It needs only these entries to
    build its commands; the data sets are Explicit VR files, whose elements carry their VR
    (the runner's SHA-256 checks of the pixel data still run). None when DCMTK's dictionary
    is not where Debian puts it: storescu then loads its own."""
    found = sorted(Path("/usr/share").glob("libdcmtk*/dicom.dic"),
                   key=lambda f: int("0" + "".join(c for c in f.parent.name if c.isdigit())))
    if not found:
        return None
    lines = [ln for ln in found[-1].read_text(errors="replace").splitlines() if ln.startswith(("(0000,", "(0002,"))]
    out = root / "command.dic"
    out.write_text("\n".join(lines) + "\n")
    return out


def start(host: str, port: int, called: str, root: Path, shares: list[dict]) -> list[subprocess.Popen]:
    """One storescu process (one association) per share; TCP_NODELAY=1 (DCMTK leaves Nagle on);
    the command dictionary only (:func:`command_dictionary`)."""
    env = {**os.environ, "TCP_NODELAY": "1"}
    dictionary = command_dictionary(root)
    if dictionary is not None:
        env["DCMDICTPATH"] = str(dictionary)
    procs = []
    for i, share in enumerate(shares):
        with open(root / f"a{i}.log", "w") as log:  # a file, not a pipe: nothing waits for a reader
            procs.append(subprocess.Popen(
                ["/usr/bin/storescu", "-lc", str(root / "log.cfg"), "-aet", "LOAD01", "-aec", called, "-R",
                 "-to", "120", "-td", "120", "-ta", "120", host, str(port), *share["files"]],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
    return procs


def collect(root: Path, procs: list[subprocess.Popen], shares: list[dict]) -> list[dict]:
    """Wait for each storescu; its results in the pynetdicom generator's shape."""
    for proc in procs:
        proc.wait()
    return [parse((root / f"a{i}.log").read_text(errors="replace"), share) for i, share in enumerate(shares)]


def parse(log: str, share: dict) -> dict:
    out: dict = {"latencies": [], "errors": 0, "bytes": 0, "hashes": {}, "sent": [], "rejected": 0}
    current, sent_at = None, None
    for line in log.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        t, msg = float(m.group(1)), m.group(2)
        if msg.startswith("Association Rejected"):  # A-ASSOCIATE-RJ (reason on the next lines)
            out["rejected"] = 1
        elif msg.startswith("Sending file: "):
            current, sent_at = share["files"].get(msg.removeprefix("Sending file: ").strip()), None
        elif msg.startswith("Sending Store Request"):
            sent_at = t
        elif msg.startswith("Received Store Response") and current is not None and sent_at is not None:
            out["latencies"].append(t - sent_at)
            if "(Success)" in msg:
                out["sent"].append(current)
                out["bytes"] += share["bytes"][current]
                if current in share["hashes"]:
                    out["hashes"][current] = share["hashes"][current]
            else:
                out["errors"] += 1
            current = None
    answered = len(out["latencies"])
    out["errors"] += len(share["files"]) - answered  # never answered (refused, aborted, timed out)
    out["latencies"] += [120.0] * (len(share["files"]) - answered)  # counted as the timeout
    return out


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)

"""CPU of reading one STOW-RS body into its parts (``PartSpooler.feed`` + ``close``), the
request's spooler then let go, as ``api/stow.py`` does (issue 33): the capacity runner's
132.5 KB MR in one part, fed in 64 KiB chunks as the HTTP server hands them over.
Prints µs per body and the process's minor page faults per body.

    PYTHONPATH=DIR python benchmarks/spool_body_cpu.py [--bodies 2000] [--rounds 3]

Run it once per build (``PYTHONPATH``) to compare them."""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # (PYTHONPATH first: the build measured)

from dicomweb_server.dicom.multipart import PartSpooler  # noqa: E402
from loadtests import dataset  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bodies", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    data, _ = dataset.stow_template(256)
    body = (f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode() + data
            + f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode())
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.rounds):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = time.process_time()
            for _ in range(a.bodies):
                spooler = PartSpooler(dataset.STOW_BOUNDARY, Path(tmp), max_bytes=1 << 30, max_parts=100)
                for chunk in chunks:
                    spooler.feed(chunk)
                spooler.close()
                assert len(spooler.parts) == 1 and spooler.parts[0].data is not None
            per = (time.process_time() - t) / a.bodies * 1e6
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / a.bodies
            print(f"{len(body)} B body in {len(chunks)} chunks: {per:.1f} us, {faults:.1f} minor page faults per body, "
                  f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")


if __name__ == "__main__":
    main()

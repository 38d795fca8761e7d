"""A large C-STORE with the listener's memory watched: an opt-in check, not a test.

    python -m benchmarks.dimse_large --port 11112 [--frames 600] [--pid LISTENER_PID]

Writes one multi-frame 512 x 512 x 16-bit MR instance of ``--frames`` frames to a temporary
file, streamed (header by pydicom, then the Pixel Data element written frame by frame: the
generator never holds it whole either), sends it with DCMTK's ``storescu`` (TCP_NODELAY=1)
and reports the seconds, MB/s, and the listener process's peak resident memory (VmHWM)
before and after. 600 frames = 315 MB of pixel data. Then the instance is checked over
QIDO-RS (``--http``) and removed with DELETE.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

ENHANCED_MR = "1.2.840.10008.5.1.4.1.1.4.1"


def write_instance(path: Path, frames: int, rows: int = 512, cols: int = 512) -> tuple[str, str, int]:
    """(Study Instance UID, SOP Instance UID, pixel bytes) of the file written at ``path``."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ENHANCED_MR
    ds.SOPClassUID = ENHANCED_MR
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientID, ds.PatientName, ds.Modality = "LARGE", "LARGE^CSTORE", "MR"
    ds.Rows, ds.Columns, ds.NumberOfFrames = rows, cols, frames
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.save_as(path, enforce_file_format=True)
    frame = np.random.default_rng(9).integers(0, 4096, size=rows * cols, dtype=np.uint16)
    n = rows * cols * 2 * frames
    with open(path, "ab") as f:  # (7FE0,0010) OW, explicit VR LE: 2 reserved bytes, 4-byte length
        f.write(struct.pack("<HH2sHI", 0x7FE0, 0x0010, b"OW", 0, n))
        for i in range(frames):
            frame[0] = i  # each frame differs
            f.write(frame.tobytes())
    return str(ds.StudyInstanceUID), str(ds.SOPInstanceUID), n


def vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dimse_large", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11112)
    p.add_argument("--ae-title", default="DICOMWEB")
    p.add_argument("--http", default="http://127.0.0.1:8080")
    p.add_argument("--frames", type=int, default=600)
    p.add_argument("--pid", type=int, help="the listener process (default: whoever listens on --port)")
    args = p.parse_args(argv)
    pid = args.pid
    if pid is None:
        from loadtests.load01 import pid_listening

        pid = pid_listening(args.port)
    with tempfile.TemporaryDirectory(prefix="dimse-large-") as tmp:
        path = Path(tmp) / "large.dcm"
        study, sop, n = write_instance(path, args.frames)
        before = vm_hwm_mb(pid) if pid else None
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        r = subprocess.run(["storescu", "-aec", args.ae_title, args.host, str(args.port), str(path)],
                           env=dict(os.environ, TCP_NODELAY="1"), capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        after = vm_hwm_mb(pid) if pid else None
        size = path.stat().st_size
    found = httpx.get(f"{args.http}/instances", params={"SOPInstanceUID": sop}, timeout=60).json()
    httpx.delete(f"{args.http}/studies/{study}", timeout=120)
    print(f"C-STORE of one {args.frames}-frame 512x512x16 MR: {size / 1e6:.1f} MB file ({n / 1e6:.1f} MB pixel data), "
          f"storescu rc {r.returncode}, {seconds:.2f} s = {size / 1e6 / seconds:.0f} MB/s; "
          f"stored and found by QIDO-RS: {len(found) == 1}; listener peak RSS (VmHWM) before {before} MiB, "
          f"after {after} MiB; load average {load:.2f}")
    return 0 if r.returncode == 0 and len(found) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())

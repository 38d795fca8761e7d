"""Compress on ingest: a received instance that a ``[[store_as]]`` rule of the routes
file matches (routing/rules.py) is re-encoded losslessly before it is stored.

When: before the acknowledgement. The store path (archive.py) calls
:func:`compress_spooled` on the durable spool file, after the instance was read and
validated and before it is placed and indexed; the STOW-RS / C-STORE success then
means the compressed file is durable (fdatasync'ed here, placed and indexed as any
other). No second copy, no background job and no window in which the archive holds an
instance in two encodings. The price is the encode time in the sender's latency
(benchmarks/results/transcode.md: 7 to 140 ms per 512x512 frame).

Lossless means lossless: the new file is decoded and its pixels compared with the
received file's, both decoded by pydicom in a decode worker process
(dicom/decode_worker.py); only equal pixels let the compressed file replace the
received one. An encoder refusal, a decoder failure or a mismatch keeps the received
file as it is and logs a warning: the store itself never fails because of this policy.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pydicom

from ..dicom import decode_worker
from ..dicom.pixel_info import UnsupportedTransferSyntax
from . import transcode

log = logging.getLogger("dicomweb_server.policy.ingest")

__all__ = ["compress_spooled", "encode_verified", "same_pixels"]


def same_pixels(received: str, encoded: str) -> str | None:
    """None when both files decode (pydicom) to equal pixel arrays, else why not.
    Runs in a decode worker process."""
    a = pydicom.dcmread(received).pixel_array
    b = pydicom.dcmread(encoded).pixel_array
    if a.shape != b.shape:
        return f"shape {b.shape} instead of {a.shape}"
    if a.dtype.newbyteorder("=") != b.dtype.newbyteorder("="):
        return f"samples {b.dtype} instead of {a.dtype}"
    if not (a == b).all():
        return f"{int((a != b).sum())} sample(s) differ"
    return None


def _verify(received: Path, encoded: Path) -> str | None:
    """:func:`same_pixels` in a decode worker (a decoder crash is not the store's)."""
    return decode_worker.call(same_pixels, str(received), str(encoded))


def compress_spooled(path: Path, target_ts: str, sop_uid: str) -> Path | None:
    """``path`` (a received PS3.10 file in the spool folder) re-encoded in
    ``target_ts`` into a new, fdatasync'ed file next to it, after checking that it
    decodes to the same pixels; None (and a warning logged) when it cannot be, or
    when the instance has no Pixel Data. ``path`` itself is left alone: the caller
    drops it once the new file took its place."""
    out, problem = encode_verified(path, target_ts, path.parent)
    if problem is not None:
        log.warning("store_as: instance %s kept as received: %s", sop_uid, problem)
    return out


def encode_verified(path: Path, target_ts: str, folder: Path) -> tuple[Path | None, str | None]:
    """``path`` (a PS3.10 file) re-encoded in ``target_ts`` into a new, fdatasync'ed file
    in ``folder``, decoded and compared with ``path`` (:func:`same_pixels`): (the new
    file, None); or (None, why not) when it cannot be read, encoded or verified; or
    (None, None) when it has no Pixel Data (nothing to encode). ``path`` is left alone.
    Compress on ingest and ``recompress`` (policy/recompress.py) both go through here."""
    try:
        ds = pydicom.dcmread(path)
    except Exception as e:  # noqa: BLE001 - it was read once already; keep it as it is
        return None, f"cannot be read again: {e}"
    if "PixelData" not in ds:
        return None, None
    fd, name = tempfile.mkstemp(dir=folder, suffix=".store_as")
    out = Path(name)
    try:
        try:
            encoded = transcode.transcode(ds, target_ts)
            with os.fdopen(fd, "wb") as f:
                fd = -1
                encoded.save_as(f, enforce_file_format=True)
                f.flush()
                os.fdatasync(f.fileno())
            problem = _verify(path, out)
        except (UnsupportedTransferSyntax, decode_worker.WorkerDied, decode_worker.WorkerTimeout) as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 - a decoder's error on the new file counts as a mismatch
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            out.unlink(missing_ok=True)
            return None, (f"({ds.file_meta.get('TransferSyntaxUID')}): the {target_ts} copy was not stored: "
                          f"{problem}")
        return out, None
    except BaseException:
        if fd >= 0:
            os.close(fd)
        out.unlink(missing_ok=True)
        raise

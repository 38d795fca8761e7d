"""Compress on ingest: a received instance that a ``[[store_as]]`` rule of the routes
file matches (routing/rules.py) is re-encoded before it is stored.

When: before the acknowledgement. The store path (archive.py) calls
:func:`compress_spooled` on the durable spool file, after the instance was read and
validated and before it is placed and indexed; the STOW-RS / C-STORE success then
means the compressed file is durable (fdatasync'ed here, placed and indexed as any
other). No second copy, no background job and no window in which the archive holds an
instance in two encodings. The price is the encode time in the sender's latency
(benchmarks/results/store_as.md).

Lossless means lossless: the new file is decoded and its pixels compared with the
received file's, both decoded by pydicom in a decode worker process
(dicom/decode_worker.py); only equal pixels let the compressed file replace the
received one. An encoder refusal, a decoder failure or a mismatch keeps the received
file as it is and logs a warning: the store itself never fails because of this policy.

Lossy (a rule with ``lossy = true`` only): PS3.3 C.7.6.1.1.5 says that an image that is
a lossy compressed version of another image has Lossy Image Compression (0028,2110)
"01", Value 1 of Image Type (0008,0008) DERIVED and, when the predecessor was a DICOM
image, a new SOP Instance UID. So the stored instance is a new one (:func:`derive_lossy`):
a SOP Instance UID derived from the received one (:func:`lossy_uid`, so a re-sent instance gives the same new UID and stays an identical
duplicate), the received instance in Source Image Sequence (0008,2112) with purpose
(121320, DCM, "Uncompressed predecessor") (C.12.4, CID 7202), Derivation Code Sequence
(113040, DCM, "Lossy Compression") (CID 7203), the ratio in Derivation Description as
the note of C.7.6.1.1.5 recommends, and the ratio and method appended to Lossy Image
Compression Ratio (0028,2112) / Method (0028,2114) after those of earlier lossy steps
(policy/transcode.py). The received instance is not kept. The lossy file is checked
to decode to a picture of the same shape and sample type.

:func:`encode_file` (an instance file and a rule in, a verified file out) is what
``recompress`` reuses; :func:`compress_spooled` is its logging wrapper for the store.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pydicom
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.values import convert_value

from ..dicom import decode_worker
from ..dicom.compressed import LOSSY
from ..dicom.pixel_info import UnsupportedTransferSyntax
from . import transcode

if TYPE_CHECKING:
    from ..routing.rules import StoreAs

log = logging.getLogger("dicomweb_server.policy.ingest")

__all__ = ["NotEncoded", "compress_spooled", "derive_lossy", "encode_file", "encode_verified", "lossy_uid",
           "same_instance_transcoded", "same_pixels"]


def same_pixels(received: str, encoded: str, *, lossy: bool = False) -> str | None:
    """None when both files decode (pydicom) to equal pixel arrays (``lossy``: to
    pictures of the same shape and sample type), else why not. Runs in a decode
    worker process."""
    a = pydicom.dcmread(received).pixel_array
    b = pydicom.dcmread(encoded).pixel_array
    if a.shape != b.shape:
        return f"shape {b.shape} instead of {a.shape}"
    if a.dtype.newbyteorder("=") != b.dtype.newbyteorder("="):
        return f"samples {b.dtype} instead of {a.dtype}"
    if not lossy and not (a == b).all():
        return f"{int((a != b).sum())} sample(s) differ"
    return None


def same_instance_transcoded(received: Path, stored: Path) -> bool:
    """Whether two PS3.10 files in different transfer syntaxes hold the same instance: one
    a lossless re-encoding of the other (``recompress``, a ``when = "after_ack"`` rule), as
    when a modality re-sends the original of an instance stored re-encoded. PS3.5 §10: a
    transfer syntax is an encoding of the same data set.

    Every element up to Pixel Data equal, decoded (so an Implicit VR file compares with
    an Explicit VR one), but for those a lossless transcode changes
    (:data:`.transcode.TRANSCODE_CHANGES`); and both Pixel Data decoded to equal arrays
    (:func:`same_pixels` in a decode worker: a decoder crash is not the store's). Never
    when either syntax is lossy (PS3.5 §8.2): a lossy encoding is not the same pixels.
    Files that do not parse or decode compare as different."""
    try:
        a = pydicom.dcmread(received, stop_before_pixels=True)
        b = pydicom.dcmread(stored, stop_before_pixels=True)
        ts_a, ts_b = (str(d.file_meta.get("TransferSyntaxUID", "") or "") for d in (a, b))
        if not ts_a or not ts_b or ts_a == ts_b or ts_a in LOSSY or ts_b in LOSSY:
            return False
        if not _same_elements(a, b, transcode.TRANSCODE_CHANGES):
            return False
        return _verify(received, stored) is None
    except Exception as e:  # noqa: BLE001 - unreadable, undecodable, a worker died: not shown the same
        log.info("%s and the stored %s are not shown to be the same instance: %s", received, stored, e)
        return False


def _same_elements(a: Dataset, b: Dataset, ignore: frozenset[int] = frozenset()) -> bool:
    """Element by element (sequences item by item), values decoded; group lengths
    (gggg,0000, an encoding detail) and ``ignore`` (top level only) left out."""
    tags = {t for t in (*a.keys(), *b.keys()) if t not in ignore and t.element != 0}
    for t in tags:
        if t not in a or t not in b:
            return False
        ea, eb = a[t], b[t]
        if ea.VR == "SQ" or eb.VR == "SQ":
            if ea.VR != eb.VR or len(ea.value) != len(eb.value) \
                    or not all(_same_elements(x, y) for x, y in zip(ea.value, eb.value)):
                return False
        elif ea.value != eb.value and not _same_raw(ea, eb):
            return False
    return True


def _same_raw(ea, eb) -> bool:
    """An element read as UN (Implicit VR, a private tag the dictionary does not know)
    against its decoded value in the other file."""
    if (ea.VR == "UN") == (eb.VR == "UN"):
        return False
    raw, known = (ea, eb) if ea.VR == "UN" else (eb, ea)
    value = raw.value if isinstance(raw.value, bytes) else b""
    decoded = convert_value(known.VR, RawDataElement(raw.tag, known.VR, len(value), value, 0, False, True))
    return decoded == known.value


class NotEncoded(Exception):
    """The instance cannot be stored as the rule asks; the message says why (the
    received file is then kept as it is)."""


class NoPixelData(NotEncoded):
    """Nothing to encode: the instance has no Pixel Data."""


def _verify(received: Path, encoded: Path) -> str | None:
    """:func:`same_pixels` in a decode worker (a decoder crash is not the store's)."""
    return decode_worker.call(same_pixels, str(received), str(encoded))


def _verify_lossy(received: Path, encoded: Path) -> str | None:
    """:func:`same_pixels` of a lossy copy in a decode worker."""
    return decode_worker.call(functools.partial(same_pixels, lossy=True), str(received), str(encoded))


#: PS3.16 codes (DCM): CID 7203 Image Derivation, CID 7202 Source Image Purposes of Reference
LOSSY_COMPRESSION = ("113040", "DCM", "Lossy Compression")
UNCOMPRESSED_PREDECESSOR = ("121320", "DCM", "Uncompressed predecessor")


def _code(value: str, scheme: str, meaning: str) -> Dataset:
    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = value, scheme, meaning
    return item


def lossy_uid(sop_instance_uid: str, transfer_syntax: str) -> str:
    """The SOP Instance UID of the lossy compressed version of ``sop_instance_uid`` in
    ``transfer_syntax``: a UUID-derived UID (PS3.5 B.2, "2.25." and a name-based UUID,
    ISO/IEC 9834-8 version 5) of both, so the same for a re-sent instance."""
    name = f"dicomweb-server store_as {sop_instance_uid} {transfer_syntax}"
    return f"2.25.{uuid.uuid5(uuid.NAMESPACE_OID, name).int}"


def derive_lossy(new: Dataset, received: Dataset) -> Dataset:
    """``new`` (``received`` lossy compressed by :func:`transcode.transcode`, which set
    Lossy Image Compression, Ratio and Method) made the new, derived image PS3.3
    C.7.6.1.1.5 asks for: new SOP Instance UID, Image Type value 1 DERIVED, the
    received image as Source Image Sequence item (C.12.4.1.2), Derivation Code
    Sequence and Derivation Description appended. ``new`` is changed and returned."""
    uid = lossy_uid(received.SOPInstanceUID, new.file_meta.TransferSyntaxUID)
    new.SOPInstanceUID = uid
    new.file_meta.MediaStorageSOPInstanceUID = uid
    image_type = list(received.get("ImageType") or [])
    new.ImageType = ["DERIVED"] + image_type[1:] if image_type else ["DERIVED", "SECONDARY"]
    source = Dataset()
    source.ReferencedSOPClassUID = received.SOPClassUID
    source.ReferencedSOPInstanceUID = received.SOPInstanceUID
    source.PurposeOfReferenceCodeSequence = Sequence([_code(*UNCOMPRESSED_PREDECESSOR)])
    new.SourceImageSequence = Sequence(list(received.get("SourceImageSequence") or []) + [source])
    new.DerivationCodeSequence = Sequence(list(received.get("DerivationCodeSequence") or [])
                                          + [_code(*LOSSY_COMPRESSION)])
    ratio, method = new.LossyImageCompressionRatio, new.LossyImageCompressionMethod
    ratio = ratio[-1] if isinstance(ratio, (list, pydicom.multival.MultiValue)) else ratio
    method = method[-1] if isinstance(method, (list, pydicom.multival.MultiValue)) else method
    step = f"Lossy compression {method}, ratio {ratio}:1"
    earlier = str(received.get("DerivationDescription") or "")
    new.DerivationDescription = (f"{earlier}; {step}" if earlier else step)[:1024]  # ST
    return new


def encode_file(source: Path, rule: StoreAs, *, directory: Path | None = None) -> Path:
    """The PS3.10 file ``source`` encoded as ``rule`` says (``rule.transfer_syntax``;
    a lossy one only when ``rule.lossy``), written to a new fdatasync'ed file in
    ``directory`` (default: next to ``source``) and verified: lossless pixels equal
    to the received ones (decoded by pydicom in a decode worker), a lossy picture of
    the same shape with the attributes of :func:`derive_lossy`. ``source`` is left
    alone. Raises NotEncoded (why) when it cannot be, or has no Pixel Data; nothing
    new is left behind then."""
    return _encode(source, rule.transfer_syntax, rule.lossy, directory or source.parent)


def encode_verified(path: Path, target_ts: str, folder: Path) -> tuple[Path | None, str | None]:
    """``path`` (a PS3.10 file) re-encoded losslessly in ``target_ts`` into a new, fdatasync'ed,
    verified file in ``folder`` (:func:`encode_file`'s work): (the new file, None); or (None,
    why not) when it cannot be read, encoded or verified; or (None, None) when it has no Pixel
    Data. ``path`` is left alone. ``recompress`` (policy/recompress.py) goes through here: it
    re-encodes in place, keeping the SOP Instance UID, so never to a lossy syntax."""
    try:
        return _encode(path, target_ts, False, folder), None
    except NoPixelData:
        return None, None
    except NotEncoded as e:
        return None, str(e)


def _encode(source: Path, target_ts: str, allow_lossy: bool, directory: Path) -> Path:
    lossy = transcode.is_lossy_target(target_ts)
    if lossy and not allow_lossy:
        raise NotEncoded(f"{target_ts} is lossy and the rule does not say lossy = true")
    try:
        ds = pydicom.dcmread(source)
    except Exception as e:  # noqa: BLE001 - it was read once already; keep it as received
        raise NotEncoded(f"cannot be read again: {e}") from None
    if "PixelData" not in ds:
        raise NoPixelData("no Pixel Data")
    fd, name = tempfile.mkstemp(dir=directory, suffix=".store_as")
    out = Path(name)
    try:
        try:
            encoded = transcode.transcode(ds, target_ts)
            if lossy:
                derive_lossy(encoded, ds)
            with os.fdopen(fd, "wb") as f:
                fd = -1
                encoded.save_as(f, enforce_file_format=True)
                f.flush()
                os.fdatasync(f.fileno())
            problem = _verify_lossy(source, out) if lossy else _verify(source, out)
        except (UnsupportedTransferSyntax, decode_worker.WorkerDied, decode_worker.WorkerTimeout) as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 - a decoder's error on the new file counts as a mismatch
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            raise NotEncoded(f"the {target_ts} copy was not stored: {problem}")
        return out
    except BaseException:
        if fd >= 0:
            os.close(fd)
        out.unlink(missing_ok=True)
        raise


def compress_spooled(path: Path, rule: StoreAs, sop_uid: str) -> Path | None:
    """``path`` (a received PS3.10 file in the spool folder) encoded by
    :func:`encode_file` into a new, fdatasync'ed, verified file next to it; None (and
    a warning logged, unless the instance has no Pixel Data) when it cannot be.
    ``path`` itself is left alone: the caller drops it once the new file took its
    place."""
    try:
        return encode_file(path, rule)
    except NoPixelData:
        return None
    except NotEncoded as e:
        log.warning("store_as: instance %s kept as received: %s", sop_uid, e)
        return None

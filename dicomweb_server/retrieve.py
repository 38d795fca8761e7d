"""Reading what the archive stores: whole files, frames, bulk data, transcoded
instances. Blocking functions; the web layer runs them in worker threads.

Frames are read with the layout computed at store time (a seek and a read);
only files whose frame boundaries are unknown (deflated, bit-packed, ambiguous
fragments) are parsed with pydicom at read time.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pydicom
from pydicom.dataset import Dataset
from pydicom.encaps import generate_frames

from .dicom import pixels
from .dicom.frames import PixelLayout, read_frame
from .dicom.json_model import resolve_bulkdata
from .dicom.media_types import (
    EXPLICIT_VR_LE,
    NATIVE_LE,
    OCTET_STREAM,
    UNENCAPSULATED,
    Choice,
    NotAcceptable,
    is_video,
    pixel_media_type,
)
from .store.base import InstanceLocation


class NotFound(LookupError):
    """A frame, bulk data element or pixel data that does not exist (HTTP 404)."""


def can_decode(ts: str) -> bool:
    """Whether pixel data in ``ts`` can be decoded to native pixels here."""
    return ts in UNENCAPSULATED or pixels.is_supported_transfer_syntax(ts)


#: files larger than this are streamed in CHUNK pieces instead of read whole
LARGE_FILE = 16 * 1024 * 1024
CHUNK = 1024 * 1024


def file_chunks(path: Path, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
    """The file (or ``length`` bytes from ``offset``) in 1 MiB pieces (bounded
    memory for multi-GB instances)."""
    with open(path, "rb") as f:
        f.seek(offset)
        left = length if length is not None else -1
        while left != 0:
            chunk = f.read(CHUNK if left < 0 else min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk) if left > 0 else 0
            yield chunk


def large_native_pixel_data(loc: InstanceLocation) -> tuple[int, int] | None:
    """(offset, length) of Pixel Data to stream, when it is native little endian
    and larger than LARGE_FILE; else None."""
    pix = loc.pixel or {}
    if loc.transfer_syntax_uid in NATIVE_LE and pix.get("length") and pix["length"] > LARGE_FILE:
        return pix["offset"], pix["length"]
    return None


def read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def header(path: Path) -> Dataset:
    """The dataset without pixel data (for decoding and rendering)."""
    return pydicom.dcmread(path, stop_before_pixels=True)


def instance_payload(path: Path, loc: InstanceLocation, choice: Choice) -> bytes:
    """The PS3.10 file as stored, or converted to Explicit VR Little Endian.

    Raises
    ------
    pixels.UnsupportedTransferSyntax
        The stored pixel data cannot be decoded (HTTP 406).
    """
    if not choice.transcode:
        return read_file(path)
    ds = pydicom.dcmread(path)
    if "PixelData" in ds or loc.transfer_syntax_uid not in NATIVE_LE:
        ds = pixels.transcode_to_explicit_le(ds)
    ds.file_meta.TransferSyntaxUID = EXPLICIT_VR_LE
    buf = io.BytesIO()
    ds.save_as(buf, implicit_vr=False, little_endian=True, enforce_file_format=True)
    return buf.getvalue()


def _check_frames(loc: InstanceLocation, numbers: list[int]) -> int:
    if loc.pixel is None:
        raise NotFound(f"instance {loc.sop_uid} has no pixel data")
    n = int(loc.pixel.get("number_of_frames") or 1)
    bad = [k for k in numbers if k > n]
    if bad:
        raise NotFound(f"instance {loc.sop_uid} has {n} frame(s); no frame {bad[0]}")
    return n


_RLE = "1.2.840.10008.1.2.5"


def _unpad(frame: bytes, ts: str) -> bytes:
    """Drop the 0x00 that encapsulation adds after an odd-length codestream (PS3.5
    §A.4), so a JPEG/JPEG-LS/JPEG 2000 frame is its codestream byte-for-byte (the
    codestream ends with the EOI/EOC marker FFD9)."""
    if ts != _RLE and ts not in UNENCAPSULATED and frame.endswith(b"\xff\xd9\x00"):
        return frame[:-1]
    return frame


def pixel_tag(loc: InstanceLocation) -> str:
    """Which pixel data element the instance has: ``7FE00010`` (Pixel Data), or
    ``7FE00008``/``7FE00009`` (Float / Double Float Pixel Data), as recorded at store time."""
    return str((loc.pixel or {}).get("tag", "7FE00010"))


def stored_frames(path: Path, loc: InstanceLocation, numbers: list[int]) -> list[bytes]:
    """Frames (1-based numbers, in the order asked) exactly as stored: native
    bytes in the stored byte order, or each frame's compressed codestream.

    Raises
    ------
    NotFound
        No pixel data, or a frame number beyond NumberOfFrames.
    """
    return list(iter_stored_frames(path, loc, numbers))


def iter_stored_frames(path: Path, loc: InstanceLocation, numbers: list[int]) -> Iterator[bytes]:
    """:func:`stored_frames` one frame at a time (memory: one frame). The frame
    numbers are checked before the first frame is read."""
    n = _check_frames(loc, numbers)
    return _iter_stored_frames(path, loc, numbers, n)


def _iter_stored_frames(path: Path, loc: InstanceLocation, numbers: list[int], n: int) -> Iterator[bytes]:
    pix = loc.pixel or {}
    if "offset" in pix:
        layout = PixelLayout.from_json(pix)
        try:
            with open(path, "rb") as fp:
                for k in numbers:
                    yield _unpad(read_frame(fp, layout, k, pix.get("frame_length")), loc.transfer_syntax_uid)
            return
        except IndexError as e:
            raise NotFound(f"no frame {e}") from None
        except LookupError:
            pass  # frame boundaries unknown: parse below
    ds = pydicom.dcmread(path)  # deflated, bit-packed or ambiguous fragments: sizes checked at STOW
    data = ds[int(pixel_tag(loc), 16)].value
    if loc.transfer_syntax_uid in UNENCAPSULATED:
        flen = pix.get("frame_length") or len(data) // n
        for k in numbers:
            yield bytes(data[(k - 1) * flen : k * flen])
        return
    frames = list(generate_frames(data, number_of_frames=n))
    for k in numbers:
        yield _unpad(frames[k - 1], loc.transfer_syntax_uid)


def frames_payload(path: Path, loc: InstanceLocation, numbers: list[int], choice: Choice) -> Iterator[bytes]:
    """Frames in the negotiated representation (PS3.18 §10.4.1.1.2), one at a time: as
    stored, or decoded to native little-endian bytes for application/octet-stream.
    Frame numbers are checked before the first frame is read (NotFound)."""
    raw = iter_stored_frames(path, loc, numbers)
    ts = loc.transfer_syntax_uid
    if choice.media_type == OCTET_STREAM and choice.transfer_syntax == EXPLICIT_VR_LE and ts not in NATIVE_LE:
        hdr = header(path)
        vr = (loc.pixel or {}).get("vr")
        return (pixels.frame_to_native_bytes(hdr, f, ts, pixel_vr=vr)[0] for f in raw)
    return raw


def frame_part_type(choice: Choice) -> str:
    """Content-Type of each frame part, naming the real transfer syntax."""
    return f"{choice.media_type}; transfer-syntax={choice.transfer_syntax}"


def bulkdata(path: Path, loc: InstanceLocation, tagpath: str) -> Iterator[tuple[str, bytes]]:
    """The value behind a BulkDataURI as (content type, bytes) parts, one at a time.

    Pixel data (Pixel Data, Float or Double Float Pixel Data) of a native instance
    is one ``application/octet-stream`` part; encapsulated Pixel Data is one part per
    frame in its compressed media type (PS3.18 §8.7.3.3.2 / §10.4.1.1.5), or one part
    holding the whole stream for video syntaxes. Other elements are read from the
    file (a read-time parse, only for bulk data other than pixels). Errors are raised
    before the first part.

    Raises
    ------
    ValueError
        Malformed tag path (HTTP 400).
    NotFound
        No such element (HTTP 404).
    NotAcceptable
        Compressed pixel data in a syntax without a media type (HTTP 406).
    """
    if tagpath.upper() == pixel_tag(loc) and loc.pixel is not None:
        ts = loc.transfer_syntax_uid
        n = int(loc.pixel.get("number_of_frames") or 1)
        if ts not in UNENCAPSULATED:
            media = pixel_media_type(ts)
            if media is None:
                raise NotAcceptable(f"pixel data stored as {ts}, a compressed syntax without a PS3.18 media type")
            label = f"{media}; transfer-syntax={ts}"
            if is_video(ts):  # all frames are one stream (PS3.18 §8.7.3.3.2)
                return iter([(label, b"".join(iter_stored_frames(path, loc, [1])))])
            return ((label, f) for f in iter_stored_frames(path, loc, list(range(1, n + 1))))
        pix = loc.pixel
        if ts in NATIVE_LE and "offset" in pix and pix.get("length") is not None:
            with open(path, "rb") as fp:
                fp.seek(pix["offset"])
                return iter([(f"{OCTET_STREAM}; transfer-syntax={ts}", fp.read(pix["length"]))])
    ds = pydicom.dcmread(path)
    try:
        return iter([(OCTET_STREAM, resolve_bulkdata(ds, tagpath))])
    except KeyError as e:
        raise NotFound(f"no bulk data at {tagpath}: {e}") from None


def rendered(path: Path, loc: InstanceLocation, frame_numbers: list[int] | None, params, media_type: str,
             thumbnail: bool = False, pictures: int = 1) -> bytes:
    """Render frames of an instance (PS3.18 §10.4.1.1.3): the frames asked, or
    those PS3.18 gives for an instance-level request of this media type.
    ``pictures``: how many such pictures the answer holds (for the size bound).

    Raises
    ------
    NotFound
        No pixel data or no such frame.
    pixels.NotAnImage, pixels.UnsupportedTransferSyntax, render.UnsupportedMediaType
        Cannot be rendered (HTTP 406).
    render.InvalidRenderParameter
        e.g. a viewport region outside the image (HTTP 400).
    render.RenderTooLarge
        The answer would exceed the rendering bounds (HTTP 413).
    """
    from .dicom import render

    hdr = header(path)
    if loc.pixel is None:
        # Float / Double Float Pixel Data (PS3.3 C.7.6.24) the record has no layout for:
        # the whole file is read, once the header shows a 32/64-bit image
        if pixels.image_info(hdr).bits_allocated not in (32, 64):
            raise pixels.NotAnImage(f"instance {loc.sop_uid} (SOP Class {loc.sop_class_uid}) has no pixel data")
        hdr = pydicom.dcmread(path)
    n = int((loc.pixel or {}).get("number_of_frames") or pixels.image_info(hdr).number_of_frames)
    if frame_numbers is None:
        frame_numbers = render.frames_for_thumbnail(n) if thumbnail else render.frames_for_rendered(n, media_type)
    render.check_size(hdr, len(frame_numbers), params, media_type, pictures)  # 413 before any frame is read
    if loc.pixel is None:
        if any(k > n for k in frame_numbers):
            raise NotFound(f"instance {loc.sop_uid} has {n} frame(s); no frame {max(frame_numbers)}")
        return render.render(hdr, pixels.float_frames(hdr, frame_numbers), params, media_type,
                             frame_numbers=frame_numbers)
    vr = loc.pixel.get("vr")

    def decoded() -> Iterator:  # frames read 16 at a time, each decoded only when rendered
        for i in range(0, len(frame_numbers), 16):
            for f in stored_frames(path, loc, frame_numbers[i : i + 16]):
                yield pixels.decode_frame(hdr, f, loc.transfer_syntax_uid, pixel_vr=vr)

    return render.render(hdr, decoded(), params, media_type, frame_numbers=frame_numbers)

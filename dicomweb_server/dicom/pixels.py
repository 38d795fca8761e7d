"""Pixel data: one stored frame -> numpy array, native bytes, or a transcoded dataset.

How the archive calls this module
---------------------------------
At read time the archive has

* the header, ``pydicom.dcmread(path, stop_before_pixels=True)``, and
* the bytes of one frame exactly as stored in the file: for native (uncompressed)
  transfer syntaxes the frame's slice of the Pixel Data value (for Explicit VR Big
  Endian still big endian: the byte swap happens here); for encapsulated transfer
  syntaxes the frame's codestream (``pydicom.encaps.generate_frames`` /
  ``get_frame`` output, fragments already joined).

Deflated Explicit VR Little Endian (1.2.840.10008.1.2.1.99) deflates the *whole
dataset*, not the pixels: ``pydicom.dcmread`` inflates it, after which Pixel Data is
plain Explicit VR Little Endian. So a frame of a deflated file reaches this module as
native little-endian bytes sliced from the inflated dataset and is treated exactly
like 1.2.840.10008.1.2.1.

Decoders (pydicom 3 ``pydicom.pixels`` plugins, tried in the order below, the first
that succeeds wins; all permissively licensed):

============================== =====================================================
JPEG Baseline / Extended       pillow (libjpeg-turbo), gdcm [python-gdcm]; 12-bit
                               Extended needs a 12-bit JPEG decoder: none of those
                               has one (pylibjpeg-libjpeg is GPL and not used), so
                               it goes to imagecodecs [optional, BSD-3] when that is
                               installed, else UnsupportedTransferSyntax.
JPEG Lossless (.57, .70)       gdcm [python-gdcm]
JPEG-LS (.80, .81)             pyjpegls (CharLS), gdcm
JPEG 2000 (.90, .91), HTJ2K    pylibjpeg-openjpeg, gdcm, pillow
RLE Lossless                   pylibjpeg-rle, pydicom (pure Python)
native / deflated / big endian numpy, in this module
============================== =====================================================

Errors: ``NotAnImage`` when the header describes no pixels (SR, KO, PR ...: web
layer 404/406); ``UnsupportedTransferSyntax`` when nothing here can decode the frame
(web layer 406). ``PixelDataError`` (a subclass of UnsupportedTransferSyntax, so a
handler for the latter catches it) for a frame that is truncated or whose pixel
description cannot be handled.

Encapsulated frames are decoded by :mod:`.compressed`: their codestream header is
checked against the data set first (:mod:`.codestream`), then the plugins above run
in an isolated decoder process (:mod:`.decode_worker`), so a decoder crash or hang
is a PixelDataError, never a dead web worker. Native frames (and Float / Double
Float Pixel Data, 7FE0,0008 / 7FE0,0009) are read here, in-process. The Image Pixel
description and errors live in :mod:`.pixel_info` (re-exported here).

All functions are thread-safe (no shared mutable state but the decoder pool), so the
web layer may run them in a thread pool.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.encaps import generate_frames
from pydicom.pixels import get_decoder
from pydicom.pixels.processing import convert_color_space
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian

from .compressed import KEEP_COLOUR_SPACE, LOSSY, MAX_DECODED_FRAME_BYTES, decode_compressed
from .pixel_info import (
    ENCAPSULATED_UNCOMPRESSED_LE,
    NATIVE_LITTLE_ENDIAN,
    ImageInfo,
    NotAnImage,
    PixelDataError,
    UnsupportedTransferSyntax,
    element_value,
    fix_unused_bits,
    image_info,
    normalise_ts,
)

__all__ = [
    "ENCAPSULATED_UNCOMPRESSED_LE",
    "MAX_DECODED_FRAME_BYTES",
    "NATIVE_LITTLE_ENDIAN",
    "ImageInfo",
    "NotAnImage",
    "PixelDataError",
    "UnsupportedTransferSyntax",
    "decode_frame",
    "decoded_photometric_interpretation",
    "element_value",
    "float_frames",
    "is_float",
    "frame_to_native_bytes",
    "image_info",
    "is_supported_transfer_syntax",
    "transcode_to_explicit_le",
]


_YBR = ("YBR_FULL", "YBR_FULL_422")


def is_supported_transfer_syntax(transfer_syntax_uid: str) -> bool:
    """True if frames in this transfer syntax can (in principle) be decoded here."""
    ts = normalise_ts(transfer_syntax_uid)
    if ts in NATIVE_LITTLE_ENDIAN or ts == ExplicitVRBigEndian:
        return True
    try:
        return bool(get_decoder(ts).is_available)
    except NotImplementedError:
        return False


def decoded_photometric_interpretation(header: Dataset) -> str:
    """Photometric Interpretation of the array returned by :func:`decode_frame`.

    YBR_FULL / YBR_FULL_422 (and the JPEG 2000 YBR_ICT / YBR_RCT) come back as RGB,
    as ``Dataset.pixel_array`` does; everything else is unchanged.
    """
    pi = image_info(header).photometric_interpretation
    return "RGB" if pi.startswith("YBR") else pi


# --------------------------------------------------------------------------- native


def _native_array(
    info: ImageInfo, frame: bytes | bytearray | memoryview, big_endian: bool, pixel_vr: str | None
) -> np.ndarray:
    """Native frame bytes -> array shaped (rows, cols[, 3]) as stored (planar kept)."""
    rows, cols, spp = info.rows, info.columns, info.samples_per_pixel
    pixels = rows * cols
    need = info.native_frame_length
    if len(frame) < need:
        raise PixelDataError(f"the frame has {len(frame)} bytes of pixel data, {need} are needed")
    if info.bits_allocated == 1:
        bits = np.unpackbits(np.frombuffer(frame, np.uint8, count=need), bitorder="little")
        return bits[:pixels].reshape(rows, cols)

    itemsize = info.bits_allocated // 8
    kind = "i" if info.pixel_representation else "u"
    if big_endian and itemsize == 1 and (pixel_vr or "OB").upper() == "OW":
        # PS3.5: 8-bit samples in an OW value of a big-endian dataset are byte-swapped
        # in 16-bit words. The caller passes the word-aligned bytes (frame + pad byte).
        raw = np.frombuffer(frame, np.uint8, count=len(frame) - (len(frame) % 2))
        if raw.size < need:
            raw = np.frombuffer(bytes(frame) + b"\x00", np.uint8)
        words = raw[: raw.size - raw.size % 2].view(">u2").astype("<u2")
        arr = words.view(np.uint8)[:need].view(f"{kind}1")
    else:
        order = ">" if big_endian and itemsize > 1 else "<"
        count = need // itemsize
        arr = np.frombuffer(frame, dtype=f"{order}{kind}{itemsize}", count=count)
        if order == ">":
            arr = arr.astype(arr.dtype.newbyteorder("="))

    if info.photometric_interpretation == "YBR_FULL_422" and spp == 3:
        # Expand 4:2:2 subsampling: Y1 Y2 Cb Cr -> Y1 Cb Cr Y2 Cb Cr
        out = np.empty(pixels * 3, dtype=arr.dtype)
        out[0::6] = arr[0::4]
        out[3::6] = arr[1::4]
        out[1::6] = out[4::6] = arr[2::4]
        out[2::6] = out[5::6] = arr[3::4]
        arr = out.reshape(rows, cols, 3)
    elif spp == 1:
        arr = arr.reshape(rows, cols)
    elif info.planar_configuration == 1:
        arr = arr.reshape(3, rows, cols).transpose(1, 2, 0)
    else:
        arr = arr.reshape(rows, cols, 3)
    return fix_unused_bits(arr, info)


# ------------------------------------------------------------------------------ float

#: Float Pixel Data (7FE0,0008, OF: float32) and Double Float Pixel Data (7FE0,0009,
#: OD: float64), PS3.3 C.7.6.3 / C.7.6.24, used instead of Pixel Data (7FE0,0010).
FLOAT_PIXEL_DATA = {0x7FE00008: "OF", 0x7FE00009: "OD"}


def is_float(info: ImageInfo, pixel_vr: str | None) -> bool:
    """Whether frames are floats: the element's VR is OF/OD, or Bits Allocated is 64
    (only Double Float Pixel Data has 64 bits, PS3.3 C.7.6.3.1)."""
    return (pixel_vr or "").upper() in ("OF", "OD") or info.bits_allocated == 64


def _float_array(
    info: ImageInfo, frame: bytes | bytearray | memoryview, big_endian: bool
) -> np.ndarray:
    itemsize = 8 if info.bits_allocated == 64 else 4
    count = info.rows * info.columns * info.samples_per_pixel
    if len(frame) < count * itemsize:
        raise PixelDataError(
            f"the float frame has {len(frame)} bytes, {count * itemsize} are needed"
        )
    arr = np.frombuffer(frame, f"{'>' if big_endian else '<'}f{itemsize}", count=count)
    if big_endian:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    shape = (info.rows, info.columns) + ((3,) if info.samples_per_pixel == 3 else ())
    return arr.reshape(shape)


def float_frames(ds: Dataset, numbers: Iterable[int]) -> Iterator[np.ndarray]:
    """Frames `numbers` (1-based) of the Float or Double Float Pixel Data of a whole
    data set (read with its pixel data), as float32 / float64 arrays (Rows, Columns).

    Raises NotAnImage when the data set has neither element, PixelDataError for a
    frame number beyond Number of Frames or a value too short for it.
    """
    info = image_info(ds)
    for tag, vr in FLOAT_PIXEL_DATA.items():
        value = element_value(ds, tag)
        if isinstance(value, (bytes, bytearray)):
            break
    else:
        raise NotAnImage("the instance has no Float or Double Float Pixel Data")
    big_endian = not getattr(ds, "is_little_endian", True)
    info = replace(info, bits_allocated=64 if vr == "OD" else 32)
    size = info.native_frame_length
    for k in numbers:
        if not 1 <= k <= info.number_of_frames:
            raise PixelDataError(f"no frame {k}: the instance has {info.number_of_frames}")
        yield _float_array(info, memoryview(value)[(k - 1) * size : k * size], big_endian)


# ------------------------------------------------------------------------------ API


def decode_frame(
    header: Dataset,
    frame: bytes | bytearray | memoryview,
    transfer_syntax_uid: str,
    *,
    pixel_vr: str | None = None,
) -> np.ndarray:
    """Decode one stored frame to a numpy array.

    Returns shape (Rows, Columns) for one sample per pixel, (Rows, Columns, 3) for
    colour (always interleaved). The dtype follows Bits Allocated / Pixel
    Representation (uint8/int8 ... uint32/int32; Bits Allocated 1 -> uint8 0/1);
    with Bits Stored < Bits Allocated the unused high bits are masked (unsigned) or
    the value sign-extended (signed). YBR_FULL / YBR_FULL_422 are converted to RGB
    (see :func:`decoded_photometric_interpretation`), i.e. the result equals frame 1
    of ``Dataset.pixel_array``. PALETTE COLOR stays as indices.

    The result may be a read-only view on `frame` (native little endian, no
    correction needed): copy it before writing into it.

    `pixel_vr` ("OB"/"OW") only matters for Explicit VR Big Endian with 8-bit
    samples: OW values are byte-swapped in 16-bit words, so for such a frame pass
    the word-aligned bytes (one more byte when the frame length is odd). "OF"/"OD"
    (and any frame with Bits Allocated 64) is a frame of Float / Double Float Pixel
    Data: a float32 / float64 array (see :func:`float_frames`).
    """
    info = image_info(header)
    ts = normalise_ts(transfer_syntax_uid)
    if ts in NATIVE_LITTLE_ENDIAN or ts == ExplicitVRBigEndian:
        if is_float(info, pixel_vr):
            return _float_array(info, frame, ts == ExplicitVRBigEndian)
        arr = _native_array(info, frame, ts == ExplicitVRBigEndian, pixel_vr)
        if arr.ndim == 3:
            if info.photometric_interpretation in _YBR and arr.dtype == np.uint8:
                arr = convert_color_space(np.ascontiguousarray(arr), "YBR_FULL", "RGB")
            elif not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
        return arr
    arr, _ = decode_compressed(info, frame, ts, raw=False)
    return arr


def _description(
    info: ImageInfo, photometric: str, dtype: np.dtype, bits_stored: int
) -> dict[str, Any]:
    bits_allocated = 1 if info.bits_allocated == 1 else dtype.itemsize * 8
    out: dict[str, Any] = {
        "TransferSyntaxUID": str(ExplicitVRLittleEndian),
        "Rows": info.rows,
        "Columns": info.columns,
        "SamplesPerPixel": info.samples_per_pixel,
        "PhotometricInterpretation": photometric,
        "BitsAllocated": bits_allocated,
        "BitsStored": bits_stored,
        "HighBit": bits_stored - 1,
        "PixelRepresentation": info.pixel_representation,
    }
    if info.samples_per_pixel > 1:
        out["PlanarConfiguration"] = info.planar_configuration
    return out


def frame_to_native_bytes(
    header: Dataset,
    frame: bytes | bytearray | memoryview,
    transfer_syntax_uid: str,
    *,
    pixel_vr: str | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """One frame as Explicit VR Little Endian native bytes, plus their description.

    Native little-endian frames are returned unchanged (only a trailing pad byte is
    dropped): planar configuration, unused high bits and YBR_FULL_422 subsampling
    stay exactly as the stored header/metadata reports them (case W5). Big endian
    frames are byte-swapped. Encapsulated frames are decoded to
    Rows*Columns*SamplesPerPixel*BitsAllocated/8 bytes, colour interleaved
    (PlanarConfiguration 0); lossy JPEG/JPEG 2000 YCbCr comes back as RGB, lossless
    RLE/JPEG-LS/JPEG Lossless keep their stored colour space bit-exact.

    The dict describes the returned bytes with DICOM keywords: TransferSyntaxUID,
    Rows, Columns, SamplesPerPixel, PhotometricInterpretation, BitsAllocated,
    BitsStored, HighBit, PixelRepresentation and (colour) PlanarConfiguration. Compare
    with the header to see what changed (e.g. YBR_FULL_422 -> RGB, 1 -> 0).
    """
    info = image_info(header)
    ts = normalise_ts(transfer_syntax_uid)
    need = info.native_frame_length
    if ts in NATIVE_LITTLE_ENDIAN:
        if len(frame) < need:
            raise PixelDataError(f"the frame has {len(frame)} bytes, {need} are needed")
        data = frame if isinstance(frame, bytes) and len(frame) == need else bytes(frame[:need])
        desc = _description(
            info,
            info.photometric_interpretation,
            np.dtype(f"u{max(info.bits_allocated // 8, 1)}"),
            info.bits_stored,
        )
        return data, desc
    if ts == ExplicitVRBigEndian:
        if info.bits_allocated == 1 or (
            info.bits_allocated == 8 and (pixel_vr or "OB").upper() != "OW"
        ):
            if len(frame) < need:
                raise PixelDataError(f"the frame has {len(frame)} bytes, {need} are needed")
            data = bytes(frame[:need])
        else:
            if len(frame) < need:
                raise PixelDataError(f"the frame has {len(frame)} bytes, {need} are needed")
            itemsize = info.bits_allocated // 8
            if itemsize == 1:  # OW: swap 16-bit words
                raw = bytes(frame) + (b"\x00" if len(frame) % 2 else b"")
                data = np.frombuffer(raw, ">u2").astype("<u2").tobytes()[:need]
            else:
                data = (
                    np.frombuffer(frame, f">u{itemsize}", count=need // itemsize)
                    .astype(f"<u{itemsize}")
                    .tobytes()
                )
        desc = _description(
            info,
            info.photometric_interpretation,
            np.dtype(f"u{max(info.bits_allocated // 8, 1)}"),
            info.bits_stored,
        )
        return data, desc

    keep = ts in KEEP_COLOUR_SPACE
    arr, props = decode_compressed(info, frame, ts, raw=keep)
    itemsize = info.bits_allocated // 8
    kind = "i" if info.pixel_representation else "u"
    target = np.dtype(f"<{kind}{itemsize}")
    if arr.dtype != target:
        arr = arr.astype(target)
    data = np.ascontiguousarray(arr).tobytes()
    photometric = str(props.get("photometric_interpretation", info.photometric_interpretation))
    if photometric in ("YBR_ICT", "YBR_RCT"):
        photometric = "RGB"  # the J2K decoder applied the inverse multi-component transform
    desc = _description(info, photometric, target, info.bits_stored)
    if info.samples_per_pixel > 1:
        desc["PlanarConfiguration"] = 0
    return data, desc


# --------------------------------------------------------------------- whole dataset


def _element_copy(ds: Dataset) -> Dataset:
    """A new Dataset sharing the (immutable) elements of `ds` but not its dict."""
    new = Dataset({tag: ds.get_item(tag) for tag in ds.keys()})
    if hasattr(ds, "file_meta"):
        new.file_meta = copy.deepcopy(ds.file_meta)
    return new


_SWAP_WORD = {"OW": 2, "OF": 4, "OL": 4, "OD": 8, "OV": 8}


def _swap_copy(ds: Dataset) -> Dataset:
    """Copy of a big-endian dataset whose OW/OF/OL/OD/OV byte values are little endian.

    Numeric VRs (US, SS, FL ...) are parsed values and re-encode themselves on
    write; raw word VRs are bytes and have to be swapped here. Pixel Data is swapped
    by Bits Allocated of the dataset (item) that holds it.
    """
    new = Dataset()
    bits_allocated = ds.get("BitsAllocated", 16) or 16
    for elem in ds:
        if elem.VR == "SQ":
            seq = Sequence([_swap_copy(item) for item in elem.value])
            new.add(DataElement(elem.tag, "SQ", seq))
            continue
        value = elem.value
        size = _SWAP_WORD.get(elem.VR)
        if size and isinstance(value, (bytes, bytearray)) and value:
            if elem.tag == 0x7FE00010:
                size = max(int(bits_allocated) // 8, 2)
            usable = len(value) - len(value) % size
            swapped = np.frombuffer(value, f">u{size}", count=usable // size).astype(f"<u{size}")
            value = swapped.tobytes() + bytes(value[usable:])
            new.add(DataElement(elem.tag, elem.VR, value))
        else:
            new.add(elem)
    return new


def transcode_to_explicit_le(ds: Dataset) -> Dataset:
    """Return a copy of `ds` (with pixel data) in Explicit VR Little Endian, native.

    For WADO-RS instance retrieval with transfer-syntax=1.2.840.10008.1.2.1 when the
    stored file is compressed or big endian. `ds` is not modified. Encapsulated
    Pixel Data is decoded frame by frame (same decoders and colour rules as
    :func:`frame_to_native_bytes`); the SOP Instance UID is kept and, for lossy
    sources, Lossy Image Compression is set to "01" when absent. Write the result
    with ``ds.save_as(fp, enforce_file_format=True)`` / ``dcmwrite``.

    Raises UnsupportedTransferSyntax when the pixel data cannot be decoded.
    """
    file_meta = getattr(ds, "file_meta", None)
    ts = normalise_ts(getattr(file_meta, "TransferSyntaxUID", None) or ExplicitVRLittleEndian)

    if ts == ExplicitVRBigEndian:
        new = _swap_copy(ds)
        if file_meta is not None:
            new.file_meta = copy.deepcopy(file_meta)
    else:
        new = _element_copy(ds)

    if ts not in NATIVE_LITTLE_ENDIAN and ts != ExplicitVRBigEndian and "PixelData" in ds:
        if ts == ENCAPSULATED_UNCOMPRESSED_LE:
            info = image_info(ds)
            chunks = [
                bytes(f[: info.native_frame_length])
                for f in generate_frames(ds.PixelData, number_of_frames=info.number_of_frames)
            ]
            desc = _description(
                info,
                info.photometric_interpretation,
                np.dtype(f"u{max(info.bits_allocated // 8, 1)}"),
                info.bits_stored,
            )
        else:
            info = image_info(ds)
            chunks = []
            desc = {}
            for frame in generate_frames(ds.PixelData, number_of_frames=info.number_of_frames):
                data, desc = frame_to_native_bytes(ds, frame, ts)
                chunks.append(data)
                if len(chunks) == info.number_of_frames:
                    break
            if not chunks:
                raise PixelDataError("the encapsulated pixel data holds no frames")
        pixel_data = b"".join(chunks)
        if len(pixel_data) % 2:
            pixel_data += b"\x00"
        vr = "OB" if info.bits_allocated <= 8 else "OW"
        new[0x7FE00010] = DataElement(0x7FE00010, vr, pixel_data)
        new[0x00280004] = DataElement(0x00280004, "CS", desc["PhotometricInterpretation"])
        if info.samples_per_pixel > 1:
            new[0x00280006] = DataElement(0x00280006, "US", desc.get("PlanarConfiguration", 0))
        if "NumberOfFrames" in ds and len(chunks) != info.number_of_frames:
            new[0x00280008] = DataElement(0x00280008, "IS", str(len(chunks)))
        if ts in LOSSY and ds.get("LossyImageCompression", None) != "01":
            new[0x00282110] = DataElement(0x00282110, "CS", "01")
            if "LossyImageCompressionMethod" not in ds:
                new[0x00282114] = DataElement(0x00282114, "CS", LOSSY[ts])
        for tag in (0x7FE00001, 0x7FE00002):  # Extended Offset Table (+ Lengths)
            if tag in new:
                del new[tag]

    if not hasattr(new, "file_meta"):
        from pydicom.dataset import FileMetaDataset

        new.file_meta = FileMetaDataset()
    new.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return new

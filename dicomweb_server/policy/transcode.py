"""Transcoding pixel data between transfer syntaxes: decode what is stored, encode
what is asked for (WADO-RS instances/frames/bulk data, C-GET/C-MOVE sub-operations).

Pure: no web framework, no archive. Decoding is :mod:`..dicom.pixels` (codestream
checked, decoders in the isolated decode worker processes); encoding goes to the same
worker processes (:mod:`..dicom.decode_worker`): the compiled encoders run on pixels
that came from clients, and a crash or hang must not take a web or DIMSE process down.

Encoders (no hand-written codec):

=================================== ============================================
JPEG-LS Lossless (.4.80)            pydicom's encoder, pyjpegls (CharLS)
JPEG 2000 Lossless (.4.90)          pydicom's encoder, pylibjpeg-openjpeg
RLE Lossless (.5)                   pydicom's encoder (pylibjpeg-rle, or pydicom)
HTJ2K Lossless (.4.201)             imagecodecs ``htj2k_encode`` (OpenJPH)
HTJ2K Lossless RPCL (.4.202)        imagecodecs ``htj2k_encode`` (OpenJPH), checked
JPEG Baseline 8-bit (.4.50), lossy  imagecodecs ``jpeg8_encode`` (libjpeg-turbo)
JPEG 2000 (.4.91), lossy            pydicom's encoder, pylibjpeg-openjpeg
HTJ2K (.4.203), lossy               imagecodecs ``htj2k_encode`` (OpenJPH), 9-7 wavelet
Explicit / Implicit VR LE           :func:`..dicom.pixels.transcode_to_explicit_le`
=================================== ============================================

HTJ2K Lossless RPCL (.4.202), PS3.5 10.18 (Table A-4): the progression order is RPCL,
the number of decompositions brings the lowest resolution to 64 pixels a side or less
(a thumbnail), and TLM marker segments are present (here with one tile-part per
resolution, so that the TLM gives the resolution breakpoints). OpenJPH writes RPCL by
default; the TLM and the decompositions are asked for, and every codestream's COD and
TLM are read back (:func:`..dicom.codestream.coding_style`) before it is used.

HTJ2K is written without the multiple component transform (also .201), as JPEG 2000 is:
the samples stay in their colour space and Photometric Interpretation does not change
(PS3.5 8.2.4 / 8.2.14 ask YBR_RCT or YBR_ICT of a codestream that uses it).

Lossy syntaxes are produced only when the caller names them (:data:`LOSSY_TARGETS`);
the answer then carries Lossy Image Compression (0028,2110) "01", and the ratio and
method of this compression appended to Lossy Image Compression Ratio (0028,2112) and
Method (0028,2114), as PS3.3 C.7.6.1.1.5 asks. The SOP Instance UID is kept: a
compressed transfer syntax is an encoding of the same instance (PS3.5 §8.2; the
DICOMweb client asked for that representation, PS3.18 §8.7.3).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    UID,
    ExplicitVRLittleEndian,
    HTJ2K,
    HTJ2KLossless,
    HTJ2KLosslessRPCL,
    ImplicitVRLittleEndian,
    JPEG2000,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGLSLossless,
    RLELossless,
)

from ..dicom import decode_worker, pixels
from ..dicom.codestream import coding_style
from ..dicom.media_types import UNENCAPSULATED
from ..dicom.pixel_info import ImageInfo, PixelDataError, UnsupportedTransferSyntax, fix_unused_bits, normalise_ts

__all__ = [
    "LOSSLESS_TARGETS",
    "LOSSY_TARGETS",
    "NATIVE_TARGETS",
    "TRANSCODE_CHANGES",
    "can_decode",
    "can_transcode",
    "encodable",
    "is_lossy_target",
    "transcode",
    "transcode_frame",
]

#: uncompressed syntaxes produced from any decodable source
NATIVE_TARGETS = (ExplicitVRLittleEndian, ImplicitVRLittleEndian)


@dataclass(frozen=True, slots=True)
class Target:
    """A compressed syntax this module can encode: its Lossy Image Compression
    Method (PS3.3 C.7.6.1.1.5, defined terms) when lossy, else None."""

    uid: str
    method: str | None = None


#: lossless compressed syntaxes, in the order C-MOVE proposes them
LOSSLESS_TARGETS = (JPEGLSLossless, JPEG2000Lossless, HTJ2KLossless, HTJ2KLosslessRPCL, RLELossless)
#: lossy syntaxes: produced only when named by the client (never for C-GET/C-MOVE)
LOSSY_TARGETS = (JPEGBaseline8Bit, JPEG2000, HTJ2K)
#: the top-level elements a lossless :func:`transcode` may change besides the transfer syntax
#: (the pixels' encoding): Photometric Interpretation and Planar Configuration (the colour
#: layout the encoder writes), Pixel Data, Extended Offset Table (+ Lengths), and Data Set
#: Trailing Padding (PS3.10 §7, no meaning). Lossy Image Compression and its Ratio / Method
#: are not among them: a lossy encoding is other content.
TRANSCODE_CHANGES = frozenset({0x00280004, 0x00280006, 0x7FE00010, 0x7FE00001, 0x7FE00002, 0xFFFCFFFC})
#: Lossy Image Compression Method (0028,2114) defined terms, PS3.3 C.7.6.1.1.5.1
_METHOD = {JPEGBaseline8Bit: "ISO_10918_1", JPEG2000: "ISO_15444_1", HTJ2K: "ISO_15444_15"}
_HTJ2K = (HTJ2KLossless, HTJ2KLosslessRPCL, HTJ2K)
#: encoding plugin preference: GDCM's RLE encoder aborts the process on some sizes
#: (image_len % MaxNumSegments), so pylibjpeg-rle / pydicom's own go first
_ENCODER_PREFERENCE = {RLELossless: ("pylibjpeg", "pydicom")}
#: quality of JPEG Baseline (libjpeg's 0-100 scale) and compression ratio of lossy JPEG 2000
JPEG_QUALITY = 90
J2K_RATIO = 10
#: quantization step of lossy HTJ2K as a fraction of the frame's sample range (max -
#: min): about 10:1 on a CT, as J2K_RATIO (OpenJPH has no rate control)
HTJ2K_QSTEP = 0.015
#: PS3.5 10.18: the lowest resolution of HTJ2K Lossless RPCL is at most this wide and high
RPCL_THUMBNAIL = 64
#: OpenJPH's default number of decompositions (kept when it is enough for RPCL_THUMBNAIL)
_HTJ2K_DECOMPOSITIONS = 5


def is_lossy_target(ts: str) -> bool:
    return ts in LOSSY_TARGETS


@functools.cache
def encodable() -> frozenset[str]:
    """The compressed syntaxes whose encoder is installed here."""
    from pydicom.pixels import get_encoder

    out = set()
    for ts in (JPEGLSLossless, JPEG2000Lossless, RLELossless, JPEG2000):
        try:
            if get_encoder(ts).is_available:
                out.add(ts)
        except NotImplementedError:
            pass
    try:
        import imagecodecs

        if imagecodecs.HTJ2K.available:
            out.update(_HTJ2K)
        if imagecodecs.JPEG8.available:
            out.add(JPEGBaseline8Bit)
    except (ImportError, AttributeError):
        pass
    return frozenset(out)


def can_decode(ts: str) -> bool:
    """Whether pixel data stored in ``ts`` can be decoded to native pixels here."""
    return ts in UNENCAPSULATED or pixels.is_supported_transfer_syntax(ts)


def can_transcode(stored_ts: str, target_ts: str) -> bool:
    """Whether an instance stored in ``stored_ts`` can be given in ``target_ts``
    (by syntax alone: a picture an encoder cannot take, e.g. 16-bit for JPEG
    Baseline, is refused later by :func:`transcode` / :func:`transcode_frame`)."""
    if target_ts == stored_ts:
        return True
    if target_ts not in NATIVE_TARGETS and target_ts not in encodable():
        return False
    return can_decode(stored_ts)


# ------------------------------------------------------------------------ encoding


def _frame_array(native: bytes, desc: dict) -> np.ndarray:
    """Native little-endian frame bytes (described as pixels.frame_to_native_bytes does)
    -> array (rows, columns[, samples]) interleaved, unused high bits cleared/sign-extended."""
    info = ImageInfo(
        desc["Rows"], desc["Columns"], desc["SamplesPerPixel"], desc["BitsAllocated"], desc["BitsStored"],
        desc["PixelRepresentation"], desc["PhotometricInterpretation"], desc.get("PlanarConfiguration", 0), 1,
    )
    kind = "i" if info.pixel_representation else "u"
    arr = np.frombuffer(native, f"<{kind}{info.bits_allocated // 8}",
                        count=info.rows * info.columns * info.samples_per_pixel)
    if info.samples_per_pixel == 1:
        arr = arr.reshape(info.rows, info.columns)
    elif info.planar_configuration == 1:
        arr = arr.reshape(info.samples_per_pixel, info.rows, info.columns).transpose(1, 2, 0)
    else:
        arr = arr.reshape(info.rows, info.columns, info.samples_per_pixel)
    return fix_unused_bits(np.ascontiguousarray(arr), info)


def _check_encodable(desc: dict, target: str) -> None:
    photometric = desc["PhotometricInterpretation"]
    if desc["BitsAllocated"] not in (8, 16, 32) or (desc["BitsAllocated"] == 32 and target != RLELossless):
        raise PixelDataError(f"{desc['BitsAllocated']}-bit pixels are not encoded as {UID(target).name}")
    if photometric == "YBR_FULL_422":
        raise PixelDataError(f"native YBR_FULL_422 (subsampled) pixels are not re-encoded as {UID(target).name}")
    if target == JPEGBaseline8Bit and (desc["BitsStored"] > 8 or desc["PixelRepresentation"]):
        raise PixelDataError("JPEG Baseline holds 8-bit unsigned samples only "
                             f"(these are {desc['BitsStored']}-bit, "
                             f"{'signed' if desc['PixelRepresentation'] else 'unsigned'})")
    if target == JPEGLSLossless and desc["BitsStored"] > 16:
        raise PixelDataError("JPEG-LS holds at most 16-bit samples")


def encode_native_frame(native: bytes, desc: dict, target: str) -> tuple[bytes, str]:
    """One native frame -> (codestream in ``target``, Photometric Interpretation of it).
    Runs in a decode worker process (module-level, picklable arguments)."""
    _check_encodable(desc, target)
    arr = _frame_array(native, desc)
    photometric = desc["PhotometricInterpretation"]
    if target in _HTJ2K:
        return _htj2k(arr, desc, target), photometric
    if target == JPEGBaseline8Bit:
        import imagecodecs

        if arr.ndim == 3:  # RGB (or YBR_FULL, taken as is) -> YCbCr 4:2:2 inside the JPEG (PS3.5 8.2.1)
            data = imagecodecs.jpeg8_encode(arr, level=JPEG_QUALITY, colorspace="RGB" if photometric == "RGB"
                                            else "YCbCr", outcolorspace="YCbCr", subsampling="422")
            return data, "YBR_FULL_422"
        return imagecodecs.jpeg8_encode(arr, level=JPEG_QUALITY), photometric
    if target in (JPEG2000Lossless, JPEG2000) and min(arr.shape[:2]) < _J2K_MIN_SIDE:
        return _small_j2k(arr, desc, lossless=target == JPEG2000Lossless), photometric
    from pydicom.pixels import get_encoder

    opts: dict = {
        "rows": desc["Rows"], "columns": desc["Columns"], "samples_per_pixel": desc["SamplesPerPixel"],
        "bits_allocated": desc["BitsAllocated"], "bits_stored": desc["BitsStored"],
        "pixel_representation": desc["PixelRepresentation"], "photometric_interpretation": photometric,
        "number_of_frames": 1, "planar_configuration": 0,
    }
    if target in (JPEG2000Lossless, JPEG2000):
        opts["use_mct"] = False  # samples kept in their colour space: bit-exact, Photometric unchanged
    if target == JPEG2000:
        opts["j2k_cr"] = [J2K_RATIO]
    encoder = get_encoder(target)
    preferred = [p for p in _ENCODER_PREFERENCE.get(target, ()) if p in encoder.available_plugins]
    if preferred:
        opts["encoding_plugin"] = preferred[0]
    return encoder.encode(arr, **opts), photometric


def rpcl_decompositions(rows: int, columns: int) -> int:
    """The decompositions HTJ2K Lossless RPCL needs (PS3.5 10.18): enough for the
    lowest resolution to be RPCL_THUMBNAIL pixels or less on each side; OpenJPH's
    default 5 when that is enough."""
    d = _HTJ2K_DECOMPOSITIONS
    while max(rows, columns) > RPCL_THUMBNAIL << d:
        d += 1
    return d


def _htj2k(arr: np.ndarray, desc: dict, target: str) -> bytes:
    """An HTJ2K codestream (OpenJPH through imagecodecs) of one frame, no colour
    transform. For .202 the COD and TLM written are checked (PS3.5 10.18)."""
    import imagecodecs

    if target == HTJ2K:
        # OpenJPH's step is a fraction of 2^precision, and imagecodecs declares the
        # precision of the sample type (16 for 12 bits stored): the step is made
        # HTJ2K_QSTEP of the frame's own range
        span = max(1, int(arr.max()) - int(arr.min())) if arr.size else 1
        qstep = max(HTJ2K_QSTEP * span / (1 << (arr.dtype.itemsize * 8)), 1e-5)
        return imagecodecs.htj2k_encode(arr, level=qstep, reversible=False, rgb=False)
    if target == HTJ2KLossless:
        return imagecodecs.htj2k_encode(arr, reversible=True, rgb=False)
    decompositions = rpcl_decompositions(desc["Rows"], desc["Columns"])
    data = imagecodecs.htj2k_encode(arr, reversible=True, rgb=False, tlm=True, resolutions=decompositions,
                                    tilepart=imagecodecs.HTJ2K.TILEPART.RESOLUTIONS)
    style = coding_style(data)
    if (style.progression_order, style.tlm, style.decompositions, style.reversible) != \
            ("RPCL", True, decompositions, True):
        raise PixelDataError(f"the HTJ2K encoder wrote {style}, not the RPCL progression order, TLM and "
                             f"{decompositions} decompositions that HTJ2K Lossless RPCL needs")
    return data


#: pylibjpeg-openjpeg always makes 6 DWT resolutions, which needs 2^5 pixels a side
_J2K_MIN_SIDE = 32


def _small_j2k(arr: np.ndarray, desc: dict, *, lossless: bool) -> bytes:
    """A JPEG 2000 codestream of a picture smaller than 32 pixels a side, with fewer
    resolutions (imagecodecs, OpenJPEG too)."""
    import imagecodecs

    resolutions = max(1, min(6, int(min(arr.shape[:2])).bit_length()))
    return imagecodecs.jpeg2k_encode(arr, level=0 if lossless else 100 // J2K_RATIO * 4, codecformat="J2K",
                                     bitspersample=desc["BitsStored"], resolutions=resolutions,
                                     reversible=lossless, mct=False)


def _encode(native: bytes, desc: dict, target: str) -> tuple[bytes, str]:
    """:func:`encode_native_frame` in a decode worker; its failures are PixelDataError (406)."""
    try:
        data, photometric = decode_worker.call(encode_native_frame, bytes(native), desc, str(target))
        return bytes(data), photometric  # pydicom's encoders give a bytearray
    except PixelDataError:
        raise
    except (decode_worker.WorkerDied, decode_worker.WorkerTimeout) as e:
        raise PixelDataError(f"encoding as {UID(target).name} failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - an encoder's refusal (range, size, options)
        raise PixelDataError(f"cannot encode these pixels as {UID(target).name}: {e}") from None


def transcode_frame(header: Dataset, frame: bytes, stored_ts: str, target_ts: str,
                    *, pixel_vr: str | None = None) -> bytes:
    """One stored frame (as :mod:`..dicom.pixels` takes it) in ``target_ts``: the
    codestream of a compressed syntax, or native little-endian bytes for Explicit /
    Implicit VR Little Endian.

    Raises
    ------
    UnsupportedTransferSyntax
        The frame cannot be decoded, or its pixels not encoded in ``target_ts`` (406).
    """
    stored_ts, target_ts = normalise_ts(stored_ts), normalise_ts(target_ts)
    if not can_transcode(stored_ts, target_ts):
        raise UnsupportedTransferSyntax(f"cannot produce {target_ts} from {stored_ts}")
    native, desc = pixels.frame_to_native_bytes(header, frame, stored_ts, pixel_vr=pixel_vr)
    if target_ts in NATIVE_TARGETS:
        return native
    return _encode(native, desc, target_ts)[0]


def _ds_value(ds: Dataset, keyword: str) -> list[str]:
    value = ds.get(keyword)
    if value is None or value == "":
        return []
    return [str(v) for v in value] if not isinstance(value, (str, bytes)) and hasattr(value, "__iter__") \
        else [str(value)]


def transcode(ds: Dataset, target_ts: str) -> Dataset:
    """A copy of ``ds`` (read with its pixel data) whose file meta and pixel data are
    in ``target_ts``; ``ds`` is not modified. Write it with
    ``save_as(fp, enforce_file_format=True)`` (the encoding follows the file meta).

    A data set without Pixel Data only changes its Transfer Syntax UID (a compressed
    syntax encodes the rest as Explicit VR Little Endian, PS3.5 A.4).

    Raises
    ------
    UnsupportedTransferSyntax
        The stored pixels cannot be decoded, or not encoded in ``target_ts`` (e.g.
        16-bit pixels as JPEG Baseline, Float Pixel Data, 1-bit pixels compressed).
    """
    target_ts = normalise_ts(target_ts)
    stored_ts = normalise_ts(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
                             or ExplicitVRLittleEndian)
    if not can_transcode(stored_ts, target_ts):
        raise UnsupportedTransferSyntax(f"cannot produce {target_ts} from {stored_ts}")
    new = pixels.transcode_to_explicit_le(ds)
    if target_ts in NATIVE_TARGETS or "PixelData" not in new:
        new.file_meta.TransferSyntaxUID = target_ts
        return new
    info = pixels.image_info(new)
    desc = {
        "Rows": info.rows, "Columns": info.columns, "SamplesPerPixel": info.samples_per_pixel,
        "BitsAllocated": info.bits_allocated, "BitsStored": info.bits_stored,
        "PixelRepresentation": info.pixel_representation,
        "PhotometricInterpretation": info.photometric_interpretation,
        "PlanarConfiguration": info.planar_configuration,
    }
    if info.bits_allocated == 1:
        raise PixelDataError(f"1-bit pixels are not encoded as {UID(target_ts).name}")
    size = info.native_frame_length
    data = memoryview(new.PixelData)
    frames: list[bytes] = []
    photometric = info.photometric_interpretation
    for k in range(info.number_of_frames):
        chunk = data[k * size : (k + 1) * size]
        if len(chunk) < size:
            raise PixelDataError(f"frame {k + 1} has {len(chunk)} bytes of pixel data, {size} are needed")
        encoded, photometric = _encode(bytes(chunk), desc, target_ts)
        frames.append(encoded)
    # new elements: the copy shares the unchanged ones with ``ds``
    new[0x7FE00010] = DataElement(0x7FE00010, "OB", encapsulate(frames, has_bot=True), is_undefined_length=True)
    new[0x00280004] = DataElement(0x00280004, "CS", photometric)
    if info.samples_per_pixel > 1:
        new[0x00280006] = DataElement(0x00280006, "US", 0)
    if target_ts in LOSSY_TARGETS:
        ratio = size * info.number_of_frames / max(1, sum(len(f) for f in frames))
        new[0x00282110] = DataElement(0x00282110, "CS", "01")
        ratios = _ds_value(new, "LossyImageCompressionRatio") + [f"{ratio:.2f}"[:16]]
        methods = _ds_value(new, "LossyImageCompressionMethod") + [_METHOD[target_ts]]
        new[0x00282112] = DataElement(0x00282112, "DS", ratios)
        new[0x00282114] = DataElement(0x00282114, "CS", methods)
    new.file_meta.TransferSyntaxUID = target_ts
    return new

"""Encapsulated (compressed) frames -> numpy arrays with pydicom's decoding plugins,
made safe for a server: the codestream header is checked against the data set
(:mod:`.codestream`) and the decoders run in isolated worker processes
(:mod:`.decode_worker`); see :func:`decode_compressed`. Plugin order and licences:
the table in :mod:`.pixels`."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydicom.pixels import get_decoder
from pydicom.uid import (
    UID,
    HTJ2K,
    HTJ2KLossless,
    HTJ2KLosslessRPCL,
    JPEG2000,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    JPEGLossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)

from . import decode_worker
from .codestream import CodestreamMismatch, check_frame
from .pixel_info import ImageInfo, PixelDataError, UnsupportedTransferSyntax, fix_unused_bits

__all__ = ["KEEP_COLOUR_SPACE", "LOSSY", "MAX_DECODED_FRAME_BYTES", "decode_compressed"]

#: Lossless codecs without a colour transform: when producing native bytes the
#: decoded samples are kept in the stored colour space (e.g. RLE YBR_FULL stays
#: YBR_FULL, bit-exact) instead of being converted to RGB.
KEEP_COLOUR_SPACE = frozenset(
    {RLELossless, JPEGLossless, JPEGLosslessSV1, JPEGLSLossless, JPEGLSNearLossless}
)

#: Lossy transfer syntaxes (PS3.5 8.2): decoded copies keep Lossy Image Compression.
LOSSY = {
    JPEGBaseline8Bit: "ISO_10918_1",
    JPEGExtended12Bit: "ISO_10918_1",
    JPEGLSNearLossless: "ISO_14495_1",
    JPEG2000: "ISO_15444_1",
    HTJ2K: "ISO_15444_15",
}

#: Plugin preference per encapsulated transfer syntax (fast, exact decoders first).
_PLUGIN_PREFERENCE: dict[str, tuple[str, ...]] = {
    JPEGBaseline8Bit: ("pillow", "gdcm", "pylibjpeg"),
    JPEGExtended12Bit: ("pillow", "gdcm", "pylibjpeg"),
    JPEGLossless: ("gdcm", "pylibjpeg"),
    JPEGLosslessSV1: ("gdcm", "pylibjpeg"),
    JPEGLSLossless: ("pyjpegls", "gdcm", "pylibjpeg"),
    JPEGLSNearLossless: ("pyjpegls", "gdcm", "pylibjpeg"),
    JPEG2000Lossless: ("pylibjpeg", "gdcm", "pillow"),
    JPEG2000: ("pylibjpeg", "gdcm", "pillow"),
    HTJ2KLossless: ("pylibjpeg",),
    HTJ2KLosslessRPCL: ("pylibjpeg",),
    HTJ2K: ("pylibjpeg",),
    RLELossless: ("pylibjpeg", "pydicom", "gdcm"),
}


def _encapsulate_one(frame: bytes | bytearray | memoryview) -> bytes:
    """Wrap one codestream as encapsulated Pixel Data (empty BOT + one item)."""
    n = len(frame)
    pad = b"\x00" if n % 2 else b""
    return b"".join(
        (
            b"\xfe\xff\x00\xe0\x00\x00\x00\x00",
            b"\xfe\xff\x00\xe0",
            (n + len(pad)).to_bytes(4, "little"),
            bytes(frame),
            pad,
        )
    )


def _decoder_for(ts: UID):
    try:
        decoder = get_decoder(ts)
    except NotImplementedError as exc:
        raise UnsupportedTransferSyntax(
            f"no pixel data decoder for transfer syntax {ts} ({ts.name})"
        ) from exc
    if not decoder.is_available:
        raise UnsupportedTransferSyntax(
            f"no decoding plugin is installed for transfer syntax {ts} ({ts.name})"
        )
    return decoder


def _plugin_order(ts: UID, decoder) -> list[str]:
    available = list(decoder.available_plugins)
    preferred = [p for p in _PLUGIN_PREFERENCE.get(ts, ()) if p in available]
    return preferred + [p for p in available if p not in preferred]


def _imagecodecs_jpeg(
    info: ImageInfo, frame: bytes | bytearray | memoryview
) -> tuple[np.ndarray, dict[str, Any]] | None:
    """Decode a JPEG (incl. 12-bit Extended) frame with imagecodecs, if installed.

    imagecodecs (BSD-3-Clause; libjpeg-turbo 3 with 12-bit support) is an optional
    dependency: without it 12-bit JPEG Extended frames are UnsupportedTransferSyntax.
    """
    try:
        import imagecodecs
    except ImportError:
        return None
    arr = imagecodecs.jpeg8_decode(bytes(frame))
    expected = (info.rows, info.columns) + ((3,) if info.samples_per_pixel == 3 else ())
    if arr.shape != expected:
        raise ValueError(f"imagecodecs decoded shape {arr.shape}, expected {expected}")
    kind = "i" if info.pixel_representation else "u"
    target = np.dtype(f"{kind}{max(info.bits_allocated // 8, 1)}")
    if arr.dtype != target:
        arr = (
            arr.astype(target.newbyteorder("="))
            if arr.dtype.itemsize != target.itemsize
            else arr.view(target)
        )
    arr = fix_unused_bits(np.ascontiguousarray(arr), info)
    photometric = "RGB" if info.samples_per_pixel == 3 else info.photometric_interpretation
    return arr, {"photometric_interpretation": photometric, "planar_configuration": 0}


def _decode_encapsulated(
    info: ImageInfo, frame: bytes | bytearray | memoryview, ts: UID, *, raw: bool
) -> tuple[np.ndarray, dict[str, Any]]:
    errors = []
    if ts in (JPEGExtended12Bit, JPEGBaseline8Bit) and info.bits_stored > 8:
        # 12-bit JPEG: no pydicom plugin here can decode it (pylibjpeg-libjpeg is GPL)
        try:
            result = _imagecodecs_jpeg(info, frame)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"imagecodecs: {exc}")
            result = None
        if result is not None:
            return result
        if not errors:
            errors.append("imagecodecs: not installed (optional, needed for 12-bit JPEG)")
    decoder = _decoder_for(ts)
    src = _encapsulate_one(frame)
    opts = info.decode_options()
    for plugin in _plugin_order(ts, decoder):
        try:
            arr, props = decoder.as_array(src, index=0, raw=raw, decoding_plugin=plugin, **opts)
        except Exception as exc:  # noqa: BLE001 - every plugin failure is tried/reported
            text = str(exc).strip()
            errors.append(f"{plugin}: {text.splitlines()[0] if text else type(exc).__name__}")
            continue
        return arr, props
    raise UnsupportedTransferSyntax(
        f"unable to decode the {ts.name} frame ({info.bits_stored}-bit, "
        f"{info.photometric_interpretation}): " + "; ".join(errors)
    )


def _decode_here(
    info: ImageInfo, frame: bytes, ts: UID, raw: bool
) -> tuple[np.ndarray, dict[str, Any]]:
    """_decode_encapsulated as a module-level function a decode worker can run."""
    arr, props = _decode_encapsulated(info, frame, ts, raw=raw)
    return arr, {k: (str(v) if isinstance(v, str) else v) for k, v in props.items()}


#: Largest decoded frame of a compressed transfer syntax (Rows x Columns x Samples per
#: Pixel x Bits Allocated / 8): a small codestream can declare a huge picture.
MAX_DECODED_FRAME_BYTES = 1 << 30


def decode_compressed(
    info: ImageInfo, frame: bytes | bytearray | memoryview, ts: UID, *, raw: bool
) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode an encapsulated frame safely: header check here, decoding in a worker.

    The codestream header must describe the data set's picture
    (:mod:`.codestream`), and the native decoders run in a decode worker process
    (:mod:`.decode_worker`), so neither a mismatched nor a decoder-crashing frame can
    take the web process down: both become PixelDataError (web layer: 406).
    """
    what = f"the stored {ts.name} frame"
    size = info.rows * info.columns * info.samples_per_pixel * max(info.bits_allocated // 8, 1)
    if size > MAX_DECODED_FRAME_BYTES:
        raise PixelDataError(
            f"{what} would decode to {size:,} bytes, more than the {MAX_DECODED_FRAME_BYTES:,} "
            "this server decodes (it is available as stored: transfer-syntax=*)"
        )
    try:
        check_frame(
            frame,
            ts,
            rows=info.rows,
            columns=info.columns,
            samples_per_pixel=info.samples_per_pixel,
            bits_allocated=info.bits_allocated,
        )
        return decode_worker.call(_decode_here, info, bytes(frame), ts, raw)
    except CodestreamMismatch as exc:
        raise PixelDataError(f"{what} cannot be decoded: {exc}") from None
    except (decode_worker.WorkerDied, decode_worker.WorkerTimeout) as exc:
        raise PixelDataError(f"{what} cannot be decoded: {exc}") from None

"""Codestream header checks (dicom/codestream.py): every family accepts its own
well-formed frame and refuses one that describes another picture."""

from __future__ import annotations

import imagecodecs
import numpy as np
import pytest
from pydicom.pixels import get_encoder
from pydicom.uid import (
    JPEG2000,
    HTJ2KLossless,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGLosslessSV1,
    JPEGLSLossless,
    RLELossless,
)

from dicomweb_server.dicom.codestream import CodestreamMismatch, check_frame

RGB = (np.arange(24 * 32 * 3) % 251).astype(np.uint8).reshape(24, 32, 3)
GREY16 = (np.arange(24 * 32) % 4096).astype(np.uint16).reshape(24, 32)


def _rle(arr: np.ndarray) -> bytes:
    spp = 3 if arr.ndim == 3 else 1
    return get_encoder(RLELossless).encode(
        arr.tobytes(), rows=arr.shape[0], columns=arr.shape[1], samples_per_pixel=spp,
        bits_allocated=arr.itemsize * 8, bits_stored=arr.itemsize * 8, pixel_representation=0,
        photometric_interpretation="RGB" if spp == 3 else "MONOCHROME2", number_of_frames=1,
        planar_configuration=0,
    )


FRAMES = [
    # (name, codestream, transfer syntax, samples per pixel, bits allocated)
    ("jpeg-rgb", bytes(imagecodecs.jpeg8_encode(RGB)), JPEGBaseline8Bit, 3, 8),
    ("jpeg-lossless", bytes(imagecodecs.ljpeg_encode(GREY16, bitspersample=12)), JPEGLosslessSV1, 1, 16),
    ("jpeg-ls", bytes(imagecodecs.jpegls_encode(GREY16)), JPEGLSLossless, 1, 16),
    ("j2k-rgb", bytes(imagecodecs.jpeg2k_encode(RGB, codecformat="j2k")), JPEG2000, 3, 8),
    ("jp2-grey", bytes(imagecodecs.jpeg2k_encode(GREY16, level=0, codecformat="jp2")), JPEG2000Lossless, 1, 16),
    ("htj2k", bytes(imagecodecs.jpeg2k_encode(GREY16, level=0, codecformat="j2k")), HTJ2KLossless, 1, 16),
    ("rle-rgb", _rle(RGB), RLELossless, 3, 8),
    ("rle-grey16", _rle(GREY16), RLELossless, 1, 16),
]


@pytest.mark.parametrize("name, frame, ts, spp, ba", FRAMES, ids=[f[0] for f in FRAMES])
def test_matching_header_passes(name, frame, ts, spp, ba):
    check_frame(frame, ts, rows=24, columns=32, samples_per_pixel=spp, bits_allocated=ba)


@pytest.mark.parametrize("name, frame, ts, spp, ba", FRAMES, ids=[f[0] for f in FRAMES])
@pytest.mark.parametrize("change", ["rows", "columns", "samples_per_pixel"])
def test_mismatch_is_refused(name, frame, ts, spp, ba, change):
    expect = {"rows": 24, "columns": 32, "samples_per_pixel": spp, "bits_allocated": ba}
    expect[change] = {"rows": 25, "columns": 512, "samples_per_pixel": 4 - spp}[change]
    if ts == RLELossless and change != "samples_per_pixel":
        check_frame(frame, ts, **expect)  # the RLE header holds no size: only segments are checked
        return
    with pytest.raises(CodestreamMismatch, match="does not match the data set"):
        check_frame(frame, ts, **expect)


def test_precision_above_bits_allocated_is_refused():
    frame = bytes(imagecodecs.jpegls_encode(GREY16))
    with pytest.raises(CodestreamMismatch, match="precision 16 does not fit Bits Allocated 8"):
        check_frame(frame, JPEGLSLossless, rows=24, columns=32, samples_per_pixel=1, bits_allocated=8)


@pytest.mark.parametrize("frame, ts, message", [
    (b"\xff\xd8\xff\xda\x00\x02", JPEGBaseline8Bit, "no frame header"),
    (bytes(imagecodecs.jpegls_encode(GREY16)), JPEGBaseline8Bit, "SOF marker FFF7"),
    (b"\x00" * 100, JPEG2000, "not a JPEG 2000 codestream"),
    (b"\xff\x4f\xff\x51\x00\x29", JPEG2000, "truncated"),
    (b"\x01\x00\x00\x00" + b"\x00" * 60, RLELossless, "invalid segment offsets"),
    (b"\x01\x00", RLELossless, "less than its 64-byte header"),
])
def test_malformed_headers(frame, ts, message):
    with pytest.raises(CodestreamMismatch, match=message):
        check_frame(frame, ts, rows=24, columns=32, samples_per_pixel=1, bits_allocated=8)

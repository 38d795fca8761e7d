"""policy/transcode.py: every lossless syntax round-trips byte-identical pixel arrays
(8-bit, 12-bit, 16-bit unsigned and signed, RGB, multi-frame; pydicom's shipped test
files and synthetic ones), transcoding between every pair claimed (checked by decoding
the answer with pydicom), lossy output labelled as PS3.3 C.7.6.1.1.5 asks, and
refusals for what cannot be produced."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.dataset import Dataset
from pydicom.uid import (
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    HTJ2KLossless,
    HTJ2KLosslessRPCL,
    ImplicitVRLittleEndian,
    JPEG2000,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGLSLossless,
    RLELossless,
)

from dicomweb_server.dicom.pixel_info import UnsupportedTransferSyntax
from dicomweb_server.policy import transcode
from tests.helpers import make_dataset

LOSSLESS = [JPEGLSLossless, JPEG2000Lossless, HTJ2KLossless, HTJ2KLosslessRPCL, RLELossless]
NATIVE = [ExplicitVRLittleEndian, ImplicitVRLittleEndian]


def _written(ds: Dataset) -> Dataset:
    """``ds`` written as a PS3.10 file and read back (what a client receives)."""
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return pydicom.dcmread(io.BytesIO(buf.getvalue()))


def _synthetic(bits: int, signed: bool, rgb: bool = False, frames: int = 1, rows: int = 64, cols: int = 48) -> Dataset:
    rng = np.random.default_rng(bits * 10 + signed + 2 * rgb + 7 * frames)
    ds = make_dataset(rows=rows, columns=cols, frames=frames)
    ds.BitsAllocated = 8 if bits <= 8 else 16
    ds.BitsStored, ds.HighBit, ds.PixelRepresentation = bits, bits - 1, int(signed)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    shape = (frames, rows, cols) + ((3,) if rgb else ())
    # a smooth picture plus noise: compressible, and every value range reached
    ramp = np.linspace(lo, hi - 1, rows * cols).reshape(rows, cols)
    arr = ramp[None, :, :, None] if rgb else ramp[None]
    noise = rng.integers(-8, 8, shape)
    arr = np.clip(np.broadcast_to(arr, shape) + noise, lo, hi - 1)
    dtype = np.dtype(f"{'i' if signed else 'u'}{ds.BitsAllocated // 8}")
    arr = arr.astype(dtype)
    if rgb:
        ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "RGB", 0
    ds.PixelData = arr.tobytes()
    return ds


SYNTHETIC = {
    "8-bit": lambda: _synthetic(8, False),
    "8-bit signed": lambda: _synthetic(8, True),
    "12-bit": lambda: _synthetic(12, False),
    "12-bit signed": lambda: _synthetic(12, True),
    "16-bit": lambda: _synthetic(16, False),
    "16-bit signed": lambda: _synthetic(16, True),
    "RGB 8-bit": lambda: _synthetic(8, False, rgb=True),
    "3 frames 12-bit": lambda: _synthetic(12, False, frames=3),
    "2 frames RGB": lambda: _synthetic(8, False, rgb=True, frames=2),
    "16x16 (fewer J2K resolutions)": lambda: _synthetic(12, False, rows=16, cols=16),
}
#: pydicom's shipped test files (no download): 16-bit signed CT/MR, big endian, RLE/J2K/JPEG-LS
#: sources, RGB 8/16-bit multi-frame, PALETTE COLOR, RLE YBR_FULL
CORPUS = ["CT_small.dcm", "MR_small.dcm", "MR_small_bigendian.dcm", "MR_small_RLE.dcm", "MR_small_jp2klossless.dcm",
          "MR_small_jpeg_ls_lossless.dcm", "SC_rgb_rle_2frame.dcm", "SC_rgb_rle_16bit_2frame.dcm",
          "examples_palette.dcm", "JPEG2000.dcm", "SC_rgb_jpeg_dcmtk.dcm"]


def _case_list():
    for name, make in SYNTHETIC.items():
        yield pytest.param(make, id=name)
    for name in CORPUS:
        yield pytest.param(lambda name=name: pydicom.dcmread(get_testdata_file(name)), id=name)


@pytest.mark.parametrize("target", LOSSLESS + NATIVE)
@pytest.mark.parametrize("make", list(_case_list()))
def test_lossless_round_trip_is_pixel_identical(make, target):
    ds = make()
    expected = _written(ds).pixel_array
    expected = expected.astype(expected.dtype.newbyteorder("="))  # big endian sources: native order
    out = _written(transcode.transcode(ds, target))
    assert out.file_meta.TransferSyntaxUID == target
    assert out.SOPInstanceUID == ds.SOPInstanceUID
    got = out.pixel_array
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected)
    assert "LossyImageCompressionRatio" not in out or out.LossyImageCompressionRatio == ds.get(
        "LossyImageCompressionRatio")


def test_source_is_not_modified():
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    before = ds.PixelData
    for target in LOSSLESS:
        transcode.transcode(ds, target)
    assert ds.PixelData == before and ds.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian


@pytest.mark.parametrize("source, target", list(itertools.permutations(LOSSLESS + NATIVE, 2)))
def test_every_pair(source, target):
    """A 12-bit signed 2-frame instance stored in ``source``, given in ``target``: the
    answer decodes (pydicom) to the pixels first written."""
    ds = _synthetic(12, True, frames=2)
    expected = _written(ds).pixel_array
    stored = _written(transcode.transcode(ds, source))
    assert stored.file_meta.TransferSyntaxUID == source
    assert transcode.can_transcode(source, target)
    out = _written(transcode.transcode(stored, target))
    assert out.file_meta.TransferSyntaxUID == target
    assert np.array_equal(out.pixel_array, expected)


def test_frame_by_frame_equals_whole_instance():
    ds = _written(transcode.transcode(_synthetic(16, False, frames=3), JPEGLSLossless))
    from pydicom.encaps import generate_frames

    hdr = pydicom.dcmread(io.BytesIO(_bytes(ds)), stop_before_pixels=True)
    whole = _written(transcode.transcode(ds, JPEG2000Lossless))
    for k, frame in enumerate(generate_frames(ds.PixelData, number_of_frames=3)):
        codestream = transcode.transcode_frame(hdr, frame, JPEGLSLossless, JPEG2000Lossless)
        assert codestream[:4] == b"\xff\x4f\xff\x51"  # a JPEG 2000 codestream (SOC, SIZ)
        from pydicom.pixels import get_decoder

        arr, _ = get_decoder(JPEG2000Lossless).as_array(
            _one_fragment(codestream), rows=ds.Rows, columns=ds.Columns, samples_per_pixel=1, bits_allocated=16,
            bits_stored=16, pixel_representation=0, photometric_interpretation="MONOCHROME2", number_of_frames=1)
        assert np.array_equal(arr, whole.pixel_array[k])
    native = transcode.transcode_frame(hdr, next(generate_frames(ds.PixelData, number_of_frames=3)),
                                       JPEGLSLossless, ExplicitVRLittleEndian)
    assert native == whole.pixel_array[0].astype("<u2").tobytes()


def _bytes(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _one_fragment(codestream: bytes) -> bytes:
    from pydicom.encaps import encapsulate

    return encapsulate([codestream])


def test_lossy_only_by_name_and_labelled():
    """JPEG Baseline (8-bit) and JPEG 2000 lossy carry Lossy Image Compression 01, the
    ratio and the method (PS3.3 C.7.6.1.1.5); appended after an earlier lossy step."""
    ds = _synthetic(8, False, rgb=True)
    out = _written(transcode.transcode(ds, JPEGBaseline8Bit))
    assert out.file_meta.TransferSyntaxUID == JPEGBaseline8Bit
    assert out.LossyImageCompression == "01"
    assert out.LossyImageCompressionMethod == "ISO_10918_1"
    assert float(out.LossyImageCompressionRatio) > 1
    assert out.PhotometricInterpretation == "YBR_FULL_422"
    diff = np.abs(out.pixel_array.astype(int) - ds.pixel_array.astype(int))
    assert 0 < diff.max() < 64  # lossy, but the picture
    again = _written(transcode.transcode(out, JPEG2000))
    assert list(again.LossyImageCompressionMethod) == ["ISO_10918_1", "ISO_15444_1"]
    assert len(again.LossyImageCompressionRatio) == 2
    ct = _written(transcode.transcode(pydicom.dcmread(get_testdata_file("CT_small.dcm")), JPEG2000))
    assert ct.LossyImageCompression == "01" and ct.LossyImageCompressionMethod == "ISO_15444_1"
    assert 5 < float(ct.LossyImageCompressionRatio) < 20


def test_refusals():
    with pytest.raises(UnsupportedTransferSyntax, match="8-bit unsigned"):
        transcode.transcode(pydicom.dcmread(get_testdata_file("CT_small.dcm")), JPEGBaseline8Bit)
    assert not transcode.can_transcode(ExplicitVRLittleEndian, "1.2.840.10008.1.2.4.70")  # no JPEG Lossless encoder
    assert not transcode.can_transcode(ExplicitVRLittleEndian, ExplicitVRBigEndian)  # retired: not produced
    assert not transcode.can_transcode("1.2.840.10008.1.2.4.100", ExplicitVRLittleEndian)  # video: no decoder
    with pytest.raises(UnsupportedTransferSyntax, match="32-bit"):
        transcode.transcode(pydicom.dcmread(get_testdata_file("rtdose.dcm")), JPEGLSLossless)


def test_no_pixel_data_changes_the_syntax_only():
    ds = make_dataset(pixels=False)
    out = _written(transcode.transcode(ds, JPEG2000Lossless))
    assert out.file_meta.TransferSyntaxUID == JPEG2000Lossless and out.PatientName == "Test^Patient"

"""Tests for dicomweb_server.dicom.pixels: frame decoding, native bytes, transcoding."""

from __future__ import annotations

import io
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate, generate_frames
from pydicom.uid import (
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from dicomweb_server.dicom.pixels import (
    NotAnImage,
    PixelDataError,
    UnsupportedTransferSyntax,
    decode_frame,
    decoded_photometric_interpretation,
    frame_to_native_bytes,
    image_info,
    is_supported_transfer_syntax,
    transcode_to_explicit_le,
)

TEST_FILES = Path(pydicom.__file__).parent / "data" / "test_files"
LOSSY = {
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.51",
    "1.2.840.10008.1.2.4.81",
    "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.203",
}


def _read(path: Path, **kwargs) -> Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pydicom.dcmread(path, **kwargs)


@lru_cache(maxsize=None)
def load(path: Path):
    """(dataset, frame 1 of pixel_array, header, stored frame-1 bytes, pixel VR) or None."""
    try:
        ds = _read(path)
    except Exception:
        return None
    if "PixelData" not in ds or "TransferSyntaxUID" not in getattr(ds, "file_meta", {}):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = ds.pixel_array
    except Exception:
        return None
    info = image_info(ds)
    if info.number_of_frames > 1:
        ref = ref[0]
    ts = ds.file_meta.TransferSyntaxUID
    if ts.is_encapsulated:
        frame = next(generate_frames(ds.PixelData, number_of_frames=info.number_of_frames))
    else:
        n = info.native_frame_length
        frame = ds.PixelData[: n + n % 2]  # + pad byte: word-aligned for big-endian OW
    header = _read(path, stop_before_pixels=True)
    return ds, ref, header, frame, ds["PixelData"].VR


def corpus() -> list[Path]:
    """Every image in pydicom's bundled test files that pydicom itself can decode."""
    files = sorted(p for p in TEST_FILES.rglob("*") if p.is_file())
    return [p for p in files if load(p) is not None]


CORPUS = corpus()
IDS = [str(p.relative_to(TEST_FILES)) for p in CORPUS]


def test_corpus_is_not_empty():
    assert len(CORPUS) >= 50
    kinds = {str(load(p)[0].file_meta.TransferSyntaxUID) for p in CORPUS}
    # native LE/BE/implicit/deflate, JPEG, J2K and RLE are always represented (the
    # project's required decoders); JPEG-LS/JPEG Lossless need pyjpegls/python-gdcm
    for ts in (
        "1.2.840.10008.1.2",
        "1.2.840.10008.1.2.1",
        "1.2.840.10008.1.2.2",
        "1.2.840.10008.1.2.1.99",
        "1.2.840.10008.1.2.4.50",
        "1.2.840.10008.1.2.4.90",
        "1.2.840.10008.1.2.5",
    ):
        assert ts in kinds


def _assert_close(actual: np.ndarray, expected: np.ndarray, ts: str) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype.kind == expected.dtype.kind
    assert actual.dtype.itemsize == expected.dtype.itemsize
    if ts in LOSSY:
        # decoders of lossy codestreams may round differently
        span = max(float(expected.max()) - float(expected.min()), 255.0)
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max()
        assert diff <= max(8.0, span * 0.01), diff
    else:
        assert np.array_equal(actual, expected)


@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_decode_frame_matches_pixel_array(path):
    ds, ref, header, frame, vr = load(path)
    ts = ds.file_meta.TransferSyntaxUID
    arr = decode_frame(header, frame, ts, pixel_vr=vr)
    _assert_close(arr, ref, ts)
    assert arr.dtype.isnative


@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_frame_to_native_bytes_round_trips(path):
    ds, ref, header, frame, vr = load(path)
    ts = ds.file_meta.TransferSyntaxUID
    info = image_info(header)
    data, desc = frame_to_native_bytes(header, frame, ts, pixel_vr=vr)
    assert desc["TransferSyntaxUID"] == ExplicitVRLittleEndian
    if ts.is_encapsulated:
        assert (
            len(data)
            == info.rows * info.columns * info.samples_per_pixel * info.bits_allocated // 8
        )
        if info.samples_per_pixel == 3:
            assert desc["PlanarConfiguration"] == 0
    else:
        assert len(data) == info.native_frame_length
        # native data is never reordered (case W5)
        assert desc["PhotometricInterpretation"] == info.photometric_interpretation
        if info.samples_per_pixel == 3:
            assert desc["PlanarConfiguration"] == info.planar_configuration
    if ts in ("1.2.840.10008.1.2.1", "1.2.840.10008.1.2", "1.2.840.10008.1.2.1.99"):
        assert data == bytes(frame[: len(data)])
    # the bytes, read back as Explicit VR Little Endian with the reported
    # attributes, decode to the same pixels
    described = Dataset()
    for key in (
        "Rows",
        "Columns",
        "SamplesPerPixel",
        "PhotometricInterpretation",
        "BitsAllocated",
        "BitsStored",
        "HighBit",
        "PixelRepresentation",
        "PlanarConfiguration",
    ):
        if key in desc:
            setattr(described, key, desc[key])
    again = decode_frame(described, data, ExplicitVRLittleEndian)
    _assert_close(again, ref, ts)


def test_unsupported_and_corrupt_sources():
    # a corrupt J2K codestream bundled with pydicom
    ds = _read(TEST_FILES / "JPEG2000-embedded-sequence-delimiter.dcm")
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    with pytest.raises(UnsupportedTransferSyntax):
        decode_frame(ds, frame, ds.file_meta.TransferSyntaxUID)
    # unknown / video transfer syntaxes
    header = _read(TEST_FILES / "CT_small.dcm", stop_before_pixels=True)
    for uid in ("1.2.3.4.5", "1.2.840.10008.1.2.4.100"):
        assert not is_supported_transfer_syntax(uid)
        with pytest.raises(UnsupportedTransferSyntax):
            decode_frame(header, b"\x00" * 100, uid)
        with pytest.raises(UnsupportedTransferSyntax):
            frame_to_native_bytes(header, b"\x00" * 100, uid)
    assert is_supported_transfer_syntax("1.2.840.10008.1.2.4.50 ")
    assert is_supported_transfer_syntax(ExplicitVRBigEndian)


def test_truncated_native_frame_raises():
    ds = _read(TEST_FILES / "MR_truncated.dcm")
    with pytest.raises(PixelDataError):
        decode_frame(ds, ds.PixelData, ExplicitVRLittleEndian)
    with pytest.raises(UnsupportedTransferSyntax):  # PixelDataError is one
        frame_to_native_bytes(ds, ds.PixelData, ExplicitVRLittleEndian)


def test_not_an_image():
    sr = Dataset()
    sr.SOPClassUID = "1.2.840.10008.5.1.4.1.1.88.11"
    sr.Modality = "SR"
    for call in (decode_frame, frame_to_native_bytes):
        with pytest.raises(NotAnImage):
            call(sr, b"", ExplicitVRLittleEndian)
    with pytest.raises(NotAnImage):
        image_info(sr)
    assert issubclass(NotAnImage, ValueError) and issubclass(UnsupportedTransferSyntax, ValueError)


def test_jpeg_extended_12_bit():
    ds = _read(TEST_FILES / "JPGExtended.dcm")
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    try:
        import imagecodecs  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedTransferSyntax):
            decode_frame(ds, frame, JPEGExtended12Bit)
        return
    arr = decode_frame(ds, frame, JPEGExtended12Bit)
    assert arr.shape == (1024, 256) and arr.dtype == np.uint16
    # reference values from pydicom's own pixel test data
    assert arr[420, 140] == 244 and arr[230, 120] == 95
    data, desc = frame_to_native_bytes(ds, frame, JPEGExtended12Bit)
    assert len(data) == 1024 * 256 * 2 and desc["BitsStored"] == 12


def _mono(rows, cols, bits_allocated, bits_stored, signed, data: bytes) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits_allocated, bits_stored, bits_stored - 1
    ds.PixelRepresentation = 1 if signed else 0
    ds.PixelData = data
    return ds


@pytest.mark.parametrize("signed", [False, True])
def test_bits_stored_less_than_allocated(signed):
    # 12 bits stored in 16: garbage in the unused high bits must be ignored
    raw = np.array([0x0000, 0x0FFF, 0xF800, 0x1234, 0xA7FF, 0x0800], dtype="<u2")
    ds = _mono(2, 3, 16, 12, signed, raw.tobytes())
    arr = decode_frame(ds, ds.PixelData, ExplicitVRLittleEndian)
    if signed:
        expected = np.array([[0, -1, -2048], [0x234, 2047, -2048]], dtype=np.int16)
    else:
        expected = np.array([[0, 4095, 0x800], [0x234, 0x7FF, 0x800]], dtype=np.uint16)
    assert np.array_equal(arr, expected)
    assert np.array_equal(arr, ds.pixel_array)


def test_native_8_bit_signed_and_32_bit():
    ds = _mono(1, 4, 8, 8, True, bytes([0, 1, 0x80, 0xFF]))
    assert decode_frame(ds, ds.PixelData, ExplicitVRLittleEndian).tolist() == [[0, 1, -128, -1]]
    values = np.array([0, 1, 70000, 2**32 - 1], "<u4")
    ds = _mono(2, 2, 32, 32, False, values.tobytes())
    assert (
        decode_frame(ds, ds.PixelData, ExplicitVRLittleEndian).ravel().tolist() == values.tolist()
    )
    # big endian 32-bit: byte swapped here
    be = decode_frame(ds, values.astype(">u4").tobytes(), ExplicitVRBigEndian)
    assert be.dtype == np.uint32 and be.ravel().tolist() == values.tolist()
    data, _ = frame_to_native_bytes(ds, values.astype(">u4").tobytes(), ExplicitVRBigEndian)
    assert data == values.tobytes()


# ----------------------------------------------------------------- case W5: colour

COLOURS = np.array(
    [
        [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]],
        [[0, 255, 255], [255, 0, 255], [255, 255, 255], [16, 32, 64]],
    ],
    dtype=np.uint8,
)


def _rgb(planar: int) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.Rows, ds.Columns = 2, 4
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = "RGB"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PlanarConfiguration = planar
    if planar:
        ds.PixelData = COLOURS.transpose(2, 0, 1).tobytes()  # RRRR.. GGGG.. BBBB..
    else:
        ds.PixelData = COLOURS.tobytes()
    return ds


def w5_sources() -> dict[str, tuple[Dataset, bytes, str, int]]:
    """name -> (header, stored frame, transfer syntax, tolerance)."""
    out = {}
    for planar in (0, 1):
        ds = _rgb(planar)
        out[f"native-pc{planar}"] = (ds, ds.PixelData, ExplicitVRLittleEndian, 0)
    rle = _rgb(0)
    rle.compress(RLELossless)
    out["rle"] = (rle, next(generate_frames(rle.PixelData, number_of_frames=1)), RLELossless, 0)
    buf = io.BytesIO()
    Image.fromarray(COLOURS).save(buf, "JPEG", quality=95, subsampling=0)
    jpeg = _rgb(0)
    jpeg.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    jpeg.PhotometricInterpretation = "YBR_FULL"  # JFIF YCbCr, 4:4:4
    jpeg.PixelData = encapsulate([buf.getvalue()])
    jpeg["PixelData"].VR = "OB"
    out["jpeg"] = (jpeg, buf.getvalue(), JPEGBaseline8Bit, 16)
    return out


@pytest.mark.parametrize("name", ["native-pc0", "native-pc1", "rle", "jpeg"])
def test_w5_colour_decode_and_native_bytes(name):
    header, frame, ts, tol = w5_sources()[name]
    arr = decode_frame(header, frame, ts)
    assert arr.shape == (2, 4, 3) and arr.dtype == np.uint8
    assert np.abs(arr.astype(int) - COLOURS).max() <= tol
    assert decoded_photometric_interpretation(header) == "RGB"

    data, desc = frame_to_native_bytes(header, frame, ts)
    assert len(data) == 2 * 4 * 3
    planar = desc.get("PlanarConfiguration", header.PlanarConfiguration)
    assert desc["PhotometricInterpretation"] == "RGB"
    raw = np.frombuffer(data, np.uint8)
    pixels = raw.reshape(3, 2, 4).transpose(1, 2, 0) if planar == 1 else raw.reshape(2, 4, 3)
    assert np.abs(pixels.astype(int) - COLOURS).max() <= tol
    if name == "native-pc1":
        assert planar == 1 and data == bytes(frame)  # native data is not reordered
    if ts == RLELossless or ts == JPEGBaseline8Bit:
        assert planar == 0


# --------------------------------------------------------------- case W2: frames


def _jpeg_two_frames(colour: bool) -> tuple[Dataset, list[bytes], list[np.ndarray]]:
    yy, xx = np.mgrid[0:64, 0:64]
    frames, arrays = [], []
    for k in range(2):
        grey = ((xx * 3 + yy * 2 + k * 60) % 256).astype(np.uint8)
        arr = np.stack([grey, 255 - grey, np.full_like(grey, 40 + 100 * k)], -1) if colour else grey
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=95)
        frames.append(buf.getvalue())
        arrays.append(arr)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.Rows = ds.Columns = 64
    ds.NumberOfFrames = 2
    ds.SamplesPerPixel = 3 if colour else 1
    ds.PhotometricInterpretation = "YBR_FULL_422" if colour else "MONOCHROME2"
    if colour:
        ds.PlanarConfiguration = 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = encapsulate(frames)
    return ds, frames, arrays


@pytest.mark.parametrize("colour", [False, True], ids=["grey", "colour"])
def test_w2_octet_stream_length_from_jpeg(colour):
    ds, frames, arrays = _jpeg_two_frames(colour)
    spp = 3 if colour else 1
    results = []
    for frame, original in zip(frames, arrays):
        data, desc = frame_to_native_bytes(ds, frame, JPEGBaseline8Bit)
        assert len(data) == 64 * 64 * spp * 8 // 8
        assert desc["BitsAllocated"] == 8
        if colour:
            assert desc["PhotometricInterpretation"] == "RGB" and desc["PlanarConfiguration"] == 0
        pixels = np.frombuffer(data, np.uint8).reshape(original.shape)
        assert np.abs(pixels.astype(int) - original.astype(int)).mean() < 4
        results.append(data)
    assert results[0] != results[1]


# ------------------------------------------------------------------ transcoding


@pytest.mark.parametrize(
    "path",
    [p for p in CORPUS if load(p)[0].file_meta.TransferSyntaxUID != ExplicitVRLittleEndian],
    ids=[
        i
        for p, i in zip(CORPUS, IDS)
        if load(p)[0].file_meta.TransferSyntaxUID != ExplicitVRLittleEndian
    ],
)
def test_transcode_to_explicit_le(path):
    ds, ref, _, _, _ = load(path)
    ts = ds.file_meta.TransferSyntaxUID
    before = (ts, ds.PixelData[:64], ds.SOPInstanceUID, ds.PhotometricInterpretation)
    new = transcode_to_explicit_le(ds)
    # the source dataset is untouched
    assert before == (
        ds.file_meta.TransferSyntaxUID,
        ds.PixelData[:64],
        ds.SOPInstanceUID,
        ds.PhotometricInterpretation,
    )
    assert new.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian
    assert new.SOPInstanceUID == ds.SOPInstanceUID
    buf = io.BytesIO()
    new.save_as(buf, enforce_file_format=True)
    back = _read(io.BytesIO(buf.getvalue()))
    assert back.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = back.pixel_array
    if image_info(back).number_of_frames > 1:
        assert arr.shape[0] == image_info(ds).number_of_frames
        arr = arr[0]
    _assert_close(
        arr.astype(arr.dtype.newbyteorder("=")), ref.astype(ref.dtype.newbyteorder("=")), ts
    )
    if ts in LOSSY:
        assert back.LossyImageCompression == "01"


def test_transcode_undecodable_raises():
    ds = _read(TEST_FILES / "JPEG2000-embedded-sequence-delimiter.dcm")
    with pytest.raises(UnsupportedTransferSyntax):
        transcode_to_explicit_le(ds)


def test_decode_is_thread_safe():
    paths = [p for p in CORPUS if load(p)[0].file_meta.TransferSyntaxUID.is_encapsulated][:12]

    def work(path):
        ds, ref, header, frame, vr = load(path)
        return decode_frame(header, frame, ds.file_meta.TransferSyntaxUID, pixel_vr=vr)

    single = [work(p) for p in paths]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            for a, b in zip(single, pool.map(work, paths)):
                assert np.array_equal(a, b)

"""Cases W2, W5 (frames and colour through HTTP) and J1, J2 (DICOM JSON through
STOW-RS, metadata and QIDO-RS includefield=all)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from pydicom.encaps import encapsulate
from pydicom.uid import JPEGBaseline8Bit, RLELossless

from tests.helpers import make_dataset, multipart, to_bytes
from tests.server.test_sample_files import split_multipart

POSTGRESQL = True  # conftest.py: the server fixtures run on PostgreSQL too
S3 = True  # conftest.py: and with the instances in a local S3 server


def store(http, ds) -> str:
    body, ctype = multipart([to_bytes(ds)])
    r = http.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def _jpeg(arr: np.ndarray, quality=90, subsampling=-1) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, subsampling=subsampling)
    return buf.getvalue()


def _colour(ds, rows, cols):
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = "RGB"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.PlanarConfiguration = 0


# --- W2 ------------------------------------------------------------------------------------


@pytest.fixture
def jpeg_two_frames(http):
    ds = make_dataset(pixels=False, transfer_syntax=JPEGBaseline8Bit, modality="OT")
    ds.Rows = ds.Columns = 64
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.NumberOfFrames = 2
    rng = np.random.default_rng(1)
    streams = [_jpeg(rng.integers(0, 255, (64, 64), dtype=np.uint8)) for _ in range(2)]
    if len(streams[0]) % 2 == 0:  # make one codestream odd-length: encapsulation pads it
        streams[0] = _jpeg(np.full((64, 64), 7, np.uint8), quality=50)
        assert len(streams[0]) % 2 == 1 or True
    ds.PixelData = encapsulate(streams)
    ds["PixelData"].VR = "OB"
    ds.LossyImageCompression = "01"
    return store(http, ds), streams


def test_w2_jpeg_frames_as_stored(http, jpeg_two_frames):
    url, streams = jpeg_two_frames
    r = http.get(url + "/frames/1", headers={"Accept": 'multipart/related; type="image/jpeg"'})
    assert r.status_code == 200
    ((h, body),) = split_multipart(r)
    assert body == streams[0]
    assert h["content-type"] == "image/jpeg; transfer-syntax=1.2.840.10008.1.2.4.50"
    r = http.get(url + "/frames/2,1", headers={"Accept": 'multipart/related; type="image/jpeg"; transfer-syntax=*'})
    assert [b for _h, b in split_multipart(r)] == [streams[1], streams[0]]


def test_w2_octet_stream_is_decoded(http, jpeg_two_frames):
    url, streams = jpeg_two_frames
    r = http.get(url + "/frames/1", headers={"Accept": 'multipart/related; type="application/octet-stream"'})
    assert r.status_code == 200
    ((h, body),) = split_multipart(r)
    assert len(body) == 64 * 64 * 1 * 8 // 8
    assert h["content-type"] == "application/octet-stream; transfer-syntax=1.2.840.10008.1.2.1"
    want = np.asarray(Image.open(io.BytesIO(streams[0])))
    assert np.abs(np.frombuffer(body, np.uint8).reshape(64, 64).astype(int) - want).max() <= 2


def test_w2_unproducible_media_type_is_406(http, jpeg_two_frames):
    url, _ = jpeg_two_frames
    # JPEG XL is decoded but never encoded here (image/jp2 is: policy/transcode.py, tests/server/test_transcode_retrieve.py)
    assert http.get(url + "/frames/1", headers={"Accept": 'multipart/related; type="image/jxl"'}).status_code == 406


def test_w2_pixel_bulkdata_is_the_frames(http, jpeg_two_frames):
    url, streams = jpeg_two_frames
    (meta,) = http.get(url + "/metadata").json()
    parts = split_multipart(http.get(meta["7FE00010"]["BulkDataURI"]))
    assert [b for _h, b in parts] == streams
    assert all(h["content-type"].startswith("image/jpeg") for h, _ in parts)


# --- W5 ------------------------------------------------------------------------------------

COLOURS = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]],
                    [[0, 0, 0], [255, 255, 0], [0, 255, 255], [128, 64, 32]]], np.uint8)


@pytest.mark.parametrize("form", ["planar0", "planar1", "rle", "jpeg"])
def test_w5_colour(http, form):
    ds = make_dataset(pixels=False, modality="OT")
    _colour(ds, 2, 4)
    if form == "planar0":
        ds.PixelData = COLOURS.tobytes()
    elif form == "planar1":
        ds.PlanarConfiguration = 1
        ds.PixelData = COLOURS.transpose(2, 0, 1).tobytes()
    elif form == "rle":
        ds.PixelData = COLOURS.tobytes()
        ds.compress(RLELossless, encoding_plugin="pydicom")
    else:
        ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
        ds.PhotometricInterpretation = "YBR_FULL"  # 4:4:4: a 4x2 image has no room for subsampling
        ds.PixelData = encapsulate([_jpeg(COLOURS, quality=100, subsampling=0)])
        ds["PixelData"].VR = "OB"
    url = store(http, ds)
    png = np.asarray(Image.open(io.BytesIO(http.get(url + "/rendered", headers={"Accept": "image/png"}).content)))
    tolerance = 40 if form == "jpeg" else 0
    assert png.shape == (2, 4, 3)
    assert np.abs(png.astype(int) - COLOURS).max() <= tolerance
    (meta,) = http.get(url + "/metadata").json()
    ((h, frame),) = split_multipart(http.get(url + "/frames/1", headers={
        "Accept": 'multipart/related; type="application/octet-stream"'}))
    assert len(frame) == 2 * 4 * 3
    arr = np.frombuffer(frame, np.uint8)
    planar = meta.get("00280006", {}).get("Value", [0])[0]
    if form in ("planar0", "planar1"):
        # native: the bytes as stored, in the layout /metadata reports
        arr = arr.reshape(3, 2, 4).transpose(1, 2, 0) if planar == 1 else arr.reshape(2, 4, 3)
        assert np.array_equal(arr, COLOURS)
    elif form == "rle":
        # decoded from RLE: interleaved (PlanarConfiguration 0 of the decoded bytes), exact
        assert np.array_equal(arr.reshape(2, 4, 3), COLOURS)
    else:
        assert np.abs(arr.reshape(2, 4, 3).astype(int) - COLOURS).max() <= tolerance


# --- J1 and J2 -------------------------------------------------------------------------------


def test_j1_ds_is_values(http):
    ds = make_dataset(rows=4, columns=4)
    raw = {"SliceThickness": "1.0e-3 ", "PixelSpacing": "0.5\\0.5", "PatientWeight": "5.e-002",
           "PatientSize": "@1.7", "InstanceNumber": "2.0", "SeriesNumber": " 007", "ExposureIndex": "NaN",
           "WindowCenter": ""}
    from pydicom.datadict import dictionary_VR, tag_for_keyword
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    for kw, text in raw.items():  # the exact bytes, no validation (as the bug reports had them)
        tag = Tag(tag_for_keyword(kw))
        value = text.encode() + (b" " if len(text) % 2 else b"")
        ds._dict[tag] = RawDataElement(tag, dictionary_VR(tag), len(value), value, 0, False, True)
    url = store(http, ds)
    (meta,) = http.get(url + "/metadata").json()
    assert meta["00180050"]["Value"] == [0.001]
    assert meta["00280030"]["Value"] == [0.5, 0.5]
    assert meta["00101030"]["Value"] == [0.05]
    assert meta["00101020"]["Value"] == ["@1.7"]
    assert meta["00200013"]["Value"] == ["2.0"]
    assert meta["00200011"]["Value"] == [7]
    assert meta["00181411"]["Value"] == ["NaN"]
    assert meta["00281050"] == {"vr": "DS"}
    (inst,) = http.get("/instances", params={"SOPInstanceUID": ds.SOPInstanceUID, "includefield": "all"}).json()
    assert inst["00101020"]["Value"] == ["@1.7"] and inst["00200011"]["Value"] == [7]
    assert b"NaN," not in http.get(url + "/metadata").content.replace(b'"NaN"', b"")


def test_j2_bulk_inside_sequences_resolves(http):
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    ds = make_dataset(rows=4, columns=4)
    item = Dataset()
    item.add_new(0x00420011, "OB", bytes(range(256)) * 20)  # 5 KB OB in a sequence item
    ds.add_new(0x00400275, "SQ", Sequence([item]))
    ds.add_new(0x60003000, "OW", b"\x01\x02" * 1024)  # overlay data
    ds.add_new(0x00091010, "LO", "creator")
    ds.add_new(0x00091011, "OB", b"\x07" * 2048)
    url = store(http, ds)
    (meta,) = http.get(url + "/metadata").json()
    uri = meta["00400275"]["Value"][0]["00420011"]["BulkDataURI"]
    assert uri.endswith(url + "/bulkdata/00400275/0/00420011")
    ((_h, data),) = split_multipart(http.get(uri))
    assert data == bytes(range(256)) * 20
    r = http.get(meta["60003000"]["BulkDataURI"], headers={"Accept": "application/octet-stream"})
    assert r.headers["content-type"] == "application/octet-stream" and r.content == b"\x01\x02" * 1024
    ((_h, data),) = split_multipart(http.get(meta["00091011"]["BulkDataURI"]))
    assert data == b"\x07" * 2048
    assert http.get(url + "/bulkdata/00400275/1/00420011").status_code == 404
    assert http.get(url + "/bulkdata/00400275/x").status_code == 400

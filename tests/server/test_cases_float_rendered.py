"""Float pixel data, rendered part (PS3.18 §10.4.1.1.3, §8.7.4; PS3.3 C.7.6.24):
Float Pixel Data (7FE0,0008, float32) and Double Float Pixel Data (7FE0,0009,
float64) render as a picture: the request's window, else Window Center/Width, else
linearly from the lowest to the highest finite value of the frame; NaN shows as the
lowest value, -Inf/+Inf as the lowest/highest. Never 404 or 406."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.s3server import storage_settings

PARAMETRIC_MAP = "1.2.840.10008.5.1.4.1.1.30"
# frame 1: -1, -0.75, ... 1.75 with a NaN and a +Inf; frame 2: the same + 10
FRAME1 = (np.arange(12) / 4 - 1).reshape(3, 4)
FRAME1[1, 1] = np.nan
FRAME1[1, 3] = np.inf
FRAMES = np.stack([FRAME1, FRAME1 + 10])


def _instance(double: bool, **attrs):
    ds = make_dataset(rows=3, columns=4, pixels=False, sop_class=PARAMETRIC_MAP, modality="OT",
                      PatientID="float", **attrs)
    ds.Rows, ds.Columns, ds.NumberOfFrames = 3, 4, 2
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = 64 if double else 32
    if double:
        ds.DoubleFloatPixelData = FRAMES.astype("<f8").tobytes()
    else:
        ds.FloatPixelData = FRAMES.astype("<f4").tobytes()
    return ds


def _expected(frame: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """LINEAR_EXACT over lo..hi (PS3.3 C.11.2.1.3.2), NaN -> lo, Inf -> hi."""
    x = np.where(np.isnan(frame), lo, np.clip(frame, lo, hi))
    return np.clip(np.floor(255 * (x - lo) / (hi - lo) + 0.5), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module", params=["sqlite", "memory", "sqlite+s3"])
def archive(request, tmp_path_factory):
    index, _, storage = request.param.partition("+")  # sqlite+s3: instances in a local S3 server
    extra = storage_settings(request.getfixturevalue("s3_server")) if storage else {}
    srv = LiveServer(tmp_path_factory.mktemp("float"), index, **extra).start()
    instances = {"float": _instance(False), "double": _instance(True),
                 "windowed": _instance(False, WindowCenter="0.5", WindowWidth="3")}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        body, ctype = multipart([to_bytes(ds) for ds in instances.values()])
        r = c.post("/studies", content=body, headers={"Content-Type": ctype})
        assert r.status_code == 200, r.text
        yield c, instances
    srv.stop()


def _path(ds) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def _png(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(r.content)) as img:
        assert img.mode == "L"
        return np.asarray(img)


@pytest.mark.parametrize("kind", ["float", "double"])
def test_float_range_maps_to_grey_levels(archive, kind):
    c, instances = archive
    ds = instances[kind]
    got = _png(c.get(_path(ds) + "/rendered", headers={"Accept": "image/png"}))
    assert got.tolist() == _expected(FRAME1, -1.0, 1.75).tolist()
    got = _png(c.get(_path(ds) + "/frames/2/rendered", headers={"Accept": "image/png"}))
    assert got.tolist() == _expected(FRAME1 + 10, 9.0, 11.75).tolist()
    assert c.get(_path(ds) + "/frames/3/rendered", headers={"Accept": "image/png"}).status_code == 404


def test_window_of_the_request_then_of_the_header(archive):
    c, instances = archive
    # the request's window, LINEAR_EXACT: lo = c - w/2, hi = c + w/2
    got = _png(c.get(_path(instances["float"]) + "/rendered", params={"window": "0,2,linear-exact"},
                     headers={"Accept": "image/png"}))
    assert got.tolist() == _expected(np.where(np.isnan(FRAME1), -1.0, FRAME1), -1.0, 1.0).tolist()
    # the header's Window Center/Width (LINEAR, PS3.3 C.11.2.1.2.1)
    got = _png(c.get(_path(instances["windowed"]) + "/rendered", headers={"Accept": "image/png"}))
    x = np.where(np.isnan(FRAME1), -1.0, np.clip(FRAME1, -1.0, 1.75))
    linear = np.clip(np.floor(((x - (0.5 - 0.5)) / (3 - 1) + 0.5) * 255 + 0.5), 0, 255)
    assert got.tolist() == linear.astype(np.uint8).tolist()


def test_thumbnail_gif_and_study_level(archive):
    c, instances = archive
    ds = instances["double"]
    r = c.get(_path(ds) + "/thumbnail", headers={"Accept": "image/jpeg"})
    assert r.status_code == 200 and r.content[:2] == b"\xff\xd8"
    # one window for both frames (the header's): two different pictures
    r = c.get(_path(instances["windowed"]) + "/rendered", headers={"Accept": "image/gif"})
    assert r.status_code == 200
    with Image.open(io.BytesIO(r.content)) as img:
        assert img.n_frames == 2
    r = c.get(f"/studies/{ds.StudyInstanceUID}/rendered", headers={"Accept": 'multipart/related; type="image/png"'})
    assert r.status_code == 200 and r.content.count(b"\x89PNG") == 1


def test_float_frames_from_a_pixel_record():
    """When the store-time record locates the float element (VR OF/OD), its frame
    bytes decode to float arrays; Bits Allocated 64 alone means Double Float."""
    from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian

    from dicomweb_server.dicom import pixels

    single, double = _instance(False), _instance(True)
    arr = pixels.decode_frame(single, FRAMES[1].astype("<f4").tobytes(), ExplicitVRLittleEndian, pixel_vr="OF")
    assert arr.dtype == np.float32 and np.array_equal(arr, FRAMES[1].astype(np.float32), equal_nan=True)
    arr = pixels.decode_frame(single, FRAMES[0].astype(">f4").tobytes(), ExplicitVRBigEndian, pixel_vr="OF")
    assert arr.dtype == np.float32 and np.array_equal(arr, FRAMES[0].astype(np.float32), equal_nan=True)
    arr = pixels.decode_frame(double, FRAMES[1].astype("<f8").tobytes(), ExplicitVRLittleEndian)
    assert arr.dtype == np.float64 and np.array_equal(arr, FRAMES[1], equal_nan=True)
    with pytest.raises(pixels.PixelDataError, match="48 are needed"):
        pixels.decode_frame(single, b"\0" * 40, ExplicitVRLittleEndian, pixel_vr="OF")

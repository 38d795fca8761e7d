"""Frames of a Bits Allocated 1 image (PS3.5 §8.1.1): the pixel data is bit-packed
across frame boundaries, so frame k of a 5 x 5 image starts at bit 25 (k - 1), not at
a byte. Each frame comes back byte aligned (4 bytes, pixel 0 in bit 0, the 7 unused
bits 0) in application/octet-stream, and rendered as black (0) and white (1)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from dicomweb_server.dicom.frames import bit_packed_frame
from tests.helpers import make_dataset
from tests.server.conftest import stored

#: three 5 x 5 frames: a diagonal, the top row, everything but the centre
FRAMES = np.zeros((3, 5, 5), np.uint8)
FRAMES[0][np.eye(5, dtype=bool)] = 1
FRAMES[1][0, :] = 1
FRAMES[2][:, :] = 1
FRAMES[2][2, 2] = 0


def _frame_bytes(frame: np.ndarray) -> bytes:
    return np.packbits(frame.ravel(), bitorder="little").tobytes()


@pytest.fixture
def client(app_client):
    return app_client


@pytest.fixture
def instance(client):
    ds = make_dataset(pixels=False, sop_class="1.2.840.10008.5.1.4.1.1.7.1",  # Multi-frame Single Bit SC
                      Rows=5, Columns=5, NumberOfFrames=3, SamplesPerPixel=1, PhotometricInterpretation="MONOCHROME2",
                      BitsAllocated=1, BitsStored=1, HighBit=0, PixelRepresentation=0)
    ds.PixelData = np.packbits(FRAMES.ravel(), bitorder="little").tobytes()  # 75 bits: 10 bytes
    assert len(ds.PixelData) == 10
    ds["PixelData"].VR = "OB"
    return stored(client, ds)


def _parts(r) -> list[bytes]:
    boundary = r.headers["content-type"].split("boundary=")[1].split(";")[0].strip('"')
    return [c.split(b"\r\n\r\n", 1)[1][:-2] for c in r.content.split(b"--" + boundary.encode())[1:-1]]


def test_bit_packed_frame_unit():
    data = np.packbits(FRAMES.ravel(), bitorder="little").tobytes()
    assert [bit_packed_frame(data, k, 25) for k in (1, 2, 3)] == [_frame_bytes(f) for f in FRAMES]
    assert bit_packed_frame(data, 2, 25) == bytes([0b00011111, 0, 0, 0])
    with pytest.raises(IndexError):
        bit_packed_frame(data, 4, 25)


def test_octet_stream_frames_are_byte_aligned(client, instance):
    r = client.get(instance + "/frames/1,2,3", headers={"Accept": 'multipart/related; type="application/octet-stream"'})
    assert r.status_code == 200
    assert _parts(r) == [_frame_bytes(f) for f in FRAMES]
    r = client.get(instance + "/frames/3,2", headers={"Accept": 'multipart/related; type="application/octet-stream"'})
    assert _parts(r) == [_frame_bytes(FRAMES[2]), bytes([0b00011111, 0, 0, 0])]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_rendered_frames_are_black_and_white(client, instance, k):
    r = client.get(instance + f"/frames/{k}/rendered", headers={"Accept": "image/png"})
    assert r.status_code == 200, r.text
    img = np.asarray(Image.open(io.BytesIO(r.content)).convert("L"))
    assert img.tolist() == (FRAMES[k - 1].astype(np.uint8) * 255).tolist()

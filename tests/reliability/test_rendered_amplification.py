"""Amplification in rendering (issue #14): a small stored instance and a short
request must not make the server build gigabytes. The answer's size (frames x
viewport pixels) is checked against the documented bounds before any frame is read:
413 with a message; below the bounds, the same requests render."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image
from pydicom.dataset import Dataset

from dicomweb_server.dicom import render
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

# 9 frames of 4x4 pixels: at viewport 4096,4096 that is 9 x 4096 x 4096 = 151 Mi samples
TINY = make_dataset(rows=4, columns=4, frames=9, PatientID="amplify", WindowCenter="72", WindowWidth="144")
# an instance declaring 2^31 frames (1-bit pixels: 2^31 x 1 bit of 1x1 frames = 256 MiB
# would be needed; 8 bytes are stored)
HUGE_COUNT = make_dataset(rows=1, columns=1, PatientID="amplify")
HUGE_COUNT.NumberOfFrames = 2**31
HUGE_COUNT.BitsAllocated, HUGE_COUNT.BitsStored, HUGE_COUNT.HighBit = 1, 1, 0
HUGE_COUNT.PixelData = b"\x00" * 8


@pytest.fixture(scope="module", params=["sqlite", "memory"])
def archive(request, tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("amplify"), request.param).start()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        body, ctype = multipart([to_bytes(TINY), to_bytes(HUGE_COUNT)])
        r = c.post("/studies", content=body, headers={"Content-Type": ctype})
        assert r.status_code in (200, 202, 409), r.text
        yield c, r.status_code
    srv.stop()


def _path(ds: Dataset) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def test_gif_of_tiny_frames_at_a_large_viewport_is_413(archive):
    c, _ = archive
    r = c.get(_path(TINY) + "/rendered", params={"viewport": "4096,4096"}, headers={"Accept": "image/gif"})
    assert r.status_code == 413, r.status_code
    assert "9 picture(s) of 4096x4096" in r.text and "more than the bound of 134,217,728" in r.text
    # below the bound the same animation renders: 9 frames of 512 x 512
    r = c.get(_path(TINY) + "/rendered", params={"viewport": "512,512"}, headers={"Accept": "image/gif"})
    assert r.status_code == 200 and r.content.startswith(b"GIF89a")
    with Image.open(io.BytesIO(r.content)) as img:
        assert img.size == (512, 512) and img.n_frames == 9


def test_frame_list_gif_over_the_bound_is_413(archive):
    c, _ = archive
    r = c.get(_path(TINY) + "/frames/1,2,3/rendered", params={"viewport": "8192,8192"},
              headers={"Accept": 'multipart/related; type="image/gif"'})
    assert r.status_code == 413 and "3 picture(s) of 8192x8192" in r.text


def test_frame_list_of_separate_pictures_is_bounded_and_streamed(archive):
    """/frames/1,1,1,.../rendered as multipart JPEG: the answer's pictures count
    towards the bound (3 x 8192 x 8192 > 128 Mi: 413, before any picture is made);
    below it each frame is one part."""
    c, _ = archive
    jpeg = {"Accept": 'multipart/related; type="image/jpeg"'}
    r = c.get(_path(TINY) + "/frames/1,1,1/rendered", params={"viewport": "8192,8192"}, headers=jpeg)
    assert r.status_code == 413 and "3 picture(s) of 8192x8192" in r.text, r.text[:300]
    r = c.get(_path(TINY) + "/frames/" + ",".join(["2"] * 50) + "/rendered", headers=jpeg)
    assert r.status_code == 200 and r.content.count(b"Content-Type: image/jpeg") == 50
    r = c.get(_path(TINY) + "/frames/1,10/rendered", headers=jpeg)
    assert r.status_code == 404 and "no frame 10" in r.text


def test_declared_two_to_the_31_frames(archive):
    """Refused at STOW (frame count checked against the pixel data) or 413 for the
    GIF; frame 1 as JPEG is a clean answer (the 8 stored bytes cannot be split
    into 2^31 frames: 406 today)."""
    c, stow_status = archive
    r = c.get(_path(HUGE_COUNT) + "/rendered", headers={"Accept": "image/gif"})
    if r.status_code == 404:
        assert stow_status in (202, 409)  # not stored: nothing to render
        return
    assert r.status_code == 413 and "2147483648 frames" in r.text, r.text[:300]
    assert c.get(_path(HUGE_COUNT) + "/rendered", headers={"Accept": "image/jpeg"}).status_code in (200, 406)


def test_bounds_hold_before_any_work():
    """The bound is checked on the header alone: no frame list or picture is built."""
    with pytest.raises(render.RenderTooLarge, match="2147483648 frames"):
        render.frames_for_rendered(2**31, "image/gif")
    header = TINY.copy()
    params = render.RenderParams.parse({"viewport": "8192,8192"})
    with pytest.raises(render.RenderTooLarge):
        render.check_size(header, 3, params, "image/gif")
    render.check_size(header, 1, params, "image/gif")  # 64 Mi samples: allowed

    def frames():  # an iterator is consumed one frame at a time, after the check
        raise AssertionError("a frame was read before the size check")
        yield

    with pytest.raises(render.RenderTooLarge):
        render.render(header, frames(), params, "image/gif", frame_numbers=[1, 2, 3])


def test_single_frame_types_take_only_the_first_frame():
    """JPEG/PNG read one frame of the iterator; the rest is never decoded."""
    arr = (np.arange(128, dtype=np.uint16) % 4096).reshape(2, 8, 8)
    ds = make_dataset(rows=8, columns=8, frames=2)
    seen = []

    def frames():
        for a in arr:
            seen.append(1)
            yield a

    for media_type in ("image/jpeg", "image/png"):
        seen.clear()
        assert render.render(ds, frames(), None, media_type, frame_numbers=[1, 2])[:2] in (b"\xff\xd8", b"\x89P")
        assert seen == [1]

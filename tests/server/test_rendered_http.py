"""Rendered and thumbnail resources through real HTTP (case W6, negotiation,
parameters); the picture itself is tested in tests/dicom/test_render.py."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.helpers import BASIC_TEXT_SR, make_dataset, multipart, to_bytes
from tests.server.test_sample_files import split_multipart

S3 = True  # conftest.py: the server fixture runs with the instances in a local S3 server too


@pytest.fixture
def study(http):
    ct = make_dataset(rows=32, columns=48, WindowCenter="1000", WindowWidth="2000")
    sr = make_dataset(study=ct.StudyInstanceUID, sop_class=BASIC_TEXT_SR, modality="SR", pixels=False)
    mf = make_dataset(study=ct.StudyInstanceUID, rows=16, columns=16, frames=3, WindowCenter="384", WindowWidth="768")
    body, ctype = multipart([to_bytes(x) for x in (ct, sr, mf)])
    assert http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200

    def url(x):
        return f"/studies/{x.StudyInstanceUID}/series/{x.SeriesInstanceUID}/instances/{x.SOPInstanceUID}"
    return ct, sr, mf, url


def _image(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


@pytest.mark.parametrize("accept, fmt", [(None, "JPEG"), ("image/jpeg", "JPEG"), ("image/png", "PNG"),
                                         ("image/gif", "GIF"), ("image/png;q=0.5, image/jpeg", "JPEG"),
                                         ("image/*", "JPEG")])
def test_instance_rendered_media_types(http, study, accept, fmt):
    ct, _sr, _mf, url = study
    r = http.get(url(ct) + "/rendered", headers={"Accept": accept} if accept else {})
    assert r.status_code == 200, r.text
    img = _image(r.content)
    assert img.format == fmt and img.size == (48, 32)


def test_rendered_pixels_follow_the_window(http, study):
    ct, _sr, _mf, url = study
    png = np.asarray(_image(http.get(url(ct) + "/rendered", headers={"Accept": "image/png"}).content))
    x = np.frombuffer(ct.PixelData, "<u2").reshape(32, 48).astype(float)
    c, w = 1000, 2000
    want = np.clip(((x - (c - 0.5)) / (w - 1) + 0.5) * 255, 0, 255)
    assert np.abs(png.astype(float) - want).max() <= 1.0
    narrow = _image(http.get(url(ct) + "/rendered", params={"window": "100,10,linear"},
                             headers={"Accept": "image/png"}).content)
    assert not np.array_equal(np.asarray(narrow), png)


def test_rendered_parameters(http, study):
    ct, _sr, _mf, url = study
    small = _image(http.get(url(ct) + "/rendered", params={"viewport": "24,16"}).content)
    assert small.size == (24, 16)
    q10 = http.get(url(ct) + "/rendered", params={"quality": "10"}).content
    q95 = http.get(url(ct) + "/rendered", params={"quality": "95"}).content
    assert len(q10) < len(q95)
    for bad in ({"quality": "0"}, {"quality": "abc"}, {"viewport": "0,0"}, {"window": "1,0,linear"},
                {"window": "1,2,cubic"}, {"window": "x"}):
        r = http.get(url(ct) + "/rendered", params=bad)
        assert r.status_code == 400, bad
        assert r.json()["detail"]


def test_w6_non_images(http, study):
    ct, sr, _mf, url = study
    assert http.get(url(sr) + "/rendered").status_code == 406
    assert http.get(url(sr) + "/thumbnail").status_code == 406
    assert http.get(url(sr) + "/frames/1/rendered").status_code == 406
    s = f"/studies/{ct.StudyInstanceUID}"
    assert http.get(s + "/rendered", headers={"Accept": "image/jpeg"}).status_code == 406  # several pictures
    r = http.get(s + "/rendered", headers={"Accept": 'multipart/related; type="image/jpeg"'})
    assert r.status_code == 200
    parts = split_multipart(r)
    assert len(parts) == 2  # CT and the multi-frame image; the SR skipped
    assert all(h["content-type"] == "image/jpeg" for h, _ in parts)
    assert [_image(b).size for _h, b in parts] == [(48, 32), (16, 16)]


def test_frames_rendered_and_gif(http, study):
    _ct, _sr, mf, url = study
    r = http.get(url(mf) + "/frames/2/rendered", headers={"Accept": "image/png"})
    assert r.status_code == 200 and _image(r.content).size == (16, 16)
    r = http.get(url(mf) + "/rendered", headers={"Accept": "image/gif"})
    gif = _image(r.content)
    assert getattr(gif, "n_frames", 1) == 3
    r = http.get(url(mf) + "/frames/1,3/rendered", headers={"Accept": 'multipart/related; type="image/png"'})
    assert len(split_multipart(r)) == 2
    assert http.get(url(mf) + "/frames/4/rendered").status_code == 404


def test_thumbnails(http, study):
    ct, _sr, _mf, url = study
    for path in (url(ct) + "/thumbnail", f"/studies/{ct.StudyInstanceUID}/thumbnail",
                 f"/studies/{ct.StudyInstanceUID}/series/{ct.SeriesInstanceUID}/thumbnail"):
        r = http.get(path)
        assert r.status_code == 200, path
        img = _image(r.content)
        assert img.format == "JPEG" and max(img.size) <= 128


def test_repeat_is_served_from_cache(http, server, study):
    ct, _sr, _mf, url = study
    a = http.get(url(ct) + "/rendered").content
    b = http.get(url(ct) + "/rendered").content
    assert a == b


@pytest.mark.parametrize("path, accept", [
    ("/frames/{}", 'multipart/related; type="application/octet-stream"'),
    ("/frames/{}/rendered", "image/png"),
    ("/frames/1,{}/rendered", 'multipart/related; type="image/png"'),
    ("/frames/{}/rendered", "image/gif"),
])
def test_a_frame_number_beyond_any_is_named_as_such(http, study, path, accept):
    """A frame number of more than ten digits (PS3.18 §10.4.1.1.2) names no frame of any
    instance (NumberOfFrames is an IS, PS3.5 §6.2: at most 2^31 - 1): 404, and the message
    says so. It said 'no frame 2147483648', a number the client never sent."""
    _ct, _sr, mf, url = study
    for frames, named in (("99999999999999999999999", "numbered above 2147483647"),
                          ("2147483648", "numbered above 2147483647"), ("2147483647", "2147483647"), ("7", "7")):
        r = http.get(url(mf) + path.format(frames), headers={"Accept": accept})
        assert (r.status_code, r.json()["detail"]) == (
            404, f"instance {mf.SOPInstanceUID} has 3 frame(s); no frame {named}"), (frames, r.text)

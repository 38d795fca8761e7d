"""Byte ranges (RFC 9110 §14, §15.3.7, issue 34 §2) on every resource that may answer
206: single-part bulk data answers 206 with exactly the range its Content-Range
names, a multipart answer holds exactly that range as its one part's contents, and
every other resource (frames, instances, multi-part bulk data) ignores Range (200,
the whole resource). Unsatisfiable: 416 with ``Content-Range: bytes */length``.
Invalid ranges and If-Range are ignored (§14.1.1, §13.1.5). Exact bytes throughout,
files and S3 objects."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from dicomweb_server import retrieve
from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes
from tests.server.test_sample_files import split_multipart

SINGLE = {"Accept": "application/octet-stream"}
MULTI = {"Accept": 'multipart/related; type="application/octet-stream"'}


@pytest.fixture(params=["files", "s3"])
def client(request, tmp_path):
    extra = request.getfixturevalue("s3_storage") if request.param == "s3" else {}
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", **extra))
    with TestClient(create_app(archive.settings, archive=archive), raise_server_exceptions=False) as c:
        yield c
    archive.close()


def _store(c: TestClient, **kw):
    ds = make_dataset(**kw)
    body, ctype = multipart([to_bytes(ds)])
    assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    return ds, f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def _body(r, accept) -> bytes:
    if accept is SINGLE:
        return r.content
    ((_h, part),) = split_multipart(r)
    return part


@pytest.mark.parametrize("streamed", [False, True])  # True: a value above retrieve.LARGE_VALUE, read from disk
@pytest.mark.parametrize("accept", [SINGLE, MULTI])
@pytest.mark.parametrize("rng, status, want", [
    ("bytes=10-109", 206, slice(10, 110)),
    ("bytes=500-", 206, slice(500, None)),
    ("bytes=-16", 206, slice(-16, None)),
    ("bytes=0-99999", 206, slice(0, None)),
    ("bytes=5-3", 200, slice(None)),  # invalid (§14.1.1): ignored
    ("bytes=1-2,5-6", 200, slice(None)),
    ("items=1-2", 200, slice(None)),
    ("bytes=512-", 416, None),  # 16x16x2 = 512 bytes: first-pos at the end
    ("bytes=-0", 416, None),
])
def test_bulkdata_pixel_data_range(client, monkeypatch, streamed, accept, rng, status, want):
    if streamed:
        monkeypatch.setattr(retrieve, "LARGE_VALUE", 100)
    ds, url = _store(client, rows=16, columns=16)
    value = ds.PixelData
    assert len(value) == 512
    r = client.get(url + "/bulkdata/7FE00010", headers={**accept, "Range": rng})
    assert r.status_code == status, r.text
    if status == 416:
        assert r.headers["content-range"] == "bytes */512"
        return
    body = _body(r, accept)
    assert body == value[want]
    if status == 206:
        first = want.start if want.start is None or want.start >= 0 else 512 + want.start
        assert r.headers["content-range"] == f"bytes {first}-{first + len(body) - 1}/512"
    else:
        assert "content-range" not in r.headers


def test_if_range_sends_the_whole_value(client):
    """No validator is ever sent with bulk data, so an If-Range condition cannot hold (§13.1.5)."""
    ds, url = _store(client, rows=16, columns=16)
    r = client.get(url + "/bulkdata/7FE00010", headers={**SINGLE, "Range": "bytes=0-9", "If-Range": '"x"'})
    assert r.status_code == 200 and r.content == ds.PixelData and "content-range" not in r.headers


def test_resources_that_ignore_range(client):
    """Frames, instances and bulk data of several parts: 200 and the whole resource."""
    ds, url = _store(client, rows=8, columns=8, frames=3)
    frame = 8 * 8 * 2
    r = client.get(url + "/frames/2", headers={**MULTI, "Range": "bytes=0-9"})
    assert r.status_code == 200 and "content-range" not in r.headers
    assert _body(r, MULTI) == ds.PixelData[frame : 2 * frame]
    r = client.get(url, headers={"Accept": "application/dicom; transfer-syntax=*", "Range": "bytes=0-9"})
    assert r.status_code == 200 and r.content == to_bytes(ds) and "content-range" not in r.headers

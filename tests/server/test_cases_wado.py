"""WADO-RS conformance cases through real HTTP: W1 Accept negotiation, W3 multipart and
single-part framing, W4 frame lists (PS3.18 §10.4, §8.7)."""

from __future__ import annotations

import numpy as np
import pytest
from pydicom.uid import generate_uid

from tests.helpers import BASIC_TEXT_SR, make_dataset, multipart, to_bytes
from tests.server.test_sample_files import split_multipart

POSTGRESQL = True  # conftest.py: the server fixtures run on PostgreSQL too
S3 = True  # conftest.py: and with the instances in a local S3 server

ELE = "1.2.840.10008.1.2.1"


@pytest.fixture
def ct(http):
    ds = make_dataset(rows=16, columns=16)
    data = to_bytes(ds)
    body, ctype = multipart([data])
    assert http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
    return ds, data, url


# --- W1 Accept negotiation ---------------------------------------------------------------------


@pytest.mark.parametrize("accept", [
    'multipart/related; type="application/dicom"; transfer-syntax=*',
    f"multipart/related; type=application/dicom; transfer-syntax={ELE}",
    'Multipart/Related; TYPE="Application/DICOM"; Transfer-Syntax="*"',
    f'multipart/related;transfer-syntax="{ELE}";type="application/dicom"',
    "*/*",
    None,
    "text/html;q=0.5, multipart/related; type=application/dicom",
])
def test_w1_acceptable(http, ct, accept):
    _ds, data, url = ct
    headers = {"Accept": accept} if accept else {}
    r = http.get(url, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith('multipart/related; type="application/dicom"; boundary=')
    ((h, body),) = split_multipart(r)
    assert body == data
    assert h["content-type"] == f"application/dicom; transfer-syntax={ELE}"


@pytest.mark.parametrize("accept", [
    'multipart/related; type="application/dicom"; transfer-syntax=1.2.840.10008.1.2.4.50',
    "text/html",
    "application/dicom+json",
    'multipart/related; type="image/jpeg"',
])
def test_w1_not_acceptable(http, ct, accept):
    r = http.get(ct[2], headers={"Accept": accept})
    assert r.status_code == 406
    assert r.json()["detail"]


@pytest.mark.parametrize("accept", ["application/json", "application/dicom+json, */*;q=0.1", "*/*", None])
def test_w1_qido_answers_dicom_json(http, ct, accept):
    r = http.get("/studies", headers={"Accept": accept} if accept else {})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/dicom+json"


def test_w1_qido_and_metadata_refuse_xml(http, ct):
    assert http.get("/studies", headers={"Accept": "application/dicom+xml"}).status_code == 406
    assert http.get(ct[2] + "/metadata", headers={"Accept": "text/html"}).status_code == 406


# --- W3 single part vs multipart --------------------------------------------------------------


def test_w3_multipart_framing(http, ct):
    _ds, data, url = ct
    r = http.get(url, headers={"Accept": 'multipart/related; type="application/dicom"'})
    boundary = r.headers["content-type"].split("boundary=")[1].split(";")[0]
    assert r.content.startswith(f"--{boundary}\r\nContent-Type: application/dicom".encode())
    assert r.content.endswith(f"\r\n--{boundary}--\r\n".encode())
    assert data in r.content


def test_w3_single_part_for_one_instance(http, ct):
    _ds, data, url = ct
    r = http.get(url, headers={"Accept": "application/dicom"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/dicom")
    assert r.content == data


def test_w3_study_as_single_part_is_406(http, ct):
    ds, _data, _url = ct
    r = http.get(f"/studies/{ds.StudyInstanceUID}", headers={"Accept": "application/dicom"})
    assert r.status_code == 406
    r = http.get(f"/studies/{ds.StudyInstanceUID}")
    assert r.status_code == 200 and len(split_multipart(r)) == 1


def test_study_and_series_retrieve_stream_every_instance(http):
    study, series = generate_uid(), generate_uid()
    items = [make_dataset(study=study, series=series if i < 2 else None) for i in range(3)]
    datas = [to_bytes(ds) for ds in items]
    body, ctype = multipart(datas)
    assert http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    parts = split_multipart(http.get(f"/studies/{study}"))
    assert [b for _h, b in parts] == datas
    parts = split_multipart(http.get(f"/studies/{study}/series/{series}"))
    assert [b for _h, b in parts] == datas[:2]
    assert http.get(f"/studies/{generate_uid()}").status_code == 404


# --- W4 frame numbers ---------------------------------------------------------------------------


@pytest.fixture
def three_frames(http):
    ds = make_dataset(rows=16, columns=16, frames=3)
    ds.PixelData = np.stack([np.full((16, 16), k, np.uint16) for k in (1, 2, 3)]).tobytes()
    sr = make_dataset(study=ds.StudyInstanceUID, sop_class=BASIC_TEXT_SR, modality="SR", pixels=False)
    single = make_dataset(study=ds.StudyInstanceUID, rows=4, columns=4)
    body, ctype = multipart([to_bytes(x) for x in (ds, sr, single)])
    assert http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200

    def url(x):
        return f"/studies/{x.StudyInstanceUID}/series/{x.SeriesInstanceUID}/instances/{x.SOPInstanceUID}"
    return url(ds), url(sr), url(single), single


@pytest.mark.parametrize("frames, want", [("1", [1]), ("3,1", [3, 1]), ("1%2C2", [1, 2]), ("2,2", [2, 2])])
def test_w4_frames_in_order(http, three_frames, frames, want):
    r = http.get(three_frames[0] + f"/frames/{frames}")
    assert r.status_code == 200
    parts = split_multipart(r)
    assert [b for _h, b in parts] == [np.full(256, k, "<u2").tobytes() for k in want]
    assert all(h["content-type"] == f"application/octet-stream; transfer-syntax={ELE}" for h, _ in parts)


@pytest.mark.parametrize("frames, status", [("0", 400), ("x", 400), ("1,,2", 400), ("-1", 400), ("4", 404),
                                            ("1,4", 404), ("١", 400)])
def test_w4_bad_frames(http, three_frames, frames, status):
    r = http.get(three_frames[0] + f"/frames/{frames}")
    assert r.status_code == status
    assert r.json()["detail"]


def test_w4_single_frame_and_sr(http, three_frames):
    _mf, sr, single_url, single = three_frames
    ((_h, body),) = split_multipart(http.get(single_url + "/frames/1"))
    assert body == single.PixelData
    r = http.get(sr + "/frames/1")
    assert r.status_code == 404
    assert "no pixel data" in r.json()["detail"]


def test_metadata_levels_and_404(http, three_frames):
    mf_url = three_frames[0]
    study_url = mf_url.split("/series/")[0]
    assert len(http.get(study_url + "/metadata").json()) == 3
    (meta,) = http.get(mf_url + "/metadata").json()
    assert meta["7FE00010"]["BulkDataURI"].startswith(str(http.base_url).rstrip("/") + mf_url + "/bulkdata/")
    r = http.get(meta["7FE00010"]["BulkDataURI"])
    ((_h, pix),) = split_multipart(r)
    assert pix == np.stack([np.full((16, 16), k, np.uint16) for k in (1, 2, 3)]).tobytes()
    assert http.get(f"/studies/{generate_uid()}/metadata").status_code == 404


@pytest.mark.parametrize("path", [
    "/studies/1.2.3/series/..%2F..%2Fetc/instances/1.2/metadata",
    "/studies/..%2F..%2F..%2Fetc%2Fpasswd",
    "/studies/1.2.3/series/1.2/instances/1.2%00",
    "/studies/" + "1" * 65,
    "/studies/1.2/series/1.3/instances/1.4/bulkdata/..%2F..%2Fx",
    "/studies/1.2/series/1.3/instances/1.4/bulkdata/7FE00010/zz",
])
def test_paths_that_are_not_uids(http, path):
    r = http.get(path)
    assert r.status_code in (400, 404)


@pytest.mark.parametrize("rng, status, want", [
    ("bytes=10-109", 206, slice(10, 110)), ("bytes=500-", 206, slice(500, None)), ("bytes=-16", 206, slice(-16, None)),
    ("bytes=0-99999", 206, slice(0, None)), ("bytes=1-2,5-6", 200, slice(None)), ("items=1-2", 200, slice(None)),
    ("bytes=99999-", 416, None),
])
def test_bulkdata_byte_range(http, ct, rng, status, want):
    ds, _data, url = ct
    (meta,) = http.get(url + "/metadata").json()
    for accept in ("application/octet-stream", 'multipart/related; type="application/octet-stream"'):
        r = http.get(meta["7FE00010"]["BulkDataURI"], headers={"Range": rng, "Accept": accept})
        assert r.status_code == status, r.text
        if want is None:
            assert r.headers["content-range"] == f"bytes */{len(ds.PixelData)}"
            continue
        body = r.content if accept == "application/octet-stream" else split_multipart(r)[0][1]
        assert body == ds.PixelData[want]

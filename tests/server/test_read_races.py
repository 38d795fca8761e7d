"""Reads racing DELETE, and the render cache across processes (issue 14 §3).

Interleaving is made deterministic: the index look-up of the request under test
runs a real DELETE right after it returns, so the file (and row) are gone
between look-up and read. Single resources answer 404; study and series streams
leave the deleted instance out and end cleanly."""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes

WHOLE = {"Accept": "multipart/related; type=\"application/dicom\"; transfer-syntax=*"}


@pytest.fixture(params=["sqlite", "memory", "sqlite+s3"])
def archive(tmp_path, request):
    index, _, storage = request.param.partition("+")
    extra = request.getfixturevalue("s3_storage") if storage else {}
    a = Archive.open(Settings(data_dir=tmp_path, index=index, **extra))
    yield a
    a.close()


def _client(archive) -> TestClient:
    return TestClient(create_app(archive.settings, archive=archive), raise_server_exceptions=False)


def _store(c: TestClient, *datasets) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = c.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text


def _delete_after_lookup(monkeypatch, archive, study: str, series: str, sop: str) -> list[bool]:
    """Arm a one-shot hook: the next index look-up (locate or instances) returns its
    answer, then the instance is deleted through the archive (rows, then file)."""
    armed = [True]
    for name in ("locate", "instances"):
        real = getattr(archive.index, name)

        def hooked(*a, _real=real, **k):
            out = _real(*a, **k)
            if armed[0]:
                armed[0] = False
                assert archive.delete(study, series, sop) == 1
            return out

        monkeypatch.setattr(archive.index, name, hooked)
    return armed


def _parts(r) -> list[bytes]:
    """Part bodies of a multipart/related answer (the boundary is random, so a plain split)."""
    boundary = r.headers["content-type"].split("boundary=")[1].split(";")[0].strip('"')
    return [c.split(b"\r\n\r\n", 1)[1][:-2] for c in r.content.split(b"--" + boundary.encode())[1:-1]]


@pytest.mark.parametrize("path, headers, ts", [
    ("", WHOLE, ExplicitVRLittleEndian),  # as stored
    ("", {"Accept": "application/dicom; transfer-syntax=*"}, ExplicitVRLittleEndian),
    ("", {"Accept": "multipart/related; type=\"application/dicom\""}, ImplicitVRLittleEndian),  # transcoded
    ("/frames/1", {"Accept": "multipart/related; type=\"application/octet-stream\""}, ExplicitVRLittleEndian),
    ("/bulkdata/7FE00010", {}, ExplicitVRLittleEndian),
    ("/bulkdata/00100010", {}, ExplicitVRLittleEndian),  # an element read from the file
    ("/rendered", {"Accept": "image/png"}, ExplicitVRLittleEndian),
    ("/thumbnail", {"Accept": "image/jpeg"}, ExplicitVRLittleEndian),
])
@pytest.mark.parametrize("rows", [8, 800])  # 800x800x2 bytes: above retrieve.LARGE_FILE, streamed from disk
def test_instance_read_racing_delete_is_404(archive, monkeypatch, path, headers, ts, rows):
    ds = make_dataset(rows=rows, columns=rows, transfer_syntax=ts)
    with _client(archive) as c:
        _store(c, ds)
        url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}{path}"
        armed = _delete_after_lookup(monkeypatch, archive, ds.StudyInstanceUID, ds.SeriesInstanceUID,
                                     ds.SOPInstanceUID)
        r = c.get(url, headers=headers)
        assert not armed[0]  # the DELETE ran between look-up and read
        assert r.status_code == 404, (r.status_code, r.text[:200])


@pytest.mark.parametrize("level", ["study", "series"])
@pytest.mark.parametrize("rows", [8, 800])
def test_study_and_series_streams_skip_an_instance_deleted_meanwhile(archive, monkeypatch, level, rows):
    a = make_dataset(rows=rows, columns=rows)
    b, c3 = (make_dataset(study=a.StudyInstanceUID, series=a.SeriesInstanceUID, rows=rows, columns=rows)
             for _ in range(2))
    with _client(archive) as c:
        _store(c, a, b, c3)
        url = f"/studies/{a.StudyInstanceUID}" + (f"/series/{a.SeriesInstanceUID}" if level == "series" else "")
        single = f"/studies/{a.StudyInstanceUID}/series/{a.SeriesInstanceUID}/instances/{c3.SOPInstanceUID}/rendered"
        expected_picture = c.get(single, headers={"Accept": "image/png"}).content
        armed = _delete_after_lookup(monkeypatch, archive, a.StudyInstanceUID, a.SeriesInstanceUID,
                                     a.SOPInstanceUID)
        r = c.get(url, headers=WHOLE)
        assert not armed[0]
        assert r.status_code == 200
        assert sorted(_parts(r)) == sorted([to_bytes(b), to_bytes(c3)])
        monkeypatch.undo()
        armed = _delete_after_lookup(monkeypatch, archive, a.StudyInstanceUID, a.SeriesInstanceUID,
                                     b.SOPInstanceUID)
        r = c.get(url + "/rendered", headers={"Accept": "multipart/related; type=\"image/png\""})
        assert not armed[0] and r.status_code == 200
        assert _parts(r) == [expected_picture]


def _png_values(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def test_render_cache_sees_a_delete_and_restore_made_by_another_process(tmp_path):
    """Two archives (two worker processes) on one data folder, each with its own
    render cache: DELETE and a new store of the same UIDs through one, rendered and
    thumbnail through the other show the new picture."""
    settings = Settings(data_dir=tmp_path, index="sqlite")
    one, two = Archive.open(settings), Archive.open(settings)
    try:
        with _client(one) as c1, _client(two) as c2:
            old = make_dataset(rows=16, columns=16)
            new = make_dataset(study=old.StudyInstanceUID, series=old.SeriesInstanceUID, sop=old.SOPInstanceUID,
                               rows=16, columns=16)
            new.PixelData = (4095 - np.frombuffer(old.PixelData, np.uint16)).astype(np.uint16).tobytes()
            assert len(to_bytes(new)) == len(to_bytes(old))  # same size: only the file's identity differs
            url = f"/studies/{old.StudyInstanceUID}/series/{old.SeriesInstanceUID}/instances/{old.SOPInstanceUID}"
            _store(c1, old)
            before = {k: c2.get(url + k, headers={"Accept": "image/png"}).content for k in ("/rendered", "/thumbnail")}
            assert c1.delete(f"/studies/{old.StudyInstanceUID}").status_code == 204
            _store(c1, new)
            for k, stale in before.items():
                fresh = c1.get(url + k, headers={"Accept": "image/png"}).content
                assert not np.array_equal(_png_values(fresh), _png_values(stale))
                assert c2.get(url + k, headers={"Accept": "image/png"}).content == fresh, k
            assert pydicom.dcmread(io.BytesIO(_parts(c2.get(url, headers=WHOLE))[0])).PixelData == new.PixelData
    finally:
        one.close()
        two.close()


def _pixel_instances():
    """Two-frame instances whose reads go through the merged media/lifecycle paths:
    Float Pixel Data (7FE00008, OF), JPEG Baseline fragments (one per frame, odd
    codestreams padded with 0x00) and an MPEG-4 video stream (one fragment)."""
    from pydicom.encaps import encapsulate

    flt = make_dataset(pixels=False, modality="OT", sop_class="1.2.840.10008.5.1.4.1.1.30")
    flt.Rows, flt.Columns, flt.SamplesPerPixel, flt.NumberOfFrames, flt.BitsAllocated = 3, 4, 1, 2, 32
    flt.PhotometricInterpretation = "MONOCHROME2"
    values = (np.arange(24, dtype=np.float32) - 10.5).tobytes()
    flt.FloatPixelData = values
    frames = {"float": ("7FE00008", [values[:48], values[48:]])}
    streams = [b"\xff\xd8" + bytes([k]) * 5 + b"\xff\xd9" for k in (1, 2)]  # 9 bytes: padded when stored
    video = [b"\x00\x00\x00\x18ftypmp42" + bytes(range(40))]
    out = [flt]
    for name, ts, values in (("jpeg", "1.2.840.10008.1.2.4.50", streams), ("video", "1.2.840.10008.1.2.4.102", video)):
        ds = make_dataset(pixels=False, transfer_syntax=ts, modality="OT")
        ds.Rows = ds.Columns = 16
        ds.SamplesPerPixel, ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 1, 8, 8, 7, 0
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.NumberOfFrames = 2
        ds.PixelData = encapsulate(values)
        ds["PixelData"].VR = "OB"
        frames[name] = ("7FE00010", values)
        out.append(ds)
    return dict(zip(frames, out)), frames


@pytest.mark.parametrize("name", ["float", "jpeg", "video"])
def test_pixel_reads_by_recorded_tag_and_media_type_racing_delete(archive, monkeypatch, name):
    """Merge of the media and lifecycle branches: the pixel tag recorded at store
    time, the media-type labels and video as one stream are read through the file
    opened once; a DELETE between look-up and read is 404 for frames and bulk data."""
    datasets, expected = _pixel_instances()
    ds, (tag, values) = datasets[name], expected[name]
    octet = {"Accept": "multipart/related; type=\"application/octet-stream\"; transfer-syntax=*"}
    with _client(archive) as c:
        _store(c, ds)
        url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
        r = c.get(url + "/bulkdata/" + tag, headers={"Accept": "multipart/related; type=\"*/*\""}
                  if name != "float" else {})
        assert r.status_code == 200, r.text[:200]
        assert _parts(r) == ([b"".join(values)] if name != "jpeg" else values)
        if name != "video":  # a video's frames cannot be cut from the stream (406)
            r = c.get(url + "/frames/2,1", headers=octet)
            assert r.status_code == 200 and _parts(r) == [values[1], values[0]]
        for path, headers in [("/bulkdata/" + tag, {})] + ([("/frames/1", octet)] if name != "video" else []):
            armed = _delete_after_lookup(monkeypatch, archive, ds.StudyInstanceUID, ds.SeriesInstanceUID,
                                         ds.SOPInstanceUID)
            r = c.get(url + path, headers=headers)
            assert not armed[0] and r.status_code == 404, (path, r.status_code, r.text[:200])
            monkeypatch.undo()
            _store(c, ds)

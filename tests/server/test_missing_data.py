"""Damaged storage (issue 34 §1, missing_data.py): a file or S3 object that the index
names but that is gone. Single-instance resources answer 500 "instance data missing"
(a read racing a DELETE stays 404: tests/server/test_read_races.py); study, series
and their rendered resources send the rest with a Warning naming what is missing
(all missing: 500, never an empty 200); every finding is counted at /metrics and
logged at ERROR once per instance; QIDO-RS and metadata keep the instance until
``check --repair``; the landing page shows what the last check found. Files and S3."""

from __future__ import annotations

import io
import logging
import re

import pydicom
import pytest
from pydicom.uid import ImplicitVRLittleEndian
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.check import reconcile
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, remove_stored, to_bytes
from tests.server.test_sample_files import split_multipart

WHOLE = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}
TRANSCODED = {"Accept": 'multipart/related; type="application/dicom"'}  # streamed: converted one at a time


@pytest.fixture(params=["files", "s3"])
def archive(request, tmp_path):
    extra = request.getfixturevalue("s3_storage") if request.param == "s3" else {}
    a = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", **extra))
    yield a
    a.close()


@pytest.fixture
def client(archive):
    with TestClient(create_app(archive.settings, archive=archive), raise_server_exceptions=False) as c:
        yield c


def _store(c: TestClient, *datasets) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = c.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text


def _rel(ds) -> str:
    return f"{ds.StudyInstanceUID}/{ds.SeriesInstanceUID}/{ds.SOPInstanceUID}.dcm"


def _url(ds) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def _missing_total(c: TestClient) -> float:
    m = re.search(r"^dicomweb_instance_data_missing_total (\S+)$", c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("path, headers", [
    ("", WHOLE),
    ("", {"Accept": "application/dicom; transfer-syntax=*"}),
    ("", TRANSCODED),
    ("/frames/1", {"Accept": 'multipart/related; type="application/octet-stream"'}),
    ("/bulkdata/7FE00010", {}),
    ("/bulkdata/7FE00010", {"Accept": "application/octet-stream", "Range": "bytes=0-9"}),
    ("/bulkdata/00100010", {}),  # an element read from the file
    ("/rendered", {"Accept": "image/png"}),
    ("/thumbnail", {"Accept": "image/jpeg"}),
])
@pytest.mark.parametrize("rows", [8, 800])  # 800x800x2 bytes: above retrieve.LARGE_FILE, streamed from disk
def test_single_resources_answer_500_instance_data_missing(archive, client, caplog, path, headers, rows):
    ds = make_dataset(rows=rows, columns=rows, transfer_syntax=ImplicitVRLittleEndian)
    _store(client, ds)
    remove_stored(archive.settings, _rel(ds))
    before = _missing_total(client)
    with caplog.at_level(logging.ERROR, logger="dicomweb_server.missing"):
        for _ in range(2):
            r = client.get(_url(ds) + path, headers=headers)
            assert r.status_code == 500, (r.status_code, r.text[:300])
            assert r.json()["detail"].startswith("instance data missing")
            assert ds.SOPInstanceUID in r.json()["detail"]
    assert _missing_total(client) == before + 2  # every finding counted
    logged = [rec for rec in caplog.records if rec.name == "dicomweb_server.missing"]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR  # logged once per instance
    assert ds.SOPInstanceUID in logged[0].getMessage()
    # the index is the truth: listed and described until `check --repair`
    found = client.get("/instances", params={"SOPInstanceUID": ds.SOPInstanceUID}).json()
    assert [i["00080018"]["Value"][0] for i in found] == [ds.SOPInstanceUID]
    assert client.get(_url(ds) + "/metadata").status_code == 200


@pytest.mark.parametrize("level", ["study", "series"])
@pytest.mark.parametrize("headers", [WHOLE, TRANSCODED])  # files sent as opened, and streamed one by one
def test_study_and_series_send_the_rest_with_a_warning(archive, client, level, headers):
    a = make_dataset(rows=8, columns=8, transfer_syntax=ImplicitVRLittleEndian)
    b, c3 = (make_dataset(study=a.StudyInstanceUID, series=a.SeriesInstanceUID, rows=8, columns=8,
                          transfer_syntax=ImplicitVRLittleEndian) for _ in range(2))
    _store(client, a, b, c3)
    remove_stored(archive.settings, _rel(b))
    url = f"/studies/{a.StudyInstanceUID}" + (f"/series/{a.SeriesInstanceUID}" if level == "series" else "")
    r = client.get(url, headers=headers)
    assert r.status_code == 200
    warning = r.headers["warning"]
    assert warning.startswith('299 dicomweb-archive: "1 instance(s) omitted: instance data missing')
    assert b.SOPInstanceUID in warning and a.SOPInstanceUID not in warning
    got = sorted(pydicom.dcmread(io.BytesIO(part)).SOPInstanceUID for _h, part in split_multipart(r))
    assert got == sorted([a.SOPInstanceUID, c3.SOPInstanceUID])
    for kind, accept in (("rendered", 'multipart/related; type="image/png"'), ("thumbnail", "image/png")):
        r = client.get(f"{url}/{kind}", headers={"Accept": accept})
        assert r.status_code == 200 and b.SOPInstanceUID in r.headers["warning"], kind
        if kind == "rendered":
            assert len(split_multipart(r)) == 2
    for gone in (a, c3):
        remove_stored(archive.settings, _rel(gone))
    for suffix, accept in (("", headers["Accept"]), ("/rendered", 'multipart/related; type="image/png"'),
                           ("/thumbnail", "image/png")):
        r = client.get(url + suffix, headers={"Accept": accept})
        assert r.status_code == 500, (suffix, r.status_code)  # all missing: never an empty 200
        detail = r.json()["detail"]
        assert detail.startswith("instance data missing (3 instance(s)")
        assert all(ds.SOPInstanceUID in detail for ds in (a, b, c3))


def test_check_finds_them_the_landing_page_shows_it_and_repair_drops_the_rows(archive, client):
    a, b = make_dataset(rows=8, columns=8), make_dataset(rows=8, columns=8)
    _store(client, a, b)
    assert client.get("/", headers={"Accept": "application/json"}).json()["last_check"] is None
    remove_stored(archive.settings, _rel(a))
    report = reconcile(archive)
    assert [(p.kind, p.subject) for p in report.problems] == [("missing file", a.SOPInstanceUID)]
    landing = client.get("/", headers={"Accept": "application/json"}).json()["last_check"]
    assert {k: landing[k] for k in ("indexed", "problems", "missing_files", "repaired")} == \
        {"indexed": 2, "problems": 1, "missing_files": 1, "repaired": False}
    html = client.get("/", headers={"Accept": "text/html"}).text
    assert "<td>last check</td><td>1 missing file(s), 1 problem(s) at " in html
    assert len(client.get("/instances").json()) == 2  # QIDO keeps listing it until the repair
    reconcile(archive, repair=True)
    assert [i["00080018"]["Value"][0] for i in client.get("/instances").json()] == [b.SOPInstanceUID]
    assert client.get(_url(a)).status_code == 404
    landing = client.get("/", headers={"Accept": "application/json"}).json()["last_check"]
    assert (landing["missing_files"], landing["repaired"]) == (1, True)
    reconcile(archive)
    assert client.get("/", headers={"Accept": "application/json"}).json()["last_check"]["missing_files"] == 0


def test_an_unreadable_file_is_missing_data_too(tmp_path):
    """A name the index gives that cannot be read as a file (here a folder in its place:
    EISDIR; EACCES or EIO alike) is missing data, not an unhandled error."""
    a = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite"))
    try:
        with TestClient(create_app(a.settings, archive=a), raise_server_exceptions=False) as c:
            ds, other = make_dataset(rows=8, columns=8), make_dataset(rows=8, columns=8)
            other.StudyInstanceUID, other.SeriesInstanceUID = ds.StudyInstanceUID, ds.SeriesInstanceUID
            _store(c, ds, other)
            remove_stored(a.settings, _rel(ds))
            (tmp_path / "data" / "blobs" / _rel(ds)).mkdir()
            for path in ("", "/frames/1", "/rendered"):
                r = c.get(_url(ds) + path, headers=WHOLE if not path else {})
                assert r.status_code == 500 and r.json()["detail"].startswith("instance data missing"), path
            r = c.get(f"/studies/{ds.StudyInstanceUID}", headers=WHOLE)
            assert r.status_code == 200 and ds.SOPInstanceUID in r.headers["warning"]
            assert [h for h, _ in split_multipart(r)] and len(split_multipart(r)) == 1
    finally:
        a.close()


def test_study_sent_by_the_kernel_names_the_missing_file(tmp_path):
    """Real uvicorn: a whole study as stored is sent with sendfile (api/sendfile.py), its
    files opened before the answer starts: the one that cannot be opened is named in the
    Warning; none left: 500."""
    import httpx

    from tests.helpers import LiveServer

    srv = LiveServer(tmp_path / "data", "sqlite").start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            a = make_dataset(rows=8, columns=8)
            b = make_dataset(study=a.StudyInstanceUID, series=a.SeriesInstanceUID, rows=8, columns=8)
            body, ctype = multipart([to_bytes(a), to_bytes(b)])
            assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
            remove_stored(srv.settings, _rel(a))
            r = c.get(f"/studies/{a.StudyInstanceUID}", headers=WHOLE)
            assert r.status_code == 200 and a.SOPInstanceUID in r.headers["warning"]
            assert [part for _h, part in split_multipart(r)] == [to_bytes(b)]
            remove_stored(srv.settings, _rel(b))
            r = c.get(f"/studies/{a.StudyInstanceUID}", headers=WHOLE)
            assert r.status_code == 500 and r.json()["detail"].startswith("instance data missing (2 instance(s)")
    finally:
        srv.stop()

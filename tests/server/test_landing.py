"""``GET /``: JSON for programs, HTML for browsers; counts from the index (both kinds)."""

from __future__ import annotations

import shutil

import httpx

from dicomweb_server import __version__
from dicomweb_server.api.landing import _size, wants_html
from dicomweb_server.settings import Settings
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

POSTGRESQL = True  # the index's stored_bytes (schema version 4) on each kind

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def _store_two_studies(http) -> None:
    """2 studies, 3 series, 4 instances."""
    a, b = make_dataset(), make_dataset()
    datasets = [a, make_dataset(study=a.StudyInstanceUID, series=a.SeriesInstanceUID),
                make_dataset(study=a.StudyInstanceUID, modality="MR"), b]
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = http.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text


def test_json_for_programs_with_counts_and_links(server, http, index_kind):
    r = http.get("/")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    empty = r.json()
    assert (empty["studies"], empty["series"], empty["instances"]) == (0, 0, 0)
    _store_two_studies(http)
    d = http.get("/", headers={"Accept": "*/*"}).json()
    assert (d["name"], d["version"], d["index"]) == ("dicomweb-archive", __version__, index_kind)
    assert (d["studies"], d["series"], d["instances"]) == (2, 3, 4)
    # the archive's own bytes (issue 26 item 6), not the file system's: the stored files' sizes
    files = (server.settings.data_dir / "blobs").rglob("*.dcm")
    assert d["stored_bytes"] == sum(p.stat().st_size for p in files) > 0
    assert d["disk"]["data_dir"] == str(server.settings.data_dir.resolve())
    fs = shutil.disk_usage(server.settings.data_dir)
    assert d["disk"]["total_bytes"] == fs.total and 0 < d["disk"]["used_bytes"] < fs.total
    assert 0 < d["disk"]["free_bytes"] <= d["disk"]["total_bytes"]
    assert d["storage"] == {"kind": "folder", "url": str(server.settings.data_dir.resolve())}
    assert d["links"] == {"dicomweb": f"{server.url}/studies", "docs": f"{server.url}/docs",
                          "openapi": f"{server.url}/openapi.json", "ui": f"{server.url}/ui/"}
    assert d["dimse_port"] == getattr(server.settings, "dimse_port", None)
    for name in ("docs", "openapi", "dicomweb", "ui"):
        assert http.get(d["links"][name]).status_code == 200, name


def test_html_for_browsers_with_viewer_link(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "index.html").write_text("<!doctype html><title>OHIF</title>")
    server = LiveServer(tmp_path / "data", "sqlite", viewer=True, viewer_dir=dist, prefix="/dicomweb").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            _store_two_studies(httpx.Client(base_url=server.url + "/dicomweb", timeout=30))
            for path in ("/", "/dicomweb/"):
                r = http.get(path, headers={"Accept": BROWSER_ACCEPT})
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
                page = r.text
                assert f"dicomweb-archive {__version__}" in page
                assert "<tr><td>studies</td><td>2</td></tr>" in page
                assert "<tr><td>instances</td><td>4</td></tr>" in page
                size = sum(p.stat().st_size for p in (tmp_path / "data" / "blobs").rglob("*.dcm"))
                assert f"<tr><td>stored</td><td>{_size(size)} (4 instances)</td></tr>" in page
                assert " free of " in page and "used by all its files" in page
                assert f'<a href="{server.url}/viewer/">OHIF viewer</a>' in page
                assert f'<a href="{server.url}/docs">API documentation</a>' in page
                assert f'<a href="{server.url}/ui/">Operator\'s page</a>' in page
                assert f'<a href="{server.url}/dicomweb/studies">DICOMweb</a>' in page
            assert http.get("/", headers={"Accept": "application/json"}).json()["links"]["viewer"] == \
                f"{server.url}/viewer/"
    finally:
        server.stop()


def test_accept_negotiation():
    assert wants_html(BROWSER_ACCEPT)
    assert wants_html("text/html")
    assert not wants_html("")
    assert not wants_html("*/*")
    assert not wants_html("application/json")
    assert not wants_html("application/json, text/html;q=0.5")
    assert not wants_html("text/html;q=0")


def test_dimse_port_when_on(tmp_path):
    """The DIMSE port appears when that listener is configured (the dimse_port setting);
    before that setting exists, the page says null."""
    settings_has_it = "dimse_port" in Settings.model_fields
    kwargs = {"dimse_port": 11112} if settings_has_it else {}
    server = LiveServer(tmp_path / "data", "memory", **kwargs).start()
    try:
        d = httpx.get(server.url + "/", timeout=30).json()
        assert d["dimse_port"] == (11112 if settings_has_it else None)
        page = httpx.get(server.url + "/", headers={"Accept": "text/html"}, timeout=30).text
        assert ("DICOM (DIMSE) on port 11112" in page) == settings_has_it
        assert "OHIF viewer: off (start the archive with <code>--viewer</code>)" in page
    finally:
        server.stop()


def test_instances_in_s3_are_named_as_such(tmp_path, s3_storage):
    """With ``--storage s3://...`` the page says the instances are in the bucket (the data
    folder's disk then holds only spool, locks and the index)."""
    server = LiveServer(tmp_path / "data", "sqlite", **s3_storage).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            d = http.get("/").json()
            assert d["storage"] == {"kind": "s3", "url": s3_storage["storage"],
                                    "endpoint": s3_storage["s3_endpoint_url"]}
            page = http.get("/", headers={"Accept": BROWSER_ACCEPT}).text
            assert (f"<tr><td>instances kept in</td><td>{s3_storage['storage']} "
                    f"(S3 at {s3_storage['s3_endpoint_url']})</td></tr>") in page
    finally:
        server.stop()

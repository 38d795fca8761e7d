"""Case P4: HEAD on every GET resource, OPTIONS, 405 with Allow, and the neighbours
in RFC 9110 (Content-Length correctness, 406 vs 415). Real server, http.client on
one keep-alive connection: a HEAD answer that leaked body bytes would corrupt the
GET answer read after it."""

from __future__ import annotations

import http.client
import re

import httpx
import pytest

from tests.helpers import make_dataset, multipart, to_bytes

_BOUNDARY = re.compile(r"boundary=[^;]+")


@pytest.fixture
def stored(server):
    study = "1.2.3.4.5"
    ds = make_dataset(study=study, series="1.2.3.4.5.6", sop="1.2.3.4.5.6.7", frames=2)
    body, ctype = multipart([to_bytes(ds)])
    r = httpx.post(server.url + "/studies", content=body, headers={"content-type": ctype}, timeout=60)
    assert r.status_code == 200, r.text
    return server, "/studies/1.2.3.4.5", "/studies/1.2.3.4.5/series/1.2.3.4.5.6", \
        "/studies/1.2.3.4.5/series/1.2.3.4.5.6/instances/1.2.3.4.5.6.7"


def _resources(study: str, series: str, inst: str) -> list[tuple[str, str]]:
    """(path, Accept) of every GET resource."""
    out = [("/studies", ""), ("/series", ""), ("/instances", ""), (f"{study}/series", ""),
           (f"{study}/instances", ""), (f"{series}/instances", ""), ("/studies?PatientID=P1", ""),
           (study, ""), (series, ""), (inst, ""), (inst, "application/dicom; transfer-syntax=*"),
           (f"{study}/metadata", ""), (f"{series}/metadata", ""), (f"{inst}/metadata", ""),
           (f"{inst}/frames/1", ""), (f"{inst}/frames/2,1", ""),
           (f"{inst}/bulkdata/7FE00010", ""), (f"{inst}/bulkdata/7FE00010", "application/octet-stream"),
           ("/openapi.json", ""), ("/studies/9.9.9", ""), (f"{inst}/frames/9", "")]
    for kind in ("rendered", "thumbnail"):
        out += [(f"{study}/{kind}", ""), (f"{series}/{kind}", ""), (f"{inst}/{kind}", "image/png"),
                (f"{inst}/frames/1/{kind}", "")]
    return out


def _comparable(headers: http.client.HTTPMessage) -> dict[str, str]:
    # Transfer-Encoding is framing of the sent content (RFC 9112 §6.1: optional for HEAD)
    out = {k.lower(): v for k, v in headers.items() if k.lower() not in ("date", "server", "transfer-encoding")}
    if "content-type" in out:
        out["content-type"] = _BOUNDARY.sub("boundary=B", out["content-type"])
    return out


def test_p4_head_on_every_get_resource(stored):
    server, study, series, inst = stored
    conn = http.client.HTTPConnection("127.0.0.1", server.settings.port, timeout=60)
    try:
        for path, accept in _resources(study, series, inst):
            headers = {"Accept": accept} if accept else {}
            conn.request("HEAD", path, headers=headers)
            head = conn.getresponse()
            head_body = head.read()
            conn.request("GET", path, headers=headers)
            get = conn.getresponse()
            get_body = get.read()
            assert head.status == get.status, path
            assert head_body == b"", path
            assert _comparable(head.headers) == _comparable(get.headers), path
            if get.headers.get("content-length") is not None:
                assert int(get.headers["content-length"]) == len(get_body), path
            assert head.status in (200, 404), (path, head.status)
    finally:
        conn.close()


_ALLOW = {
    "/studies": "GET, HEAD, OPTIONS, POST",
    "/series": "GET, HEAD, OPTIONS",
    "{study}": "DELETE, GET, HEAD, OPTIONS, POST",
    "{series}": "DELETE, GET, HEAD, OPTIONS",
    "{inst}": "DELETE, GET, HEAD, OPTIONS",
    "{inst}/metadata": "GET, HEAD, OPTIONS",
    "{inst}/frames/1": "GET, HEAD, OPTIONS",
    "{inst}/rendered": "GET, HEAD, OPTIONS",
    "{study}/thumbnail": "GET, HEAD, OPTIONS",
}


def test_p4_unsupported_method_is_405_with_allow_and_options_lists_them(stored):
    server, study, series, inst = stored
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for template, allow in _ALLOW.items():
            path = template.format(study=study, series=series, inst=inst)
            for method in ("PUT", "PATCH", "TRACE"):
                r = c.request(method, path)
                assert r.status_code == 405, (method, path)
                assert r.headers["allow"] == allow, (method, path)
                assert r.json()["detail"]
            r = c.options(path)
            assert (r.status_code, r.headers["allow"], r.content) == (204, allow, b""), path
        assert c.options("/no/such/resource").status_code == 404
        # a method RFC 9110 does not define is 501 (§9.1), anywhere
        for path in ("/studies", study):
            r = c.request("PROPFIND", path)
            assert r.status_code == 501 and "PROPFIND" in r.json()["detail"]


def test_stow_406_for_an_unproducible_response_and_415_for_an_unsupported_body(server):
    body, ctype = multipart([to_bytes(make_dataset())])
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/studies", content=body, headers={"content-type": ctype, "accept": "application/dicom+xml"})
        assert r.status_code == 406
        r = c.post("/studies", content=body, headers={"content-type": "application/dicom"})
        assert r.status_code == 415
        assert c.get("/instances").json() == []  # nothing stored by either


def test_p4_head_on_the_viewer_pages(tmp_path):
    """The viewer's routes (a stand-in dist/ folder: the real one is fetched with npm)."""
    from tests.helpers import LiveServer

    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "index.html").write_text('<html><script src="/app.bundle.js"></script></html>')
    (dist / "app.bundle.js").write_text("console.log(1);" * 1000)
    srv = LiveServer(tmp_path / "data", viewer=True, viewer_dir=dist).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.settings.port, timeout=60)
    try:
        for path in ("/viewer/", "/viewer/app-config.js", "/viewer/app.bundle.js", "/viewer/studies/1.2",
                     "/viewer/no-such.js"):
            conn.request("HEAD", path)
            head = conn.getresponse()
            assert head.read() == b""
            conn.request("GET", path)
            get = conn.getresponse()
            get_body = get.read()
            assert head.status == get.status, path
            assert _comparable(head.headers) == _comparable(get.headers), path
            if get.headers.get("content-length") is not None:
                assert int(get.headers["content-length"]) == len(get_body), path
        conn.request("PUT", "/viewer/")
        put = conn.getresponse()
        put.read()
        assert put.status == 405 and "GET" in put.headers["allow"]
    finally:
        conn.close()
        srv.stop()

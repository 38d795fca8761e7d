"""The ``accept`` and ``charset`` query parameters (PS3.18 §8.3.3.1, §8.3.3.2) on
every resource that has them: QIDO-RS, WADO-RS instances, metadata, frames, bulk data,
rendered and thumbnail. The parameter's media types take the place of the Accept
header's; it is percent-encoded (a media type with parameters) or written plainly; a
bad value, a wildcard, a type the Accept header excludes, or DICOM and rendered types
together are 400."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.helpers import make_dataset
from tests.server.conftest import stored

DICOM_PARTS = 'multipart/related; type="application/dicom"'
OCTET_PARTS = 'multipart/related; type="application/octet-stream"'


@pytest.fixture
def client(app_client):
    return app_client


@pytest.fixture
def inst(client):
    ds = make_dataset(rows=4, columns=4, frames=2)
    return stored(client, ds)


def q(media_type: str) -> str:
    return "accept=" + quote(media_type, safe="")


def test_percent_encoded_media_type_with_parameters():
    assert q(DICOM_PARTS) == "accept=multipart%2Frelated%3B%20type%3D%22application%2Fdicom%22"


def test_qido(client, inst):
    for query in ("accept=application/dicom%2Bjson", "accept=application/dicom+json", "accept=application/json",
                  "charset=utf-8", "charset=UTF-8,iso-8859-1;q=0.5", "accept=application/dicom%2Bjson&charset=utf-8"):
        r = client.get("/studies?" + query)
        assert r.status_code == 200, (query, r.text)
        assert r.headers["content-type"].startswith("application/dicom+json")
        assert len(r.json()) == 1
    # the parameter takes the place of the header: text/html alone is 406, with the parameter 200
    browser = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    assert client.get("/studies", headers={"Accept": "text/html"}).status_code == 406
    assert client.get("/studies?accept=application/dicom%2Bjson", headers=browser).status_code == 200
    assert client.get("/studies?accept=application/dicom%2Bxml").status_code == 406


@pytest.mark.parametrize("query", [
    "accept=*/*", "accept=application/*", "accept=nonsense", "accept=", "accept=application/dicom,image/jpeg",
    "charset=*", "charset=no-such-charset", "charset=iso-8859-1", "charset=utf-8;q=0",
])
def test_bad_values_are_400(client, inst, query):
    for url in ("/studies", inst, inst + "/metadata", inst + "/rendered", inst + "/frames/1"):
        r = client.get(url + "?" + query)
        assert r.status_code == 400, (url, query, r.status_code)
        assert r.json()["detail"].startswith(query.split("=")[0] + ":")


def test_parameter_outside_the_accept_header_is_400(client, inst):
    r = client.get(inst + "/rendered?accept=image/png", headers={"Accept": "image/jpeg"})
    assert r.status_code == 400
    assert "not compatible with the Accept header" in r.json()["detail"]
    assert client.get(inst + "/rendered?accept=image/png", headers={"Accept": "image/*"}).status_code == 200


def test_instance(client, inst):
    r = client.get(inst + "?" + q("application/dicom"))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/dicom")  # single part, as the parameter asked
    r = client.get(inst + "?" + q(DICOM_PARTS + "; transfer-syntax=*"))
    assert r.headers["content-type"].startswith("multipart/related")
    assert client.get(inst + "?" + q("application/dicom; transfer-syntax=1.2.840.10008.1.2.4.50")).status_code == 406
    r = client.get(inst.rsplit("/instances/", 1)[0] + "?" + q(DICOM_PARTS))
    assert r.status_code == 200 and r.headers["content-type"].startswith("multipart/related")
    # the plus-as-space of HTML forms next to ";" is a space
    r = client.get(inst + "?accept=multipart/related;+type=application/dicom")
    assert r.status_code == 200 and r.headers["content-type"].startswith("multipart/related")


def test_metadata(client, inst):
    assert client.get(inst + "/metadata?accept=application/dicom%2Bjson").status_code == 200
    assert client.get(inst + "/metadata?accept=application/dicom%2Bxml").status_code == 406


def test_frames_and_bulkdata(client, inst):
    r = client.get(inst + "/frames/2?" + q(OCTET_PARTS))
    assert r.status_code == 200 and 'type="application/octet-stream"' in r.headers["content-type"]
    # image/jpeg's default syntax (JPEG Lossless SV1, PS3.18 Table 8.7.3-5) is not produced here
    assert client.get(inst + "/frames/2?accept=image/jpeg").status_code == 406
    r = client.get(inst + "/bulkdata/7FE00010?accept=application/octet-stream")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"  # single part, as the parameter asked
    assert len(r.content) == 4 * 4 * 2 * 2


def test_rendered_and_thumbnail(client, inst):
    for suffix in ("/rendered", "/frames/1/rendered", "/thumbnail"):
        r = client.get(inst + suffix + "?accept=image/png&quality=90")
        assert r.status_code == 200, (suffix, r.text)
        assert r.headers["content-type"] == "image/png"
        assert r.content.startswith(b"\x89PNG")
    r = client.get(inst + "/frames/1,2/rendered?" + q('multipart/related; type="image/png"'))
    assert r.status_code == 200 and 'type="image/png"' in r.headers["content-type"]

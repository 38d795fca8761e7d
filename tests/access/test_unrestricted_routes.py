"""Resources that are not studies — the modality worklist, the list of rejected instances
across studies — are for callers every study is open to: a key restricted by access rules
(labels) gets 403 there, as a share link does (api/deps.py ``Unrestricted``); and the small
JSON/CSV bodies of those routes and of a share request are refused (413) once past their
bound, never read whole."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.access.test_http_access import ALL, ONLY_A, h, key_name, store
from tests.helpers import make_dataset

ENTRY = {"00100010": {"vr": "PN", "Value": [{"Alphabetic": "SECRET^PATIENT"}]},
         "00100020": {"vr": "LO", "Value": ["PB"]},
         "00400100": {"vr": "SQ", "Value": [{"00400001": {"vr": "AE", "Value": ["CT1"]},
                                             "00080060": {"vr": "CS", "Value": ["CT"]},
                                             "00400009": {"vr": "SH", "Value": ["SPS-1"]}}]}}


@pytest.fixture
def client(tmp_path):
    every = ["read", "write", "delete"]
    settings = Settings(data_dir=tmp_path, index="sqlite", api_keys={ALL: every, ONLY_A: every},
                        access_rules={"identities": {f"key:{key_name(ONLY_A)}": ["a"]}})
    archive = Archive.open(settings)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def test_the_worklist_is_for_unrestricted_callers(client):
    assert client.post("/worklist", json=ENTRY, headers=h(ALL)).status_code == 201
    for method, path, kw in (("GET", "/worklist", {}), ("GET", "/worklist/SPS-1", {}),
                             ("POST", "/worklist", {"json": ENTRY}), ("DELETE", "/worklist/SPS-1", {}),
                             ("GET", "/mpps/1.2.3", {})):  # (the performed steps: the same router)
        r = client.request(method, path, headers=h(ONLY_A), **kw)
        assert r.status_code == 403 and "SECRET" not in r.text, (method, path, r.text)
    assert [e["00100020"]["Value"] for e in client.get("/worklist", headers=h(ALL)).json()] == [["PB"]]


def test_the_rejected_list_is_for_unrestricted_callers(client):
    ds = make_dataset(PatientID="PB")
    assert store(client, ALL, ds).status_code == 200
    r = client.post(f"/studies/{ds.StudyInstanceUID}/reject/113001^DCM", headers=h(ALL))
    assert r.status_code == 200, r.text
    r = client.get("/admin/rejected", headers=h(ONLY_A))
    assert r.status_code == 403 and ds.StudyInstanceUID not in r.text
    assert [e["SOPInstanceUID"] for e in client.get("/admin/rejected", headers=h(ALL)).json()] == [ds.SOPInstanceUID]


def test_small_bodies_are_bounded(client):
    ds = make_dataset(PatientID="PA")
    assert store(client, ALL, ds).status_code == 200
    r = client.post(f"/studies/{ds.StudyInstanceUID}/share", content=b" " * 5000,
                    headers=h(ALL, **{"Content-Type": "application/json"}))
    assert r.status_code == 413, r.text

    def chunks():  # no Content-Length: refused as the bytes pass the bound
        for _ in range(20):
            yield b" " * 1024 * 1024
    r = client.post("/worklist", content=chunks(), headers=h(ALL, **{"Content-Type": "application/json"}))
    assert r.status_code == 413, r.text
    assert client.get("/worklist", headers=h(ALL)).json() == []

"""The hot path (api/hot.py) answers exactly as FastAPI does: every hot route is the
route Starlette's router would pick for that method and path, and a script of requests
(STOW-RS, also through the routes file's doors; QIDO-RS; WADO-RS instance, frames, rendered
and thumbnail pictures; good, malformed, unauthenticated, without the scope, restricted by
access rules, HEAD, OPTIONS, 405, cross-origin) gets the same status, header fields, body
(the pictures' bytes too) and audit lines from an app with the hot path as from the same app
with it turned off (every request through Starlette and FastAPI)."""

from __future__ import annotations

import hashlib
import re

import orjson
import pytest
from starlette.routing import Match
from starlette.testclient import TestClient

from dicomweb_server.api.hot import ArchiveApp, HotRouter
from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes

ALL, ONLY_A, READER = "tok-all", "tok-a", "tok-read"
ORIGIN = "https://viewer.example"
STUDY, SERIES, SOP = "1.2.826.0.1.3680043.8.498.1", "1.2.826.0.1.3680043.8.498.2", "1.2.826.0.1.3680043.8.498.3"
STUDY_B, SOP_B = "1.2.826.0.1.3680043.8.498.11", "1.2.826.0.1.3680043.8.498.13"
STUDY_C, SOP_C, SOP_D = "1.2.826.0.1.3680043.8.498.21", "1.2.826.0.1.3680043.8.498.23", "1.2.826.0.1.3680043.8.498.24"


def _key(token: str) -> str:
    return f"key-{hashlib.sha256(token.encode()).hexdigest()[:8]}"


def _settings(data_dir) -> Settings:
    every = ["read", "write", "delete"]
    data_dir.mkdir(parents=True)
    routes = data_dir / "routes.toml"  # the STOW-RS door "cardio" (api/stow.py)
    routes.write_text('[[rules]]\nname = "cardio door"\nstow_prefix = "cardio"\nlabels = ["cardio"]\n')
    return Settings(data_dir=data_dir, index="sqlite", api_keys={ALL: every, ONLY_A: every, READER: ["read"]},
                    access_rules={"identities": {f"key:{_key(ONLY_A)}": ["a"]}}, cors_origins=[ORIGIN],
                    audit_log=data_dir / "audit.log", routes_file=routes, render_cache_bytes=0)


def _auth(token: str | None, **more) -> dict:
    return ({"Authorization": f"Bearer {token}"} if token else {}) | more


def _script() -> list[tuple[str, str, dict, bytes | None]]:
    ds = make_dataset(study=STUDY, series=SERIES, sop=SOP, PatientID="P1", frames=2)
    other = make_dataset(study=STUDY_B, sop=SOP_B, PatientID="P2")
    body, ctype = multipart([to_bytes(ds)])
    body_b, _ = multipart([to_bytes(other)])
    body_c, _ = multipart([to_bytes(make_dataset(study=STUDY_C, sop=SOP_C, PatientID="P3"))])
    body_d, _ = multipart([to_bytes(make_dataset(study=STUDY_C, sop=SOP_D, PatientID="P3"))])
    instance = f"/studies/{STUDY}/series/{SERIES}/instances/{SOP}"
    return [
        ("POST", "/studies", _auth(None, **{"Content-Type": ctype}), body),  # 401
        ("POST", "/studies", _auth(READER, **{"Content-Type": ctype}), body),  # 403: no write scope
        ("POST", "/studies", _auth(ALL, **{"Content-Type": "application/dicom"}), body),  # 415
        ("POST", "/studies", _auth(ALL, **{"Content-Type": ctype, "Accept": "text/html"}), body),  # 406
        ("POST", "/studies/not-a-uid", _auth(ALL, **{"Content-Type": ctype}), body),  # 400
        ("POST", "/studies", _auth(ALL, **{"Content-Type": ctype, "Origin": ORIGIN}), body),  # 200
        ("POST", "/studies", _auth(ALL, **{"Content-Type": ctype}), body),  # already stored
        ("POST", f"/studies/{STUDY}", _auth(ALL, **{"Content-Type": ctype}), body_b),  # 409: another study
        ("PUT", f"/studies/{STUDY}/labels/a", _auth(ALL), None),
        ("POST", "/studies", _auth(ALL, **{"Content-Type": ctype}), body_b),
        ("PUT", f"/studies/{STUDY_B}/labels/b", _auth(ALL), None),
        ("GET", "/studies", _auth(ALL), None),
        ("GET", "/studies", _auth(ONLY_A), None),  # the access rules' filter: study A only
        ("GET", "/studies?PatientID=P2", _auth(ONLY_A), None),
        ("GET", "/studies", _auth(None, Origin=ORIGIN), None),  # 401 with the CORS headers
        ("HEAD", "/studies", _auth(ALL), None),
        ("GET", "/series?limit=1", _auth(ALL), None),
        ("GET", f"/studies/{STUDY}/series", _auth(ALL), None),
        ("GET", "/instances?includefield=all", _auth(ALL), None),
        ("GET", f"/studies/{STUDY}/instances", _auth(ALL), None),
        ("GET", f"/studies/{STUDY}/series/{SERIES}/instances", _auth(ALL), None),
        ("GET", "/studies?StudyDate=bad-date", _auth(ALL), None),  # 400
        ("GET", "/studies", _auth(ALL, Accept="application/dicom"), None),  # 406
        ("GET", "/studies?includerejected=true", _auth(READER), None),  # 403
        ("GET", instance, _auth(ALL), None),
        ("GET", instance, _auth(ALL, Accept="application/dicom; transfer-syntax=*"), None),
        ("HEAD", instance, _auth(ALL), None),
        ("GET", instance, _auth(ONLY_A), None),
        ("GET", f"/studies/{STUDY_B}/series/{SERIES}/instances/{SOP_B}", _auth(ONLY_A), None),  # 404
        ("GET", instance.replace(SOP, "1.2.3.bad..uid"), _auth(ALL), None),  # 400
        ("GET", instance + "/frames/2,1", _auth(ALL), None),
        ("GET", instance + "/frames/3", _auth(ALL), None),  # 404 no such frame
        ("GET", instance + "/frames/x", _auth(ALL), None),  # 400
        *_pictures(instance),
        *_doors(ctype, body_c, body_d),
        ("OPTIONS", "/studies", _auth(ALL), None),
        ("OPTIONS", "/studies", {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}, None),  # preflight
        ("PATCH", instance, _auth(ALL), None),  # 405 with Allow
        ("PROPFIND", "/studies", _auth(ALL), None),  # 501
        ("DELETE", f"/studies/{STUDY_B}", _auth(ALL), None),
        ("GET", "/instances", _auth(ALL), None),
    ]


def _pictures(instance: str) -> list[tuple[str, str, dict, bytes | None]]:
    """WADO-RS rendered and thumbnail resources (PS3.18 §10.4.1.1.3, §10.4.1.1.4), every
    level, with the query parameters of §8.3.5.1 and each consumer media type."""
    jpeg, png, gif = (_auth(ALL, Accept=t) for t in ("image/jpeg", "image/png", "image/gif"))
    series = f"/studies/{STUDY}/series/{SERIES}"
    return [
        ("GET", instance + "/rendered", _auth(ALL), None),  # 200 image/jpeg
        ("GET", instance + "/rendered?window=100,200,LINEAR&viewport=16,16&quality=40", jpeg, None),
        ("GET", instance + "/rendered?viewport=4,4,2,2,4,4", png, None),
        ("GET", instance + "/rendered?accept=image/gif", _auth(ALL), None),
        ("GET", instance + "/rendered?window=1,0", jpeg, None),  # 400: a width below 1
        ("GET", instance + "/rendered", _auth(ALL, Accept="application/dicom"), None),  # 406
        ("GET", instance.replace(SOP, SOP + ".9") + "/rendered", jpeg, None),  # 404
        ("GET", instance + "/rendered", _auth(ONLY_A), None),  # study A: label a
        ("GET", f"/studies/{STUDY_B}/series/{SERIES}/instances/{SOP_B}/rendered", _auth(ONLY_A), None),  # 404
        ("GET", instance + "/rendered", _auth(None), None),  # 401
        ("HEAD", instance + "/rendered", png, None),
        ("GET", instance + "/frames/2/rendered", png, None),
        ("GET", instance + "/frames/1,2/rendered", gif, None),  # 406: several pictures, one asked
        ("GET", instance + "/frames/1,2/rendered", _auth(ALL, Accept='multipart/related; type="image/png"'), None),
        ("GET", instance + "/frames/3/rendered", jpeg, None),  # 404: no frame 3
        ("GET", instance + "/frames/x/rendered", jpeg, None),  # 400
        ("GET", instance + "/thumbnail", _auth(ALL), None),
        ("GET", instance + "/thumbnail?viewport=32,32", png, None),
        ("HEAD", instance + "/thumbnail", jpeg, None),
        ("GET", instance + "/frames/2/thumbnail", gif, None),
        ("GET", f"/studies/{STUDY}/thumbnail", jpeg, None),
        ("GET", f"/studies/{STUDY_B}/thumbnail", _auth(ONLY_A), None),  # 404
        ("GET", series + "/thumbnail", png, None),
        ("GET", f"/studies/{STUDY}/rendered", _auth(ALL, Accept='multipart/related; type="image/jpeg"'), None),
        ("GET", series + "/rendered?window=100,200", _auth(ALL, Accept="image/*"), None),
        ("GET", series + "/rendered", png, None),  # 406: several pictures, one asked
        ("GET", series.replace(SERIES, "not-a-uid") + "/rendered", jpeg, None),  # 400
        ("PATCH", instance + "/rendered", _auth(ALL), None),  # 405
    ]


def _doors(ctype: str, body_c: bytes, body_d: bytes) -> list[tuple[str, str, dict, bytes | None]]:
    """STOW-RS through the routes file's door ``cardio`` (``POST {prefix}/{door}/studies``)."""
    return [
        ("POST", "/cardio/studies", _auth(None, **{"Content-Type": ctype}), body_c),  # 401
        ("POST", "/cardio/studies", _auth(ONLY_A, **{"Content-Type": ctype}), body_c),  # 403: may not write cardio
        ("POST", "/oncology/studies", _auth(ALL, **{"Content-Type": ctype}), body_c),  # 404: no such door
        ("POST", "/studies/studies", _auth(ALL, **{"Content-Type": ctype}), body_c),  # 404: the door "studies"
        ("POST", "/cardio/studies", _auth(ALL, **{"Content-Type": "application/dicom"}), body_c),  # 415
        ("POST", "/cardio/studies/not-a-uid", _auth(ALL, **{"Content-Type": ctype}), body_c),  # 400
        ("POST", "/cardio/studies", _auth(ALL, **{"Content-Type": ctype, "Origin": ORIGIN}), body_c),  # 200
        ("POST", f"/cardio/studies/{STUDY_C}", _auth(ALL, **{"Content-Type": ctype}), body_d),  # 200
        ("POST", f"/cardio/studies/{STUDY}", _auth(ALL, **{"Content-Type": ctype}), body_d),  # 409: another study
        ("GET", "/cardio/studies", _auth(ALL), None),  # 405: the door is POST only
        ("GET", f"/studies/{STUDY_C}/instances", _auth(ALL), None),
        ("GET", f"/studies?StudyInstanceUID={STUDY_C}&includefield=all", _auth(ALL), None),
    ]


def _run(app, requests) -> list[tuple[int, list, bytes]]:
    out = []
    with TestClient(app) as client:
        for method, url, headers, body in requests:
            r = client.request(method, url, headers=headers, content=body)
            fields = sorted((k, v) for k, v in r.headers.multi_items() if k != "date")
            content = r.content
            boundary = re.search(r'boundary="?([^";]+)', r.headers.get("content-type", ""))
            if boundary:  # a multipart answer's random boundary
                fields = [(k, v.replace(boundary[1], "B")) for k, v in fields]
                content = content.replace(boundary[1].encode(), b"B")
            out.append((r.status_code, fields, content))
    return out


def _audit(path) -> list[dict]:
    return [{k: v for k, v in orjson.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


def test_hot_path_answers_as_fastapi(tmp_path):
    script = _script()
    results, audits = [], []
    for name, hot in (("hot", True), ("framework", False)):
        settings = _settings(tmp_path / name)
        archive = Archive.open(settings)
        try:
            app = create_app(settings, archive=archive)
            assert isinstance(app, ArchiveApp) and app.hot is not None
            if not hot:
                app.hot = None
            results.append(_run(app, script))
            audits.append(_audit(settings.audit_log))
        finally:
            archive.close()
    hot, framework = results
    statuses = [r[0] for r in hot]
    assert statuses[:8] == [401, 403, 415, 406, 400, 200, 200, 409]
    instance = f"/studies/{STUDY}/series/{SERIES}/instances/{SOP}"
    pictures, doors = len(_pictures(instance)), len(_doors("", b"", b""))
    first = next(i for i, r in enumerate(script) if r[1].endswith("/rendered"))
    assert statuses[first:first + pictures] == [200, 200, 200, 200, 400, 406, 404, 200, 404, 401, 200, 200, 406, 200,
                                                404, 400, 200, 200, 200, 200, 200, 404, 200, 200, 200, 406, 400, 405]
    assert statuses[first + pictures:first + pictures + doors] == [401, 403, 404, 404, 415, 400, 200, 200, 409, 405,
                                                                   200, 200]
    picture = dict(hot[first][1])
    assert picture["content-type"] == "image/jpeg" and hot[first][2][:2] == b"\xff\xd8"
    assert hot[first + 2][2][:8] == b"\x89PNG\r\n\x1a\n" and hot[first + 3][2][:6] == b"GIF89a"
    assert len(orjson.loads(hot[first + pictures + doors - 2][2])) == 2  # both door instances stored
    router = HotRouter("")  # each of them is answered by the hot path
    for method, url, _, _ in script[first:first + pictures + doors]:
        hot_route = router.match({"type": "http", "method": method, "path": url.split("?")[0], "root_path": ""})
        assert (hot_route is None) is (method == "PATCH" or url == "/cardio/studies" and method == "GET"), (method, url)
    assert 404 in statuses and 405 in statuses and 501 in statuses and 206 not in statuses
    for i, (a, b) in enumerate(zip(hot, framework)):
        assert a == b, f"request {i}: {script[i][:2]}"
    assert audits[0] == audits[1] and len(audits[0]) >= 30


def _flat(routes):
    """The app's routes in the order its router tries them (FastAPI keeps included
    routers as branches: ``effective_candidates``)."""
    for route in routes:
        branch = getattr(route, "effective_candidates", None)
        if callable(branch):
            yield from _flat(branch())
        else:
            yield route


@pytest.mark.parametrize("prefix", ["", "/dicomweb"])
def test_hot_routes_are_the_routes_starlette_picks(tmp_path, prefix):
    """For each hot route (and HEAD of the GET ones), the first route of the app's router
    that fully matches is the FastAPI route of the same endpoint function; other methods
    on the same paths, and paths next to them, are not hot."""
    app = create_app(Settings(data_dir=tmp_path, index="sqlite", prefix=prefix))
    hot = HotRouter(prefix)
    hot_endpoints = {route[2] for route in hot._routes}
    u = "1.2.3"
    i = f"/studies/{u}/series/{u}/instances/{u}"
    pictures = [level + "/" + kind for kind in ("rendered", "thumbnail")
                for level in (f"/studies/{u}", f"/studies/{u}/series/{u}", i, i + "/frames/1,2")]
    doors = ["/cardio/studies", f"/cardio/studies/{u}", "/studies/studies", "/studies/studies/studies", "/ui/studies",
             "/docs/studies", "/admin/studies", f"/metrics/studies/{u}", "/x/studies"]
    paths = ["/studies", f"/studies/{u}", "/series", f"/studies/{u}/series", "/instances",
             f"/studies/{u}/instances", f"/studies/{u}/series/{u}/instances", i, i + "/frames/1,2",
             f"/studies/{u}/series/{u}", f"/studies/{u}/metadata", i + "/metadata", i + "/frames/1/bulkdata",
             f"/studies/{u}/rendered/x", i + "/rendered/1", "/studies/", f"/studies/{u}/share", *pictures, *doors]
    found = 0
    for path in paths:
        for method in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"):
            scope = {"type": "http", "method": "GET" if method == "HEAD" else method, "path": prefix + path,
                     "root_path": "", "headers": []}
            match = hot.match({**scope, "method": method})
            picked = next((child.get("endpoint") for route in _flat(app.router.routes)
                           for m, child in [route.matches(scope)] if m is Match.FULL), None)
            if match is not None:
                found += 1
                assert match[0] is picked, (method, path)
            else:
                assert picked not in hot_endpoints, (method, path)
    # GET+HEAD of 8 read routes and 8 picture routes, POST of 2 store routes and of 9 door paths
    assert found == 2 * 8 + 2 * 8 + 2 + 9

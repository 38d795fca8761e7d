"""The archive's own pages served from the package (dicomweb_server/ui/): ``/docs`` with
Swagger UI's files from the package (no CDN: offline), the operator's page ``/ui/``, and
the one read route the page added, ``GET /admin/queue/studies/{study}``, without routing
(with routing: tests/routing/test_study_queue.py). The page itself
is driven in Chromium by tests/interop/test_operator_ui.py."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.settings import Settings

STATIC = Path(__file__).parents[2] / "dicomweb_server" / "ui" / "static"
KEY = {"Authorization": "Bearer s3cret"}


def _client(tmp_path, **settings) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path / "data", index="sqlite", **settings)))


def test_docs_names_no_other_origin_and_its_assets_are_served(tmp_path):
    with _client(tmp_path) as c:
        page = c.get("/docs")
        assert page.status_code == 200
        assert re.findall(r"https?://", page.text) == []  # nothing from a CDN (or anywhere else)
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert sorted(assets) == ["/ui/static/swagger-ui/favicon-32x32.png", "/ui/static/swagger-ui/swagger-ui-bundle.js",
                                  "/ui/static/swagger-ui/swagger-ui.css"]
        assert "url: '/openapi.json'" in page.text and '"validatorUrl": null' in page.text
        for path in assets:  # the very bytes of the package, with their media types
            r = c.get(path)
            assert r.status_code == 200
            assert r.content == (STATIC / path.removeprefix("/ui/static/")).read_bytes()
        assert c.get("/ui/static/swagger-ui/swagger-ui-bundle.js").headers["content-type"] == \
            "text/javascript; charset=utf-8"
        assert c.get("/ui/static/swagger-ui/swagger-ui.css").headers["content-type"] == "text/css; charset=utf-8"
        redirect = c.get("/docs/oauth2-redirect")  # Swagger UI's OAuth2 page, as before: inline, no other origin
        assert redirect.status_code == 200 and "oauth2" in redirect.text and re.findall(r"https?://", redirect.text) == []
        assert "oauth2RedirectUrl: window.location.origin + '/docs/oauth2-redirect'" in page.text
        assert c.get("/ui/static/%2e%2e/__init__.py").status_code == 404  # nothing outside static/


def test_the_operator_page_and_its_files_need_no_credentials_the_api_does(tmp_path):
    with _client(tmp_path, api_keys={"s3cret": ["read", "write", "delete"]}) as c:
        assert c.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
        page = c.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert '<meta name="dicomweb-prefix" content="">' in page.text
        assert re.findall(r"https?://", page.text) == []
        scripts = re.findall(r'<script src="/ui/static/(ui/[a-z]+\.js)" defer></script>', page.text)
        assert scripts[0] == "ui/core.js" and scripts[-1] == "ui/app.js"  # the router, which starts the page, last
        assert sorted(scripts) == sorted(f"ui/{p.name}" for p in (STATIC / "ui").glob("*.js"))  # every one, no other
        for name in scripts:  # each served as shipped, none over 500 lines, none naming another origin
            js = c.get(f"/ui/static/{name}")
            assert js.status_code == 200
            assert hashlib.sha256(js.content).digest() == hashlib.sha256((STATIC / name).read_bytes()).digest()
            assert re.findall(r"https?://", js.text) == [] and js.text.count("\n") < 500, name
        assert c.get("/docs").status_code == 200
        # what the page asks for is the API's to allow
        assert c.get("/studies").status_code == 401
        assert c.get("/studies", headers=KEY).status_code == 200
        assert c.get("/metrics").status_code == 401


def test_the_page_knows_the_dicomweb_prefix(tmp_path):
    with _client(tmp_path, prefix="/dicom-web") as c:
        assert '<meta name="dicomweb-prefix" content="/dicom-web">' in c.get("/ui/").text


def test_study_queue_without_routing_is_404(tmp_path):
    with _client(tmp_path) as c:
        r = c.get("/admin/queue/studies/1.2.3")
        assert r.status_code == 404 and "routing is not configured" in r.text

"""The archive's own pages served from the package (dicomweb_server/ui/): ``/docs`` with
Swagger UI's files from the package (no CDN: offline), the operator's page ``/ui/``, and
the one read route the page added, ``GET /admin/queue/studies/{study}``. The page itself
is driven in Chromium by tests/interop/test_operator_ui.py."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes

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
        assert c.get("/docs/oauth2-redirect").status_code == 404
        assert c.get("/ui/static/%2e%2e/__init__.py").status_code == 404  # nothing outside static/


def test_the_operator_page_and_its_files_need_no_credentials_the_api_does(tmp_path):
    with _client(tmp_path, api_keys={"s3cret": ["read", "write", "delete"]}) as c:
        assert c.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
        page = c.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert '<meta name="dicomweb-prefix" content="">' in page.text
        assert re.findall(r"https?://", page.text) == []
        js = c.get("/ui/static/ui/app.js")
        assert js.status_code == 200
        assert hashlib.sha256(js.content).digest() == hashlib.sha256((STATIC / "ui/app.js").read_bytes()).digest()
        assert re.findall(r"https?://", js.text) == []
        assert c.get("/docs").status_code == 200
        # what the page asks for is the API's to allow
        assert c.get("/studies").status_code == 401
        assert c.get("/studies", headers=KEY).status_code == 200
        assert c.get("/metrics").status_code == 401


def test_the_page_knows_the_dicomweb_prefix(tmp_path):
    with _client(tmp_path, prefix="/dicom-web") as c:
        assert '<meta name="dicomweb-prefix" content="/dicom-web">' in c.get("/ui/").text


def test_study_queue_per_destination(tmp_path):
    """Every configured destination, with the study's rows for it (zeros when none);
    another study's rows are not counted."""
    routes = tmp_path / "routes.toml"
    routes.write_text("""
[[destinations]]
name = "pacs"
stow_url = "http://127.0.0.1:9"

[[destinations]]
name = "backup"
dimse = { ae_title = "BACKUP", host = "127.0.0.1", port = 9 }

[[destinations]]
name = "events"
webhook = { url = "http://127.0.0.1:9/hook" }

[delivery]
max_attempts = 1
""")
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            a = [make_dataset(study="1.2.3.1", series="1.2.3.1.1", sop=f"1.2.3.1.1.{i}") for i in (1, 2)]
            b = make_dataset(study="1.2.3.2", series="1.2.3.2.1", sop="1.2.3.2.1.1")
            body, ctype = multipart([to_bytes(ds) for ds in [*a, b]])
            assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
            assert c.get("/admin/queue/studies/1.2.3.1").json()["destinations"]["pacs"] == {
                "kind": "stow", "pending": 0, "in_flight": 0, "delivered": 0, "failed": 0, "last_error": None}
            # owe study 1 to pacs by hand: two rows pending
            archive.routing.export("pacs", archive.index.instances("1.2.3.1", None))
            doc = c.get("/admin/queue/studies/1.2.3.1").json()
            assert doc["study"] == "1.2.3.1"
            assert {k: v["kind"] for k, v in doc["destinations"].items()} == {
                "pacs": "stow", "backup": "dimse", "events": "webhook"}
            pacs = doc["destinations"]["pacs"]
            assert pacs["pending"] + pacs["in_flight"] + pacs["failed"] == 2 and pacs["delivered"] == 0
            assert doc["destinations"]["backup"]["pending"] == 0
            assert c.get("/admin/queue/studies/1.2.3.2").json()["destinations"]["pacs"]["pending"] == 0
    finally:
        archive.close()


def test_study_queue_without_routing_is_404(tmp_path):
    with _client(tmp_path) as c:
        r = c.get("/admin/queue/studies/1.2.3")
        assert r.status_code == 404 and "routing is not configured" in r.text

"""``GET /admin/queue/studies/{study}`` (api/admin.py, Outbox.study_stats): a study's
routing state per configured destination, on each index that holds the outbox. The
operator's page (``/ui/``) shows it."""

from __future__ import annotations

from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes


def test_study_queue_per_destination(tmp_path, backend):
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
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index=backend.index, routes_file=routes, **backend.settings))
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

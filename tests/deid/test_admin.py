"""GET/POST /admin/deid/{project}/pseudonyms: the re-identification table, for the admin
scope only."""

from __future__ import annotations

import httpx

from tests.helpers import LiveServer

KEYS = {"writer-key": ["read", "write", "delete"], "admin-key": ["read", "admin"]}


def test_pseudonym_table_needs_the_admin_scope(tmp_path):
    srv = LiveServer(tmp_path / "data", "sqlite", api_keys=KEYS).start()
    try:
        admin = {"Authorization": "Bearer admin-key"}
        writer = {"Authorization": "Bearer writer-key"}
        url = f"{srv.url}/admin/deid/trial-a/pseudonyms"
        r = httpx.post(url, content=b"PatientID,pseudonym\nMRN-1,SUBJ-1\n", headers=writer)
        assert r.status_code == 403 and "lack the 'admin' scope" in r.text
        r = httpx.post(url, content=b"PatientID,pseudonym\nMRN-1,SUBJ-1\nMRN-2,SUBJ-2\n", headers=admin)
        assert r.status_code == 200 and r.json() == {"project": "trial-a", "added": 2}
        assert httpx.get(url, headers=writer).status_code == 403
        assert httpx.get(url).status_code == 401
        r = httpx.get(url, headers=admin)
        assert r.status_code == 200 and r.json() == {"project": "trial-a", "pseudonyms": [
            {"PatientID": "MRN-1", "pseudonym": "SUBJ-1", "source": "csv"},
            {"PatientID": "MRN-2", "pseudonym": "SUBJ-2", "source": "csv"}]}
        r = httpx.post(url, content=b"MRN-1,OTHER\n", headers=admin)
        assert r.status_code == 400 and "already has pseudonym 'SUBJ-1'" in r.text
        assert httpx.get(f"{srv.url}/admin/deid/nope/pseudonyms", headers=admin).status_code == 404
    finally:
        srv.stop()

"""``/jobs`` over HTTP (api/jobs.py): the write scope; a job's state and counts; cancel; a
caller restricted by access rules sees only the jobs it submitted (404 for another's,
as for one that does not exist), an unrestricted one sees all."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.access.test_http_access import ALL, ONLY_A, h, key_name
from tests.jobs import kinds
from tests.routing.conftest import wait_for

READER = "reader-key-0123456789"
ADMIN = "admin-key-0123456789"


@pytest.fixture
def client(tmp_path, monkeypatch):
    kinds.install(monkeypatch)
    every = ["read", "write", "delete"]
    settings = Settings(data_dir=tmp_path / "data", index="sqlite", jobs_retry=0.05,
                        api_keys={ALL: every, ONLY_A: every, READER: ["read"], ADMIN: [*every, "admin"]},
                        access_rules={"identities": {f"key:{key_name(ONLY_A)}": ["a"]}})
    archive = Archive.open(settings)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def _submit(client, owner: str, restricted: bool, params: dict) -> str:
    return client.app.state.jobs.submit("count", params, owner, restricted)


def test_jobs_need_the_write_scope(client):
    assert client.get("/jobs").status_code == 401
    r = client.get("/jobs", headers=h(READER))
    assert r.status_code == 403 and "'write' scope" in r.text
    assert client.get("/jobs", headers=h(ALL)).json() == {"jobs": []}
    assert client.get("/jobs/0123456789abcdef", headers=h(ALL)).status_code == 404
    assert client.get("/jobs/..%2f..%2fetc", headers=h(ALL)).status_code in (404, 422)


def test_a_job_state_and_counts_and_cancel(client, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job_id = _submit(client, f"api-key:{key_name(ALL)}", False, {"out": str(out), "n": 5, "every": 2})
    job = wait_for(lambda: (j := client.get(f"/jobs/{job_id}", headers=h(ALL)).json())["state"] == "done" and j,
                   30, "the job")
    assert job["kind"] == "count" and job["progress"] == {"total": 5, "done": 5, "failed": 0, "skipped": 0}
    assert job["result"] == {"items": 5} and job["error"] is None and "checkpoint" not in job
    long = _submit(client, None, False, {"out": str(out), "n": 100_000, "sleep": 0.01})
    wait_for(lambda: client.get(f"/jobs/{long}", headers=h(ALL)).json()["state"] == "running", 30, "it to run")
    r = client.delete(f"/jobs/{long}", headers=h(ALL))
    assert r.status_code == 202 and r.json()["cancel"] is True
    wait_for(lambda: client.get(f"/jobs/{long}", headers=h(ALL)).json()["state"] == "cancelled", 30, "the cancel")
    assert [j["id"] for j in client.get("/jobs", headers=h(ALL)).json()["jobs"]] == [long, job_id]


def test_a_restricted_caller_sees_only_its_own_jobs(client, tmp_path):
    mine = _submit(client, f"api-key:{key_name(ONLY_A)}", True, {"out": str(tmp_path), "n": 1})
    other = _submit(client, f"api-key:{key_name(ALL)}", False, {"out": str(tmp_path), "n": 1})
    assert [j["id"] for j in client.get("/jobs", headers=h(ONLY_A)).json()["jobs"]] == [mine]
    assert client.get(f"/jobs/{mine}", headers=h(ONLY_A)).status_code == 200
    for method in ("GET", "DELETE"):
        r = client.request(method, f"/jobs/{other}", headers=h(ONLY_A))
        assert r.status_code == 404 and r.json() == client.get("/jobs/0123456789abcdef", headers=h(ALL)).json()
    assert {j["id"] for j in client.get("/jobs", headers=h(ALL)).json()["jobs"]} == {mine, other}


def test_jobs_of_admin_kinds_need_the_admin_scope(client, tmp_path):
    """A pull's query names patients and a recompress rewrites every stored file: both are
    started with the admin scope (api/auth.py), and only that scope sees or cancels them."""
    pull = client.app.state.jobs.submit("pull", {"from": "NOWHERE"}, f"api-key:{key_name(ADMIN)}", False)
    mine = _submit(client, f"api-key:{key_name(ALL)}", False, {"out": str(tmp_path), "n": 1})
    assert [j["id"] for j in client.get("/jobs", headers=h(ALL)).json()["jobs"]] == [mine]
    for method in ("GET", "DELETE"):
        assert client.request(method, f"/jobs/{pull}", headers=h(ALL)).status_code == 404
    assert {j["id"] for j in client.get("/jobs", headers=h(ADMIN)).json()["jobs"]} == {pull, mine}
    assert client.get(f"/jobs/{pull}", headers=h(ADMIN)).json()["kind"] == "pull"


def test_a_queued_job_shows_zero_counts(client, tmp_path):
    client.app.state.jobs.stop()  # nothing runs it: as queued
    job_id = _submit(client, None, False, {"out": str(tmp_path), "n": 1})
    job = client.get(f"/jobs/{job_id}", headers=h(ALL)).json()
    assert (job["state"], job["progress"]) == ("queued", {"total": None, "done": 0, "failed": 0, "skipped": 0})

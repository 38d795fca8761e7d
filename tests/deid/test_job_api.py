"""``POST /studies/{study}/$deidentify`` and ``POST /$deidentify`` (api/deidentify.py):
202 with a job run by the durable runner (jobs/runner.py); the caller's scope and
access; and a real server process SIGKILLed mid-job (fault point ``deid-exported``),
restarted: the job resumes from its checkpoint and the folder holds every instance
once, byte-identical to an uninterrupted ``export --deidentify`` of the same project."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.deid.uids import new_uid
from dicomweb_server.settings import Settings
from tests.access.test_http_access import ALL, ONLY_A, h, key_name
from tests.deid.test_job import PER_STUDY, ROOT, _archive, _export, _files
from tests.helpers import free_port
from tests.routing.conftest import wait_for

READER = "reader-key-0123456789"
ADMIN = "admin-key-0123456789"
S1, S2 = "1.2.826.0.1.3680043.8.498.1", "1.2.826.0.1.3680043.8.498.2"


@pytest.fixture
def client(tmp_path):
    data = tmp_path / "data"
    _archive(data, 2)
    every = ["read", "write", "delete"]
    settings = Settings(data_dir=data, index="sqlite", jobs_retry=0.05,
                        api_keys={ALL: every, ONLY_A: every, READER: ["read"], ADMIN: [*every, "admin"]},
                        access_rules={"identities": {f"key:{key_name(ONLY_A)}": ["a"]}})
    archive = Archive.open(settings)
    archive.index.set_label(S2, "a")
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def _done(client, r, key=ALL) -> dict:
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/jobs/{job['id']}" and job["kind"] == "deidentify"
    return wait_for(lambda: (j := client.get(f"/jobs/{job['id']}", headers=h(key)).json())["state"]
                    in ("done", "failed") and j, 60, "the job")


def test_a_query_into_a_label(client):
    """The researcher's path: a QIDO-RS query, dates shifted, into a label; progress and
    the report in GET /jobs/{id}; the copies found by QIDO-RS under the label."""
    archive = client.app.state.archive
    r = client.post("/$deidentify", headers=h(ALL), json={
        "project": "lung", "options": ["retain_modified_dates"], "query": {"PatientID": "P*"},
        "target": {"label": "research"}})
    job = _done(client, r)
    assert job["state"] == "done", job["error"]
    assert job["progress"] == {"total": 2 * PER_STUDY + 1, "done": 2 * PER_STUDY, "failed": 0, "skipped": 1}
    assert job["result"]["to"] == "label:research" and job["result"]["refused"] == 1
    assert job["result"]["problems"][0]["outcome"] == "refused"
    secret = archive.pseudonyms.secret("lung")
    found = client.get("/studies", params={"label": "research"}, headers=h(ALL)).json()
    assert sorted(s["0020000D"]["Value"][0] for s in found) == sorted(new_uid(secret, s) for s in (S1, S2))
    # again: nothing new (the same UIDs, byte-identical duplicates)
    job = _done(client, client.post(f"/studies/{S1}/$deidentify", headers=h(ALL),
                                    json={"project": "lung", "options": ["retain_modified_dates"],
                                          "target": {"label": "research"}}))
    assert job["progress"]["done"] == PER_STUDY
    assert len(archive.index.instances(new_uid(secret, S1))) == PER_STUDY


def test_a_restricted_caller_deidentifies_what_it_sees(client):
    """ONLY_A sees S2 alone: its query's job has S2 only; S1 in the path is 404; a
    label it could not see is 403; a folder needs the admin scope."""
    job = _done(client, client.post("/$deidentify", headers=h(ONLY_A), json={
        "project": "lung", "query": {}, "target": {"label": "a"}}), ONLY_A)
    assert (job["result"]["studies"], job["progress"]["done"]) == (1, PER_STUDY)
    secret = client.app.state.archive.pseudonyms.secret("lung")
    assert client.app.state.archive.index.labels(new_uid(secret, S2)) == ["a"]
    assert client.app.state.archive.index.labels(new_uid(secret, S1)) is None
    body = {"project": "lung", "target": {"label": "a"}}
    assert client.post(f"/studies/{S1}/$deidentify", headers=h(ONLY_A), json=body).status_code == 404
    r = client.post(f"/studies/{S2}/$deidentify", headers=h(ONLY_A), json={**body, "target": {"label": "b"}})
    assert r.status_code == 403 and "label 'b'" in r.text
    r = client.post(f"/studies/{S2}/$deidentify", headers=h(ALL), json={**body, "target": {"folder": "/tmp/x"}})
    assert r.status_code == 403 and "'admin' scope" in r.text


def test_refusals(client):
    assert client.post("/$deidentify", json={}).status_code == 401
    r = client.post("/$deidentify", headers=h(READER), json={})
    assert r.status_code == 403 and "'write' scope" in r.text
    r = client.post("/$deidentify", headers=h(ALL), content=b"{nope")
    assert r.status_code == 400 and "not JSON" in r.text
    r = client.post("/$deidentify", headers=h(ALL), json={"project": "nope", "target": {"label": "x"},
                                                          "studies": [S1]})
    assert r.status_code == 400 and "no de-identification project 'nope'" in r.text
    assert client.get("/jobs", headers=h(ALL)).json() == {"jobs": []}  # nothing queued


def test_a_folder_target_with_the_admin_scope(client, tmp_path):
    out = tmp_path / "out"
    job = _done(client, client.post("/$deidentify", headers=h(ADMIN), json={
        "project": "lung", "studies": [S1, S2, "1.2.3.4.404"], "target": {"folder": str(out)}}), ADMIN)
    assert (job["state"], job["result"]["studies"], job["progress"]["done"]) == ("done", 2, 2 * PER_STUDY)
    assert len(list(out.rglob("*.dcm"))) == 2 * PER_STUDY


# --- a real server, killed mid-job ----------------------------------------------------------

def _serve(data: Path, fault: str | None = None):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DICOMWEB_LOG_LEVEL": "warning"}
    env.pop("DICOMWEB_FAULT", None)
    if fault:
        env["DICOMWEB_FAULT"] = fault
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--workers", "1", "--index",
                             "sqlite", "--data-dir", str(data), "--port", str(port)], env=env, cwd=str(ROOT),
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(url + "/jobs", timeout=1).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, "the server ended"
            return False

    wait_for(up, 60, "the server")
    return proc, url


def test_a_server_killed_mid_job_resumes_it_without_duplicates(tmp_path):
    data = tmp_path / "data"
    _archive(data, 3)
    rc, _, err = _export(data, str(tmp_path / "reference"))  # the uninterrupted run, by the command line
    assert rc == 1, err
    reference = _files(tmp_path / "reference")
    out = tmp_path / "out"
    proc, url = _serve(data, fault="deid-exported:15")
    try:
        r = httpx.post(url + "/$deidentify", json={"project": "lung", "options": ["retain_modified_dates"],
                                                   "query": {}, "target": {"folder": str(out)}}, timeout=30)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        assert proc.wait(60) == -signal.SIGKILL  # killed by the fault point, after the 15th instance
    finally:
        if proc.poll() is None:
            proc.kill()
    inodes = {p: p.stat().st_ino for p in out.rglob("*.dcm")}
    assert len(inodes) == 15  # 5 past the checkpoint of the 10th
    proc, url = _serve(data)
    try:
        job = wait_for(lambda: (j := httpx.get(f"{url}/jobs/{job_id}", timeout=10).json())["state"]
                       in ("done", "failed") and j, 120, "the resumed job")
        assert job["state"] == "done", job["error"]
        assert job["attempts"] == 2
        assert job["progress"] == {"total": 3 * PER_STUDY + 1, "done": 3 * PER_STUDY, "failed": 0, "skipped": 1}
    finally:
        proc.terminate()
        proc.wait(30)
    assert _files(out) == reference  # every instance once, nothing else, the same bytes
    # resumed from the checkpoint: the 10 files before it untouched, the 5 after it written again
    assert sum(p.stat().st_ino == ino for p, ino in inodes.items()) == 10

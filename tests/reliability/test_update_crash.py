"""Crash safety of a study update (lifecycle/update.py): SIGKILL of a real server process
updating a 50-instance study after 20 new files were written, right before and right
after the index switch; after a restart every instance is wholly old or wholly new (all
of them the same), none missing, and ``check --repair`` indexes none of the update's
files (they are versions, not orphans nor misfiled copies). Also the command line
``update`` and how long the update takes.

Why 50 instances suffice: the kills are at deterministic points (``DICOMWEB_FAULT``, the
n-th occurrence of a step), not at moments, and an update has no batches: it writes every
new version one after another, then switches them all in one index transaction. What
must be proven is a kill with some new versions written and some not (20 of 50: both
sides of the kill hold instances; ``_state`` checks every one), one with all written but
not switched, and one just after the switch. 500 instances (the figure until 2026-12)
took the same code paths ten times as often; how long a large update takes is
benchmarks/lifecycle.py's business. The kills are not timed, so the test needs no
machine of its own: it runs in the parallel phase (tests/conftest.py SERIAL)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pydicom
import pytest
from pydicom.uid import generate_uid

from tests.helpers import make_dataset, multipart, to_bytes
from tests.reliability.test_crash import Server, _database

N = 50  # instances of the study (the module docstring says why this suffices)
WRITTEN = 20  # new versions written when the first kill comes: some, not all


def _study_files(url: str, st: str) -> list[pydicom.Dataset]:
    r = httpx.get(f"{url}/studies/{st}", headers={"Accept": 'multipart/related; type="application/dicom"; '
                                                            "transfer-syntax=*"}, timeout=120)
    assert r.status_code == 200, r.text
    boundary = r.headers["content-type"].split("boundary=")[1].split(";")[0].strip('"').encode()
    parts = r.content.split(b"--" + boundary)[1:-1]
    return [pydicom.dcmread(io.BytesIO(p.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n", 1)[0])) for p in parts]


def _state(url: str, st: str) -> str:
    """'old' or 'new': what every instance (index, metadata and file) says, all the same."""
    files = _study_files(url, st)
    assert len(files) == N
    ids = {ds.PatientID for ds in files}
    meta = {m["00100020"]["Value"][0] for m in httpx.get(f"{url}/studies/{st}/metadata", timeout=60).json()}
    found = httpx.get(f"{url}/studies", params={"StudyInstanceUID": st}, timeout=30).json()
    assert len(ids) == 1 and meta == ids and found[0]["00100020"]["Value"] == list(ids), (ids, meta)
    return {"OLD": "old", "NEW": "new"}[ids.pop()]


def _check(data: Path, index: str) -> str:
    out = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "check", "--repair", "--data-dir", str(data),
                          "--index", index], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("index", ["sqlite", "memory", "postgresql", "sqlite+s3"])
def test_sigkill_during_an_update(tmp_path, index, request, monkeypatch):
    index = _database(request, monkeypatch, index)  # (PostgreSQL, S3: set in the environment)
    data = tmp_path / "data"
    st, se = generate_uid(), generate_uid()
    body, ctype = multipart([to_bytes(make_dataset(study=st, series=se, PatientID="OLD", InstanceNumber=i))
                             for i in range(N)])
    new = {"00100020": {"vr": "LO", "Value": ["NEW"]}}
    # 7 server starts, not 11: a fault fires at its update step only (dicomweb_server/faults.py),
    # so the server that is killed in an update first does what needs no kill: the study's store
    # (the first one), the check of the state ``check --repair`` left (the others)
    after_check = None  # the state expected after the previous kill's check --repair
    for fault, expected in ((f"update-written:{WRITTEN}", "old"), ("update-switch", "old"), ("update-switched", "new")):
        srv = Server(data, index, fault)
        try:
            if after_check is None:
                assert httpx.post(srv.url + "/studies", content=body, headers={"Content-Type": ctype},
                                  timeout=120).status_code == 200
            else:  # check indexed none of the previous update's files
                assert _state(srv.url, st) == after_check, fault
            with pytest.raises(httpx.HTTPError):
                r = httpx.post(f"{srv.url}/studies/{st}/$update", json=new, timeout=300)
                pytest.fail(f"{fault}: the update was answered (not killed): {r.status_code} {r.text[:500]}")
        finally:
            srv.kill()
        assert srv.proc.returncode == -9, fault
        srv = Server(data, index)
        try:
            assert _state(srv.url, st) == expected, fault
        finally:
            srv.kill()
        report = _check(data, index)
        assert "0 problem(s)" in report and "version(s) of updated instances kept" in report, report
        after_check = expected
    # the last kill's check, then a full update to the end (the old patient again), timed
    srv = Server(data, index)
    try:
        assert _state(srv.url, st) == after_check  # check indexed none of the update's files
        t0 = time.monotonic()
        r = httpx.post(f"{srv.url}/studies/{st}/$update", json={"00100020": {"vr": "LO", "Value": ["OLD"]}},
                       timeout=300)
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        print(f"\n{index}: update of {N} instances: {took:.2f} s (server: {r.json()['seconds']} s)")
        assert _state(srv.url, st) == "old"
    finally:
        srv.kill()


def test_update_on_the_command_line(tmp_path):
    data = tmp_path / "data"
    st, se = generate_uid(), generate_uid()
    srv = Server(data, "sqlite")
    try:
        body, ctype = multipart([to_bytes(make_dataset(study=st, series=se, PatientID="OLD")) for _ in range(2)])
        assert httpx.post(srv.url + "/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        audit = tmp_path / "audit.jsonl"
        env = {**os.environ, "DICOMWEB_AUDIT_LOG": str(audit)}
        out = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "update", st, "--set", "PatientID=NEW",
                              "--set", "PatientName=New^Name", "--data-dir", str(data), "--index", "sqlite"],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        assert "2 instance(s)" in out.stdout
        found = httpx.get(f"{srv.url}/studies", params={"PatientID": "NEW"}).json()  # the running server sees it
        assert found[0]["00100010"]["Value"] == [{"Alphabetic": "New^Name"}]
        import json

        (line,) = [json.loads(x) for x in audit.read_text().splitlines()]
        assert line["action"] == "update" and line["user"]
        assert {c["keyword"]: (c["from"], c["to"]) for c in line["changes"]}["PatientID"] == (["OLD"], ["NEW"])
        bad = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "update", st, "--set", "Rows=4",
                              "--data-dir", str(data), "--index", "sqlite"], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "study-level" in bad.stderr
        # keep_versions: check --repair removes earlier versions older than that (the original stays)
        sop = httpx.get(f"{srv.url}/studies/{st}/instances").json()[0]["00080018"]["Value"][0]
        assert httpx.post(f"{srv.url}/studies/{st}/$update",
                          json={"00081030": {"vr": "LO", "Value": ["third"]}}).status_code == 200
        blobs = data / "blobs" / st / se
        assert (blobs / f"{sop}.v2.dcm").exists() and (blobs / f"{sop}.v3.dcm").exists()
        out = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "check", "--repair", "--data-dir", str(data),
                              "--index", "sqlite"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "DICOMWEB_KEEP_VERSIONS": "0"})
        assert out.returncode == 0 and "4 earlier version(s) of updated instances kept, 2 older than keep_versions " \
            "removed" in out.stdout, out.stdout
        assert (blobs / f"{sop}.dcm").exists() and not (blobs / f"{sop}.v2.dcm").exists()
        vs = httpx.get(f"{srv.url}/studies/{st}/series/{se}/instances/{sop}/versions").json()
        assert [(v["version"], v["size"] is not None, v["current"]) for v in vs] == [
            (1, True, False), (2, False, False), (3, True, True)]
        assert httpx.post(f"{srv.url}/studies/{st}/series/{se}/instances/{sop}/$restore",
                          params={"version": 2}).status_code == 404
        # a DELETE removes the instance's versions with it
        assert httpx.delete(f"{srv.url}/studies/{st}").status_code == 204
        assert not (data / "blobs" / st).exists()
    finally:
        srv.kill()

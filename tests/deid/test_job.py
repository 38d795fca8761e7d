"""The ``deidentify`` job (deid/job.py) into each kind of target, and resumed after a
real SIGKILL of a real ``dicomweb-server export --deidentify ... --resume FILE`` process:
every instance exported exactly once (no extra file or object), byte-identical to an
uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from pydicom import dcmread

from dicomweb_server.access.filter import only
from dicomweb_server.archive import Archive
from dicomweb_server.deid import job
from dicomweb_server.deid.uids import new_uid
from dicomweb_server.jobs import JobError, run_inline
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, store_datasets
from tests.routing.sink import Sink

ROOT = Path(__file__).resolve().parents[2]
PER_STUDY = 25


def _datasets(n_ct: int):
    """``n_ct`` CT studies of PER_STUDY instances (patients P0, P1 alternating), one US
    image with burned-in annotation (refused) in the middle."""
    out = []
    for s in range(n_ct):
        study, series = f"1.2.826.0.1.3680043.8.498.{s + 1}", f"1.2.826.0.1.3680043.8.498.{s + 1}.1"
        out += [make_dataset(study=study, series=series, sop=f"{series}.{i + 1}", PatientID=f"P{s % 2}",
                             PatientName=f"Doe^{s % 2}", StudyDate=f"202401{10 + s:02d}")
                for i in range(PER_STUDY)]
        if s == 0:
            out.append(make_dataset(study="1.2.826.0.1.3680043.8.498.99", PatientID="P9", modality="US",
                                    BurnedInAnnotation="YES"))
    return out


def _archive(data: Path, n_ct: int, **settings) -> None:
    archive = Archive.open(Settings(data_dir=data, index="sqlite", **settings))
    store_datasets(archive, _datasets(n_ct))
    archive.pseudonyms.secret("lung")
    archive.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("deidjob") / "data"
    _archive(d, 3)
    return d


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (whatever its name) -> its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _export(data: Path, to: str, *extra: str, resume: Path | None = None, fault: str | None = None,
            wait: bool = True, env: dict | None = None):
    """``python -m dicomweb_server export --deidentify ...`` in its own process."""
    cmd = [sys.executable, "-m", "dicomweb_server.cli", "export", "--data-dir", str(data), "--index", "sqlite",
           "--deidentify", "basic,retain_modified_dates", "--project", "lung", "--to", to, *extra]
    if resume is not None:
        cmd += ["--resume", str(resume)]
    e = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    e.pop("DICOMWEB_FAULT", None)
    if fault:
        e["DICOMWEB_FAULT"] = fault
    proc = subprocess.Popen(cmd, env=e, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> tuple[dict[str, bytes], dict]:
    """The files and report of one uninterrupted run."""
    out = tmp_path_factory.mktemp("ref") / "out"
    rc, stdout, err = _export(data, str(out))
    assert rc == 1, err  # one refused
    report = orjson.loads(stdout)
    assert (report["studies"], report["instances"], report["exported"], report["refused"], report["failed"]) == \
        (4, 3 * PER_STUDY + 1, 3 * PER_STUDY, 1, 0)
    files = _files(out)
    assert len(files) == 3 * PER_STUDY and all(k.endswith(".dcm") for k in files)
    return files, report


def _same_report(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k != "to"} == {k: v for k, v in b.items() if k != "to"}


def test_killed_after_an_instance_resumes_without_duplicates(data, reference, tmp_path):
    """Killed (SIGKILL, by the fault point) after the 15th instance is in the folder and
    before the checkpoint of the 20th: the rerun does instances 11.. again over themselves."""
    files, ref_report = reference
    out, resume = tmp_path / "out", tmp_path / "job.json"
    rc, _, _ = _export(data, str(out), resume=resume, fault="deid-exported:15")
    assert rc == -signal.SIGKILL
    saved = orjson.loads(resume.read_bytes())
    assert saved["progress"]["done"] + saved["progress"]["skipped"] == 10  # the last save
    # the checkpoint names the study in progress and its last instance done: small whatever the selection
    assert saved["checkpoint"] == {"total": 3 * PER_STUDY + 1, "next": "1.2.826.0.1.3680043.8.498.1",
                                   "after": "1.2.826.0.1.3680043.8.498.1.1.10", "problems": [],
                                   "counts": {"exported": 10, "refused": 0, "failed": 0}}
    inodes = {p: p.stat().st_ino for p in out.rglob("*.dcm")}
    assert len(inodes) == 15  # five more than the checkpoint says
    rc, stdout, err = _export(data, str(out), resume=resume)
    assert rc == 1, err
    _same_report(orjson.loads(stdout), ref_report)
    assert _files(out) == files  # exactly the same names and bytes: nothing twice, nothing extra
    # from the checkpoint: the 10 files before it untouched, the 5 after it written again (renamed over)
    assert sum(p.stat().st_ino == ino for p, ino in inodes.items()) == 10


def test_killed_from_outside_at_any_moment(data, reference, tmp_path):
    """A real SIGKILL sent by the test while the export runs (after its 2nd checkpoint)."""
    files, ref_report = reference
    out, resume = tmp_path / "out", tmp_path / "job.json"
    proc = _export(data, str(out), "--quiet", resume=resume, wait=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if orjson.loads(resume.read_bytes())["progress"]["done"] >= 20:
                break
        except (FileNotFoundError, orjson.JSONDecodeError):
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the export ended before it could be killed"
    before = orjson.loads(resume.read_bytes())["progress"]
    assert 20 <= before["done"] < 3 * PER_STUDY
    rc, stdout, err = _export(data, str(out), "--quiet", resume=resume)
    assert rc == 1, err
    _same_report(orjson.loads(stdout), ref_report)
    assert _files(out) == files


def test_resume_file_of_another_job_is_refused(data, tmp_path):
    resume = tmp_path / "job.json"
    assert _export(data, str(tmp_path / "a"), "PatientID=P0", resume=resume)[0] == 0
    rc, _, err = _export(data, str(tmp_path / "a"), "PatientID=P1", resume=resume)
    assert rc == 2 and b"holds another job" in err


@pytest.fixture(scope="module")
def s3():
    from tests.s3server import S3Server

    server = S3Server()
    yield server
    server.stop()


def test_s3_prefix_killed_and_resumed(data, reference, s3, tmp_path):
    """``--to s3://bucket/prefix``: one object per instance at ``prefix/{study}/{series}/{sop}.dcm``,
    the very bytes of the folder export; killed after the 15th PUT and resumed: each
    object once (the conditional PUT of an existing object answers 412, compared equal)."""
    files, ref_report = reference
    bucket = s3.fresh_bucket()
    to = f"s3://{bucket}/exports/lung-2024"
    resume = tmp_path / "job.json"
    rc, _, err = _export(data, to, "--s3-endpoint-url", s3.url, resume=resume, fault="deid-exported:15")
    assert rc == -signal.SIGKILL, err
    assert len(s3.keys(bucket)) == 15
    rc, stdout, err = _export(data, to, "--s3-endpoint-url", s3.url, resume=resume)
    assert rc == 1, err
    report = orjson.loads(stdout)
    _same_report(report, ref_report)
    assert report["to"] == to
    keys = s3.keys(bucket)
    assert keys == sorted(f"exports/lung-2024/{k}" for k in files)  # nothing else (the probe key is gone)
    for k in files:
        assert s3.get(bucket, f"exports/lung-2024/{k}") == files[k]
    puts = [r for r in s3.requests if r.method == "PUT" and r.path.startswith(f"/{bucket}/exports/lung-2024/2.25.")]
    assert len([r for r in puts if r.status == 200]) == 3 * PER_STUDY  # each object written once
    assert len([r for r in puts if r.status == 412]) == 5  # the five after the checkpoint, found there


def test_bad_s3_target(data, tmp_path):
    rc, _, err = _export(data, "s3://bucket/../x")
    assert rc == 2 and b"--to:" in err


# --- in the process: labels, destinations, access -------------------------------------------

@pytest.fixture
def sink(tmp_path):
    s = Sink(tmp_path / "sink").start()
    yield s
    s.stop()


@pytest.fixture
def small(tmp_path) -> Path:
    d = tmp_path / "data"
    _archive(d, 2)
    return d


def test_into_a_label_of_this_archive(small, tmp_path):
    """De-identified copies stored back through archive.store, their studies labelled;
    run twice: the second stores nothing new (byte-identical duplicates)."""
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))
    try:
        p = job.params(deidentify="basic", project="lung", target={"label": "research"}, query=[("PatientID", "P0")])
        result, progress = run_inline("deidentify", p, archive)
        assert (result["exported"], result["studies"], progress.done, progress.total) == (PER_STUDY, 1, PER_STUDY,
                                                                                          PER_STUDY)
        secret = archive.pseudonyms.secret("lung")
        new_study = new_uid(secret, "1.2.826.0.1.3680043.8.498.1")
        assert archive.index.labels(new_study) == ["research"]
        assert archive.index.labels("1.2.826.0.1.3680043.8.498.1") == []  # the original: untouched
        stored = archive.index.instances(new_study)
        assert sorted(i.sop_uid for i in stored) == sorted(
            new_uid(secret, f"1.2.826.0.1.3680043.8.498.1.1.{i + 1}") for i in range(PER_STUDY))
        with archive.blobs.local_copy(stored[0].path) as path:
            ds = dcmread(path)
        assert ds.PatientIdentityRemoved == "YES" and ds.PatientID.startswith("PSN-")
        assert run_inline("deidentify", p, archive)[0]["exported"] == PER_STUDY
        assert len(archive.index.instances(new_study)) == PER_STUDY
    finally:
        archive.close()


def test_only_studies_the_caller_may_see(small, tmp_path):
    """A caller restricted to label ``a`` de-identifies only the studies carrying it,
    whether named or found by a query."""
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))
    try:
        archive.index.set_label("1.2.826.0.1.3680043.8.498.2", "a")
        for sel in ({"query": []}, {"studies": ["1.2.826.0.1.3680043.8.498.1", "1.2.826.0.1.3680043.8.498.2"]}):
            out = tmp_path / f"out-{len(sel)}-{'q' if 'query' in sel else 's'}"
            p = job.params(deidentify="basic", project="lung", target={"folder": str(out)}, allowed=only({"a"}),
                           **sel)
            result, _ = run_inline("deidentify", p, archive)
            assert (result["studies"], result["exported"]) == (1, PER_STUDY)
            secret = archive.pseudonyms.secret("lung")
            assert [p.name for p in out.iterdir()] == [new_uid(secret, "1.2.826.0.1.3680043.8.498.2")]
    finally:
        archive.close()


def test_into_a_destination(small, tmp_path, sink):
    """A STOW-RS destination of the routes file: each de-identified instance sent once;
    the job run again sends them again, and the destination keeps one copy of each."""
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[destinations]]\nname = "research"\nstow_url = "{sink.url}"\n')
    archive = Archive.open(Settings(data_dir=small, index="sqlite", routes_file=routes))
    try:
        p = job.params(deidentify="basic", project="lung", target={"destination": "research"},
                       studies=["1.2.826.0.1.3680043.8.498.1"])
        result, _ = run_inline("deidentify", p, archive)
        assert (result["exported"], result["refused"], result["to"]) == (PER_STUDY, 0, "destination:research")
        secret = archive.pseudonyms.secret("lung")
        sent = {new_uid(secret, f"1.2.826.0.1.3680043.8.498.1.1.{i + 1}") for i in range(PER_STUDY)}
        assert set(sink.recorder.received) == sent and set(sink.recorder.received.values()) == {1}
        run_inline("deidentify", p, archive)
        assert set(sink.recorder.received.values()) == {2}
        with pytest.raises(JobError, match="no destination 'nowhere'"):
            run_inline("deidentify", {**p, "target": {"destination": "nowhere"}}, archive)
    finally:
        archive.close()


def test_a_destination_that_is_down_stops_the_job(small, tmp_path, sink):
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[destinations]]\nname = "research"\nstow_url = "{sink.url}"\n')
    archive = Archive.open(Settings(data_dir=small, index="sqlite", routes_file=routes))
    sink.recorder.down = True
    try:
        p = job.params(deidentify="basic", project="lung", target={"destination": "research"},
                       studies=["1.2.826.0.1.3680043.8.498.1"])
        with pytest.raises(job.TargetUnavailable, match="destination:research"):
            run_inline("deidentify", p, archive, tmp_path / "job.json")
        assert orjson.loads((tmp_path / "job.json").read_bytes())["progress"]["done"] == 0
    finally:
        archive.close()


def test_parameters():
    assert job.parse_target("s3://b/p") == {"s3": "s3://b/p"}
    assert job.parse_target("label:research") == {"label": "research"}
    assert job.parse_target("destination:pacs") == {"destination": "pacs"}
    assert job.parse_target("/x/y") == {"folder": "/x/y"}
    with pytest.raises(ValueError, match="invalid label"):
        job.parse_target("label:Bad Label")
    assert job.check_target({"s3": "s3://b"}) == {"s3": "s3://b"}
    for bad in ({"s3": "/x"}, {"label": ""}, {"folder": 1}, {"ftp": "x"}, {"label": "a", "s3": "s3://b"}):
        with pytest.raises(ValueError):
            job.check_target(bad)
    with pytest.raises(ValueError, match="not both"):
        job.params(deidentify="basic", project="p", target={"label": "x"}, studies=["1"], query=[])
    p = job.params(deidentify="basic,clean_descriptors", options=["retain_modified_dates"], project="p",
                   target={"label": "x"}, studies=["1"])
    assert p["deidentify"] == "basic,retain_modified_dates,clean_descriptors"


def test_request_bodies(small, tmp_path):
    """``POST /$deidentify`` bodies (deid/job.py request_params): what is taken, what is
    refused with 400/403 and why."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "research"\nstow_url = "http://127.0.0.1:9/dicom-web"\n')
    archive = Archive.open(Settings(data_dir=small, index="sqlite", routes_file=routes))
    write = {"read", "write"}
    try:
        p = job.request_params({"project": "lung", "target": {"s3": "s3://b/x"}, "options": ["retain_modified_dates"],
                                "query": {"PatientID": "P0", "ModalitiesInStudy": ["CT"]}}, archive, only({"a"}),
                               {"read", "write", "admin"})
        assert p == {"deidentify": "basic,retain_modified_dates", "project": "lung", "allow_burned_in": False,
                     "safe_private": [], "studies": None, "query": [["PatientID", "P0"], ["ModalitiesInStudy", "CT"]],
                     "allowed": {"clauses": [["a"]], "studies": None}, "target": {"s3": "s3://b/x"}}
        p = job.request_params({"project": "lung", "target": {"label": "research"}}, archive, only({"research"}),
                               write, study="1.2.3")
        assert (p["studies"], p["query"], p["target"]) == (["1.2.3"], None, {"label": "research"})
        assert job.request_params({"project": "lung", "target": {"destination": "research"}, "studies": ["1.2"]},
                                  archive, only({"a"}), write)["studies"] == ["1.2"]

        def refused(body, status, text, allowed=only({"a"}), scopes=write, study=None):
            with pytest.raises(job.RequestError, match=text) as e:
                job.request_params(body, archive, allowed, scopes, study)
            assert e.value.status == status

        t = {"label": "a"}
        refused([], 400, "JSON object")
        refused({"project": "nope", "target": t, "studies": ["1"]}, 400, "no de-identification project 'nope'")
        refused({"project": "lung", "target": t}, 400, "give studies")
        refused({"project": "lung", "target": t, "studies": ["1"], "query": {}}, 400, "give studies")
        refused({"project": "lung", "target": t, "studies": ["1"]}, 400, "only in POST /\\$deidentify", study="1")
        refused({"project": "lung", "target": t, "query": {"Nonsense": "1"}}, 400, "query: ")
        refused({"project": "lung", "target": t, "studies": []}, 400, "non-empty list")
        refused({"project": "lung", "target": {"ftp": "x"}, "studies": ["1"]}, 400, "target: one of")
        refused({"project": "lung", "target": {"destination": "pacs"}, "studies": ["1"]}, 400,
                "no destination 'pacs' \\(configured: research\\)")
        refused({"project": "lung", "target": t, "studies": ["1"], "profile": "strict"}, 400, "unknown de-id")
        refused({"project": "lung", "target": t, "studies": ["1"], "extra": 1}, 400, "unknown field")
        refused({"project": "lung", "target": {"folder": "/tmp/x"}, "studies": ["1"]}, 403, "'admin' scope")
        refused({"project": "lung", "target": {"label": "b"}, "studies": ["1"]}, 403, "label 'b'")
        assert job.request_params({"project": "lung", "target": {"folder": "/tmp/x"}, "studies": ["1"]}, archive,
                                  only({"a"}), {"read", "write", "admin"})["target"] == {"folder": "/tmp/x"}
        archive.settings = archive.settings.model_copy(update={"storage": "s3://store/archive"})
        admin = {"read", "write", "admin"}
        for inside in ("s3://store", "s3://store/archive", "s3://store/archive/x"):
            refused({"project": "lung", "target": {"s3": inside}, "studies": ["1"]}, 400, "own storage",
                    scopes=admin)
        # the server's credentials write it: admin only (with write alone, any bucket they reach)
        refused({"project": "lung", "target": {"s3": "s3://store/exports"}, "studies": ["1"]}, 403, "'admin' scope")
        assert job.request_params({"project": "lung", "target": {"s3": "s3://store/exports"}, "studies": ["1"]},
                                  archive, only({"a"}), admin)["target"] == {"s3": "s3://store/exports"}
    finally:
        archive.close()


def test_an_s3_target_inside_the_storage_is_refused(data, tmp_path):
    rc, _, err = _export(data, "s3://store/archive/exports", env={"DICOMWEB_STORAGE": "s3://store/archive",
                                                                   "DICOMWEB_S3_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert rc == 2 and b"inside the archive's own storage" in err


def test_into_a_dimse_destination(small, tmp_path):
    """A C-STORE destination (the routing's DIMSE sender): each de-identified instance
    stored at the SCP under its new UIDs; one refused for good (0xC000) is counted failed
    with the status and the job goes on."""
    from tests.routing.test_dimse_destination import storage_scp

    received: dict[str, str] = {}
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))
    secret = archive.pseudonyms.secret("lung")
    archive.close()
    refused = new_uid(secret, "1.2.826.0.1.3680043.8.498.1.1.3")

    def on_store(event):
        if event.dataset.SOPInstanceUID == refused:
            return 0xC000
        received[event.dataset.SOPInstanceUID] = str(event.dataset.PatientID)
        return 0x0000

    server, routes = storage_scp(tmp_path, on_store)
    archive = Archive.open(Settings(data_dir=small, index="sqlite", routes_file=routes))
    try:
        p = job.params(deidentify="basic", project="lung", target={"destination": "pacs"},
                       studies=["1.2.826.0.1.3680043.8.498.1"])
        result, progress = run_inline("deidentify", p, archive)
        assert (result["exported"], result["failed"], progress.failed) == (PER_STUDY - 1, 1, 1)
        assert result["problems"][0]["sop"] == "1.2.826.0.1.3680043.8.498.1.1.3"
        assert "0xC000" in result["problems"][0]["reason"]
        assert set(received) == {new_uid(secret, f"1.2.826.0.1.3680043.8.498.1.1.{i + 1}")
                                 for i in range(PER_STUDY)} - {refused}
        assert set(received.values()) == {archive.pseudonyms.pseudonym("lung", "P0")}
    finally:
        archive.close()
        server.shutdown()

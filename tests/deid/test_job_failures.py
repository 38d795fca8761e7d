"""The ``deidentify`` job (deid/job.py) when something goes wrong: a label target never
labels an identified original (retain_uids, a SOP Instance UID already stored elsewhere);
a folder target's files and folders are durable before the checkpoint that counts them;
an archive that cannot store (0xA700, 0x0110) stops the job for a retry instead of
failing its instances; one unreadable stored file fails alone."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import orjson
import pytest

from dicomweb_server import jobs
from dicomweb_server.archive import Archive
from dicomweb_server.deid import export, job
from dicomweb_server.deid.uids import new_uid
from dicomweb_server.jobs import run_inline
from dicomweb_server.settings import Settings
from tests.deid.test_job import PER_STUDY, _archive

STUDY = "1.2.826.0.1.3680043.8.498.1"


@pytest.fixture
def small(tmp_path) -> Path:
    d = tmp_path / "data"
    _archive(d, 2)
    return d


def _stored_bytes(archive, study: str) -> dict[str, bytes]:
    out = {}
    for loc in archive.index.instances(study):
        with archive.blobs.local_copy(loc.path) as path:
            out[loc.sop_uid] = path.read_bytes()
    return out


def test_retain_uids_into_a_label_is_refused(small):
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))
    try:
        with pytest.raises(ValueError, match="retain_uids option with a label target"):
            job.params(deidentify="basic", options=["retain_uids"], project="lung", target={"label": "research"},
                       studies=[STUDY])
        with pytest.raises(job.RequestError, match="retain_uids option with a label target") as e:
            job.request_params({"project": "lung", "target": {"label": "research"}, "options": ["retain_uids"],
                                "studies": [STUDY]}, archive, job.UNRESTRICTED, {"read", "write"})
        assert e.value.status == 400
        # other targets keep the option
        assert job.params(deidentify="basic", options=["retain_uids"], project="lung", target={"folder": "/x"},
                          studies=[STUDY])["deidentify"] == "basic,retain_uids"
    finally:
        archive.close()


@pytest.mark.parametrize("policy", ["keep", "reject", "replace"])
def test_a_copy_under_the_original_uids_never_labels_the_original(small, policy):
    """A job queued with retain_uids into a label (parameters made before the refusal, or
    by hand): the copies keep the original UIDs; whatever the duplicate policy, the
    original study gets no label and its stored files are unchanged."""
    archive = Archive.open(Settings(data_dir=small, index="sqlite", duplicate_policy=policy))
    try:
        before = _stored_bytes(archive, STUDY)
        p = job.params(deidentify="basic", project="lung", target={"folder": "/unused"}, studies=[STUDY])
        p = {**p, "deidentify": "basic,retain_uids", "target": {"label": "research"}}
        result, _ = run_inline("deidentify", p, archive)
        assert archive.index.labels(STUDY) == []  # without the fix, keep: ["research"]
        assert _stored_bytes(archive, STUDY) == before
        assert (result["exported"], result["failed"]) == (0, PER_STUDY)
        assert "keeps the original's Study Instance UID" in result["problems"][0]["reason"]
    finally:
        archive.close()


def test_a_copy_kept_with_other_content_is_not_counted_exported(small):
    """A copy made before with other options (dates shifted, then removed): the same
    UIDs, other content; under duplicate_policy keep the store answers a duplicate and
    keeps the first copy: the job fails those instances, and labels no original."""
    archive = Archive.open(Settings(data_dir=small, index="sqlite", duplicate_policy="keep"))
    try:
        secret = archive.pseudonyms.secret("lung")
        p = job.params(deidentify="basic", options=["retain_modified_dates"], project="lung",
                       target={"label": "research"}, studies=[STUDY])
        assert run_inline("deidentify", p, archive)[0]["exported"] == PER_STUDY
        assert run_inline("deidentify", p, archive)[0]["exported"] == PER_STUDY  # the same bytes: a success
        first = _stored_bytes(archive, new_uid(secret, STUDY))
        result, _ = run_inline("deidentify", {**p, "deidentify": "basic"}, archive)
        assert (result["exported"], result["failed"]) == (0, PER_STUDY)
        assert "is already stored with other content (kept as it is)" in result["problems"][0]["reason"]
        assert _stored_bytes(archive, new_uid(secret, STUDY)) == first
        assert archive.index.labels(STUDY) == []
    finally:
        archive.close()


def test_folder_target_entries_are_durable_before_each_checkpoint(small, tmp_path, monkeypatch):
    """A power cut cannot be tested: os.fsync is watched. At every checkpoint, each folder
    holding an exported file (series, study) and the target folder itself (new, as its
    parent) have had their entries fsynced."""
    synced: set[Path] = set()
    real_fsync = os.fsync

    def spy(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.add(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    out = tmp_path / "new" / "out"
    checks = []
    real_persist = jobs.InlineContext._persist

    def persist(ctx):
        files = [f for f in out.rglob("*.dcm")] if out.exists() else []
        need = {f.parent for f in files} | {f.parent.parent for f in files}
        if files:
            need |= {out, out.parent, out.parent.parent}
        assert need <= synced, f"not fsynced before the checkpoint: {sorted(need - synced)}"
        checks.append(len(files))
        real_persist(ctx)

    monkeypatch.setattr(jobs.InlineContext, "_persist", persist)
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))
    try:
        p = job.params(deidentify="basic", project="lung", target={"folder": str(out)}, query=[])
        result, _ = run_inline("deidentify", p, archive)
        assert result["exported"] == 2 * PER_STUDY
        assert checks[-1] == 2 * PER_STUDY and len(checks) > 3
    finally:
        archive.close()


@pytest.mark.parametrize(("err", "status"), [(errno.ENOSPC, "0xA700"), (errno.EIO, "0x0110")])
def test_an_archive_that_cannot_store_stops_a_label_job_for_a_retry(small, tmp_path, monkeypatch, err, status):
    """archive.store answers out of resources (a full disk) or processing failure (an I/O
    error): no instance is counted failed, the checkpoint stays, the job is retried."""
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))

    def place(*a, **k):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(archive.blobs, "place", place)
    try:
        p = job.params(deidentify="basic", project="lung", target={"label": "research"}, studies=[STUDY])
        with pytest.raises(job.TargetUnavailable, match=status):
            run_inline("deidentify", p, archive, tmp_path / "job.json")
        saved = orjson.loads((tmp_path / "job.json").read_bytes())
        assert (saved["progress"]["done"], saved["progress"]["failed"]) == (0, 0)
        assert saved["checkpoint"]["next"] == STUDY and saved["checkpoint"]["after"] is None
        monkeypatch.undo()
        result, _ = run_inline("deidentify", p, archive, tmp_path / "job.json")  # the retry
        assert (result["exported"], result["failed"]) == (PER_STUDY, 0)
    finally:
        archive.close()


def test_an_unreadable_stored_file_fails_alone(small, tmp_path, monkeypatch):
    """One stored file that cannot be read (a folder in its place: EISDIR; another that
    answers EACCES) fails with the reason; the job goes on with the others."""
    archive = Archive.open(Settings(data_dir=small, index="sqlite"))
    try:
        locs = archive.index.instances(STUDY)
        broken = archive.blobs.resolve(locs[2].path)
        broken.unlink()
        broken.mkdir()
        denied = str(archive.blobs.resolve(locs[5].path))
        real = export.dcmread

        def dcmread(path, *a, **k):
            if str(path) == denied:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), denied)
            return real(path, *a, **k)

        monkeypatch.setattr(export, "dcmread", dcmread)
        out = tmp_path / "out"
        p = job.params(deidentify="basic", project="lung", target={"folder": str(out)}, studies=[STUDY])
        result, _ = run_inline("deidentify", p, archive)
        assert (result["exported"], result["failed"]) == (PER_STUDY - 2, 2)
        assert [(x["sop"], x["reason"]) for x in result["problems"]] == [
            (locs[2].sop_uid, "cannot read the stored file: Is a directory"),
            (locs[5].sop_uid, "cannot read the stored file: Permission denied")]
        assert len(list(out.rglob("*.dcm"))) == PER_STUDY - 2
    finally:
        archive.close()

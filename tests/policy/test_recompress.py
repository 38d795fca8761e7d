"""``recompress`` (policy/recompress.py): stored instances re-encoded by the [[store_as]]
rules, pixel-identical, with exact byte counts; a dry run changes nothing and reports the
same; the rate limits are honoured; a real ``dicomweb-server recompress`` SIGKILLed at each
step of its switch leaves every instance readable (old or new), and the resumed run
finishes without doing anything twice; a concurrent $update is not lost; ``when =
"after_ack"`` rules store as received and re-encode in the background."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pydicom
import pytest
from pydicom.dataset import Dataset

from dicomweb_server.archive import Archive
from dicomweb_server.check import reconcile
from dicomweb_server.importer import ImportRun, run_import
from dicomweb_server.jobs import JobError, run_inline
from dicomweb_server.lifecycle.update import changes_from_keywords, update
from dicomweb_server.policy import recompress
from dicomweb_server.routing.rules import RoutesError, load_routes
from dicomweb_server.settings import Settings
from tests.policy.test_transcode import _synthetic

ELE, JLS, RLE = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.5"
ROUTES = """
[[store_as]]
match = { Modality = "CT" }
store_as = "jpeg-ls-lossless"

[[store_as]]
match = { Modality = "MR" }
store_as = "rle-lossless"
"""
#: (BitsStored, signed, Modality, frames): four CT and two MR re-encoded, one OT left as it is
KINDS = [(16, True, "CT", 1), (12, False, "CT", 2), (8, False, "CT", 1), (16, False, "CT", 1),
         (16, False, "MR", 1), (12, True, "MR", 3), (8, False, "OT", 1)]


def _fill(tmp_path: Path, index: str = "sqlite", routes: str = ROUTES, **extra) -> tuple[Settings, dict[str, Dataset]]:
    """An archive holding the KINDS as received (Explicit VR Little Endian), and its settings
    with the routes file."""
    folder = tmp_path / "in"
    folder.mkdir()
    originals = {}
    for i, (bits, signed, modality, frames) in enumerate(KINDS):
        ds = _synthetic(bits, signed, frames=frames, rows=40 + i, cols=32)
        ds.Modality = modality
        ds.save_as(folder / f"{i}.dcm", enforce_file_format=True)
        originals[ds.SOPInstanceUID] = ds
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index=index, **extra))
    run = run_import(archive, sorted(folder.iterdir()), [], ImportRun(), quiet=True)
    assert run.stored == len(KINDS)
    archive.close()
    (tmp_path / "routes.toml").write_text(routes)
    return Settings(data_dir=tmp_path / "data", index=index, routes_file=tmp_path / "routes.toml", **extra), originals


def _readable(settings: Settings, originals: dict[str, Dataset]) -> dict[str, str]:
    """Every instance readable as its row says, with the received pixels: SOP -> syntax."""
    archive = Archive.open(settings)
    try:
        out = {}
        for sop, ds in originals.items():
            loc = archive.index.locate(sop)
            with archive.blobs.local_copy(loc.path) as path:
                assert path.stat().st_size == loc.size, sop
                on_disk = pydicom.dcmread(path)
            assert on_disk.file_meta.TransferSyntaxUID == loc.transfer_syntax_uid
            assert on_disk.SOPInstanceUID == sop and on_disk.PatientName == ds.PatientName
            assert np.array_equal(on_disk.pixel_array, ds.pixel_array), sop
            out[sop] = loc.transfer_syntax_uid
        return out
    finally:
        archive.close()


def _sizes(settings: Settings) -> dict[str, int]:
    """Every stored file or object: its name's stem -> size."""
    archive = Archive.open(settings)
    try:
        return {Path(o.path).stem: o.size for o in archive.blobs.listing()}
    finally:
        archive.close()


def _want(originals: dict[str, Dataset]) -> dict[str, str]:
    return {sop: {"CT": JLS, "MR": RLE}.get(ds.Modality, ELE) for sop, ds in originals.items()}


@pytest.mark.parametrize("index", ["sqlite", "memory", "postgresql"])
def test_reencodes_by_the_rules_with_exact_bytes_and_no_new_version(tmp_path, index, request):
    extra = {"database_url": request.getfixturevalue("pg_url")} if index == "postgresql" else {}
    settings, originals = _fill(tmp_path, index, **extra)
    before = _sizes(settings)
    archive = Archive.open(settings)
    try:
        changes = archive.index.changes(limit=100)
        result, progress = run_inline("recompress", {"quiet": 0}, archive)
        assert archive.index.changes(limit=100) == changes  # the same data sets: no change-log row
        assert not reconcile(archive).problems
    finally:
        archive.close()
    assert _readable(settings, originals) == _want(originals)
    after = _sizes(settings)
    assert set(after) == set(before)  # no side file, no version left behind
    ct = [s for s, ds in originals.items() if ds.Modality == "CT"]
    mr = [s for s, ds in originals.items() if ds.Modality == "MR"]
    assert result["by_syntax"] == {
        f"{ELE} -> {JLS}": {"instances": 4, "bytes_before": sum(before[s] for s in ct),
                            "bytes_after": sum(after[s] for s in ct)},
        f"{ELE} -> {RLE}": {"instances": 2, "bytes_before": sum(before[s] for s in mr),
                            "bytes_after": sum(after[s] for s in mr)}}
    assert result["bytes_saved"] == sum(before.values()) - sum(after.values()) > 0
    assert (result["done"], result["skipped"], result["failed"]) == (6, 1, 0)
    assert result["skipped_why"] == {"no rule matches": 1}
    assert (progress.total, progress.done) == (7, 6)
    archive = Archive.open(settings)  # a second run finds nothing to do
    try:
        again, _ = run_inline("recompress", {"quiet": 0}, archive)
    finally:
        archive.close()
    assert (again["done"], again["skipped_why"]) == (0, {"already in its syntax": 6, "no rule matches": 1})
    assert _sizes(settings) == after


def test_objects_in_s3_are_reencoded_in_place(tmp_path, s3_storage):
    """Object storage (store/s3.py): the side object PUT, the row switched, the object PUT
    over, the side object deleted; `check` finds nothing."""
    settings, originals = _fill(tmp_path, **s3_storage)
    before = _sizes(settings)
    archive = Archive.open(settings)
    try:
        result, _ = run_inline("recompress", {"quiet": 0}, archive)
        assert not reconcile(archive).problems
    finally:
        archive.close()
    assert _readable(settings, originals) == _want(originals)
    after = _sizes(settings)
    assert set(after) == set(before) and result["done"] == 6
    assert result["bytes_saved"] == sum(before.values()) - sum(after.values()) > 0


def test_dry_run_changes_nothing_and_reports_what_the_run_does(tmp_path):
    settings, originals = _fill(tmp_path)
    blobs = Path(settings.data_dir) / "blobs"
    files = {p: p.read_bytes() for p in blobs.rglob("*.dcm")}
    archive = Archive.open(settings)
    try:
        dry, _ = run_inline("recompress", {"quiet": 0, "dry_run": True}, archive)
        assert {p: p.read_bytes() for p in blobs.rglob("*.dcm")} == files
        assert {loc.transfer_syntax_uid for loc in (archive.index.locate(s) for s in originals)} == {ELE}
        assert not list(archive.blobs.spool.iterdir())  # its encoded files are gone
        real, _ = run_inline("recompress", {"quiet": 0}, archive)
    finally:
        archive.close()
    assert dry["dry_run"] and not real["dry_run"]
    for key in ("by_syntax", "bytes_before", "bytes_after", "bytes_saved", "done", "skipped", "failed"):
        assert dry[key] == real[key], key


def test_match_and_limit_narrow_the_run(tmp_path):
    settings, originals = _fill(tmp_path)
    archive = Archive.open(settings)
    try:
        mr, _ = run_inline("recompress", {"quiet": 0, "match": {"Modality": "MR"}}, archive)
        assert (mr["done"], mr["skipped_why"]) == (2, {"outside the match": 5})
        one, _ = run_inline("recompress", {"quiet": 0, "limit": 1}, archive)
        assert one["done"] == 1
        with pytest.raises(JobError, match="unknown parameter 'rates'"):
            run_inline("recompress", {"rates": 1}, archive)
        with pytest.raises(JobError, match="match: "):
            run_inline("recompress", {"match": {"NoSuchKeyword": "1"}}, archive)
    finally:
        archive.close()
    got = _readable(settings, originals)
    assert sorted(got.values()).count(JLS) == 1 and sorted(got.values()).count(RLE) == 2


def test_throttle_counts_the_waits_it_owes():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    t = recompress.Throttle(rate=10, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        t.take(10_000)
    assert t.waits == 4 and slept == pytest.approx([0.1] * 4) and t.slept == pytest.approx(0.4)
    now[0], slept[:] = 0.0, []
    t = recompress.Throttle(rate=1000, bytes_rate=1000, clock=lambda: now[0], sleep=sleep)
    for size in (500, 1500, 10):  # the bytes limit: each item pays its size / bytes_rate
        t.take(size)
    assert slept == pytest.approx([0.5, 1.5])
    with pytest.raises(JobError):
        recompress.Throttle(rate=0)


def test_the_run_honours_its_rate_and_yields_to_stores(tmp_path):
    settings, _originals = _fill(tmp_path)
    archive = Archive.open(settings)
    try:
        # the import just wrote the change log: a store happened less than a second ago
        assert recompress._yield_to_stores(archive, 0.6) > 0.2
        assert recompress._yield_to_stores(archive, 0.6) == 0.0
        started = time.monotonic()
        run_inline("recompress", {"quiet": 0, "rate": 10}, archive)
        elapsed = time.monotonic() - started
        sizes = [archive.index.locate(s).size for s in _originals]  # (in the order they are walked)
        started = time.monotonic()  # the bytes limit: all the files' bytes per second
        result, _ = run_inline("recompress", {"quiet": 0, "bytes_rate": sum(sizes), "dry_run": True}, archive)
        elapsed_bytes = time.monotonic() - started
    finally:
        archive.close()
    # 7 instances at 10/s: the 7th starts 0.6 s after the first at the earliest; with the bytes
    # limit, the last starts when the others' bytes have had their time (the waits themselves
    # are counted exactly by test_throttle_counts_the_waits_it_owes)
    assert elapsed >= 0.6
    assert elapsed_bytes >= 1 - sizes[-1] / sum(sizes)
    assert result["throttled_seconds"] >= 0


def test_a_concurrent_update_is_not_lost(tmp_path):
    """An $update between the encoding and the switch: the switch is not made (the row
    changed), the update's version stays; the next run re-encodes that version."""
    settings, originals = _fill(tmp_path)
    sop, ds = next((s, d) for s, d in originals.items() if d.Modality == "CT")
    archive = Archive.open(settings)
    try:
        rules = list(archive.routing.routes.store_as)

        def meanwhile(_outcome) -> None:
            changes = changes_from_keywords(["PatientName=Updated^Meanwhile"], "study")
            update(archive, ds.StudyInstanceUID, None, changes)

        o = recompress.recompress_instance(archive, sop, rules, before_switch=meanwhile)
        assert (o.kind, o.why) == ("skipped", "changed meanwhile")
        loc = archive.index.locate(sop)
        assert loc.path.endswith(".v2.dcm") and loc.transfer_syntax_uid == ELE
        o = recompress.recompress_instance(archive, sop, rules)
        assert o.kind == "done"
        loc = archive.index.locate(sop)
        assert loc.path.endswith(".v2.dcm") and loc.transfer_syntax_uid == JLS
        on_disk = pydicom.dcmread(archive.blobs.resolve(loc.path))
        assert on_disk.PatientName == "Updated^Meanwhile" and np.array_equal(on_disk.pixel_array, ds.pixel_array)
        assert not reconcile(archive).problems
    finally:
        archive.close()


# --- SIGKILL of the real command -----------------------------------------------------------


def _command(settings: Settings, resume: Path, fault: str | None = None, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}
    env.pop("DICOMWEB_FAULT", None)
    if fault:
        env["DICOMWEB_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "recompress", "--data-dir", str(settings.data_dir),
         "--index", settings.index, "--routes", str(settings.routes_file), "--resume", str(resume),
         "--yield-seconds", "0", "--quiet", "--json", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


#: (fault point, what `check` then finds): each step of the switch, at another instance
KILLS = [("recompress-side:1", "recompress leftover"), ("recompress-switched:2", "recompress unfinished"),
         ("recompress-replaced:1", "recompress unfinished"), ("recompress-refiled:2", "recompress leftover")]


def test_sigkill_at_each_step_then_the_resumed_run_finishes_once(tmp_path):
    settings, originals = _fill(tmp_path)
    before = _sizes(settings)
    resume = tmp_path / "recompress.json"
    for fault, found in KILLS:
        proc = _command(settings, resume, fault)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, (fault, err.decode())
        syntaxes = _readable(settings, originals)  # every instance readable, old or new
        assert set(syntaxes.values()) <= {ELE, JLS, RLE}
        archive = Archive.open(settings)
        try:
            kinds = {p.kind for p in reconcile(archive).problems}  # (a dry run: changes nothing)
        finally:
            archive.close()
        assert found in kinds, (fault, kinds)
        assert kinds <= {"recompress leftover", "recompress unfinished"}, kinds
    proc = _command(settings, resume)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    result = orjson.loads(out)
    assert _readable(settings, originals) == _want(originals)
    after = _sizes(settings)
    assert set(after) == set(before)  # no side file left
    # each instance re-encoded once, counted once across the five runs, its bytes exactly
    changed = [s for s in originals if after[s] != before[s]]
    assert (result["done"], result["failed"], len(changed)) == (6, 0, 6)
    assert result["bytes_before"] == sum(before[s] for s in changed)
    assert result["bytes_after"] == sum(after[s] for s in changed)
    assert sum(v["instances"] for v in result["by_syntax"].values()) == 6
    archive = Archive.open(settings)
    try:
        assert not reconcile(archive).problems
        assert [c.action for c in archive.index.changes(limit=100)] == ["create"] * len(KINDS)
    finally:
        archive.close()


def test_sigkill_at_random_moments(tmp_path):
    settings, originals = _fill(tmp_path)
    resume = tmp_path / "recompress.json"
    rng = random.Random(30)
    for _ in range(4):
        proc = _command(settings, resume, None, "--rate", "4")
        time.sleep(rng.uniform(1.0, 3.0))  # (the command's start-up is most of a second)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        _readable(settings, originals)
    proc = _command(settings, resume, None, "--rate", "4")  # the same job (its parameters: the resume file's)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert orjson.loads(out)["done"] == 6
    assert _readable(settings, originals) == _want(originals)
    archive = Archive.open(settings)
    try:
        assert not reconcile(archive).problems
    finally:
        archive.close()


def test_command_line_report_and_errors(tmp_path):
    settings, _originals = _fill(tmp_path)
    resume = tmp_path / "r.json"
    proc = _command(settings, resume, None, "--dry-run")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and orjson.loads(out)["dry_run"] is True, err.decode()
    # the same resume file with other parameters is refused, nothing done
    proc = _command(settings, resume, None, "--rate", "5")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and b"holds another job" in err
    # without rules: a clear refusal
    (tmp_path / "routes.toml").write_text('[[destinations]]\nname = "x"\nstow_url = "http://127.0.0.1:9/x"\n')
    proc = _command(settings, tmp_path / "other.json")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and b"no [[store_as]] rule" in err


def test_the_command_refuses_the_in_memory_index(tmp_path):
    """A server running on the data folder with ``--index memory`` keeps its own rows: the
    command would leave them naming the old sizes (404 until a restart). Refused, nothing
    changed; the message names the server's POST /admin/recompress."""
    settings, originals = _fill(tmp_path, "memory")
    before = _sizes(settings)
    proc = _command(settings, tmp_path / "r.json")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and b"in-memory index" in err and b"POST /admin/recompress" in err, err.decode()
    assert _sizes(settings) == before and not (tmp_path / "r.json").exists()
    assert set(_readable(settings, originals).values()) == {ELE}


def test_the_command_silences_pydicom_warnings(tmp_path):
    """A stored instance with an invalid Instance Number ("1A", IS): pydicom warns each time
    it reads it; the command's stderr stays free of it (and of its decode workers'), the
    re-encoding done. Before: "UserWarning: Invalid value for VR IS" on stderr."""
    folder = tmp_path / "in"
    folder.mkdir()
    ds = _synthetic(16, True)
    ds.Modality = "CT"
    ds.InstanceNumber = 1
    ds.save_as(folder / "odd.dcm", enforce_file_format=True)
    raw = (folder / "odd.dcm").read_bytes()
    ok = b"\x20\x00\x13\x00IS\x02\x001 "  # (0020,0013) IS "1 ", made "1A" (pydicom will not write it)
    assert raw.count(ok) == 1
    (folder / "odd.dcm").write_bytes(raw.replace(ok, ok[:-1] + b"A"))
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite"))
    assert run_import(archive, [folder / "odd.dcm"], [], ImportRun(), quiet=True).stored == 1
    archive.close()
    (tmp_path / "routes.toml").write_text(ROUTES)
    settings = Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=tmp_path / "routes.toml")
    proc = _command(settings, tmp_path / "r.json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and orjson.loads(out)["done"] == 1, err.decode()
    assert b"Warning" not in err and b"pydicom" not in err, err.decode()


# --- after the acknowledgement ---------------------------------------------------------------


def test_after_ack_rule_stores_as_received_then_the_pass_reencodes(tmp_path):
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app
    from tests.server.conftest import stored

    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nmatch = { Modality = "CT" }\nstore_as = "jpeg-ls-lossless"\n'
                      'when = "after_ack"\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    resume = tmp_path / "data" / "recompress-after-ack.json"
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            first, second = _synthetic(16, True), _synthetic(12, False)
            stored(c, first)
            assert archive.index.locate(first.SOPInstanceUID).transfer_syntax_uid == ELE  # acknowledged as received
            progress = recompress.after_ack_pass(archive, resume)
            assert progress.done == 1
            assert archive.index.locate(first.SOPInstanceUID).transfer_syntax_uid == JLS
            stored(c, second)
            progress = recompress.after_ack_pass(archive, resume)  # goes on from the last pass
            assert (progress.done, progress.skipped) == (2, 0)
            assert archive.index.locate(second.SOPInstanceUID).transfer_syntax_uid == JLS
            for ds in (first, second):
                loc = archive.index.locate(ds.SOPInstanceUID)
                assert np.array_equal(pydicom.dcmread(archive.blobs.resolve(loc.path)).pixel_array, ds.pixel_array)
    finally:
        archive.close()


def test_the_server_runs_the_after_ack_passes(tmp_path, monkeypatch):
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app
    from tests.routing.conftest import wait_for
    from tests.server.conftest import stored

    monkeypatch.setattr(recompress, "AFTER_ACK_INTERVAL", 0.2)
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nstore_as = "rle-lossless"\nwhen = "after_ack"\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            ds = _synthetic(16, False)
            stored(c, ds)
            wait_for(lambda: archive.index.locate(ds.SOPInstanceUID).transfer_syntax_uid == RLE, 30,
                     "the background pass")
    finally:
        archive.close()
    assert (tmp_path / "data" / "recompress-after-ack.json").exists()


def test_bad_when_is_refused_with_its_line(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nstore_as = "rle-lossless"\nwhen = "later"\n')
    with pytest.raises(RoutesError, match="line 3.*when"):
        load_routes(routes)


# --- POST /admin/recompress: the job through the durable runner -------------------------------


def test_admin_recompress_runs_the_job_and_needs_the_admin_scope(tmp_path):
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app
    from tests.access.test_http_access import h
    from tests.routing.conftest import wait_for

    settings, originals = _fill(tmp_path)
    admin, writer = "admin-key-0123456789", "write-key-0123456789"
    settings = settings.model_copy(update={"api_keys": {admin: ["read", "write", "admin"],
                                                        writer: ["read", "write", "delete"]}})
    before = _sizes(settings)
    archive = Archive.open(settings)
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            r = c.post("/admin/recompress", json={"quiet": 0}, headers=h(writer))
            assert r.status_code == 403 and "'admin' scope" in r.text
            for bad, why in (({"rate": -1}, "positive"), ({"rates": 1}, "unknown parameter"),
                             ({"follow": True}, "unknown parameter 'follow'"), ([1], "JSON object")):
                r = c.post("/admin/recompress", json=bad, headers=h(admin))
                assert r.status_code == 400 and why in r.text, (bad, r.text)
            r = c.post("/admin/recompress", json={"quiet": 0, "match": {"Modality": "CT"}}, headers=h(admin))
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            assert r.headers["Location"] == f"/jobs/{job_id}" and r.json()["kind"] == "recompress"
            job = wait_for(lambda: (j := c.get(f"/jobs/{job_id}", headers=h(admin)).json())["state"]
                           in ("done", "failed") and j, 60, "the job")
    finally:
        archive.close()
    assert job["state"] == "done", job
    assert job["progress"]["done"] == 4 and job["result"]["done"] == 4
    after = _sizes(settings)
    ct = [s for s, ds in originals.items() if ds.Modality == "CT"]
    assert job["result"]["by_syntax"] == {f"{ELE} -> {JLS}": {
        "instances": 4, "bytes_before": sum(before[s] for s in ct), "bytes_after": sum(after[s] for s in ct)}}
    assert job["progress"]["detail"]["bytes_saved"] == sum(before[s] - after[s] for s in ct) > 0
    got = _readable(settings, originals)
    assert [got[s] for s in ct] == [JLS] * 4


# --- never bigger: a lossy stored instance, and a file the codec cannot shrink ----------------


def test_a_lossy_stored_instance_and_a_file_that_would_grow_are_skipped(tmp_path):
    """pydicom's JPEG2000.dcm (NM, stored lossy 4.91, Lossy Image Compression 01) would become
    a JPEG-LS lossless file many times its size; a 16-bit noise picture grows under RLE. Both
    are left as stored, with the reason in the report, and the run reports nothing saved."""
    from pydicom.data import get_testdata_file

    folder = tmp_path / "in"
    folder.mkdir()
    lossy = pydicom.dcmread(get_testdata_file("JPEG2000.dcm"))
    assert lossy.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.91" and lossy.LossyImageCompression == "01"
    lossy.save_as(folder / "lossy.dcm")
    noise = _synthetic(16, False, rows=64, cols=64)
    noise.Modality = "MR"
    noise.PixelData = np.random.default_rng(5).integers(0, 1 << 16, (64, 64), dtype=np.uint16).tobytes()
    noise.save_as(folder / "noise.dcm", enforce_file_format=True)
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite"))  # stored as received
    assert run_import(archive, sorted(folder.iterdir()), [], ImportRun(), quiet=True).stored == 2
    archive.close()
    settings = Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=tmp_path / "routes.toml")
    (tmp_path / "routes.toml").write_text('[[store_as]]\nmatch = { Modality = "NM" }\nstore_as = "jpeg-ls-lossless"\n'
                                          '[[store_as]]\nmatch = { Modality = "MR" }\nstore_as = "rle-lossless"\n')
    before = _sizes(settings)
    archive = Archive.open(settings)
    try:
        for dry_run in (True, False):
            result, _progress = run_inline("recompress", {"quiet": 0, "dry_run": dry_run}, archive)
            assert (result["done"], result["skipped"], result["failed"]) == (0, 2, 0), result
            assert result["skipped_why"] == {recompress.STORED_LOSSY: 1, recompress.NOT_SMALLER: 1}
            assert (result["bytes_before"], result["bytes_after"], result["bytes_saved"]) == (0, 0, 0)
            assert result["by_syntax"] == {}
        assert archive.index.locate(lossy.SOPInstanceUID).transfer_syntax_uid == "1.2.840.10008.1.2.4.91"
        assert archive.index.locate(noise.SOPInstanceUID).transfer_syntax_uid == ELE
        assert not reconcile(archive).problems
    finally:
        archive.close()
    assert _sizes(settings) == before  # no new file left in the store, none switched
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file() and ".store_as" in p.name]

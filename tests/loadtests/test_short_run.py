"""A short LOAD-03 run against a real archive process: 3 studies / 30 small images,
1 and 8 clients, a few seconds per step; every answer validated, no error allowed.
Plus the answer checks themselves, on good and broken answers.

Needs the ``load`` extra (locust, psutil); skipped without it."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import free_port

# find_spec, not importorskip: importing locust here would monkey-patch this process (gevent)
if importlib.util.find_spec("locust") is None or importlib.util.find_spec("psutil") is None:
    pytest.skip("the load extra is not installed: pip install -e '.[load]'", allow_module_level=True)

from loadtests import capacity, checks, common, dataset, preload, run  # noqa: E402

SPEC = dataset.Spec(seed=11, studies=3, instances=30, ct_size=64, mr_size=32)
ROW_KEYS = {"operation", "clients", "ops", "ops_s", "mb_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "errors",
            "peak_server_mb"}


@pytest.fixture(scope="module")
def archive():
    """``dicomweb-server`` as its own process on 127.0.0.1 (sqlite, one worker)."""
    with tempfile.TemporaryDirectory(prefix="load03-test-") as tmp:
        port = free_port()
        log = open(Path(tmp) / "server.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(Path(tmp) / "data"),
             "--port", str(port), "--workers", "1", "--index", "sqlite", "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/studies?limit=1", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {(Path(tmp) / 'server.log').read_text()[-2000:]}")
                time.sleep(0.1)
            yield url, proc.pid, Path(tmp)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


@pytest.fixture(scope="module")
def manifest_path(archive) -> Path:
    path = archive[2] / "manifest.json"
    path.write_text(json.dumps(dataset.build_manifest(SPEC, progress=False)))
    return path


def test_dataset_is_deterministic_and_matches_the_manifest(manifest_path):
    m = dataset.load_manifest(manifest_path)
    assert m["summary"]["instances"] == 30 and m["summary"]["studies"] == 3
    again = dataset.build_manifest(SPEC, progress=False)
    assert again["instances"] == m["instances"] and again["queries"] == m["queries"]
    assert sum(s["instances"] for s in m["studies"]) == 30
    assert any(q["expected"] > 0 for q in m["queries"])
    # no query of the mix matches the STOW-RS load patient
    stow = {"PatientID": dataset.STOW_PATIENT_ID, "PatientName": dataset.STOW_PATIENT_NAME}
    assert not any(dataset._stow_matches(q["params"]) for q in m["queries"]), stow


def test_short_run_has_no_validation_errors(archive, manifest_path, tmp_path):
    url, pid, _ = archive
    t0 = time.monotonic()
    code = run.main(["--host", url, "--clients", "1,8", "--duration", "3", "--manifest", str(manifest_path),
                     "--output", str(tmp_path), "--server-pid", str(pid), "--quiet"])
    rows = json.loads((tmp_path / "results.json").read_text())
    steps = json.loads((tmp_path / "steps.json").read_text())["steps"]
    reasons = {f"{s['operation']} {s['clients']}": s["failure_reasons"] for s in steps if s["failure_reasons"]}
    assert code == 0, reasons
    assert [(r["operation"], r["clients"]) for r in rows] == [
        (o, c) for o in ("qido", "wado", "rendered", "stow") for c in (1, 8)]
    for r in rows:
        assert set(r) == ROW_KEYS
        assert r["ops"] > 0 and r["ops_s"] > 0, r
        assert r["errors"] == 0, reasons
        assert r["peak_server_mb"] and r["peak_server_mb"] > 0
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
    for s in steps:
        if s["operation"] == "stow":  # success means durable: the server counts the same
            assert s["server_counted"] == s["ops"] - s["errors"]
    md = (tmp_path / "results.md").read_text()
    assert "| operation" in md and "nproc" in md
    for s in steps:  # the rest of the machine was measured, and judged
        assert s["other_cpu_pct"] is not None and s["machine_busy"] == (s["other_cpu_pct"] > run.BUSY_OTHER_PCT)
    assert run.busy_summary(steps) + "." in md
    assert time.monotonic() - t0 < 90


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (scripts/test.sh installs it)")
def test_capacity_wado_step_counts_answers_validated_first(archive, manifest_path, tmp_path, monkeypatch):
    """The capacity runner's WADO-RS instance step (wrk/sized.lua, no body copied into Lua):
    every instance's answer fetched and validated before the step, its whole size (status line,
    headers, body) the one wrk's byte count is checked against; a manifest whose pixel data
    another server would not match stops the step before any load."""
    url, pid, _ = archive
    m = json.loads(manifest_path.read_text())
    preload.preload(m, [url], progress=False)
    rows = capacity.run_servers([("ours", url, pid)], m, ["wado"], [2], 2, 2, tmp_path, True)
    (r,) = rows["ours"]
    assert r["requests"] > 0 and r["errors"] == 0 and r["error_detail"] == {}, r
    order = (tmp_path / "ours" / "wado.txt").read_text().split()
    lines = [ln.split("\t") for ln in (tmp_path / "ours" / "wado-sizes.txt").read_text().splitlines()]
    assert [p for p, _ in lines] == order and sorted(order) == sorted(i["path"] for i in m["instances"])
    path, size = lines[0]
    got = httpx.get(url + path, headers={"Accept": capacity.WADO_ACCEPT})
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in got.headers.items())
    assert int(size) == len(head) + 2 + len(got.content)  # the whole answer, as wrk counts it
    assert r["mb_s"] * 2 * 1e6 >= r["requests"] * min(int(n) for _, n in lines) * 0.99  # wrk read them all
    bad = json.loads(manifest_path.read_text())
    bad["instances"][3]["sha256"] = "0" * 64
    steps: list = []
    monkeypatch.setattr(capacity, "run_wrk", lambda *a, **k: steps.append(a) or {})
    with pytest.raises(capacity.InvalidAnswers, match="wado answers invalid before the step") as e:
        capacity.run_servers([("ours", url, pid)], bad, ["qido", "wado"], [2], 1, 1, tmp_path / "bad", True)
    sop = bad["instances"][3]["sop"]
    assert str(e.value).count(sop) == 1 and "SHA-256 differs" in str(e.value)
    assert steps == []  # stopped before any step, qido's too


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (scripts/test.sh installs it)")
def test_capacity_report_says_what_was_validated(archive, manifest_path, tmp_path):
    """capacity.md says, under each server's table, what was checked beyond wrk's light checks:
    the precheck's counts and problems, and every WADO-RS instance answer validated first."""
    url, pid, _ = archive
    m = json.loads(manifest_path.read_text())
    preload.preload(m, [url], progress=False)
    code = capacity.main(["--host", url, "--server-pid", str(pid), "--manifest", str(manifest_path), "--operations",
                          "wado", "--connections", "2", "--duration", "1", "--quiet", "--output", str(tmp_path)])
    assert code == 0
    md = (tmp_path / "capacity.md").read_text()
    n = len(m["instances"])
    assert (f"Checked: before the load, all {len(m['queries'])} query counts, 20 instances' pixel SHA-256 and 20 "
            f"rendered JPEGs: 0 problem(s); WADO-RS: the answers of all {n} instances fully validated") in md
    assert json.loads((tmp_path / "capacity.json").read_text())["servers"]["ours"]["validated"].startswith("Checked:")


def test_capacity_run_stops_with_an_error_line_when_an_answer_is_wrong(archive, manifest_path, tmp_path, capsys):
    """A data set that does not match what the server answers (here: one SHA-256 changed in the
    manifest) stops the capacity runner before any load, with one "error:" line naming the
    instance and exit status 2 (it was a traceback)."""
    url, pid, _ = archive
    bad = json.loads(manifest_path.read_text())
    preload.preload(bad, [url], progress=False)
    bad["instances"][5]["sha256"] = "f" * 64
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    code = capacity.main(["--host", url, "--server-pid", str(pid), "--manifest", str(path), "--operations",
                          "qido,wado", "--connections", "2", "--duration", "1", "--skip-precheck", "--quiet",
                          "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert bad["instances"][5]["sop"] in line and "SHA-256 differs" in line


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (scripts/test.sh installs it)")
def test_capacity_stow_step_stores_every_request_as_a_new_instance(archive, manifest_path, tmp_path):
    """wrk/load03.lua's STOW-RS mode (the whole request made once, each request joining its
    pieces around a new SOP Instance UID): every answered request is one new instance on the
    server (each UID 44 characters, none twice), none failed."""
    url, pid, _ = archive
    m = json.loads(manifest_path.read_text())
    rows = capacity.run_servers([("ours", url, pid)], m, ["stow"], [2], 2, 2, tmp_path, True, keep_stow=True)
    (r,) = rows["ours"]
    assert r["requests"] > 0 and r["errors"] == 0, r
    # (requests still in flight when wrk stopped may be stored without being counted)
    assert r["requests"] <= r["stored"] <= r["requests"] + 2, r
    sops: list[str] = []
    while True:  # (QIDO-RS answers at most 1,000 matches a page)
        r2 = httpx.get(f"{url}/instances", params={"PatientID": m["stow"]["PatientID"], "offset": len(sops)})
        page = r2.json() if r2.status_code == 200 else []
        sops += [x["00080018"]["Value"][0] for x in page]
        if not page:
            break
    assert len(sops) == len(set(sops)) == r["stored"] and {len(u) for u in sops} == {44}
    common.remove_stow_patient(url, m["stow"]["PatientID"])


def test_a_wrong_answer_is_a_locust_failure_with_its_reason(archive, manifest_path, tmp_path):
    url, _, _ = archive
    m = json.loads(manifest_path.read_text())
    for q in m["queries"]:
        q["expected"] += 1  # every answer now has the "wrong" count
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(m))
    step = run.run_step(url, bad, "qido", 1, 2, tmp_path / "raw", quiet=True)
    assert step["ops"] > 0 and step["errors"] == step["ops"]
    assert any("expected" in reason for reason in step["failure_reasons"])


def test_the_server_is_found_by_its_port(archive, tmp_path):
    url, pid, _ = archive
    assert common.local_server_pid(url) == pid
    assert common.local_server_pid("http://192.0.2.1:8080") is None  # not this machine
    # two workers: uvicorn's parent (whose tree holds both workers), not the one worker listed
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path),
                             "--port", str(port), "--workers", "2", "--log-level", "warning"])
    try:
        deadline = time.monotonic() + 60
        while len(common.process_tree(proc.pid)) < 3 or common.local_server_pid(f"http://127.0.0.1:{port}") is None:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert common.local_server_pid(f"http://127.0.0.1:{port}") == proc.pid
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_busy_machine_is_named_in_the_warning_and_the_summary():
    quiet = {"operation": "qido", "clients": 8, "other_cpu_pct": 3.0, "server_cpu_pct": 150.0,
             "generator_cpu_pct": 40.0}
    busy = {**quiet, "operation": "wado", "other_cpu_pct": 120.0}
    for step in (quiet, busy):
        step["machine_busy"] = run.busy_machine(step["other_cpu_pct"])
    assert (quiet["machine_busy"], busy["machine_busy"], run.busy_machine(None)) == (False, True, None)
    assert run.busy_text(busy) == ("the machine was busy during wado 8: other processes used 120% of a core "
                                   "(server 150%, load generator 40%); its numbers understate the server")
    assert run.busy_summary([quiet]) == "machine quiet (other CPU <= 25% of a core) in every measured step"
    assert run.busy_summary([quiet, busy]).startswith(
        "WARNING: machine busy (other CPU > 25% of a core) in 1 of 2 step(s): wado 8 (120%)")
    unmeasured = {**quiet, "other_cpu_pct": None, "machine_busy": None}
    assert "not measured for some steps" in run.busy_summary([quiet, unmeasured])


@pytest.mark.parametrize("args, message", [
    (["--manifest", "MANIFEST"], "load03: no --host: give the DICOMweb root"),
    (["--host", "URL"], "load03: no manifest: pass --manifest M.json or set LOAD03_MANIFEST"),
    (["--host", "URL", "--manifest", "MISSING"], "load03: cannot read the manifest: [Errno 2]"),
])
def test_locust_refuses_to_start_without_host_or_manifest(archive, manifest_path, tmp_path, args, message):
    """One clear message and exit status 2: no traceback, no idle run."""
    args = [{"URL": archive[0], "MANIFEST": str(manifest_path), "MISSING": str(tmp_path / "no.json")}.get(a, a)
            for a in args]
    env = {k: v for k, v in os.environ.items() if k != "LOAD03_MANIFEST"}
    r = subprocess.run([sys.executable, "-m", "locust", "-f", str(run.LOCUSTFILE), "--headless", "-u", "1",
                        "-t", "30s", *args, "QidoUser"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if line.startswith("load03: ")][:-1] == [
        line for line in r.stderr.splitlines() if line.startswith(message)]
    assert "Traceback" not in r.stderr and "Aggregated" not in r.stdout + r.stderr


# ----------------------------------------------------------------------------- checks


def test_pixel_data_check_on_good_and_broken_answers():
    inst, data = next(dataset.iter_instances(SPEC))
    expected = inst.rows * inst.columns * 2
    b = "xyz"
    body = f"--{b}\r\nContent-Type: application/dicom\r\n\r\n".encode() + data + f"\r\n--{b}--\r\n".encode()
    ct = f'multipart/related; type="application/dicom"; boundary="{b}"'
    s, e = checks.dicom_part(body, ct)
    v = checks.pixel_data(body, s, e, expected)
    assert body[v:v + expected] == inst.pixel_bytes
    with pytest.raises(ValueError, match="length"):
        checks.pixel_data(body, s, e, expected - 2)
    with pytest.raises(ValueError, match="closing boundary"):
        checks.dicom_part(body[:-30], ct)
    two = body.replace(f"\r\n--{b}--".encode(), f"\r\n--{b}\r\n\r\nxx\r\n--{b}--".encode())
    with pytest.raises(ValueError, match="more than one part"):
        checks.dicom_part(two, ct)
    assert checks.dicom_part(data, "application/dicom") == (0, len(data))


def test_jpeg_check_on_good_and_broken_answers():
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.arange(64 * 48, dtype=np.uint8).reshape(48, 64)).save(buf, "JPEG")
    jpeg = buf.getvalue()
    checks.check_jpeg(jpeg, 48, 64)
    checks.check_jpeg(jpeg, 48, 64, full=False)
    with pytest.raises(ValueError, match="expected 32x48"):
        checks.check_jpeg(jpeg, 48, 32)
    with pytest.raises(ValueError, match="EOI"):
        checks.check_jpeg(jpeg[:-100], 48, 64)
    with pytest.raises(ValueError, match="decode"):
        checks.check_jpeg(jpeg[:200] + b"\x00" * 40 + jpeg[-2:], 48, 64)
    with pytest.raises(ValueError, match="SOI"):
        checks.check_jpeg(b"GIF89a", 48, 64)


def test_stow_body_is_a_valid_instance_with_the_uid_filled_in():
    import pydicom

    pieces, ctype = dataset.stow_body_pieces(32)
    uid = dataset.fixed_length_uid()
    body = uid.encode().join(pieces)
    assert "boundary=" in ctype
    s, e = checks.dicom_part(body, ctype)
    ds = pydicom.dcmread(io.BytesIO(body[s:e]))
    assert ds.SOPInstanceUID == uid == ds.file_meta.MediaStorageSOPInstanceUID
    assert ds.PatientID == dataset.STOW_PATIENT_ID and ds.Rows == 32
    assert os.path.basename(run.LOCUSTFILE) == "load03.py"

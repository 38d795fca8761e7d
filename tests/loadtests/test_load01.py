"""A short LOAD-01 run (loadtests/load01.py) against a real ``dicomweb-server serve``
(sqlite, 2 HTTP workers plus the DIMSE listener process): every check passes, and the
spool's per-process lock files are not counted as partial files (they made every run
report 2-3 "partial" files)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port

if importlib.util.find_spec("psutil") is None:
    pytest.skip("the load extra is not installed: pip install -e '.[load]'", allow_module_level=True)

from loadtests import load01, load01_storescu  # noqa: E402


def test_spool_leftovers_are_data_sets_not_the_process_locks(tmp_path):
    tmp = tmp_path / "tmp"
    (tmp / "123-ab" / "dimse").mkdir(parents=True)
    (tmp / "123-ab.lock").touch()  # a live process's spool lock
    (tmp / "456-cd").mkdir()
    (tmp / "456-cd.lock").touch()
    assert load01.spool_leftovers(tmp_path) == []
    (tmp / "123-ab" / "dimse" / "dimse-x1.dcm").write_bytes(b"half")
    (tmp / "456-cd" / "part-2").write_bytes(b"half")
    assert load01.spool_leftovers(tmp_path) == ["123-ab/dimse/dimse-x1.dcm", "456-cd/part-2"]


@pytest.fixture
def serve(tmp_path):
    http, dimse = free_port(), free_port()
    data = tmp_path / "data"
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--port", str(http), "--workers", "2", "--dimse-port", str(dimse),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{http}/studies?limit=1", timeout=2).status_code == 200:
                    load01.wait_port(dimse, 30)
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp_path / "serve.log").read_text()[-2000:])
            time.sleep(0.2)
        yield http, dimse, data
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.parametrize("generator", ["pynetdicom", "storescu"])
def test_a_short_run_passes_every_check(serve, tmp_path, generator, monkeypatch):
    """The same checks with either generator (storescu: one DCMTK process per association)."""
    if generator == "storescu" and not Path("/usr/bin/storescu").exists():
        pytest.skip("DCMTK is not installed (apt-get install dcmtk)")
    http, dimse, data = serve
    stored_before_step = []  # nothing is deleted between steps (file creation after deletions)
    run_step = load01.run_step

    def counting(*args, **kwargs):
        stored_before_step.append(len(httpx.get(f"http://127.0.0.1:{http}/instances", timeout=10).json()))
        return run_step(*args, **kwargs)

    monkeypatch.setattr(load01, "run_step", counting)
    # the live processes' spool locks (the DIMSE listener's and the HTTP workers', each once
    # it has claimed its folder) are there, and are not partial files
    assert len(list((data / "tmp").glob("*.lock"))) >= 2 and load01.spool_leftovers(data) == []
    out = tmp_path / "out"
    rc = load01.main(["--port", str(dimse), "--http", f"http://127.0.0.1:{http}", "--data-dir", str(data),
                      "--associations", "1,2", "--images", "12", "--scale", "0.05", "--processes", "2",
                      "--latency", "3", "--output", str(out), "--generator", generator])
    results = json.loads((out / "results.json").read_text())
    assert rc == 0
    steps = results["steps"]
    assert [s["Step (assocs)"] for s in steps] == [1, 2]
    for s in steps:
        assert s["Operations"] == 12 and s["Errors"] == 0 and s["rejected"] == 0
        assert s["missing/extra/partial"] == "0/0/0"
        assert s["SHA-256 ok"] == "1/1"  # image 0 of the step: every 100th
        assert s["p50 ms"] > 0 and s["Max ms"] < 120_000  # every operation answered, timed
    assert results["latency"]["ours"]["ok"] == 3
    assert stored_before_step == [0, 12]  # step 1's instances still there when step 2 ran
    # the steps' instances and the latency's were removed afterwards
    assert httpx.get(f"http://127.0.0.1:{http}/instances", timeout=10).json() == []


def test_a_rejected_storescu_association_is_counted_as_such():
    """storescu's log of an A-ASSOCIATE-RJ (DCMTK 3.6, the generator's log4cplus pattern): the
    association counts as rejected and each of its images as an error (issue 33: 13 of 64
    associations rejected were only "117 errors" in the step's row)."""
    from loadtests import load01_storescu

    share = {"files": {"/x/a0/000001.dcm": "1.2.3.1", "/x/a0/000002.dcm": "1.2.3.2"}, "bytes": {}, "hashes": {}}
    log = ("1796564155.316 checking input files ...\n1796564155.316 Requesting Association\n"
           "1796564155.358 Association Rejected:\n"
           "1796564155.358 Result: Rejected Transient, Source: Service Provider (Presentation related function)\n"
           "1796564155.358 Reason: Local Limit Exceeded\n")
    out = load01_storescu.parse(log, share)
    assert (out["rejected"], out["errors"], out["sent"]) == (1, 2, [])
    assert load01_storescu.parse("1796564155.316 Requesting Association\n", share)["rejected"] == 0


def test_the_storescp_peer_is_dcmtks_not_pynetdicoms_app_of_that_name(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "storescp"  # what pynetdicom puts in a venv's bin/
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env python\n")
    script.chmod(0o755)
    binary = tmp_path / "usr" / "storescp"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF\x02\x01")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{binary.parent}")
    assert load01.dcmtk("storescp") == str(binary)


def test_peers_take_the_ports_given_in_order_then_ephemeral_ones(monkeypatch):
    """On a shared machine each user keeps to a port range: ``--peer-ports`` hands the peers
    those ports (the peers used to get whatever port the kernel picked)."""
    monkeypatch.setattr(load01, "PEER_PORTS", [28200, 28201])
    assert [load01.free_port(), load01.free_port()] == [28200, 28201]
    assert load01.free_port() not in (28200, 28201, 0)


def test_storescu_gets_the_command_dictionary_only(tmp_path):
    """storescu's start-up without DCMTK's whole data dictionary (half its CPU): the command
    and file meta groups are all it needs (test_a_short_run_passes_every_check sends with it)."""
    if not list(Path("/usr/share").glob("libdcmtk*/dicom.dic")):
        pytest.skip("DCMTK is not installed (apt-get install dcmtk)")
    text = load01_storescu.command_dictionary(tmp_path).read_text()
    tags = [line.split(")")[0] + ")" for line in text.splitlines()]
    assert "(0000,0100)" in tags and "(0000,0900)" in tags and "(0002,0010)" in tags
    assert all(t.startswith(("(0000,", "(0002,")) for t in tags) and 40 < len(tags) < 200


@pytest.mark.parametrize("steps", ["4,64,4", "0,4"])
def test_each_step_once(steps, capsys):
    """A step's SOP Instance UIDs are named by its association count and nothing is deleted
    before the last step: a repeated step would resend instances still stored."""
    with pytest.raises(SystemExit) as e:
        load01.main(["--associations", steps, "--port", "1"])
    assert e.value.code == 2 and "each step once" in capsys.readouterr().err


@pytest.mark.parametrize("rounds", ["3", "0"])
def test_rounds_one_or_even(rounds, capsys):
    """Each order (ours first, the peer first) as often as the other, or one round."""
    with pytest.raises(SystemExit) as e:
        load01.main(["--rounds", rounds, "--port", "1"])
    assert e.value.code == 2 and "1 or an even number" in capsys.readouterr().err


def test_steps_interleave_the_targets_and_rounds_reverse_them():
    """Each step's targets back to back (drift hits both sides alike), the order reversed on
    every other round; each round's instances are new ones (its own name in the UIDs)."""
    assert load01.step_order(["ours", "orthanc"], [1, 4], 1) == [(1, 0, ["ours", "orthanc"]),
                                                                  (4, 0, ["ours", "orthanc"])]
    assert load01.step_order(["ours", "orthanc"], [4], 2) == [(4, 0, ["ours", "orthanc"]),
                                                              (4, 1, ["orthanc", "ours"])]
    assert [load01.step_name(4, r, 1) for r in (0,)] == ["4"]
    assert [load01.step_name(4, r, 2) for r in (0, 1)] == ["4.1", "4.2"]
    job = load01.Job(0, 0)
    uids = {load01._dataset(load01.step_name(4, r, 2), job, 0.05, b"\0" * 64).SOPInstanceUID for r in (0, 1)}
    assert uids == {f"{load01.ROOT}.4.1.1", f"{load01.ROOT}.4.2.1"}


def _step(target, n, rnd, ops, seconds, cpu=None):
    r = load01.StepResult(target, n, round=rnd, operations=ops, seconds=seconds)
    r.server_cpu = cpu
    return r


def test_the_ratio_is_the_geometric_mean_of_the_rounds():
    """Round 0: ours 300/s, the peer 150/s (2.0); round 1: 200 against 200 (1.0): sqrt(2).
    A step whose peer round is missing has no ratio (one round carries the order effect)."""
    results = [_step("ours", 4, 0, 300, 1.0, cpu=150.0), _step("orthanc", 4, 0, 150, 1.0, cpu=100.0),
               _step("orthanc", 4, 1, 200, 1.0, cpu=100.0), _step("ours", 4, 1, 200, 1.0, cpu=150.0),
               _step("ours", 16, 0, 100, 1.0), _step("ours", 16, 1, 100, 1.0), _step("orthanc", 16, 0, 50, 1.0)]
    rows = load01.ratio_rows(results)
    assert rows[0][:6] == ["orthanc", 4, 250.0, 175.0, "1.41x", "2.00 / 1.00"]
    # CPU per image: 150 % over 1 s for 300 and for 200 images: 5.0 and 7.5 ms, mean 6.25
    assert rows[0][6] == pytest.approx(6.25) and rows[0][7] == pytest.approx((100 / 15 + 5.0) / 2)
    assert rows[1][:5] == ["orthanc", 16, 100.0, 50.0, "-"]
    # ours's second round missing (it failed), the peer's there: no ratio either
    rows = load01.ratio_rows([_step("ours", 4, 0, 300, 1.0), _step("orthanc", 4, 0, 150, 1.0),
                              _step("orthanc", 4, 1, 200, 1.0)])
    assert rows[0][:5] == ["orthanc", 4, 300.0, 175.0, "-"]


def test_rounds_with_a_peer_run_interleaved(serve, tmp_path):
    """Two rounds against DCMTK's storescp: ours and the peer alternate within each step,
    every round's images are checked, and the ratio table pairs the rounds."""
    if not Path("/usr/bin/storescp").exists():
        pytest.skip("DCMTK is not installed (apt-get install dcmtk)")
    http, dimse, data = serve
    out = tmp_path / "out"
    rc = load01.main(["--port", str(dimse), "--http", f"http://127.0.0.1:{http}", "--data-dir", str(data),
                      "--associations", "1", "--images", "6", "--scale", "0.05", "--processes", "1",
                      "--latency", "0", "--rounds", "2", "--peer", "storescp", "--output", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert rc == 0
    order = [(s["Target"], s["round"]) for s in results["steps"]]
    assert order == [("ours", 0), ("storescp", 0), ("storescp", 1), ("ours", 1)]
    for s in results["steps"]:
        assert s["Operations"] == 6 and s["Errors"] == 0 and s["missing/extra/partial"] == "0/0/0"
    (ratio,) = results["ratios"]
    assert ratio["Peer"] == "storescp" and ratio["Step (assocs)"] == 1 and ratio["ours / peer"].endswith("x")
    assert len(ratio["per round"].split(" / ")) == 2
    assert "Ours / peer" in (out / "results.md").read_text()
    assert httpx.get(f"http://127.0.0.1:{http}/instances", timeout=10).json() == []  # both rounds removed

"""The ``dicomweb`` command line against the fake server."""
from __future__ import annotations

import functools
import json

import httpx
import pydicom
import pytest

from dicomweb_client import DICOMwebClient, cli

from .conftest import sample_path
from .fakeserver import FAKE_URL


@pytest.fixture
def run(archive, monkeypatch, capsys):
    """run(*argv) -> (exit status, parsed stdout or text, stderr)."""
    monkeypatch.setattr(
        cli, "DICOMwebClient", functools.partial(DICOMwebClient, transport=httpx.MockTransport(archive.handler))
    )

    def _run(*argv):
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        try:
            return status, json.loads(out), err
        except ValueError:
            return status, out, err

    return _run


def test_store_search_retrieve(run, archive, tmp_path):
    ct, mr = sample_path("CT_small.dcm"), sample_path("MR_small.dcm")
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "mr.dcm").write_bytes(mr.read_bytes())
    status, out, _ = run("store", FAKE_URL, str(ct), str(folder), "--token", "t0k")
    assert status == 0 and out["status"] == 200 and len(out["referenced"]) == 2
    assert archive.last().headers["authorization"] == "Bearer t0k"

    ds = pydicom.dcmread(ct)
    status, out, _ = run(
        "search", FAKE_URL, "--filter", f"PatientID={ds.PatientID}", "--field", "StudyDescription", "--field", "00081030", "--limit", "5"
    )
    assert status == 0 and [s["0020000D"]["Value"][0] for s in out] == [ds.StudyInstanceUID]
    assert archive.last().url.params.get_list("includefield") == ["StudyDescription", "00081030"]

    status, out, _ = run("search", FAKE_URL, "--level", "series", "--study", ds.StudyInstanceUID, "--all")
    assert status == 0 and len(out) == 1
    status, out, _ = run("search", FAKE_URL, "--level", "instances", "--user", "u:p", "--header", "X-A: b")
    assert status == 0 and len(out) == 2
    assert archive.last().headers["authorization"].startswith("Basic ") and archive.last().headers["x-a"] == "b"

    outdir = tmp_path / "out"
    status, out, _ = run("retrieve", FAKE_URL, "--study", ds.StudyInstanceUID, "--out", str(outdir))
    assert status == 0 and out["written"] == 1
    written = outdir / f"{ds.SOPInstanceUID}.dcm"
    assert written.read_bytes() == ct.read_bytes()
    status, out, _ = run(
        "retrieve", FAKE_URL, "--study", ds.StudyInstanceUID, "--series", ds.SeriesInstanceUID, "--out", str(outdir)
    )
    assert status == 0 and out["written"] == 1
    status, out, _ = run(
        "retrieve", FAKE_URL, "--study", ds.StudyInstanceUID, "--series", ds.SeriesInstanceUID,
        "--instance", ds.SOPInstanceUID, "--out", str(outdir / "one"),
    )
    assert status == 0 and (outdir / "one" / f"{ds.SOPInstanceUID}.dcm").exists()


def test_store_partial_and_total_failure(run, archive):
    ct = pydicom.dcmread(sample_path("CT_small.dcm"))
    status, out, _ = run("store", FAKE_URL, str(sample_path("CT_small.dcm")), str(sample_path("MR_small.dcm")), "--study", ct.StudyInstanceUID)
    assert status == 2 and out["status"] == 202 and out["failed"][0]["failure_reason"] == 0xA900
    status, out, err = run("store", FAKE_URL, str(sample_path("MR_small.dcm")), "--study", "1.2.3")
    assert status == 1 and out["status"] == 409 and "409" in err


def test_errors_are_reported(run, archive, tmp_path):
    status, out, err = run("retrieve", FAKE_URL, "--study", "9.9.9", "--out", str(tmp_path))
    assert status == 1 and "404" in err
    status, out, err = run("store", FAKE_URL, str(tmp_path / "missing.dcm"))
    assert status == 1 and "missing.dcm" in err
    with pytest.raises(SystemExit):
        run("search", FAKE_URL, "--filter", "novalue")
    with pytest.raises(SystemExit):
        run("retrieve", FAKE_URL, "--study", "1", "--instance", "2", "--out", str(tmp_path))

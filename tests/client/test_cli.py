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
        "search", FAKE_URL, "--filter", f"PatientID={ds.PatientID}", "--field", "StudyDescription", "--field", "00081030", "--limit", "5", "--json"
    )
    assert status == 0 and [s["0020000D"]["Value"][0] for s in out] == [ds.StudyInstanceUID]
    assert archive.last().url.params.get_list("includefield") == ["StudyDescription", "00081030"]

    status, out, _ = run("search", FAKE_URL, "--level", "series", "--study", ds.StudyInstanceUID, "--all", "--json")
    assert status == 0 and len(out) == 1
    status, out, _ = run("search", FAKE_URL, "--level", "instances", "--user", "u:p", "--header", "X-A: b", "--json")
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


def test_search_prints_a_table_and_json_on_request(run, archive):
    """Issue 15 item 8: a table of studies by default, the server's DICOM JSON with --json."""
    from dicomweb_client.tables import format_table

    ct = pydicom.dcmread(sample_path("CT_small.dcm"))
    archive.add_file(str(sample_path("CT_small.dcm")))
    status, out, _ = run("search", FAKE_URL)
    assert status == 0
    assert archive.last().url.params.get_list("includefield") == [
        "StudyDescription", "NumberOfStudyRelatedSeries", "NumberOfStudyRelatedInstances"]
    assert out.splitlines()[0].split() == ["Patient", "Date", "Modalities", "Description", "Series", "Instances",
                                           "StudyInstanceUID"]
    assert out.splitlines()[1].split() == ["CompressedSamples,", "CT1", "(1CT1)", "2004-01-19", "CT", "e+1", "1",
                                           ct.StudyInstanceUID]
    assert out.splitlines()[-1] == "1 study"
    status, out, _ = run("search", FAKE_URL, "--json")
    assert status == 0 and out[0]["0020000D"]["Value"] == [ct.StudyInstanceUID]
    assert archive.last().url.params.get_list("includefield") == []

    study = {
        "00100010": {"vr": "PN", "Value": [{"Alphabetic": "Doe^Jane^M"}]}, "00100020": {"vr": "LO", "Value": ["P7"]},
        "00080020": {"vr": "DA", "Value": ["20240229"]}, "00080061": {"vr": "CS", "Value": ["CT", "SR"]},
        "00081030": {"vr": "LO", "Value": ["Chest\nwith contrast " + "x" * 40]},
        "00201206": {"vr": "IS", "Value": [2]}, "00201208": {"vr": "IS", "Value": [31]},
        "0020000D": {"vr": "UI", "Value": ["1.2.3"]},
    }
    assert format_table([study, {}], "studies") == (
        "Patient           Date        Modalities  Description                       Series  Instances  StudyInstanceUID\n"
        "Doe, Jane M (P7)  2024-02-29  CT/SR       Chest with contrast xxxxxxxxxxx…  2       31         1.2.3\n"
        "\n"
        "2 studies\n"
    )
    instance = {"00080016": {"vr": "UI", "Value": ["1.2.840.10008.5.1.4.1.1.2"]}, "00200013": {"vr": "IS", "Value": [4]},
                "00280010": {"vr": "US", "Value": [8]}, "00280011": {"vr": "US", "Value": [6]},
                "00280008": {"vr": "IS", "Value": [3]}, "00080018": {"vr": "UI", "Value": ["1.2.4"]}}
    assert format_table([instance], "instances").splitlines()[1].split() == ["4", "CT", "Image", "Storage", "6x8", "x3", "1.2.4"]
    # --field values become columns, by keyword or tag
    status, out, _ = run("search", FAKE_URL, "--field", "PatientSex", "--field", "00200010")
    assert archive.last().url.params.get_list("includefield")[:2] == ["PatientSex", "00200010"]
    header, row = out.splitlines()[:2]
    assert header.split()[-3:] == ["PatientSex", "00200010", "StudyInstanceUID"]
    assert row.split()[-3:] == ["O", "1CT1", ct.StudyInstanceUID]


def test_a_resource_url_is_taken_apart(run, archive, tmp_path):
    """Issue 26 item 9: a URL copied from a browser (``.../studies``, a study's URL) asked
    ``/studies/studies``; the service root or any resource URL under it works, and the
    URL's level and UIDs stand for --level, --study, --series, --instance."""
    ct = pydicom.dcmread(sample_path("CT_small.dcm"))
    archive.add_file(str(sample_path("CT_small.dcm")))
    study, series, sop = ct.StudyInstanceUID, ct.SeriesInstanceUID, ct.SOPInstanceUID
    status, out, _ = run("search", f"{FAKE_URL}/studies", "--json")
    assert status == 0 and archive.last().url.path.endswith("/studies") and "/studies/studies" not in str(
        archive.last().url)
    assert [s["0020000D"]["Value"][0] for s in out] == [study]
    status, out, _ = run("search", f"{FAKE_URL}/studies/{study}/series/", "--json")
    assert status == 0 and archive.last().url.path.endswith(f"/studies/{study}/series")
    assert [s["0020000E"]["Value"][0] for s in out] == [series]
    status, out, _ = run("search", f"{FAKE_URL}/instances?PatientID=x", "--json")
    assert status == 0 and archive.last().url.path.endswith("/instances") and len(out) == 1
    status, out, _ = run("retrieve", f"{FAKE_URL}/studies/{study}/series/{series}/instances/{sop}",
                         "--out", str(tmp_path / "one"))
    assert status == 0 and (tmp_path / "one" / f"{sop}.dcm").read_bytes() == sample_path("CT_small.dcm").read_bytes()
    assert archive.last().url.path.endswith(f"/studies/{study}/series/{series}/instances/{sop}")
    status, out, _ = run("retrieve", f"{FAKE_URL}/studies/{study}/metadata", "--out", str(tmp_path / "all"))
    assert status == 0 and out["written"] == 1
    with pytest.raises(SystemExit, match="the URL names study"):
        run("retrieve", f"{FAKE_URL}/studies/{study}", "--study", "1.2.3", "--out", str(tmp_path))
    with pytest.raises(SystemExit, match="retrieve needs --study"):
        run("retrieve", FAKE_URL, "--out", str(tmp_path))


def test_split_resource_url():
    from dicomweb_client.urls import split_resource_url

    assert split_resource_url("http://h:8080") == ("http://h:8080", {})
    assert split_resource_url("http://h:8080/dicomweb/") == ("http://h:8080/dicomweb", {})
    assert split_resource_url("http://h/dicomweb/studies") == ("http://h/dicomweb", {"level": "studies"})
    assert split_resource_url("http://h/studies/1.2/series/3.4/instances?x=1#f") == (
        "http://h", {"study": "1.2", "series": "3.4", "level": "instances"})
    assert split_resource_url("http://h/p/studies/1.2/series/3.4/instances/5.6") == (
        "http://h/p", {"study": "1.2", "series": "3.4", "instance": "5.6"})
    assert split_resource_url("http://h/studies/1.2/instances") == ("http://h", {"study": "1.2", "level": "instances"})

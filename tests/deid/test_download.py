"""De-identified downloads (deid/download.py): ``GET /studies/{study}/archive?deidentify=
basic&project=NAME`` and ``/export/metadata?deidentify=...``. Known instances in; out: a
ZIP whose members dcmread, with no original identity anywhere in its bytes, the same UIDs
and pseudonym as ``dicomweb-server export --deidentify`` gives for the project, a DICOMDIR
whose records name the members' new UIDs, pixel data byte-identical, the burned-in
instance left out and named in DEIDENTIFICATION.json unless allowed."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import orjson
import pydicom
import pytest
from pydicom.fileset import FileSet
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.cli import main
from dicomweb_server.deid.apply import date_offset, shift_date
from dicomweb_server.deid.pseudonyms import generated_pseudonym
from dicomweb_server.deid.uids import new_uid
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, store_datasets

MRN, NAME = "MRN-771234", "Doe^Johnathan"
STUDY = "1.2.826.0.1.3680043.8.498.77.1"
OPTION = "retain_modified_dates"


@pytest.fixture
def stored(tmp_path):
    """One study of patient MRN-771234: two CT images in two series (one with a private
    element naming the patient) and a US image with burned-in annotation; the project
    trial-a made by a folder export (its folder is the reference the ZIP must equal)."""
    data = tmp_path / "data"
    archive = Archive.open(Settings(data_dir=data, index="sqlite"))
    common = {"PatientID": MRN, "PatientName": NAME, "StudyDate": "20240110", "AccessionNumber": "ACC-9931",
              "InstitutionName": "General Hospital"}
    ct1 = make_dataset(study=STUDY, series=STUDY + ".1", sop=STUDY + ".1.1", InstanceNumber=1, **common)
    ct1.add_new(0x00090010, "LO", "ACME 1.0")
    ct1.add_new(0x00091001, "LO", f"{NAME} {MRN}")
    ct2 = make_dataset(study=STUDY, series=STUDY + ".2", sop=STUDY + ".2.1", InstanceNumber=1, rows=9, **common)
    us = make_dataset(study=STUDY, series=STUDY + ".3", sop=STUDY + ".3.1", modality="US", BurnedInAnnotation="YES",
                      **common)
    originals = {str(ds.SOPInstanceUID): ds for ds in (ct1, ct2, us)}
    store_datasets(archive, [ct1, ct2, us])
    archive.close()
    folder = tmp_path / "folder"
    assert main(["export", "--data-dir", str(data), "--index", "sqlite", "--deidentify", f"basic,{OPTION}",
                 "--project", "trial-a", "--quiet", "--to", str(folder), STUDY]) == 1  # the US one refused
    archive = Archive.open(Settings(data_dir=data, index="sqlite"))
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c, originals, folder
    archive.close()


def _members(content: bytes, tmp_path: Path) -> tuple[dict[str, pydicom.Dataset], dict, FileSet]:
    zf = zipfile.ZipFile(io.BytesIO(content))
    assert zf.testzip() is None
    names = zf.namelist()
    assert names[-2:] == ["DEIDENTIFICATION.json", "DICOMDIR"]
    files = {name: pydicom.dcmread(io.BytesIO(zf.read(name))) for name in names[:-2]}
    zf.extractall(tmp_path)
    return files, orjson.loads(zf.read("DEIDENTIFICATION.json")), FileSet(pydicom.dcmread(tmp_path / "DICOMDIR"))


def test_deidentified_zip_matches_the_folder_export_and_its_dicomdir(stored, tmp_path):
    c, originals, folder = stored
    r = c.get(f"/studies/{STUDY}/archive", params={"deidentify": "basic", "project": "trial-a", "option": OPTION})
    assert r.status_code == 200, r.text
    for identity in (MRN, "Doe", "Johnathan", "ACC-9931", "General Hospital", STUDY):
        assert identity.encode() not in r.content, identity  # anywhere: files, DICOMDIR, report
    files, report, fs = _members(r.content, tmp_path / "a")

    secret = c.app.state.archive.pseudonyms.secret("trial-a")
    psn, days = generated_pseudonym(secret, MRN), date_offset(secret, MRN)
    uids = {(str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID), str(ds.SOPInstanceUID)) for ds in files.values()}
    exported = [pydicom.dcmread(p) for p in folder.rglob("*.dcm")]
    # the same UIDs as `dicomweb-server export --deidentify` for the project
    assert uids == {(str(d.StudyInstanceUID), str(d.SeriesInstanceUID), str(d.SOPInstanceUID)) for d in exported}
    assert uids == {(new_uid(secret, STUDY), new_uid(secret, STUDY + f".{k}"), new_uid(secret, STUDY + f".{k}.1"))
                    for k in (1, 2)}
    for ds in files.values():
        assert ds.PatientID == psn and ds.PatientName == psn and ds.StudyDate == shift_date("20240110", days)
        assert ds.PatientIdentityRemoved == "YES" and not any(e.tag.is_private for e in ds)
        original = next(o for o in originals.values() if new_uid(secret, o.SOPInstanceUID) == ds.SOPInstanceUID)
        assert ds.PixelData == original.PixelData  # byte-identical
        assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID

    # the DICOMDIR's records name the members' new UIDs, pseudonym and shifted date
    [patient] = fs._tree.children
    assert patient._record.PatientID == psn and patient._record.PatientName == psn
    [study] = patient.children
    assert study._record.StudyInstanceUID == new_uid(secret, STUDY)
    assert study._record.StudyDate == shift_date("20240110", days)
    by_name = {"/".join(inst.node._record.ReferencedFileID): inst for inst in fs}
    assert set(by_name) == set(files)
    for name, inst in by_name.items():
        assert inst.SOPInstanceUID == files[name].SOPInstanceUID
        assert inst.node.parent._record.SeriesInstanceUID == files[name].SeriesInstanceUID

    # the burned-in US image: left out, named by its new UIDs in the report
    assert report["project"] == "trial-a" and report["options"] == [OPTION] and report["written"] == 2
    assert report["left_out"] == [{"study": new_uid(secret, STUDY), "series": new_uid(secret, STUDY + ".3"),
                                   "sop": new_uid(secret, STUDY + ".3.1"), "outcome": "refused",
                                   "reason": "BurnedInAnnotation (0028,0301) is YES"}]


def test_burned_in_passes_when_allowed_and_series_and_query_downloads(stored, tmp_path):
    c, originals, _ = stored
    secret = c.app.state.archive.pseudonyms.secret("trial-a")
    params = {"deidentify": "basic", "project": "trial-a", "allow_burned_in": "true"}
    r = c.get(f"/studies/{STUDY}/series/{STUDY}.3/archive", params=params)
    assert r.status_code == 200, r.text
    files, report, _ = _members(r.content, tmp_path / "s")
    [us] = files.values()
    assert us.SOPInstanceUID == new_uid(secret, STUDY + ".3.1") and us.BurnedInAnnotation == "YES"
    assert us.PixelData == originals[STUDY + ".3.1"].PixelData
    assert (report["written"], report["left_out"], report["allow_burned_in"]) == (1, [], True)
    assert MRN.encode() not in r.content
    # a QIDO-RS query download: the same instances, the same new UIDs
    r = c.get("/archive", params={"PatientID": MRN, **params})
    files, report, _ = _members(r.content, tmp_path / "q")
    assert sorted(str(d.SOPInstanceUID) for d in files.values()) == sorted(
        new_uid(secret, s) for s in originals)


def test_deidentified_metadata_export_agrees_with_the_zip(stored):
    c, originals, _ = stored
    secret = c.app.state.archive.pseudonyms.secret("trial-a")
    params = {"StudyInstanceUID": STUDY, "deidentify": "basic", "project": "trial-a", "option": OPTION}
    r = c.get("/export/metadata", params=params)
    assert r.status_code == 200, r.text
    for identity in (MRN, "Doe", "ACC-9931", STUDY, "BulkDataURI"):
        assert identity.encode() not in r.content, identity
    lines = [orjson.loads(line) for line in r.content.splitlines()]
    # every instance (no pixels here: burned-in text does not matter), under the new UIDs
    assert sorted(o["00080018"]["Value"][0] for o in lines) == sorted(new_uid(secret, s) for s in originals)
    psn, days = generated_pseudonym(secret, MRN), date_offset(secret, MRN)
    assert {o["00100020"]["Value"][0] for o in lines} == {psn}
    assert {o["00080020"]["Value"][0] for o in lines} == {shift_date("20240110", days)}
    flat = [orjson.loads(line) for line in c.get("/export/metadata", params={**params, "format": "flat"}).content
            .splitlines()]
    assert {o["PatientName"] for o in flat} == {psn} and "PixelData" not in flat[0]


def test_bad_deidentify_parameters_are_refused(stored):
    c, _, _ = stored
    url = f"/studies/{STUDY}/archive"
    r = c.get(url, params={"deidentify": "strict", "project": "trial-a"})
    assert r.status_code == 400 and "'strict' is not available (available: basic)" in r.text
    r = c.get(url, params={"deidentify": "basic"})
    assert r.status_code == 400 and "needs project=NAME" in r.text
    r = c.get(url, params={"deidentify": "basic", "project": "nobody"})
    assert r.status_code == 400 and "no de-identification project 'nobody'" in r.text
    assert "nobody" not in c.app.state.archive.pseudonyms.projects()  # a download makes no project
    r = c.get(url, params={"deidentify": "basic", "project": "trial-a", "option": "retain_everything"})
    assert r.status_code == 400 and "unknown de-identification option 'retain_everything'" in r.text
    r = c.get(url, params={"deidentify": "basic", "project": "trial-a", "allow_burned_in": "maybe"})
    assert r.status_code == 400 and "allow_burned_in" in r.text
    r = c.get("/export/metadata", params={"deidentify": "basic", "project": "nobody"})
    assert r.status_code == 400


def test_walk_through_admin_makes_a_project_a_download_fills_its_table(stored, tmp_path):
    """docs/research-export.md: an empty CSV makes the project; the download records
    the patient's pseudonym; the admin's table lists it."""
    c, _, _ = stored
    r = c.post("/admin/deid/lung-ai/pseudonyms", content=b"")
    assert r.status_code == 200 and r.json() == {"project": "lung-ai", "added": 0}
    assert c.get("/admin/deid/lung-ai/pseudonyms").json()["pseudonyms"] == []
    r = c.get(f"/studies/{STUDY}/archive", params={"deidentify": f"basic,{OPTION}", "project": "lung-ai"})
    assert r.status_code == 200
    files, report, _ = _members(r.content, tmp_path / "w")
    secret = c.app.state.archive.pseudonyms.secret("lung-ai")
    assert {str(d.PatientID) for d in files.values()} == {generated_pseudonym(secret, MRN)}
    assert report["options"] == [OPTION] and len(files) == 2
    assert c.get("/admin/deid/lung-ai/pseudonyms").json()["pseudonyms"] == [
        {"PatientID": MRN, "pseudonym": generated_pseudonym(secret, MRN), "source": "generated"}]


def test_an_unreadable_file_is_left_out_never_sent_as_stored(stored, tmp_path):
    c, _, _ = stored
    archive = c.app.state.archive
    [loc] = archive.index.instances(STUDY, STUDY + ".2")
    path = archive.blobs.source(loc.path)
    path.write_bytes(b"\0" * path.stat().st_size)  # damaged behind the index's back (same size)
    r = c.get(f"/studies/{STUDY}/archive", params={"deidentify": "basic", "project": "trial-a"})
    assert r.status_code == 200
    files, report, _ = _members(r.content, tmp_path / "f")
    secret = archive.pseudonyms.secret("trial-a")
    assert [str(d.SOPInstanceUID) for d in files.values()] == [new_uid(secret, STUDY + ".1.1")]
    [failed] = [x for x in report["left_out"] if x["outcome"] == "failed"]
    assert failed["sop"] == new_uid(secret, STUDY + ".2.1") and failed["reason"].startswith("InvalidDicomError")


def test_an_instance_without_pixel_data_is_written(stored, tmp_path):
    c, _, _ = stored
    archive = c.app.state.archive
    store_datasets(archive, [make_dataset(study="1.2.826.0.1.3680043.8.498.78", pixels=False, PatientID=MRN)])
    r = c.get("/studies/1.2.826.0.1.3680043.8.498.78/archive", params={"deidentify": "basic", "project": "trial-a"})
    files, report, _ = _members(r.content, tmp_path / "n")
    assert (len(files), report["written"], report["left_out"]) == (1, 1, [])
    assert "PixelData" not in next(iter(files.values()))

"""``dicomweb-server export --deidentify``: studies chosen by QIDO-RS keys, de-identified
into a folder; UIDs consistent across studies of one patient and across exports,
references that resolve, one date offset per patient, pseudonyms (generated and from a
CSV), burned-in refusal in the report, pixel data byte-identical."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydicom import dcmread
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from dicomweb_server.archive import Archive
from dicomweb_server.cli import main
from dicomweb_server.deid.apply import date_offset, shift_date
from dicomweb_server.deid.pseudonyms import Pseudonyms, generated_pseudonym
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, store_datasets

FOR = "1.2.826.0.1.3680043.8.498.1"  # a frame of reference shared by both studies of patient P1


@pytest.fixture(params=["sqlite", "memory"])
def archive_dir(request, tmp_path):
    """Two studies of patient P1 (the second's image references the first's), one of P2,
    one US image with burned-in annotation (P3)."""
    data = tmp_path / "data"
    archive = Archive.open(Settings(data_dir=data, index=request.param))
    a1 = make_dataset(study="1.2.3.1", series="1.2.3.1.1", sop="1.2.3.1.1.1", PatientID="P1",
                      PatientName="Doe^John", StudyDate="20240110", FrameOfReferenceUID=FOR,
                      InstitutionName="General Hospital", AccessionNumber="ACC1")
    a2 = make_dataset(study="1.2.3.2", series="1.2.3.2.1", sop="1.2.3.2.1.1", PatientID="P1",
                      PatientName="Doe^John", StudyDate="20240301", FrameOfReferenceUID=FOR)
    ref = Dataset()
    ref.ReferencedSOPClassUID = a1.SOPClassUID
    ref.ReferencedSOPInstanceUID = a1.SOPInstanceUID
    a2.ReferencedImageSequence = Sequence([ref])
    b = make_dataset(study="1.2.3.3", PatientID="P2", PatientName="Roe^Jane", StudyDate="20240110")
    b.add_new(0x00090010, "LO", "ACME 1.0")
    b.add_new(0x00091001, "LO", "Roe secret")
    b.add_new(0x00091002, "DS", "2.5")
    us = make_dataset(study="1.2.3.4", PatientID="P3", modality="US", BurnedInAnnotation="YES")
    store_datasets(archive, [a1, a2, b, us])
    archive.close()
    return request.param, data




def _read(folder: Path) -> dict[str, Dataset]:
    """The exported files by their PatientID (pseudonym) and StudyDate."""
    return {f"{ds.PatientID}:{ds.StudyDate}": ds for ds in (dcmread(p) for p in sorted(folder.rglob("*.dcm")))}


def test_export_two_studies_of_a_patient_twice(archive_dir, tmp_path, capsys):
    index, data = archive_dir
    base = ["export", "--data-dir", str(data), "--index", index, "--deidentify", "basic,retain_modified_dates",
            "--project", "trial-a"]
    assert main(base + ["--to", str(tmp_path / "one"), "PatientID=P1"]) == 0
    out = capsys.readouterr()
    report = orjson.loads(out.out)
    assert (report["studies"], report["instances"], report["exported"], report["refused"]) == (2, 2, 2, 0)
    assert "de-identified 2/2 instance(s)" in out.err
    assert main(base + ["--to", str(tmp_path / "two"), "PatientID=P1"]) == 0
    capsys.readouterr()

    one, two = _read(tmp_path / "one"), _read(tmp_path / "two")
    secret = Pseudonyms.sqlite(data / ("index.sqlite" if index == "sqlite" else "outbox.sqlite")).secret("trial-a")
    psn = generated_pseudonym(secret, "P1")
    days = date_offset(secret, "P1")
    first, second = one[f"{psn}:{shift_date('20240110', days)}"], one[f"{psn}:{shift_date('20240301', days)}"]
    assert first.PatientName == psn and first.PatientIdentityRemoved == "YES"
    # the same new UIDs in both exports; both studies keep their shared frame of reference
    assert sorted(one) == sorted(two)
    for k in one:
        assert one[k].SOPInstanceUID == two[k].SOPInstanceUID and one[k].StudyInstanceUID == two[k].StudyInstanceUID
    assert first.FrameOfReferenceUID == second.FrameOfReferenceUID != FOR
    assert first.StudyInstanceUID != second.StudyInstanceUID and first.StudyInstanceUID.startswith("2.25.")
    # the reference resolves to the exported first study's instance
    assert second.ReferencedImageSequence[0].ReferencedSOPInstanceUID == first.SOPInstanceUID
    assert first.file_meta.MediaStorageSOPInstanceUID == first.SOPInstanceUID
    assert "InstitutionName" in first and first.InstitutionName == "ANONYMIZED" and first.AccessionNumber == ""
    # pixel data byte-identical
    assert first.PixelData == make_dataset().PixelData
    # the file path is under the new UIDs
    path = tmp_path / "one" / first.StudyInstanceUID / first.SeriesInstanceUID / f"{first.SOPInstanceUID}.dcm"
    assert path.exists()


def test_pseudonym_csv_and_burned_in_refusal(archive_dir, tmp_path, capsys):
    index, data = archive_dir
    csv = tmp_path / "p.csv"
    csv.write_text("PatientID,pseudonym\nP2,SUBJ-002\nP3,SUBJ-003\n")
    base = ["export", "--data-dir", str(data), "--index", index, "--deidentify", "basic", "--project", "trial-b",
            "--quiet", "--pseudonyms", str(csv)]
    assert main(base + ["--to", str(tmp_path / "out"), "StudyInstanceUID=1.2.3.3\\1.2.3.4"]) == 1  # some refused
    out = capsys.readouterr()
    report = orjson.loads(out.out)
    assert "2 pseudonym(s) added to project 'trial-b'" in out.err
    assert (report["exported"], report["refused"], report["failed"]) == (1, 1, 0)
    assert report["problems"] == [{"study": "1.2.3.4", "series": report["problems"][0]["series"],
                                   "sop": report["problems"][0]["sop"], "outcome": "refused",
                                   "reason": "BurnedInAnnotation (0028,0301) is YES"}]
    (ds,) = [dcmread(p) for p in (tmp_path / "out").rglob("*.dcm")]
    assert ds.PatientID == "SUBJ-002" and ds.PatientName == "SUBJ-002" and ds.StudyDate == ""
    assert ds.LongitudinalTemporalInformationModified == "REMOVED"
    assert not any(e.tag.is_private for e in ds)
    # Retain Safe Private keeps what the safe list names, nothing else
    assert main(base + ["--to", str(tmp_path / "safe"), "--option", "retain_safe_private",
                        "--safe-private", "ACME 1.0:0009:02", "1.2.3.3"]) == 0
    capsys.readouterr()
    (ds,) = [dcmread(p) for p in (tmp_path / "safe").rglob("*.dcm")]
    assert [(int(e.tag), e.value) for e in ds if e.tag.is_private] == [(0x00090010, "ACME 1.0"), (0x00091002, 2.5)]
    # with the explicit option the burned-in image passes
    assert main(base + ["--to", str(tmp_path / "all"), "--allow-burned-in", "1.2.3.4"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert (report["exported"], report["refused"]) == (1, 0)
    (us,) = [dcmread(p) for p in (tmp_path / "all").rglob("*.dcm")]
    assert us.PatientID == "SUBJ-003" and us.BurnedInAnnotation == "YES"


def test_bad_arguments(archive_dir, tmp_path, capsys):
    index, data = archive_dir
    base = ["export", "--data-dir", str(data), "--index", index, "--to", str(tmp_path / "x")]
    assert main(base + ["--deidentify", "strict", "--project", "p"]) == 2
    assert "unknown de-identification profile 'strict'" in capsys.readouterr().err
    assert main(base + ["--deidentify", "basic", "--project", "p", "--safe-private", "ACME:0009"]) == 2
    assert "--safe-private: safe private element 'ACME:0009'" in capsys.readouterr().err
    assert main(base + ["--deidentify", "basic"]) == 2
    assert "--project NAME" in capsys.readouterr().err
    assert main(base + ["--deidentify", "basic", "--project", "p", "Nonsense=1"]) == 2
    assert main(base + ["PatientID=P1"]) == 2  # filters only with --deidentify
    assert "QIDO-RS filters only with --deidentify" in capsys.readouterr().err

"""dicom/dicomdir.py: the DICOMDIR of a downloaded File-set (PS3.10 §7.2, §8;
PS3.3 Annex F), read back by pydicom's FileSet (its offsets) and compared with
pydicom's own encoding of the records."""

from __future__ import annotations

import pytest
from pydicom import dcmread
from pydicom.fileset import FileSet

from dicomweb_server.dicom.dicomdir import DicomDir, _encoded, _record, image_record


def _item(patient: str, study: str, series: str, sop: str, number: int) -> dict:
    return {"00100020": {"vr": "LO", "Value": [patient]}, "00100010": {"vr": "PN", "Value": [{"Alphabetic": "A^B"}]},
            "0020000D": {"vr": "UI", "Value": [study]}, "0020000E": {"vr": "UI", "Value": [series]},
            "00080018": {"vr": "UI", "Value": [sop]}, "00080016": {"vr": "UI", "Value": ["1.2.840.10008.5.1.4.1.1.4"]},
            "00200013": {"vr": "IS", "Value": [number]}, "00080060": {"vr": "CS", "Value": ["MR"]},
            "00200011": {"vr": "IS", "Value": [3]}, "00200010": {"vr": "SH", "Value": ["S1"]}}


@pytest.mark.parametrize("sop, ts, number", [
    ("1.2.3.45", "1.2.840.10008.1.2.4.50", 7),  # odd lengths: padded
    ("1.2.3.4", "1.2.840.10008.1.2.1", "12"),  # even
    ("2.25.123456789012345678901234567890123456789", "1.2.840.10008.1.2", 123456),
])
def test_image_records_are_the_bytes_pydicom_writes(sop, ts, number):
    file_id = ["DICOM", "P0000001", "S0000001", "SE000001", "I0000001"]
    r = _record("IMAGE")
    r.InstanceNumber = number
    r.ReferencedFileID = file_id
    r.ReferencedSOPClassUIDInFile = "1.2.840.10008.5.1.4.1.1.2"
    r.ReferencedSOPInstanceUIDInFile = sop
    r.ReferencedTransferSyntaxUIDInFile = ts
    assert image_record(file_id, "1.2.840.10008.5.1.4.1.1.2", sop, ts, number) == _encoded(r)


def test_records_link_up_as_pydicoms_file_set_reads_them(tmp_path):
    d = DicomDir()
    names = []
    # instances of two patients, interleaved: the tree groups them, the File IDs follow it
    for k, (patient, study, series) in enumerate([("A", "1.1", "1.1.1"), ("B", "2.1", "2.1.1"), ("A", "1.1", "1.1.2"),
                                                  ("A", "1.2", "1.2.1"), ("A", "1.1", "1.1.1")]):
        names.append(d.add(_item(patient, study, series, f"9.{k}", k + 1), "1.2.840.10008.1.2.1"))
    assert names == ["DICOM/P0000001/S0000001/SE000001/I0000001", "DICOM/P0000002/S0000001/SE000001/I0000001",
                     "DICOM/P0000001/S0000001/SE000002/I0000001", "DICOM/P0000001/S0000002/SE000001/I0000001",
                     "DICOM/P0000001/S0000001/SE000001/I0000002"]
    (tmp_path / "DICOMDIR").write_bytes(d.encode())
    with pytest.warns(UserWarning):  # (the files themselves are not there)
        fs = FileSet(dcmread(tmp_path / "DICOMDIR"))
    tree = [(p._record.PatientID, [(s._record.StudyInstanceUID, [(se._record.SeriesInstanceUID,
             [(i._record.ReferencedSOPInstanceUIDInFile, "/".join(i._record.ReferencedFileID), i._record.InstanceNumber)
              for i in se.children]) for se in s.children]) for s in p.children]) for p in fs._tree.children]
    assert tree == [
        ("A", [("1.1", [("1.1.1", [("9.0", names[0], 1), ("9.4", names[4], 5)]), ("1.1.2", [("9.2", names[2], 3)])]),
               ("1.2", [("1.2.1", [("9.3", names[3], 4)])])]),
        ("B", [("2.1", [("2.1.1", [("9.1", names[1], 2)])])]),
    ]
    ds = dcmread(tmp_path / "DICOMDIR")
    assert ds.file_meta.MediaStorageSOPClassUID == "1.2.840.10008.1.3.10"
    assert ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.1"
    assert ds.FileSetConsistencyFlag == 0


def test_an_empty_file_set_has_no_records(tmp_path):
    (tmp_path / "DICOMDIR").write_bytes(DicomDir().encode())
    ds = dcmread(tmp_path / "DICOMDIR")
    assert ds.DirectoryRecordSequence == [] and ds.OffsetOfTheFirstDirectoryRecordOfTheRootDirectoryEntity == 0

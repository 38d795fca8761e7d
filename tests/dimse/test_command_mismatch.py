"""C-STORE whose command names another instance than its data set (PS3.4 B.2.3, PS3.7 9.1.1):
the Affected SOP Instance/Class UID of the C-STORE-RQ must be the data set's SOP Instance/Class
UID; otherwise the response would confirm an instance that was not the one stored."""

from __future__ import annotations

import pydicom
import pytest
from pynetdicom import build_context
from pydicom.uid import generate_uid

from dicomweb_server.dimse import status as S
from tests.helpers import make_dataset


def _file(tmp_path, ds, **meta):
    path = tmp_path / f"{ds.SOPInstanceUID}.dcm"
    ds.save_as(path, enforce_file_format=True)
    f = pydicom.dcmread(path)
    for k, v in meta.items():
        setattr(f.file_meta, k, v)
    f.save_as(path)  # enforce_file_format would rewrite the meta from the data set
    return path


@pytest.fixture(autouse=True)
def _send_files_as_they_are(monkeypatch):
    """pynetdicom's SCU takes the command's UIDs from the file meta, and sends the data set
    unchanged, only with this setting (else it re-reads the UIDs from the data set)."""
    from pynetdicom import _config

    monkeypatch.setattr(_config, "STORE_SEND_CHUNKED_DATASET", True)


def test_command_instance_uid_differs_from_data_set(dimse, tmp_path):
    ds = make_dataset(rows=8, columns=8, PatientID="MISMATCH1")
    other = generate_uid()
    path = _file(tmp_path, ds, MediaStorageSOPInstanceUID=other)  # pynetdicom sends it as AffectedSOPInstanceUID
    assert dimse.store([path]) == [S.STORE_DATASET_MISMATCH]
    assert dimse.http.get("/instances", params={"PatientID": "MISMATCH1"}).json() == []


def test_matching_command_still_stored(dimse, tmp_path):
    ds = make_dataset(rows=8, columns=8, PatientID="MISMATCH2")
    assert dimse.store([_file(tmp_path, ds)]) == [S.SUCCESS]


def test_command_class_uid_differs_from_data_set(dimse, tmp_path):
    ds = make_dataset(rows=8, columns=8, PatientID="MISMATCH3")
    path = _file(tmp_path, ds)
    f = pydicom.dcmread(path)
    f.SOPClassUID = "1.2.840.10008.5.1.4.1.1.7"  # Secondary Capture in the data set, CT in the command
    f.save_as(path)
    assoc = dimse.associate([build_context(str(ds.SOPClassUID), str(ds.file_meta.TransferSyntaxUID))])
    try:
        assert assoc.send_c_store(path).Status == S.STORE_DATASET_MISMATCH
    finally:
        assoc.release()
    assert dimse.http.get("/instances", params={"PatientID": "MISMATCH3"}).json() == []

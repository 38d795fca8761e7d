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

#: a refused C-STORE's response once lost under load in CI: stacks if a test hangs (conftest.py)
pytestmark = pytest.mark.usefixtures("stacks_if_stuck")


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


@pytest.mark.parametrize("ts", [pydicom.uid.ExplicitVRLittleEndian, pydicom.uid.ImplicitVRLittleEndian,
                                pydicom.uid.ExplicitVRBigEndian, pydicom.uid.DeflatedExplicitVRLittleEndian])
def test_the_uid_check_reads_the_data_set_after_the_listeners_file_meta(tmp_path, ts):
    """The check reads the first elements right after the listener's own file meta, in the
    accepted transfer syntax (deflated: dcmread); the same answers either way."""
    from types import SimpleNamespace

    from pydicom.filewriter import write_dataset, write_file_meta_info
    from pydicom.filebase import DicomFileLike

    from dicomweb_server.dimse.scp import _AE_SLOT_BYTES, _fill_source_ae_and_check, _file_meta_with_ae_slot

    ds = make_dataset(rows=8, columns=8, transfer_syntax=ts)
    path = tmp_path / "received.dcm"
    with open(path, "wb") as raw:  # what the listener's chunked receive writes
        raw.write(b"\x00" * 128 + b"DICM")
        write_file_meta_info(raw, _file_meta_with_ae_slot(sop_class_uid=ds.SOPClassUID,
                                                          sop_instance_uid=ds.SOPInstanceUID, transfer_syntax=ts))
        if ts == pydicom.uid.DeflatedExplicitVRLittleEndian:
            import zlib

            from pydicom.filebase import DicomBytesIO

            buf = DicomBytesIO()
            buf.is_little_endian, buf.is_implicit_VR = True, False
            write_dataset(buf, ds)
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            raw.write(c.compress(buf.getvalue()) + c.flush())
        else:
            fp = DicomFileLike(raw)
            fp.is_little_endian, fp.is_implicit_VR = ts.is_little_endian, ts.is_implicit_VR
            write_dataset(fp, ds)
    same = SimpleNamespace(AffectedSOPClassUID=ds.SOPClassUID, AffectedSOPInstanceUID=ds.SOPInstanceUID)
    other = SimpleNamespace(AffectedSOPClassUID=ds.SOPClassUID, AffectedSOPInstanceUID="1.2.3.4")
    assert _fill_source_ae_and_check(same, path, "MODALITY1", ts) is None
    assert "AffectedSOPInstanceUID '1.2.3.4'" in _fill_source_ae_and_check(other, path, "MODALITY1", ts)
    assert pydicom.dcmread(path).file_meta.SourceApplicationEntityTitle == "MODALITY1"
    assert _AE_SLOT_BYTES not in path.read_bytes()[:4096]


@pytest.mark.parametrize("sop_class,sop,ts", [
    ("1.2.840.10008.5.1.4.1.1.2", "1.2.826.0.1.3680043.8.498.77.5.2", pydicom.uid.ExplicitVRLittleEndian),
    ("1.2.840.10008.5.1.4.1.1.4", "1.2.3", pydicom.uid.ImplicitVRLittleEndian),  # odd lengths: padded
    ("1.2.840.10008.5.1.4.1.1.12.1", "1." + "9" * 62, pydicom.uid.JPEG2000Lossless),
])
def test_the_hand_encoded_file_meta_is_pydicoms(sop_class, sop, ts):
    """The listener writes a received file's meta by hand (PS3.10 7.1); the bytes are exactly
    pydicom's write_file_meta_info of the same file meta, Source AE Title slot included."""
    import io

    from pydicom.filewriter import write_file_meta_info

    from dicomweb_server.dimse.scp import _AE_SLOT_BYTES, _encoded_file_meta, _file_meta_with_ae_slot

    kwargs = dict(sop_class_uid=sop_class, sop_instance_uid=sop, transfer_syntax=ts)
    want = io.BytesIO()
    write_file_meta_info(want, _file_meta_with_ae_slot(**kwargs))
    got = _encoded_file_meta(**kwargs)
    assert bytes(got) == want.getvalue()
    assert _AE_SLOT_BYTES in got
    meta = pydicom.dcmread(io.BytesIO(b"\0" * 128 + b"DICM" + got + b"\x08\x00\x18\x00UI\x04\x001.2\0"))
    assert meta.file_meta.MediaStorageSOPInstanceUID == sop and meta.file_meta.TransferSyntaxUID == ts

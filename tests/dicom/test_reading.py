"""dicom/reading.py reads the preamble and file meta once and the data set from
there (issue 11); the result must be what ``pydicom.dcmread(stop_before_pixels=True)``
gives, for every file of pydicom's test corpus and the files the STOW tests make."""

from __future__ import annotations

import os
from pathlib import Path

import pydicom.data
import pytest
from pydicom.uid import ExplicitVRBigEndian, ImplicitVRLittleEndian

from dicomweb_server.dicom import reading
from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.status import InstanceError

from ..helpers import make_dataset, to_bytes


def _corpus() -> list[Path]:
    """pydicom's bundled test files, never a download: ``get_testdata_files`` also tries to
    fetch pydicom-data's files from GitHub (79 of them), which without a network cost every
    pytest process that collected this module 10-15 s of connection failures."""
    out = []
    for name in sorted((Path(pydicom.data.__file__).parent / "test_files").glob("*.dcm")):
        with open(name, "rb") as f:
            head = f.read(132)
        if len(head) == 132 and head[128:132] == b"DICM":  # PS3.10 files only
            out.append(Path(name))
    return out


def _both(path: Path):
    """(dcmread's result, the single-pass result) or the exception type each raised."""
    results = []
    for single in (False, True):
        try:
            with open(path, "rb") as fp:
                size = os.fstat(fp.fileno()).st_size
                head = None
                if single:
                    head = (reading.read_preamble(fp, False), reading._read_file_meta_info(fp))
                    if str(head[1].get("TransferSyntaxUID", "")) in ("", reading.DEFLATED_LE):
                        return None  # refused by read_instance / read via the inflated copy, unchanged
                ds, layout = reading._read(fp, size, head)
                results.append((ds, layout))
        except Exception as e:  # noqa: BLE001 - both paths must fail alike
            results.append(type(e))
    return results


CORPUS = _corpus()


def test_corpus_is_there():
    assert len(CORPUS) > 50


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_single_pass_read_equals_dcmread(path):
    both = _both(path)
    if both is None:
        pytest.skip("no transfer syntax (refused before reading) or Deflated (read with dcmread, unchanged)")
    old, new = both
    if isinstance(old, type) or isinstance(new, type):
        assert old == new
        return
    (ds_old, lay_old), (ds_new, lay_new) = old, new
    assert ds_new == ds_old
    assert ds_new.file_meta == ds_old.file_meta
    assert ds_new.preamble == ds_old.preamble
    assert ds_new.original_encoding == ds_old.original_encoding
    assert ds_new._character_set == ds_old._character_set
    assert (lay_new.to_json() if lay_new else None) == (lay_old.to_json() if lay_old else None)


def _file(ts: str) -> bytes:
    return to_bytes(make_dataset(transfer_syntax=ts, PatientName="DOE^JANE", rows=4, columns=4))


@pytest.mark.parametrize("ts", [ImplicitVRLittleEndian, ExplicitVRBigEndian, "1.2.840.10008.1.2.1"])
def test_records_equal_for_each_encoding(tmp_path, ts):
    path = tmp_path / "x.dcm"
    path.write_bytes(_file(ts))
    old, new = _both(path)
    assert new[0] == old[0] and new[0].original_encoding == old[0].original_encoding
    assert new[1].to_json() == old[1].to_json()
    rec = describe_instance(path)
    assert rec.transfer_syntax_uid == ts
    assert rec.pixel["length"] == 32
    assert b'"00100010":{"vr":"PN","Value":[{"Alphabetic":"DOE^JANE"}]}' in rec.metadata


def test_truncated_file_still_refused(tmp_path):
    path = tmp_path / "x.dcm"
    data = _file("1.2.840.10008.1.2.1")
    path.write_bytes(data[: data.index(b"DOE^JANE") + 3])
    with pytest.raises(InstanceError) as e:
        describe_instance(path)
    assert e.value.reason == 0xC000


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_record_from_memory_equals_record_from_file(path):
    """STOW-RS parses small parts from memory (Archive.store): the same record, or
    the same failure, as from the file."""
    out = []
    for data in (None, path.read_bytes()):
        try:
            out.append(describe_instance(path, data=data))
        except InstanceError as e:
            out.append((e.reason, e.message))
    assert out[0] == out[1]

"""A spooled file no larger than an in-memory STOW-RS part (every DIMSE C-STORE data
set, ``import``) is described from its bytes like one (dicom/lean.py, no pydicom
Dataset), with the same record the pydicom path gives; larger files, and files that
the lean walker declines, go through pydicom as before (issue 10)."""

from __future__ import annotations

import dataclasses

import pytest

from dicomweb_server import archive as archive_module
from dicomweb_server.archive import Archive
from dicomweb_server.dicom import instance, lean
from dicomweb_server.dicom.multipart import MEMORY_PART_BYTES, SpooledPart
from dicomweb_server.dicom.status import InstanceError
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, to_bytes


@pytest.fixture
def archive(tmp_path):
    a = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite"))
    yield a
    a.close()


def _spooled(a: Archive, data: bytes, name: str) -> SpooledPart:
    path = a.blobs.spool / name
    path.write_bytes(data)
    return SpooledPart(path=path, size=len(data), complete=True)


@pytest.mark.parametrize("rows, lean_expected", [(512, True), (1024, False)])  # 512 KB; 2 MB > MEMORY_PART_BYTES
def test_spooled_file_is_described_from_memory_when_small(archive, monkeypatch, tmp_path, rows, lean_expected):
    data = to_bytes(make_dataset(rows=rows, columns=rows))
    assert (len(data) <= MEMORY_PART_BYTES) == lean_expected
    walks = []
    real_walk = lean.walk
    monkeypatch.setattr(lean, "walk", lambda *a: walks.append(1) or real_walk(*a))
    described = []
    real_describe = archive_module.describe_instance
    monkeypatch.setattr(archive_module, "describe_instance",
                        lambda *a, **k: described.append(real_describe(*a, **k)) or described[-1])
    outcome = archive.store([_spooled(archive, data, "a.dcm")])
    assert outcome.stored and not outcome.failed
    assert bool(walks) == lean_expected
    # the record is the pydicom path's, field by field
    path = tmp_path / "copy.dcm"
    path.write_bytes(data)
    assert dataclasses.asdict(described[0]) == dataclasses.asdict(instance.describe_instance(path))


@pytest.mark.parametrize("bad", [
    b"\0" * 128 + b"DICM" + b"\x02\x00\x10\x00UI\x04\x00abcd",  # file meta only: no UIDs
    b"\0" * 128 + b"DICM" + b"\x02\x00\x10\x00UI\x40\x00abcd",  # cut short
    b"not DICOM at all",
])
def test_a_bad_small_file_fails_as_the_pydicom_path_says(archive, tmp_path, bad):
    path = tmp_path / "copy.dcm"
    path.write_bytes(bad)
    with pytest.raises(InstanceError) as e:
        instance.describe_instance(path)
    outcome = archive.store([_spooled(archive, bad, "bad.dcm")])
    assert not outcome.stored
    assert (outcome.failed[0].reason, outcome.failed[0].message) == (e.value.reason, e.value.message)

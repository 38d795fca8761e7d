"""dicom/lean.py (issue 11): describing an instance from its bytes without a pydicom
Dataset gives exactly the record of the pydicom path (metadata bytes, study/series
JSON, index columns, pixel record, UIDs, size, path), or declines. Differential:
pydicom's test corpus plus synthetic edge cases made with pydicom."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import ImplicitVRLittleEndian, JPEGBaseline8Bit

from dicomweb_server.dicom import instance, lean
from dicomweb_server.dicom.status import InstanceError

from ..helpers import make_dataset, to_bytes
from .test_reading import CORPUS

MR = "1.2.840.10008.5.1.4.1.1.4"


def _slow(data: bytes, tmp: Path, **kw):
    p = tmp / "x.dcm"
    p.write_bytes(data)
    try:
        return instance.describe_instance(p, **kw)  # from the file: always the pydicom path
    except InstanceError as e:
        return e


def _fast(data: bytes, threshold: int = 1024, study: str | None = None):
    try:
        return instance._describe_lean(data, threshold, study)
    except lean.Decline:
        return None


def _same_or_declined(data: bytes, tmp: Path, threshold: int = 1024, study: str | None = None) -> bool:
    """True when the lean path produced a record (then equal to the slow one)."""
    fast = _fast(data, threshold, study)
    if fast is None:
        return False
    slow = _slow(data, tmp, bulk_threshold=threshold, expected_study_uid=study)
    assert not isinstance(slow, InstanceError), f"lean accepted what the pydicom path refuses: {slow.message}"
    assert fast == slow
    assert fast.metadata == slow.metadata and fast.pixel == slow.pixel and fast.study == slow.study
    return True


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_lean_equals_pydicom_or_declines(path, tmp_path):
    data = path.read_bytes()
    _same_or_declined(data, tmp_path)
    _same_or_declined(data, tmp_path, threshold=16)


def test_corpus_mostly_takes_the_lean_path(tmp_path):
    taken = sum(_same_or_declined(p.read_bytes(), tmp_path) for p in CORPUS)
    assert taken >= 10, taken  # most corpus files hold sequences: declined


def test_describe_instance_uses_the_lean_path_for_in_memory_parts(tmp_path, monkeypatch):
    data = to_bytes(make_dataset(sop_class=MR, modality="MR", rows=256, columns=256))
    monkeypatch.setattr(instance, "read_instance", None)  # the pydicom path would fail
    rec = instance.describe_instance(tmp_path / "none.part", data=data)
    assert rec.pixel["offset"] == len(data) - 256 * 256 * 2
    assert rec.pixel["length"] == 256 * 256 * 2 and rec.pixel["number_of_frames"] == 1


EDGE = {
    "mr": {},
    "empty values": {"PatientName": "", "StudyDescription": "", "AccessionNumber": ""},
    "odd length values": {"StudyDescription": "ABC", "PatientID": "X"},
    "multi DS IS": {"PixelSpacing": ["0.5", "0.25"], "ImagePositionPatient": ["1.0", "-2.5", "1e3"],
                    "ReferencedFrameNumber": ["1", "2", "3"]},
    "bad DS": {"SliceThickness": "1.75"},  # made '@1.7' in the bytes
    "PN groups": {"PatientName": "Yamada^Tarou=山田^太郎=やまだ^たろう", "SpecificCharacterSet": "ISO_IR 192"},
    "PN multi": {"ReferringPhysicianName": ["A^B", "", "C^D"]},
    "latin1": {"PatientName": "Müller^Jürgen", "SpecificCharacterSet": "ISO_IR 100"},
    "AT": {"FrameIncrementPointer": 0x00181063},
    "floats": {"RescaleSlope": "1", "FrameTime": "33.3"},
    "private": {},
    "sequence": {"ReferencedStudySequence": None},
    "frames": {"frames": 3},
    "frames mismatch": {"NumberOfFrames": 5},
    "bad uid": {"sop": "1.2.03"},
    "implicit": {"transfer_syntax": ImplicitVRLittleEndian},
}


def _edge(name: str) -> bytes:
    attrs = dict(EDGE[name])
    frames = attrs.pop("frames", 1)
    seq = attrs.pop("ReferencedStudySequence", 0)
    ds = make_dataset(sop_class=MR, modality="MR", rows=16, columns=16, frames=frames, **attrs)
    if name == "private":
        block = ds.private_block(0x0009, "ACME 1.0", create=True)
        block.add_new(0x01, "LO", "hello")
        block.add_new(0x02, "OB", bytes(range(40)))
        block.add_new(0x03, "UN", b"\x01\x02\x03")
        ds.add_new(0x00291010, "UN", b"\x00" * 2000)
    if seq is None:
        item = Dataset()
        item.ReferencedSOPInstanceUID = "1.2.3"
        ds.ReferencedStudySequence = Sequence([item])
    if name == "floats":
        ds.add_new(0x00189087, "FD", 1.5)
        ds.add_new(0x00460044, "FD", [float("nan"), float("inf")])
        ds.add_new(0x00189089, "FD", [0.0, 1.0, -1.0])
    data = to_bytes(ds)
    if name == "bad DS":
        assert data.count(b"1.75") == 1
        data = data.replace(b"1.75", b"@1.7")
    return data


@pytest.mark.parametrize("name", sorted(EDGE))
def test_edge_cases(name, tmp_path):
    data = _edge(name)
    taken = _same_or_declined(data, tmp_path) | _same_or_declined(data, tmp_path, threshold=8)
    declines = {"sequence", "frames mismatch", "bad uid", "implicit"}
    assert taken == (name not in declines), name


def test_study_mismatch_declines(tmp_path):
    data = _edge("mr")
    assert _fast(data, study="1.2.3") is None
    assert isinstance(_slow(data, tmp_path, expected_study_uid="1.2.3"), InstanceError)


@pytest.mark.parametrize("cut", [1, 2, 100, 255 * 2, 16 * 16 * 2 + 4, 16 * 16 * 2 + 20])
def test_truncated_declines(cut, tmp_path):
    data = _edge("mr")[:-cut]
    assert _fast(data) is None
    if cut <= 16 * 16 * 2:  # inside the pixel data (a cut element header pydicom may just drop)
        assert isinstance(_slow(data, tmp_path), InstanceError)


def test_trailing_element_after_pixels_declines(tmp_path):
    data = _edge("mr") + struct.pack("<HH2s2xI", 0xFFFC, 0xFFFC, b"OB", 4) + b"\0\0\0\0"
    assert _fast(data) is None
    assert not isinstance(_slow(data, tmp_path), InstanceError)


def test_out_of_order_and_undefined_length_decline():
    data = bytearray(_edge("mr"))
    # swap in an undefined-length UN element: a sequence for pydicom
    ts, start = lean.transfer_syntax_and_start(bytes(data))
    assert ts == "1.2.840.10008.1.2.1"
    bad = bytes(data[:start]) + struct.pack("<HH2s2xI", 0x0009, 0x1000, b"UN", 0xFFFFFFFF) + bytes(data[start:])
    assert _fast(bad) is None
    elements, _ = lean.walk(bytes(data), start)
    first_two = elements[:2]
    assert first_two[0][0] < first_two[1][0]


def test_encapsulated_pixel_data(tmp_path):
    ds = make_dataset(sop_class=MR, modality="MR", pixels=False, transfer_syntax=JPEGBaseline8Bit)
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.BitsAllocated, ds.BitsStored, ds.HighBit = 1, 8, 8, 7
    ds.PhotometricInterpretation, ds.PixelRepresentation = "MONOCHROME2", 0
    from pydicom.encaps import encapsulate
    ds.PixelData = encapsulate([b"\xff\xd8" + b"\0" * 30 + b"\xff\xd9"])
    ds["PixelData"].VR = "OB"
    assert _same_or_declined(to_bytes(ds), tmp_path)


def _swap(data: bytes, old_header: bytes, new_header: bytes, new_value: bytes | None = None) -> bytes:
    """``data`` with the element whose header is ``old_header`` given ``new_header`` (and value)."""
    i = data.index(old_header)
    length = struct.unpack_from("<H", old_header, 6)[0]
    value = data[i + 8:i + 8 + length] if new_value is None else new_value
    return data[:i] + new_header + value + data[i + 8 + length:]


def _mr(**kw) -> bytes:
    kw = {"study": "1.2.9.4", "series": "1.2.9.5", "sop": "1.2.8", **kw}  # "1.2.8\0": a 6-byte UI
    return to_bytes(make_dataset(sop_class=MR, modality="MR", **kw))


#: inputs a fuzzer found where the lean path gave a record the pydicom path does not
#: (2026-12-04, ~189,000 mutated files): each must now decline
FUZZED = {
    "SOPInstanceUID as AE": lambda: _swap(_mr(), struct.pack("<HH2sH", 8, 0x18, b"UI", 6),
                                          struct.pack("<HH2sH", 8, 0x18, b"AE", 6), b"1.2.9\0"),
    "SOPInstanceUID as IS": lambda: _swap(_mr(), struct.pack("<HH2sH", 8, 0x18, b"UI", 6),
                                          struct.pack("<HH2sH", 8, 0x18, b"IS", 6), b" 1.2.9"),
    "Rows as OB": lambda: _swap(_mr(rows=2, columns=2), struct.pack("<HH2sH", 0x28, 0x10, b"US", 2),
                                struct.pack("<HH2s2xI", 0x28, 0x10, b"OB", 2), b"2 "),
    "Rows as UN": lambda: _swap(_mr(rows=2, columns=2), struct.pack("<HH2sH", 0x28, 0x10, b"US", 2),
                                struct.pack("<HH2s2xI", 0x28, 0x10, b"UN", 2), b"\x04\x00"),
    "NumberOfFrames as UN": lambda: _swap(_mr(rows=2, columns=2, frames=2), struct.pack("<HH2sH", 0x28, 0x08, b"IS", 2),
                                          struct.pack("<HH2s2xI", 0x28, 0x08, b"UN", 2), b"3 "),
    "charset with a leading NUL": lambda: _mr(SpecificCharacterSet="ISO_IR 100", PatientName="M\u00fcller").replace(
        b"CS\x0a\x00ISO_IR 100", b"CS\x0c\x00\0ISO_IR 100 "),
    "empty public UN": lambda: _swap(_mr(StudyDate="20200101"), struct.pack("<HH2sH", 8, 0x20, b"DA", 8),
                                     struct.pack("<HH2s2xI", 8, 0x20, b"UN", 0), b""),
    "meta group length as FD": lambda: _mr().replace(struct.pack("<HH2sH", 2, 0, b"UL", 4),
                                                     struct.pack("<HH2sH", 2, 0, b"FD", 4), 1),
    "implicit UI with a leading space": lambda: to_bytes(make_dataset(
        sop_class=MR, modality="MR", transfer_syntax=ImplicitVRLittleEndian, FrameOfReferenceUID="1.2.8"
    )).replace(b"1.2.8\0", b" 1.2.8"),
}


@pytest.mark.parametrize("name", sorted(FUZZED))
def test_fuzzer_findings_decline(name, tmp_path):
    data = FUZZED[name]()
    assert _fast(data) is None, name
    slow = _slow(data, tmp_path)  # the pydicom path answers them, record or error, as before
    assert slow is not None



@pytest.mark.parametrize("case", ["padded with NUL", "padded with a space", "leading space", "multi-valued",
                                  "empty", "missing", "invalid", "another VR"])
def test_the_uids_read_from_the_element_bytes_are_the_pydicom_paths_or_declined(case, tmp_path):
    """``instance._lean_uids`` (issue 33): the four UIDs read from the walked elements'
    bytes give the pydicom path's record, or the lean path declines (never a record the
    pydicom path refuses)."""
    # an even length: the padding cases replace its last character (an odd one is padded already)
    ds = make_dataset(sop_class=MR, modality="MR", rows=8, columns=8, sop="1.2.826.0.1.3680043.8.498.12345678901234")
    sop = ds.SOPInstanceUID
    data = to_bytes(ds)
    raw = sop.encode()
    assert len(raw) % 2 == 0
    if case == "padded with NUL":
        data = data.replace(raw, raw[:-1] + b"\x00")
    elif case == "padded with a space":
        data = data.replace(raw, raw[:-1] + b" ")
    elif case == "leading space":
        data = data.replace(raw, b" " + raw[1:])
    elif case == "multi-valued":
        data = data.replace(raw, raw[:2] + b"\\" + raw[3:])
    elif case == "empty":
        ds.SOPInstanceUID = ""
        data = to_bytes(ds)
    elif case == "missing":
        del ds.SeriesInstanceUID
        data = to_bytes(ds)
    elif case == "invalid":
        data = data.replace(raw, raw[:2] + b"x" + raw[3:])
    elif case == "another VR":
        ds["SOPInstanceUID"].VR = "LO"
        data = to_bytes(ds)
    accepted = _same_or_declined(data, tmp_path)
    assert accepted is (case in ("padded with NUL", "padded with a space"))


def test_the_uids_are_read_without_a_json_object_of_them(monkeypatch):
    """One DICOM JSON conversion per described instance (the whole data set's): the UIDs
    come from the element bytes (before issue 33, a JSON object of the four UID elements
    was made first, only to read them back)."""
    data = to_bytes(make_dataset(sop_class=MR, modality="MR", rows=8, columns=8))
    calls = []
    real = lean.to_json

    def counted(elements, *a, **k):
        calls.append(len(elements))
        return real(elements, *a, **k)

    monkeypatch.setattr(lean, "to_json", counted)
    rec = instance._describe_lean(data, 1024, None)
    assert rec.sop_class_uid == MR and len(calls) == 1 and calls[0] > 4

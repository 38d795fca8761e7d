"""dicom/lean_header.py (issue 33, rendered with the cache off): the header of a stored
file built from its bytes by the lean walker is the Dataset ``pydicom.dcmread(...,
stop_before_pixels=True)`` reads (every element's VR and converted value, sequences
of defined length included), or declines. Differential: pydicom's test corpus plus
synthetic files made with pydicom; and the rendered picture is the same bytes either
way."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import ImplicitVRLittleEndian

from dicomweb_server import retrieve
from dicomweb_server.dicom import lean_header, render
from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.store.base import InstanceLocation

from ..helpers import make_dataset, to_bytes
from .test_reading import CORPUS


def _lean(data: bytes) -> Dataset | None:
    try:
        return lean_header.header_dataset(data)
    except lean_header.Decline:
        return None


def _same_or_declined(data: bytes) -> bool:
    """True when the lean header was built (then equal to pydicom's, element by element)."""
    fast = _lean(data)
    if fast is None:
        return False
    slow = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
    assert list(fast.keys()) == list(slow.keys())
    for tag in slow.keys():
        a, b = fast[tag], slow[tag]  # converted by pydicom, each from its raw element
        assert (a.VR, a.value) == (b.VR, b.value), f"{tag}: {a!r} != {b!r}"
    assert fast == slow
    assert fast.file_meta.TransferSyntaxUID == slow.file_meta.TransferSyntaxUID
    assert fast.original_character_set == slow.original_character_set
    return True


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_lean_header_equals_pydicom_or_declines(path):
    data = path.read_bytes()
    _same_or_declined(data)
    # as retrieve._header gives it: the bytes up to the pixel data's value
    f = io.BytesIO(data)
    try:
        pydicom.dcmread(f, stop_before_pixels=True)
    except Exception:  # noqa: BLE001 - not readable at all: nothing more to compare
        return
    if f.tell() + 12 < len(data):
        _same_or_declined(data[:f.tell() + 12])


def test_corpus_mostly_built_lean():
    built = sum(_same_or_declined(p.read_bytes()) for p in CORPUS)
    assert built >= 30, f"only {built} of {len(CORPUS)} corpus files built lean"


def test_sequences_of_defined_length_and_character_set():
    ds = make_dataset(rows=4, columns=4, SpecificCharacterSet="ISO_IR 192", PatientName="Müller^Jörg",
                      WindowCenter=["40", "-600"], WindowWidth=["400", "1500"], RescaleSlope="1",
                      RescaleIntercept="-1024")
    item = Dataset()
    item.ReferencedSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    item.ReferencedSOPInstanceUID = "1.2.3.4"
    lut = Dataset()
    lut.add_new(0x00283002, "US", [4, 0, 16])  # LUT Descriptor
    lut.add_new(0x00283006, "US", [0, 100, 200, 300])  # LUT Data
    ds.ReferencedImageSequence = Sequence([item])
    ds.VOILUTSequence = Sequence([lut])
    data = to_bytes(ds)
    assert _same_or_declined(data)
    fast = lean_header.header_dataset(data)
    assert str(fast.PatientName) == "Müller^Jörg"
    assert fast.ReferencedImageSequence[0].ReferencedSOPInstanceUID == "1.2.3.4"
    assert list(fast.VOILUTSequence[0].LUTData) == [0, 100, 200, 300]
    assert fast.WindowCenter == [40, -600] and fast.RescaleIntercept == -1024


def test_undefined_length_sequence_and_implicit_vr_decline():
    ds = make_dataset(rows=4, columns=4)
    ds.ReferencedImageSequence = Sequence([Dataset()])
    ds["ReferencedImageSequence"].is_undefined_length = True
    assert _lean(to_bytes(ds)) is None
    assert _lean(to_bytes(make_dataset(rows=4, columns=4, transfer_syntax=ImplicitVRLittleEndian))) is None


class _CountingReader(io.BufferedReader):
    reads = 0

    def read(self, *args):
        type(self).reads += 1
        return super().read(*args)

    def read1(self, *args):
        type(self).reads += 1
        return super().read1(*args)

    def readinto(self, *args):
        type(self).reads += 1
        return super().readinto(*args)


def _stored(tmp_path: Path, ds: Dataset) -> tuple[Path, InstanceLocation]:
    path = tmp_path / "x.dcm"
    path.write_bytes(to_bytes(ds))
    r = describe_instance(path)
    return path, InstanceLocation(r.study_uid, r.series_uid, r.sop_uid, r.sop_class_uid, r.transfer_syntax_uid,
                                  str(path), r.size, r.pixel)


@pytest.mark.parametrize("sequence", [False, True])
def test_header_is_one_read_and_equals_dcmread(tmp_path, sequence):
    ds = make_dataset(rows=16, columns=16, WindowCenter="40", WindowWidth="400")
    if not sequence:
        ds.ReferencedImageSequence = Sequence([Dataset()])
        ds["ReferencedImageSequence"].is_undefined_length = True  # declined: pydicom parses the bytes read
    path, loc = _stored(tmp_path, ds)
    _CountingReader.reads = 0
    with _CountingReader(io.FileIO(path, "rb")) as f:
        hdr, _ = retrieve._header(f, loc)
    assert _CountingReader.reads == 1
    assert hdr == pydicom.dcmread(path, stop_before_pixels=True)


def _ct(**attrs) -> Dataset:
    rng = np.random.default_rng(5)
    ds = make_dataset(rows=64, columns=48, **attrs)
    ds.PixelData = rng.integers(0, 4096, (64, 48)).astype(np.uint16).tobytes()
    return ds


@pytest.mark.parametrize("attrs, query", [
    ({"WindowCenter": "40", "WindowWidth": "400", "RescaleIntercept": "-1024", "RescaleSlope": "1"}, {}),
    ({"PhotometricInterpretation": "MONOCHROME1"}, {"window": "2000,1000,sigmoid"}),
    ({"WindowCenter": "2048", "WindowWidth": "4096"}, {"annotation": "patient,technique", "viewport": "32,32"}),
])
@pytest.mark.parametrize("media_type", ["image/jpeg", "image/png"])
def test_rendered_bytes_equal_with_the_pydicom_header(tmp_path, monkeypatch, attrs, query, media_type):
    path, loc = _stored(tmp_path, _ct(**attrs))
    params = render.RenderParams.parse(query)
    lean = retrieve.rendered(path, loc, None, params, media_type)
    assert lean_header.header_dataset(path.read_bytes()[:loc.pixel["offset"]]) is not None

    def declined(data, *args):
        raise lean_header.Decline

    monkeypatch.setattr(lean_header, "header_dataset", declined)
    assert retrieve.rendered(path, loc, None, params, media_type) == lean

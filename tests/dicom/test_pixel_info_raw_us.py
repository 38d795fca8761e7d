"""dicom/pixel_info.py's fast read of raw single-valued US elements (issue 33, rendered
with the cache off): the value is the one pydicom's conversion gives, for every US
element of pydicom's test corpus read as pydicom reads it (raw elements of any transfer
syntax) and as the lean walker builds it; anything else (several values, implicit VR,
big endian, a wrong length) is left to pydicom; and reading the pixel description
converts no element of a lean header."""

from __future__ import annotations

import io

import pydicom
import pytest
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset
from pydicom.tag import BaseTag

from dicomweb_server.dicom import lean_header
from dicomweb_server.dicom.pixel_info import _TAGS, _raw_us, element_value, image_info

from ..helpers import make_dataset, to_bytes
from .test_reading import CORPUS


def _raw_datasets(data: bytes) -> list[Dataset]:
    out = []
    try:
        out.append(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True, force=True))
    except Exception:  # noqa: BLE001 - not readable: nothing to compare
        pass
    try:
        out.append(lean_header.header_dataset(data))
    except lean_header.Decline:
        pass
    return out


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_every_us_element_reads_as_pydicom_converts_it(path):
    for ds in _raw_datasets(path.read_bytes()):
        raws = [(tag, elem) for tag, elem in ds._dict.items() if isinstance(elem, RawDataElement)]
        for tag, raw in raws:
            fast = element_value(ds, int(tag))  # before pydicom converts it
            try:
                value = ds[tag].value  # pydicom's conversion (now in the data set)
            except Exception:  # noqa: BLE001 - pydicom cannot convert it: element_value says absent
                assert fast is None, (tag, raw)
                continue
            expected = None if value is None or value == "" else value
            assert fast == expected, (tag, raw, fast, value)
            if _raw_us(raw) is not None:
                assert type(fast) is int and type(value) is int, (tag, raw)


def _raw(vr: str | None, value: bytes, little: bool = True, implicit: bool = False) -> RawDataElement:
    return RawDataElement(BaseTag(0x00280010), vr, len(value), value, 0, implicit, little)


def test_only_single_explicit_little_endian_us_values_take_the_fast_read():
    assert _raw_us(_raw("US", b"\x00\x02")) == 512
    assert _raw_us(_raw("US", b"\xff\xff")) == 65535
    assert _raw_us(_raw("US", b"\x00\x02\x00\x01")) is None  # two values: pydicom's MultiValue
    assert _raw_us(_raw("US", b"")) is None  # empty
    assert _raw_us(_raw("US", b"\x00\x02", little=False)) is None  # big endian
    assert _raw_us(_raw(None, b"\x00\x02", implicit=True)) is None  # implicit VR: VR from the dictionary
    assert _raw_us(_raw("SS", b"\x00\x82")) is None
    assert _raw_us(_raw("OW", b"\x00\x02")) is None


@pytest.mark.parametrize("rows", [16, 256, 512])
def test_image_info_of_a_lean_header_converts_no_element(rows):
    ds = make_dataset(rows=rows, columns=rows)
    hdr = lean_header.header_dataset(to_bytes(ds))
    info = image_info(hdr)
    assert (info.rows, info.columns, info.bits_allocated, info.bits_stored) == (rows, rows, 16, ds.BitsStored)
    for keyword in ("Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation", "SamplesPerPixel"):
        elem = hdr._dict[BaseTag(_TAGS[keyword])]
        assert isinstance(elem, RawDataElement) and not isinstance(elem, DataElement), keyword
    assert info == image_info(pydicom.dcmread(io.BytesIO(to_bytes(ds))))

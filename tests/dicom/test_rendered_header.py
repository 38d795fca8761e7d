"""retrieve._header (rendered pictures, decoded frames): the bytes read up to the pixel
data offset recorded at store time are used only when they end with that pixel data
element's header and their parse stops exactly there (dicom/frames.py
pixel_element_start); a wrong recorded offset, or a file rewritten with the same size
whose pixel data moved, is read from the file with pydicom and its pixel data located
again. Every rendered picture here equals the picture rendered from a full pydicom read
of the file as it is, byte for byte (before the fix: a partial header, no warning, or
pixels read from the old offset)."""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, ImplicitVRLittleEndian, RLELossless

from dicomweb_server import retrieve
from dicomweb_server.dicom import frames, pixels, render
from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.media_types import Choice

from ..helpers import make_dataset, to_bytes
from .test_lean_header import _stored

_ALL_TS = [ExplicitVRLittleEndian, ImplicitVRLittleEndian, ExplicitVRBigEndian, RLELossless]


def _ct(ts: str = ExplicitVRLittleEndian, **attrs) -> Dataset:
    attrs = {"WindowCenter": "40", "WindowWidth": "400", "RescaleIntercept": "-1024", "RescaleSlope": "1"} | attrs
    ds = make_dataset(rows=32, columns=24, **attrs)
    ds.PixelData = np.random.default_rng(5).integers(0, 4096, (32, 24)).astype(np.uint16).tobytes()
    if ts == RLELossless:
        ds.compress(RLELossless)
    elif ts != ExplicitVRLittleEndian:
        if ts == ExplicitVRBigEndian:  # the value in the data set's byte order
            ds.PixelData = np.frombuffer(ds.PixelData, "<u2").astype(">u2").tobytes()
        ds.file_meta.TransferSyntaxUID = ts
    return ds


def _full_read_picture(path: Path, params, media_type: str) -> bytes:
    """The picture rendered from ``pydicom.dcmread`` of the whole file as it is."""
    ds = pydicom.dcmread(path)
    ts = str(ds.file_meta.TransferSyntaxUID)
    raw = ds.PixelData
    if ds["PixelData"].is_undefined_length:  # encapsulated: the one frame's codestream
        raw = next(pydicom.encaps.generate_frames(raw, number_of_frames=1))
    frame = pixels.decode_frame(ds, raw, ts, pixel_vr=ds["PixelData"].VR)
    return render.render(ds, iter([frame]), params, media_type, frame_numbers=[1])


_PARAMS = render.RenderParams.parse({})


@pytest.mark.parametrize("ts", _ALL_TS)
def test_recorded_offset_is_checked_for_every_stored_syntax(tmp_path, ts):
    """The offset recorded at store time is the pixel data value's: the element starts
    12 bytes before it in Explicit VR (encapsulated included), 8 in Implicit VR."""
    path, loc = _stored(tmp_path, _ct(ts))
    data = path.read_bytes()
    implicit, little = ts == ImplicitVRLittleEndian, ts != ExplicitVRBigEndian
    offset = loc.pixel["offset"]
    start = frames.pixel_element_start(data[:offset], loc.pixel, implicit, little)
    assert start == offset - (8 if implicit else 12)
    assert data[start:start + 4] == (b"\xe0\x7f\x10\x00" if little else b"\x7f\xe0\x00\x10")
    with path.open("rb") as f:
        hdr, same = retrieve._header(f, loc)
    assert same is loc and hdr == pydicom.dcmread(path, stop_before_pixels=True)
    for wrong in (offset - 2, offset + 2, 200):
        assert frames.pixel_element_start(data[:wrong], loc.pixel | {"offset": wrong}, implicit, little) is None


@pytest.mark.parametrize("ts", _ALL_TS)
@pytest.mark.parametrize("where", ["too small", "too large", "inside a value", "past the end"])
@pytest.mark.parametrize("media_type", ["image/jpeg", "image/png"])
def test_wrong_recorded_offset_renders_the_file_as_it_is(tmp_path, ts, where, media_type):
    path, loc = _stored(tmp_path, _ct(ts))
    data = path.read_bytes()
    offset = loc.pixel["offset"]
    wrong = {
        "too small": offset - 200,  # CT_small cut this way: 240 of 256 elements, no warning
        "too large": offset + 16,
        "inside a value": data.index(b"400") + 1,  # inside Window Width's value
        "past the end": loc.size + 8,
    }[where]
    bad = dataclasses.replace(loc, pixel=loc.pixel | {"offset": wrong})
    expected = _full_read_picture(path, _PARAMS, media_type)
    assert retrieve.rendered(path, loc, None, _PARAMS, media_type) == expected
    assert retrieve.rendered(path, bad, None, _PARAMS, media_type) == expected


def _padded(ts: str, pad: int, **attrs) -> Dataset:
    ds = _ct(ts, **attrs)
    ds.DataSetTrailingPadding = b"\0" * pad  # (FFFC,FFFC) after the pixel data (PS3.10 §7.2)
    return ds


@pytest.mark.parametrize("ts", _ALL_TS)
@pytest.mark.parametrize("media_type", ["image/jpeg", "image/png"])
def test_same_size_rewrite_with_another_header_renders_the_new_file(tmp_path, caplog, ts, media_type):
    """A file rewritten with the same size (a new version, a recompress): another Window
    Center of the same length, a Rescale Slope 2 bytes longer, the trailing padding 2 bytes
    shorter; its pixel data starts 2 bytes later than the index row says."""
    old = _padded(ts, 16, WindowCenter="40", RescaleSlope="1")
    path, loc = _stored(tmp_path, old)
    new = copy.deepcopy(old)
    new.WindowCenter, new.RescaleSlope = "90", "0.5"
    new.DataSetTrailingPadding = b"\0" * 14
    path.write_bytes(to_bytes(new))
    assert path.stat().st_size == loc.size  # open_stored's size check passes
    now = describe_instance(path)
    assert now.pixel["offset"] == loc.pixel["offset"] + 2
    expected = _full_read_picture(path, _PARAMS, media_type)
    assert expected != _full_read_picture_of(old, tmp_path, media_type)  # the new slope: another picture
    with caplog.at_level(logging.DEBUG, logger="dicomweb_server.retrieve"):
        assert retrieve.rendered(path, loc, None, _PARAMS, media_type) == expected
    assert [r.getMessage() for r in caplog.records] == [
        f"instance {loc.sop_uid}: the {loc.pixel['offset']} bytes before its recorded pixel data offset are not its "
        "header up to the pixel data element (a wrong offset or a rewritten file): reading the file"]


def _full_read_picture_of(ds: Dataset, tmp_path: Path, media_type: str) -> bytes:
    other = tmp_path / "old.dcm"
    other.write_bytes(to_bytes(ds))
    return _full_read_picture(other, _PARAMS, media_type)


def test_decoded_frames_of_a_rewritten_file_are_the_new_pixels(tmp_path):
    """Frames decoded for a native answer (retrieve._frames) read the header and pixels of
    the file as it is too."""
    old = _padded(RLELossless, 16, RescaleSlope="1")
    path, loc = _stored(tmp_path, old)
    new = copy.deepcopy(old)
    new.RescaleSlope = "0.5"
    new.DataSetTrailingPadding = b"\0" * 14
    path.write_bytes(to_bytes(new))
    choice = Choice("application/octet-stream", ExplicitVRLittleEndian, multipart=True)
    parts = [p for p in retrieve._frames(open(path, "rb"), loc, [1], choice) if p is not None]
    ds = pydicom.dcmread(io.BytesIO(path.read_bytes()))
    assert b"".join(parts) == ds.pixel_array.astype("<u2").tobytes()

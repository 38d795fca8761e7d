"""Data-set values feeding the renderer (issue #14, "500s"): every numeric attribute
the rendering pipeline reads (rescale, window, VOI LUT Function, Modality/VOI LUT
Sequences, palette descriptors, Frame Time and frame rates, Bits Stored ...) with
unusable values (2-value or 65535-bit LUT descriptors, empty LUT data, NaN, Inf,
1e20, 0, negative, text) renders with the documented fallback or gets a clear 4xx
error, never an unexpected exception (a 500 at the web layer)."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from dicomweb_server.dicom import pixels, render
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

CLEAN = (render.InvalidRenderParameter, render.UnsupportedMediaType, render.RenderTooLarge, pixels.NotAnImage,
         pixels.UnsupportedTransferSyntax)
WEIRD = ["NaN", "inf", "-inf", "-1", "0", "1e20", "-1e20", "1e308", "1e-300", "abc", ""]
BAD_DESCRIPTORS = [[2, 0], [256, 0, 65535], [256, 0, 0], [0, 0, 16], [4, 70000, 16], [65535, 65535, 65535],
                   [256, 0, 17], [1, 0, 1]]
BAD_LUT_DATA = [list(range(256)), [], b"\x00\x01" * 3, b""]


def _header(photometric: str = "MONOCHROME2") -> Dataset:
    ds = make_dataset(rows=8, columns=8, frames=3, pixels=False)
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel = 3 if photometric == "RGB" else 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = ds.BitsStored = 8 if photometric != "MONOCHROME2" else 16
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 0
    ds.NumberOfFrames = 3
    return ds


def _raw(ds: Dataset, tag: int, vr: str, text: str) -> None:
    """Store `text` as the element's raw bytes (as a file would carry it), so that
    pydicom converts it only when the renderer reads it."""
    from pydicom.dataelem import RawDataElement

    value = text.encode() + (b" " if len(text) % 2 else b"")
    ds._dict[tag] = RawDataElement(tag, vr, len(value), value, 0, False, True)


def _cases():
    for name, tag, vr in [("RescaleSlope", 0x00281053, "DS"), ("RescaleIntercept", 0x00281052, "DS"),
                          ("WindowCenter", 0x00281050, "DS"), ("WindowWidth", 0x00281051, "DS"),
                          ("FrameTime", 0x00181063, "DS"), ("CineRate", 0x00180040, "IS"),
                          ("RecommendedDisplayFrameRate", 0x00082144, "IS"), ("KVP", 0x00180060, "DS")]:
        for text in WEIRD:
            def setup(ds, tag=tag, vr=vr, text=text):
                _raw(ds, tag, vr, text)
                if tag in (0x00281050, 0x00281051):  # the other half of the window
                    _raw(ds, 0x00281051 if tag == 0x00281050 else 0x00281050, "DS", "100")
            yield f"{name}={text!r}", "MONOCHROME2", setup
    for desc in BAD_DESCRIPTORS + [256]:
        for data in BAD_LUT_DATA:
            for seq_name, seq_tag in (("ModalityLUTSequence", 0x00283000), ("VOILUTSequence", 0x00283010)):
                def setup(ds, desc=desc, data=data, seq_tag=seq_tag):
                    item = Dataset()
                    item.add_new(0x00283002, "US", desc)
                    item.add_new(0x00283006, "OW" if isinstance(data, bytes) else "US", data)
                    ds.add_new(seq_tag, "SQ", Sequence([item]))
                yield f"{seq_name} {desc} {len(data)} entries", "MONOCHROME2", setup
    for desc in BAD_DESCRIPTORS + [256]:
        for size in (0, 3, 512):
            def setup(ds, desc=desc, size=size):
                for element in (0x1101, 0x1102, 0x1103):  # Red/Green/Blue Palette Color LUT Descriptor
                    ds.add_new(0x00280000 | element, "US", desc)
                for element in (0x1201, 0x1202, 0x1203):  # ... Palette Color LUT Data
                    ds.add_new(0x00280000 | element, "OW", bytes(size))
            yield f"palette {desc} {size} bytes", "PALETTE COLOR", setup
    for keyword, value in [("PresentationLUTShape", "XYZ"), ("VOILUTFunction", "SIGMOID"), ("HighBit", 99),
                           ("PlanarConfiguration", 9), ("ICCProfile", b"garbage")]:
        def setup(ds, keyword=keyword, value=value):
            setattr(ds, keyword, value)
            if keyword == "VOILUTFunction":
                ds.WindowCenter, ds.WindowWidth = "0", "0"
        yield f"{keyword}={value!r}", "RGB" if keyword == "ICCProfile" else "MONOCHROME2", setup


CASES = list(_cases())
PARAMS = [render.RenderParams(),
          render.RenderParams.parse({"annotation": "patient,technique", "iccprofile": "srgb"}),
          render.RenderParams.parse({"window": "100,200,sigmoid"})]


def _frame(photometric: str) -> np.ndarray:
    if photometric == "RGB":
        return np.arange(192, dtype=np.uint8).reshape(8, 8, 3)
    if photometric == "PALETTE COLOR":
        return np.arange(64, dtype=np.uint8).reshape(8, 8)
    return np.arange(64, dtype=np.uint16).reshape(8, 8) * 50


@pytest.mark.parametrize("name, photometric, setup", CASES, ids=[c[0] for c in CASES])
def test_unusable_values_render_or_fail_cleanly(name, photometric, setup):
    for media_type in render.RENDERED_MEDIA_TYPES:
        for params in PARAMS:
            ds = _header(photometric)
            setup(ds)
            arr = _frame(photometric)
            try:
                out = render.render(ds, [arr, arr + 1, arr + 2], params, media_type, frame_numbers=[1, 2, 3])
            except CLEAN:
                continue
            assert out[:3] in (b"\xff\xd8\xff", b"\x89PN", b"GIF")


@pytest.mark.parametrize("text, expected_ms", [
    ("1e20", 218_450), ("1e308", 218_450), ("NaN", 100), ("-5", 100), ("0", 100), ("abc", 100), ("330", 330),
    ("0.001", 10)])
def test_gif_frame_time_fallbacks(text, expected_ms):
    """Frame Time: not a positive finite number -> the 100 ms default; clamped to
    10 ms .. 655,350 ms / frames (3 frames here: GIF delays are 16-bit centiseconds)."""
    ds = _header()
    ds.WindowCenter, ds.WindowWidth = "1600", "3200"  # one window for all frames: they differ
    _raw(ds, 0x00181063, "DS", text)
    arr = _frame("MONOCHROME2")
    out = render.render(ds, [arr, arr + 500, arr + 1000], None, "image/gif", frame_numbers=[1, 2, 3])
    with Image.open(io.BytesIO(out)) as img:
        assert img.n_frames == 3
        assert img.info["duration"] == expected_ms // 10 * 10


def test_modality_lut_with_two_value_descriptor_falls_back_to_rescale():
    """A LUT Descriptor of 2 values is ignored: the picture equals the one without it."""
    arr = _frame("MONOCHROME2")
    plain = render.render(_header(), [arr], None, "image/png")
    for seq_tag in (0x00283000, 0x00283010):
        ds = _header()
        item = Dataset()
        item.add_new(0x00283002, "US", [2, 0])
        item.add_new(0x00283006, "US", [0, 65535])
        ds.add_new(seq_tag, "SQ", Sequence([item]))
        assert render.render(ds, [arr], None, "image/png") == plain


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("values"), "sqlite").start()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
    srv.stop()


def test_http_samples(archive):
    """The issue's samples through the web layer: 200, never 500."""
    c = archive
    lut65535 = make_dataset(rows=8, columns=8, PatientID="values")
    item = Dataset()
    item.LUTDescriptor = [256, 0, 65535]
    item.add_new(0x00283006, "US", list(range(256)))  # LUT Data
    lut65535.VOILUTSequence = Sequence([item])
    lut2 = make_dataset(rows=8, columns=8, PatientID="values")
    item = Dataset()
    item.LUTDescriptor = [2, 0]
    item.add_new(0x00283006, "US", [0, 4095])
    lut2.ModalityLUTSequence = Sequence([item])
    cine = make_dataset(rows=8, columns=8, frames=4, PatientID="values", FrameTime="1e20")
    body, ctype = multipart([to_bytes(ds) for ds in (lut65535, lut2, cine)])
    assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    for ds, accept in ((lut65535, "image/png"), (lut2, "image/jpeg"), (cine, "image/gif")):
        path = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
        r = c.get(path + "/rendered", headers={"Accept": accept})
        assert r.status_code == 200 and r.headers["content-type"] == accept, r.text[:300]

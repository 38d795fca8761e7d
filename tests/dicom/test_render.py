"""Tests for dicomweb_server.dicom.render: parameters, VOI pipeline, encodings."""

from __future__ import annotations

import io
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate, generate_frames
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, JPEGBaseline8Bit, RLELossless, generate_uid

from dicomweb_server.dicom.pixels import NotAnImage, decode_frame, image_info
from dicomweb_server.dicom.render import (
    DEFAULT_QUALITY,
    THUMBNAIL_SIZE,
    InvalidRenderParameter,
    RenderParams,
    UnsupportedMediaType,
    Viewport,
    Window,
    encode_png,
    frames_for_rendered,
    frames_for_thumbnail,
    render,
    thumbnail_params,
    to_display,
)

TEST_FILES = Path(pydicom.__file__).parent / "data" / "test_files"
MEDIA = ("image/jpeg", "image/png", "image/gif")


def _read(path, **kwargs) -> Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pydicom.dcmread(path, **kwargs)


@lru_cache(maxsize=None)
def load(path: Path):
    """(header, frame 1 as decoded by pydicom) for images pydicom can decode, else None."""
    try:
        ds = _read(path)
    except Exception:
        return None
    if "PixelData" not in ds or "TransferSyntaxUID" not in getattr(ds, "file_meta", {}):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = ds.pixel_array
    except Exception:
        return None
    if image_info(ds).number_of_frames > 1:
        arr = arr[0]
    return _read(path, stop_before_pixels=True), arr


CORPUS = [p for p in sorted(TEST_FILES.rglob("*")) if p.is_file() and load(p) is not None]
IDS = [str(p.relative_to(TEST_FILES)) for p in CORPUS]


def _open(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def _png_array(header, arr, params=None) -> np.ndarray:
    return np.asarray(_open(render(header, [arr], params, "image/png")))


# ---------------------------------------------------------- every bundled image


@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_render_every_image_as_jpeg_png_gif(path):
    header, arr = load(path)
    info = image_info(header)
    colour = info.samples_per_pixel == 3 or info.photometric_interpretation == "PALETTE COLOR"
    for media_type, fmt in zip(MEDIA, ("JPEG", "PNG", "GIF")):
        img = _open(render(header, [arr], RenderParams(), media_type))
        assert img.format == fmt
        assert img.size == (info.columns, info.rows)
        if media_type != "image/gif":
            assert img.mode == ("RGB" if colour else "L")


def _reference_grey(header: Dataset, arr: np.ndarray, window=None) -> np.ndarray | None:
    """Plain float64 PS3.3 C.11.2.1.2 pipeline, written independently of render.py."""
    x = arr.astype(np.float64)
    slope = float(header.get("RescaleSlope", 1) or 1)
    intercept = float(header.get("RescaleIntercept", 0) or 0)
    m = x * slope + intercept
    if window is None and "WindowCenter" in header and "WindowWidth" in header:
        c, w = header.WindowCenter, header.WindowWidth
        c = float(c[0] if isinstance(c, pydicom.multival.MultiValue) else c)
        w = float(w[0] if isinstance(w, pydicom.multival.MultiValue) else w)
        function = str(header.get("VOILUTFunction", "LINEAR")).upper()
        if function != "LINEAR" or w < 1:
            return None
        window = (c, w, "LINEAR")
    if window is None:  # no VOI in the header: min-max of the frame
        lo, hi = m.min(), m.max()
        y = np.zeros_like(m) if hi == lo else (m - lo) / (hi - lo) * 255.0
    else:
        c, w, function = window
        if function == "LINEAR":
            y = np.empty_like(m)
            low = m <= c - 0.5 - (w - 1) / 2
            high = m > c - 0.5 + (w - 1) / 2
            mid = ~low & ~high
            y[low] = 0.0
            y[high] = 255.0
            y[mid] = ((m[mid] - (c - 0.5)) / (w - 1) + 0.5) * 255.0
        elif function == "LINEAR_EXACT":
            y = np.empty_like(m)
            low = m <= c - w / 2
            high = m > c + w / 2
            mid = ~low & ~high
            y[low] = 0.0
            y[high] = 255.0
            y[mid] = ((m[mid] - c) / w + 0.5) * 255.0
        else:  # SIGMOID
            y = 255.0 / (1.0 + np.exp(-4.0 * (m - c) / w))
    if header.PhotometricInterpretation == "MONOCHROME1":
        y = 255.0 - y
    return np.round(y)


GREY = [
    p for p in CORPUS if str(load(p)[0].PhotometricInterpretation) in ("MONOCHROME1", "MONOCHROME2")
]


@pytest.mark.parametrize("path", GREY, ids=[str(p.relative_to(TEST_FILES)) for p in GREY])
def test_grey_png_matches_plain_numpy_voi(path):
    header, arr = load(path)
    expected = _reference_grey(header, arr)
    if expected is None:
        pytest.skip("header VOI function is not LINEAR")
    png = _png_array(header, arr)
    assert png.dtype == np.uint8 and png.shape == arr.shape
    assert np.abs(png.astype(int) - expected.astype(int)).max() <= 1
    # grayscale GIF uses a 256-level grey palette: same pixels as the PNG
    gif = np.asarray(_open(render(header, [arr], None, "image/gif")).convert("L"))
    assert np.array_equal(gif, png)


def _ct():
    return load(TEST_FILES / "CT_small.dcm")


def test_monochrome1_is_inverted():
    header, arr = _ct()
    mono1 = _read(TEST_FILES / "CT_small.dcm", stop_before_pixels=True)
    mono1.PhotometricInterpretation = "MONOCHROME1"
    params = RenderParams(window=Window(40, 400))
    normal = _png_array(header, arr, params)
    inverted = _png_array(mono1, arr, params)
    assert np.abs(inverted.astype(int) - (255 - normal.astype(int))).max() <= 1
    expected = _reference_grey(mono1, arr, (40.0, 400.0, "LINEAR"))
    assert np.abs(inverted.astype(int) - expected).max() <= 1
    # Presentation LUT Shape INVERSE inverts MONOCHROME2 the same way
    shaped = _read(TEST_FILES / "CT_small.dcm", stop_before_pixels=True)
    shaped.PresentationLUTShape = "INVERSE"
    assert np.array_equal(_png_array(shaped, arr, params), inverted)


@pytest.mark.parametrize(
    "window",
    [
        (40.0, 400.0, "LINEAR"),
        (1000.0, 2.0, "LINEAR"),
        (-200.0, 1500.5, "LINEAR_EXACT"),
        (80.0, 300.0, "SIGMOID"),
        (0.0, 1.0, "LINEAR"),
    ],
)
def test_window_parameter_changes_pixels_as_computed(window):
    header, arr = _ct()
    c, w, function = window
    query = {"window": f"{c:g},{w:g},{function.lower()}"}
    png = _png_array(header, arr, RenderParams.parse(query))
    expected = _reference_grey(header, arr, window)
    assert np.abs(png.astype(int) - expected).max() <= 1
    assert not np.array_equal(png, _png_array(header, arr))  # differs from the header VOI


def test_window_on_signed_16_bit_with_rescale():
    header = _read(TEST_FILES / "693_J2KI.dcm", stop_before_pixels=True)  # slope 1, intercept -1024
    arr = load(TEST_FILES / "693_J2KI.dcm")[1]
    png = _png_array(header, arr, RenderParams(window=Window(300, 1500)))
    assert np.abs(png.astype(int) - _reference_grey(header, arr, (300, 1500, "LINEAR"))).max() <= 1
    # the header's first of several window pairs is used (J2K_pixelrep_mismatch has 3)
    h2, a2 = load(TEST_FILES / "J2K_pixelrep_mismatch.dcm")
    assert len(h2.WindowCenter) == 3
    assert np.abs(_png_array(h2, a2).astype(int) - _reference_grey(h2, a2)).max() <= 1


def test_viewport_scales_keeping_aspect_and_flips():
    header, arr = _ct()  # 128 x 128
    size = lambda q, mt="image/png": _open(render(header, [arr], RenderParams.parse(q), mt)).size  # noqa: E731
    assert size({"viewport": "64,64"}) == (64, 64)
    assert size({"viewport": "200,100"}) == (100, 100)
    assert size({"viewport": "512,300"}, "image/jpeg") == (300, 300)
    assert size({"viewport": "256,256,10,20,40,30"}) == (256, 192)
    assert size({"viewport": "100,100,100,0,,"}) == (
        22,
        100,
    )  # region 28 x 128 to the edges, x 100/128
    assert size({"viewport": "64,64,120,120,50,50"}) == (64, 64)  # region clipped to 8 x 8
    plain = _png_array(header, arr)
    flip_x = _png_array(header, arr, RenderParams.parse({"viewport": "128,128,0,0,-128,128"}))
    flip_y = _png_array(header, arr, RenderParams.parse({"viewport": "128,128,0,0,128,-128"}))
    assert np.array_equal(flip_x, plain[:, ::-1])
    assert np.array_equal(flip_y, plain[::-1])
    crop = _png_array(header, arr, RenderParams.parse({"viewport": "32,16,8,4,32,16"}))
    assert np.array_equal(crop, plain[4:20, 8:40])
    with pytest.raises(InvalidRenderParameter):
        render(header, [arr], RenderParams.parse({"viewport": "64,64,128,0,10,10"}), "image/png")


def test_quality_changes_jpeg_size_and_default_is_90():
    header, arr = load(TEST_FILES / "693_J2KI.dcm")
    sizes = [
        len(render(header, [arr], RenderParams(quality=q), "image/jpeg")) for q in (10, 50, 95)
    ]
    assert sizes[0] < sizes[1] < sizes[2]
    assert DEFAULT_QUALITY == 90
    assert render(header, [arr], RenderParams(), "image/jpeg") == render(
        header, [arr], RenderParams(quality=90), "image/jpeg"
    )
    # quality does not apply to lossless PNG
    assert render(header, [arr], RenderParams(quality=10), "image/png") == render(
        header, [arr], RenderParams(), "image/png"
    )


INVALID = [
    {"quality": "0"},
    {"quality": "101"},
    {"quality": "abc"},
    {"quality": "50.5"},
    {"quality": ["50", "60"]},
    {"viewport": "512"},
    {"viewport": "512,512,0"},
    {"viewport": "0,512"},
    {"viewport": "-5,512"},
    {"viewport": "a,b"},
    {"viewport": "512,512,-1,0,10,10"},
    {"viewport": "512,512,0,0,0,10"},
    {"viewport": "99999,512"},
    {"window": "40"},
    {"window": "40,abc"},
    {"window": "40,0"},
    {"window": "40,0.5,linear"},
    {"window": "40,-10,sigmoid"},
    {"window": "40,400,cubic"},
    {"window": "nan,400"},
    {"window": "40,inf"},
    {"window": "40,400,linear,extra"},
    {"annotation": "patient,weather"},
    {"annotation": ""},
    {"iccprofile": "cmyk"},
]


@pytest.mark.parametrize("query", INVALID, ids=[repr(q) for q in INVALID])
def test_invalid_parameters_raise(query):
    with pytest.raises(InvalidRenderParameter):
        RenderParams.parse(query)
    assert issubclass(InvalidRenderParameter, ValueError)


def test_valid_parameters_parse():
    p = RenderParams.parse(
        {
            "quality": "75",
            "viewport": "512,256,10,20,-100,50",
            "window": "-600,1500,LINEAR-EXACT",
            "annotation": ["patient", "technique,patient"],
            "iccprofile": "sRGB",
            "accept": "image/png",  # content negotiation: not ours
            "charset": "utf-8",
            "unknown": "whatever",  # unknown parameters are ignored
        }
    )
    assert p.quality == 75 and p.jpeg_quality == 75
    assert p.viewport == Viewport(512, 256, 10, 20, -100, 50)
    assert p.window == Window(-600.0, 1500.0, "LINEAR_EXACT")
    assert p.annotation == ("patient", "technique")
    assert p.iccprofile == "srgb"
    assert RenderParams.parse({}) == RenderParams() == RenderParams.parse(None)
    assert RenderParams.parse({"window": "40,400"}).window == Window(40.0, 400.0, "LINEAR")
    assert RenderParams.parse({"window": "40,0.5,sigmoid"}).window.function == "SIGMOID"
    assert RenderParams.parse({"window": "40,1,linear_exact"}).window.function == "LINEAR_EXACT"
    assert RenderParams.parse({"quality": ["80", "80"]}).quality == 80
    assert RenderParams.parse({"viewport": "64,32"}).viewport == Viewport(64, 32)


def test_frames_for_rendered_and_media_types():
    assert frames_for_rendered(1, "image/jpeg") == [1]
    assert frames_for_rendered(30, "image/jpeg") == [1]
    assert frames_for_rendered(30, "image/png") == [1]
    assert frames_for_rendered(3, "image/gif") == [1, 2, 3]
    assert frames_for_rendered(0, "image/gif") == [1]
    assert frames_for_thumbnail(30) == [1]
    for bad in ("image/jp2", "video/mp4", "text/html", "application/dicom"):
        with pytest.raises(UnsupportedMediaType):
            frames_for_rendered(2, bad)
    header, arr = _ct()
    with pytest.raises(UnsupportedMediaType):
        render(header, [arr], None, "image/jp2")


def test_animated_gif_for_multi_frame():
    path = TEST_FILES / "rtdose.dcm"  # 15 frames, 32-bit
    ds = _read(path)
    header = _read(path, stop_before_pixels=True)
    numbers = frames_for_rendered(int(ds.NumberOfFrames), "image/gif")
    frames = [ds.pixel_array[n - 1] for n in numbers]
    img = _open(render(header, frames, None, "image/gif"))
    assert img.n_frames == 15 and img.is_animated
    assert img.size == (ds.Columns, ds.Rows)
    # colour multi-frame
    path = TEST_FILES / "SC_rgb_rle_2frame.dcm"
    ds = _read(path)
    frames = [ds.pixel_array[0], ds.pixel_array[1]]
    img = _open(render(ds, frames, None, "image/gif"))
    assert img.n_frames == 2
    img.seek(1)
    assert img.convert("RGB").getpixel((50, 5)) == tuple(int(v) for v in ds.pixel_array[1][5, 50])
    # JPEG/PNG of several frames use the first
    jpeg = _open(render(ds, frames, None, "image/png"))
    assert np.array_equal(np.asarray(jpeg), ds.pixel_array[0])


def test_thumbnail_params():
    params = thumbnail_params()
    assert params.viewport == Viewport(*THUMBNAIL_SIZE) == Viewport(128, 128)
    header, arr = load(TEST_FILES / "JPEG2000.dcm")  # 1024 rows x 256 columns
    assert _open(render(header, [arr], params, "image/jpeg")).size == (32, 128)
    assert thumbnail_params({"viewport": "64,64", "quality": "bogus"}).viewport == Viewport(64, 64)
    with pytest.raises(InvalidRenderParameter):
        thumbnail_params({"viewport": "0,0"})


def test_not_an_image_raises():
    sr = Dataset()
    sr.Modality = "SR"
    sr.SOPClassUID = "1.2.840.10008.5.1.4.1.1.88.22"
    with pytest.raises(NotAnImage):
        render(sr, [np.zeros((2, 2), np.uint8)], None, "image/jpeg")
    with pytest.raises(NotAnImage):
        to_display(sr, np.zeros((2, 2), np.uint8))


def test_annotation_is_burned_in():
    header = _read(TEST_FILES / "CT_small.dcm", stop_before_pixels=True)
    arr = _ct()[1]
    plain = _png_array(header, arr, RenderParams(viewport=Viewport(256, 256)))
    both = _png_array(
        header, arr, RenderParams.parse({"viewport": "256,256", "annotation": "patient,technique"})
    )
    assert plain.shape == both.shape
    assert np.count_nonzero(plain != both) > 100
    header.PatientName = "Ünïcödé^名前"
    unicode = _png_array(header, arr, RenderParams.parse({"annotation": "patient"}))
    assert unicode.shape == arr.shape


def test_iccprofile():
    path = TEST_FILES / "examples_rgb_color.dcm"
    header, arr = load(path)
    with_icc = _open(render(header, [arr], RenderParams.parse({"iccprofile": "yes"}), "image/png"))
    assert with_icc.info.get("icc_profile")
    assert not _open(render(header, [arr], None, "image/png")).info.get("icc_profile")
    jpeg = _open(render(header, [arr], RenderParams.parse({"iccprofile": "srgb"}), "image/jpeg"))
    assert jpeg.info.get("icc_profile")
    grey_header, grey = _ct()
    assert not _open(
        render(grey_header, [grey], RenderParams(iccprofile="yes"), "image/png")
    ).info.get("icc_profile")


# ------------------------------------------------------------------- case W5 colour

COLOURS = np.array(
    [
        [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]],
        [[0, 255, 255], [255, 0, 255], [255, 255, 255], [16, 32, 64]],
    ],
    dtype=np.uint8,
)


def _rgb_header(planar: int) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPInstanceUID = generate_uid()
    ds.Rows, ds.Columns, ds.SamplesPerPixel = 2, 4, 3
    ds.PhotometricInterpretation = "RGB"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PlanarConfiguration = planar
    ds.PixelData = COLOURS.transpose(2, 0, 1).tobytes() if planar else COLOURS.tobytes()
    return ds


@pytest.mark.parametrize("name", ["native-pc0", "native-pc1", "rle", "jpeg"])
def test_w5_rendered_png_colours(name):
    if name.startswith("native"):
        ds = _rgb_header(int(name[-1]))
        ts, frame, tol = ExplicitVRLittleEndian, ds.PixelData, 0
    elif name == "rle":
        ds = _rgb_header(0)
        ds.compress(RLELossless)
        ts, tol = RLELossless, 0
        frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    else:
        ds = _rgb_header(0)
        buf = io.BytesIO()
        Image.fromarray(COLOURS).save(buf, "JPEG", quality=95, subsampling=0)
        ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
        ds.PhotometricInterpretation = "YBR_FULL"
        ds.PixelData = encapsulate([buf.getvalue()])
        ts, frame, tol = JPEGBaseline8Bit, buf.getvalue(), 16
    arr = decode_frame(ds, frame, ts)
    png = _png_array(ds, arr)
    assert png.shape == (2, 4, 3)
    assert np.abs(png.astype(int) - COLOURS).max() <= tol
    gif = np.asarray(_open(render(ds, [arr], None, "image/gif")).convert("RGB"))
    assert np.abs(gif.astype(int) - COLOURS).max() <= tol  # 8 colours fit a GIF palette
    assert _open(render(ds, [arr], None, "image/jpeg")).size == (4, 2)


def test_ybr_array_converted_when_asked():
    ds = _rgb_header(0)
    from pydicom.pixels import convert_color_space

    ybr = convert_color_space(COLOURS, "RGB", "YBR_FULL")
    out = to_display(ds, ybr, photometric="YBR_FULL")
    assert np.abs(out.astype(int) - COLOURS).max() <= 2


def test_palette_colour_8_and_16_bit():
    header, arr = load(TEST_FILES / "examples_palette.dcm")
    from pydicom.pixels import apply_color_lut

    ds = _read(TEST_FILES / "examples_palette.dcm")
    expected = apply_color_lut(arr, ds)
    if expected.dtype != np.uint8:
        expected = (expected >> 8).astype(np.uint8)
    assert np.array_equal(_png_array(header, arr), expected)
    # synthetic 16-bit palette, first mapped value 10
    pal = Dataset()
    pal.Rows, pal.Columns, pal.SamplesPerPixel = 1, 4, 1
    pal.PhotometricInterpretation = "PALETTE COLOR"
    pal.BitsAllocated, pal.BitsStored, pal.HighBit, pal.PixelRepresentation = 8, 8, 7, 0
    entries = np.array([0, 0x4000, 0x8000, 0xFFFF], "<u2")
    for colour in ("Red", "Green", "Blue"):
        setattr(pal, f"{colour}PaletteColorLookupTableDescriptor", [4, 10, 16])
        setattr(pal, f"{colour}PaletteColorLookupTableData", entries.tobytes())
    out = to_display(pal, np.array([[10, 11, 12, 13]], np.uint8))
    assert out[0, :, 0].tolist() == [0, 0x40, 0x80, 0xFF]


def test_segmented_palette():
    pal = Dataset()
    pal.Rows, pal.Columns, pal.SamplesPerPixel = 1, 4, 1
    pal.PhotometricInterpretation = "PALETTE COLOR"
    pal.BitsAllocated, pal.BitsStored, pal.HighBit, pal.PixelRepresentation = 8, 8, 7, 0
    # discrete segment [0], then a linear segment to 65535 over 3 entries (PS3.3 C.7.9.2)
    segments = np.array([0, 1, 0, 1, 3, 0xFFFF], "<u2").tobytes()
    for colour in ("Red", "Green", "Blue"):
        setattr(pal, f"{colour}PaletteColorLookupTableDescriptor", [4, 0, 16])
        setattr(pal, f"Segmented{colour}PaletteColorLookupTableData", segments)
    out = to_display(pal, np.array([[0, 1, 2, 3]], np.uint8))
    assert out.shape == (1, 4, 3)
    assert out[0, :, 1].tolist() == [0, 85, 170, 255]


def test_render_is_thread_safe():
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(p, mt) for p in CORPUS[:40] for mt in MEDIA]

    def work(job):
        header, arr = load(job[0])
        return render(header, [arr], RenderParams(viewport=Viewport(96, 96)), job[1])

    single = [work(j) for j in jobs]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(work, jobs)) == single


def test_modality_and_voi_lut_sequences():
    ds = Dataset()
    ds.Rows, ds.Columns, ds.SamplesPerPixel = 1, 5, 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    mlut = Dataset()
    mlut.LUTDescriptor = [4, 100, 16]
    mlut.LUTData = [0, 1000, 2000, 4000]
    ds.ModalityLUTSequence = Sequence([mlut])
    arr = np.array([[99, 100, 101, 102, 103]], np.uint16)
    # no VOI: min-max of the Modality LUT output (0..4000)
    out = to_display(ds, arr)
    assert out.tolist() == [[0, 0, 64, 128, 255]]
    ds.WindowCenter, ds.WindowWidth = 1000, 1000  # linear, in Modality LUT output units
    expected = _reference_grey_plain(np.array([0, 0, 1000, 2000, 4000.0]), 1000, 1000)
    assert np.abs(to_display(ds, arr).astype(int) - expected).max() <= 1
    # VOI LUT Sequence: used when there is no window
    del ds.WindowCenter, ds.WindowWidth
    del ds.ModalityLUTSequence
    voi = Dataset()
    voi.LUTDescriptor = [3, 0, 8]
    voi.LUTData = [0, 128, 255]
    ds.VOILUTSequence = Sequence([voi])
    assert to_display(ds, np.array([[0, 1, 2, 3, 7]], np.uint16)).tolist() == [
        [0, 128, 255, 255, 255]
    ]


def _reference_grey_plain(m: np.ndarray, c: float, w: float) -> np.ndarray:
    y = ((m - (c - 0.5)) / (w - 1) + 0.5) * 255.0
    return np.round(np.clip(y, 0, 255))


def test_enhanced_multi_frame_functional_groups():
    ds = Dataset()
    ds.Rows, ds.Columns, ds.SamplesPerPixel = 1, 3, 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.NumberOfFrames = 2
    shared = Dataset()
    pvt = Dataset()
    pvt.RescaleSlope, pvt.RescaleIntercept = 1, -1024
    shared.PixelValueTransformationSequence = Sequence([pvt])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    per = []
    for c, w in ((0, 100), (1000, 100)):
        item = Dataset()
        voi = Dataset()
        voi.WindowCenter, voi.WindowWidth = c, w
        item.FrameVOILUTSequence = Sequence([voi])
        per.append(item)
    ds.PerFrameFunctionalGroupsSequence = Sequence(per)
    arr = np.array([[1024, 1074, 2024]], np.int16)  # HU 0, 50, 1000
    f1 = to_display(ds, arr, frame_number=1)
    f2 = to_display(ds, arr, frame_number=2)
    assert (
        np.abs(f1.astype(int) - _reference_grey_plain(np.array([0.0, 50, 1000]), 0, 100)).max() <= 1
    )
    assert (
        np.abs(f2.astype(int) - _reference_grey_plain(np.array([0.0, 50, 1000]), 1000, 100)).max()
        <= 1
    )


def test_flat_and_bilevel_images():
    header, arr = load(TEST_FILES / "liver_1frame.dcm")  # 1-bit segmentation
    png = _png_array(header, arr)
    assert set(np.unique(png)) <= {0, 255}
    flat = np.full((4, 4), 7, np.uint16)
    ds = Dataset()
    ds.Rows = ds.Columns = 4
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.PixelRepresentation = 0
    assert _png_array(ds, flat).max() == 0


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (64, 33), (7, 9, 3), (120, 160, 3)])
def test_encode_png_round_trip(shape):
    rng = np.random.default_rng(sum(shape))
    arr = rng.integers(0, 256, shape, dtype=np.uint8)
    back = np.asarray(_open(encode_png(arr)))
    assert np.array_equal(back, arr)
    with_icc = _open(encode_png(arr, b"fake profile"))
    assert with_icc.info.get("icc_profile") == b"fake profile"

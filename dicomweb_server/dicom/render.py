"""Rendered resources: decoded frames -> 8-bit pictures -> JPEG / PNG / GIF bytes.

Standard sections this module follows (DICOM PS3.18 Web Services, PS3.3, PS3.4):

* Query parameters, PS3.18 8.3.5.1 (Table 8.3.5-1): ``quality``, ``viewport``,
  ``window``, ``annotation``, ``iccprofile`` (``accept``/``charset`` belong to content
  negotiation and are left to the web layer). Unknown parameters are ignored: "The
  origin server shall ignore any unknown parameters" (PS3.18 2018b 6.5.8.1.2, the
  Retrieve Rendered query parameters that 8.3.5.1 now holds). An invalid value of a known parameter raises
  :class:`InvalidRenderParameter` (web layer: 400 Bad Request).
* Rendering pipeline, PS3.18 8.3.5.1 / PS3.4 N.2: the parameters are applied "as if
  they were a Presentation State": Modality LUT -> VOI -> Presentation LUT
  (MONOCHROME1 / INVERSE) for grayscale, then the viewport (source region, flip,
  scale), then annotations burned in last. Window formulas: PS3.3 C.11.2.1.2
  (LINEAR, LINEAR_EXACT, SIGMOID). Rendered images have 8 bits per channel
  (PS3.18 8.7.4).
* Media types per resource category, PS3.18 8.7.4 Table 8.7.4-1: image/jpeg
  (default), image/png and image/gif are single-frame image media types; image/gif
  is also the multi-frame image media type. Hence for an instance (PS3.18 10.4.1.1.3
  rendered instance resource) :func:`frames_for_rendered` asks the archive for
  frame 1 only for JPEG/PNG (a single-frame format cannot hold more; clients that
  want another frame use the rendered *frames* resource) and for every frame for
  GIF, which becomes an animated GIF (Frame Time / Cine Rate give the delay).
* quality (Table 8.3.5-1, uint): 1..100, 100 best; it only affects lossy media types
  (JPEG). The standard leaves the default to the origin server: 90.
* viewport=vw,vh[,sx,sy,sw,sh] (Table 8.3.5-1): the source region starts at
  (sx, sy) (default 0,0) and is |sw| x |sh| pixels (default: to the right/bottom
  edge); a negative sw flips the region horizontally, a negative sh vertically. The
  region is clipped to the image, then scaled (up or down) to the largest size that
  fits vw x vh keeping its aspect ratio; the result is not padded. vw and vh are
  limited to :data:`MAX_VIEWPORT`.
* window=center,width[,function] (Table 8.3.5-1, PS3.3 C.11.2.1.2): replaces the header's VOI;
  function linear | linear-exact (or linear_exact) | sigmoid, case-insensitive,
  default linear. Ignored for colour images.
* annotation=patient[,technique] (Table 8.3.5-1; "the exact nature and presentation
  of the annotations is determined by the origin server"): burned in after scaling with
  Pillow's default font: "patient" draws Patient's Name, Patient ID, Birth Date and
  Sex top-left; "technique" draws Modality, Series Description, the window
  actually applied (C/W), kVp and Slice Thickness bottom-left. Without the
  parameter nothing is drawn.
* iccprofile (Table 8.3.5-1: no, yes, srgb, adobergb, rommrgb): "no" (default) embeds nothing; "yes" embeds the
  instance's ICC Profile (0028,2000) if it has one, else sRGB; "srgb" converts
  pixels from the instance's profile (if any) to sRGB and embeds sRGB. "adobergb"
  and "rommrgb" are accepted but served as "srgb" (no such profiles are bundled).
  Only colour JPEG/PNG carry a profile (grayscale and GIF never do).
* Thumbnails (PS3.18 thumbnail resources: the origin server chooses the size; only
  ``viewport`` is meaningful): :func:`thumbnail_params` fits frame 1 within
  128 x 128 unless the query gives a viewport (:data:`THUMBNAIL_SIZE`).

Everything here is pure and thread-safe (immutable parameters, no shared mutable
state besides lock-protected or idempotent caches), for use from a thread pool.
"""

from __future__ import annotations

import io
import math
import struct
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from pydicom.dataset import Dataset

from .pixels import ImageInfo, NotAnImage, PixelDataError, element_value, image_info

__all__ = [
    "DEFAULT_QUALITY",
    "MAX_VIEWPORT",
    "RENDERED_MEDIA_TYPES",
    "THUMBNAIL_SIZE",
    "InvalidRenderParameter",
    "NotAnImage",
    "RenderParams",
    "UnsupportedMediaType",
    "Viewport",
    "Window",
    "frames_for_rendered",
    "frames_for_thumbnail",
    "encode_png",
    "render",
    "thumbnail_params",
    "to_display",
]

DEFAULT_QUALITY = 90
THUMBNAIL_SIZE = (128, 128)
MAX_VIEWPORT = 8192
RENDERED_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif")
#: PNG zlib level: 1 is several times faster than the default 6 on CT/MR-sized
#: images for ~10-20% more bytes; PNG stays lossless either way.
PNG_COMPRESS_LEVEL = 1
#: Animated GIF delay when the header has neither Frame Time nor a frame rate.
DEFAULT_FRAME_TIME_MS = 100


class InvalidRenderParameter(ValueError):
    """A rendering query parameter has an invalid value (400 Bad Request)."""


class UnsupportedMediaType(ValueError):
    """The requested rendered media type cannot be produced (406 Not Acceptable)."""


# ---------------------------------------------------------------------- parameters

_FUNCTIONS = {
    "linear": "LINEAR",
    "linear_exact": "LINEAR_EXACT",
    "linear-exact": "LINEAR_EXACT",
    "sigmoid": "SIGMOID",
}
_ANNOTATIONS = ("patient", "technique")
_ICC = ("no", "yes", "srgb", "adobergb", "rommrgb")


@dataclass(frozen=True, slots=True)
class Viewport:
    """viewport=vw,vh[,sx,sy,sw,sh]; sw/sh None = to the image edge, negative = flip."""

    vw: int
    vh: int
    sx: int = 0
    sy: int = 0
    sw: int | None = None
    sh: int | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """window=center,width[,function]; function is LINEAR, LINEAR_EXACT or SIGMOID."""

    center: float
    width: float
    function: str = "LINEAR"


def _single(query: Mapping[str, Any], name: str) -> str | None:
    if name not in query:
        return None
    value = query[name]
    if isinstance(value, (list, tuple)):
        values = [str(v) for v in value]
        if not values:
            return None
        if len(set(values)) > 1:
            raise InvalidRenderParameter(f"{name} must be given once, got {len(values)} values")
        value = values[0]
    return str(value)


def _parse_int(text: str, name: str) -> int:
    text = text.strip()
    try:
        if not text or not text.lstrip("+-").isdigit():
            raise ValueError
        return int(text)
    except ValueError:
        raise InvalidRenderParameter(f"{name}: {text!r} is not an integer") from None


def _parse_decimal(text: str, name: str) -> float:
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        raise InvalidRenderParameter(f"{name}: {text!r} is not a decimal number") from None
    if not math.isfinite(value) or text.lower() in ("nan", "inf", "+inf", "-inf", "infinity"):
        raise InvalidRenderParameter(f"{name}: {text!r} is not a finite number")
    return value


def _parse_quality(text: str) -> int:
    quality = _parse_int(text, "quality")
    if not 1 <= quality <= 100:
        raise InvalidRenderParameter(f"quality must be an integer from 1 to 100, got {quality}")
    return quality


def _parse_viewport(text: str) -> Viewport:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (2, 6):
        raise InvalidRenderParameter(
            f"viewport must be vw,vh or vw,vh,sx,sy,sw,sh; got {len(parts)} values"
        )
    vw = _parse_int(parts[0], "viewport vw")
    vh = _parse_int(parts[1], "viewport vh")
    for name, v in (("vw", vw), ("vh", vh)):
        if not 1 <= v <= MAX_VIEWPORT:
            raise InvalidRenderParameter(
                f"viewport {name} must be from 1 to {MAX_VIEWPORT}, got {v}"
            )
    if len(parts) == 2:
        return Viewport(vw, vh)
    sx = _parse_int(parts[2], "viewport sx") if parts[2] else 0
    sy = _parse_int(parts[3], "viewport sy") if parts[3] else 0
    sw = _parse_int(parts[4], "viewport sw") if parts[4] else None
    sh = _parse_int(parts[5], "viewport sh") if parts[5] else None
    if sx < 0 or sy < 0:
        raise InvalidRenderParameter(f"viewport sx and sy must not be negative, got {sx},{sy}")
    if sw == 0 or sh == 0:
        raise InvalidRenderParameter("viewport sw and sh must not be 0")
    return Viewport(vw, vh, sx, sy, sw, sh)


def _parse_window(text: str) -> Window:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (2, 3):
        raise InvalidRenderParameter(
            f"window must be center,width[,function]; got {len(parts)} values"
        )
    center = _parse_decimal(parts[0], "window center")
    width = _parse_decimal(parts[1], "window width")
    function = "LINEAR"
    if len(parts) == 3:
        try:
            function = _FUNCTIONS[parts[2].lower()]
        except KeyError:
            raise InvalidRenderParameter(
                f"window function must be linear, linear-exact or sigmoid, got {parts[2]!r}"
            ) from None
    if function == "LINEAR" and width < 1:
        raise InvalidRenderParameter(f"window width must be >= 1 for linear, got {parts[1]}")
    if width <= 0:
        raise InvalidRenderParameter(f"window width must be > 0, got {parts[1]}")
    return Window(center, width, function)


def _parse_annotation(values: Any) -> tuple[str, ...]:
    items = values if isinstance(values, (list, tuple)) else [values]
    out: list[str] = []
    for item in items:
        for word in str(item).split(","):
            word = word.strip().lower()
            if word not in _ANNOTATIONS:
                raise InvalidRenderParameter(
                    f"annotation must be a list of patient, technique; got {word!r}"
                )
            if word not in out:
                out.append(word)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RenderParams:
    """Parsed rendering query parameters (PS3.18 8.3.5.1); immutable."""

    quality: int | None = None
    viewport: Viewport | None = None
    window: Window | None = None
    annotation: tuple[str, ...] = field(default=())
    iccprofile: str = "no"

    @property
    def jpeg_quality(self) -> int:
        return self.quality if self.quality is not None else DEFAULT_QUALITY

    @classmethod
    def parse(cls, query: Mapping[str, str | list[str]] | None) -> "RenderParams":
        """Parse a query mapping (value: a string or a list of repeated values).

        Parameter names are matched as given (lower case, per the standard);
        unknown names are ignored. Raises InvalidRenderParameter for bad values.
        """
        if not query:
            return cls()
        quality = viewport = window = None
        annotation: tuple[str, ...] = ()
        icc = "no"
        if (text := _single(query, "quality")) is not None:
            quality = _parse_quality(text)
        if (text := _single(query, "viewport")) is not None:
            viewport = _parse_viewport(text)
        if (text := _single(query, "window")) is not None:
            window = _parse_window(text)
        if "annotation" in query:
            annotation = _parse_annotation(query["annotation"])
        if (text := _single(query, "iccprofile")) is not None:
            icc = text.strip().lower()
            if icc not in _ICC:
                raise InvalidRenderParameter(
                    f"iccprofile must be one of {', '.join(_ICC)}; got {text!r}"
                )
        return cls(quality, viewport, window, annotation, icc)


def thumbnail_params(query: Mapping[str, str | list[str]] | None = None) -> RenderParams:
    """Parameters for a thumbnail resource: the query's viewport or 128 x 128.

    Only ``viewport`` is taken from the query (others are ignored).
    """
    viewport = None
    if query and (text := _single(query, "viewport")) is not None:
        viewport = _parse_viewport(text)
    return RenderParams(viewport=viewport or Viewport(*THUMBNAIL_SIZE))


def frames_for_rendered(number_of_frames: int, media_type: str) -> list[int]:
    """1-based frame numbers the archive passes to :func:`render` for an instance.

    image/gif: all frames (animated GIF, PS3.18 Table 8.7.4-1 Multi-frame Image);
    image/jpeg, image/png: frame 1 (single-frame media types).
    """
    media_type = _media_type(media_type)
    n = max(int(number_of_frames or 1), 1)
    if media_type == "image/gif":
        return list(range(1, n + 1))
    return [1]


def frames_for_thumbnail(number_of_frames: int) -> list[int]:
    """A thumbnail is always a single picture of frame 1."""
    return [1]


def _media_type(media_type: str) -> str:
    mt = str(media_type).split(";")[0].strip().lower()
    if mt not in RENDERED_MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"cannot render as {media_type!r}; supported: {', '.join(RENDERED_MEDIA_TYPES)}"
        )
    return mt


# ---------------------------------------------------------------- header look-ups


def _get(ds: Dataset | None, tag: int, default: Any = None) -> Any:
    return element_value(ds, tag, default)


def _first_float(value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, (list, tuple))
        or hasattr(value, "__getitem__")
        and not isinstance(value, (str, bytes))
    ):
        if len(value) == 0:
            return None
        value = value[0]
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


@dataclass(slots=True)
class _Grayscale:
    slope: float = 1.0
    intercept: float = 0.0
    center: float | None = None
    width: float | None = None
    function: str = "LINEAR"
    item: Dataset | None = None  # dataset carrying Modality/VOI LUT Sequences


def _functional_item(header: Dataset, frame_number: int, seq_tag: int) -> Dataset | None:
    """Item of a functional group macro: per-frame overrides shared (PS3.3 C.7.6.16)."""
    found = None
    shared = _get(header, 0x52009229)
    if shared:
        seq = _get(shared[0], seq_tag)
        if seq:
            found = seq[0]
    per_frame = _get(header, 0x52009230)
    if per_frame and 1 <= frame_number <= len(per_frame):
        seq = _get(per_frame[frame_number - 1], seq_tag)
        if seq:
            found = seq[0]
    return found


def _grayscale_attrs(header: Dataset, frame_number: int) -> _Grayscale:
    g = _Grayscale(item=header)
    source: Dataset = header
    voi_source: Dataset = header
    if _get(header, 0x52009229) is not None or _get(header, 0x52009230) is not None:
        source = (
            _functional_item(header, frame_number, 0x00289145) or header
        )  # Pixel Value Transformation
        voi_source = _functional_item(header, frame_number, 0x00289132) or header  # Frame VOI LUT
    g.slope = _first_float(_get(source, 0x00281053)) or 1.0
    g.intercept = _first_float(_get(source, 0x00281052)) or 0.0
    center = _first_float(_get(voi_source, 0x00281050))
    width = _first_float(_get(voi_source, 0x00281051))
    function = str(_get(voi_source, 0x00281056, "LINEAR")).strip().upper()
    if function not in ("LINEAR", "LINEAR_EXACT", "SIGMOID"):
        function = "LINEAR"
    if center is not None and width is not None:
        if width >= 1 or (function != "LINEAR" and width > 0):
            g.center, g.width, g.function = center, width, function
    return g


# ------------------------------------------------------------------ grayscale maths


def _affine_u8(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """uint8(round(clip(a*x + b, 0, 255))) in float32 with one buffer."""
    f = np.multiply(x, np.float32(a), dtype=np.float32)
    f += np.float32(b + 0.5)
    np.clip(f, 0.0, 255.5, out=f)
    return f.astype(np.uint8)


def _affine_u8_small(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """Same as _affine_u8 for 8-bit input, through a 256-entry LUT."""
    if x.dtype == np.uint8:
        lut = _affine_u8(np.arange(256, dtype=np.float64), a, b)
        return np.take(lut, x)
    lut = _affine_u8(np.arange(-128, 128, dtype=np.float64), a, b)
    return np.take(lut, x.view(np.uint8) ^ np.uint8(0x80))


def _sigmoid_u8(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """uint8(round(255 / (1 + exp(a*x + b))))."""
    f = np.multiply(x, np.float32(a), dtype=np.float32)
    f += np.float32(b)
    np.clip(f, -80.0, 80.0, out=f)
    np.exp(f, out=f)
    f += np.float32(1.0)
    np.divide(np.float32(255.0), f, out=f)
    f += np.float32(0.5)
    np.clip(f, 0.0, 255.5, out=f)
    return f.astype(np.uint8)


def _window_coefficients(
    function: str, center: float, width: float, slope: float, intercept: float, invert: bool
) -> tuple[str, float, float]:
    """Fold Modality rescale + VOI window (+ inversion) into y = a*x + b (PS3.3 C.11.2.1.2)."""
    if function == "SIGMOID":
        # y = 255 / (1 + exp(-4 (m - c) / w)), m = slope*x + intercept
        k = -4.0 / width
        a, b = k * slope, k * (intercept - center)
        if invert:  # 255 - y == 255 / (1 + exp(+4 (m - c) / w))
            a, b = -a, -b
        return "sigmoid", a, b
    if function == "LINEAR_EXACT":
        # y = ((m - c) / w + 0.5) * 255
        a = 255.0 * slope / width
        b = 255.0 * ((intercept - center) / width + 0.5)
    elif width > 1:
        # y = ((m - (c - 0.5)) / (w - 1) + 0.5) * 255, clamped to 0..255
        a = 255.0 * slope / (width - 1.0)
        b = 255.0 * ((intercept - (center - 0.5)) / (width - 1.0) + 0.5)
    else:
        # w == 1: a step at m = c - 0.5 (m <= c - 0.5 -> 0, otherwise 255)
        return "step", slope, intercept - (center - 0.5)
    if invert:
        a, b = -a, 255.0 - b
    return "affine", a, b


def _apply(kind: str, x: np.ndarray, a: float, b: float, invert: bool) -> np.ndarray:
    if kind == "affine":
        if x.dtype.itemsize == 1:
            return _affine_u8_small(x, a, b)
        return _affine_u8(x, a, b)
    if kind == "sigmoid":
        return _sigmoid_u8(x, a, b)
    # step: slope*x + offset > 0 -> 255
    m = np.multiply(x, a, dtype=np.float64)
    high = m > -b
    out = np.where(high, np.uint8(255), np.uint8(0)).astype(np.uint8)
    return 255 - out if invert else out


def _modality_lut(item: Dataset, signed: bool) -> tuple[np.ndarray, int, int] | None:
    seq = _get(item, 0x00283000)  # Modality LUT Sequence
    if not seq:
        return None
    return _lut_from_item(seq[0], signed)


def _lut_from_item(lut_item: Dataset, signed: bool) -> tuple[np.ndarray, int, int] | None:
    """(LUT values as int64, first mapped value, bits) from a LUT Descriptor/Data item."""
    desc = _get(lut_item, 0x00283002)
    data = _get(lut_item, 0x00283006)
    if desc is None or data is None:
        return None
    n, first, bits = (int(v) for v in list(desc)[:3])
    n = n or 65536
    if isinstance(data, (bytes, bytearray)):
        values = np.frombuffer(data, "<u2", count=len(data) // 2)
        if bits <= 8 and values.size * 2 == n:  # 8-bit entries packed two per word
            values = np.frombuffer(data, np.uint8)
    else:
        values = np.asarray(list(data) if not isinstance(data, (int, float)) else [data])
    values = values[:n].astype(np.int64)
    if first >= 32768 and signed:  # LUT Descriptor is US or SS after the image's sign
        first -= 65536
    return values, first, bits


def _lookup(x: np.ndarray, lut: np.ndarray, first: int) -> np.ndarray:
    idx = x.astype(np.int64) - first
    np.clip(idx, 0, lut.size - 1, out=idx)
    return np.take(lut, idx)


def _grayscale_u8(
    header: Dataset,
    info: ImageInfo,
    arr: np.ndarray,
    params: RenderParams,
    region: tuple[slice, slice],
    frame_number: int,
    applied: dict[str, Any],
) -> np.ndarray:
    g = _grayscale_attrs(header, frame_number)
    shape_lut = str(_get(header, 0x20500020, "")).strip().upper()  # Presentation LUT Shape
    invert = info.photometric_interpretation == "MONOCHROME1" or shape_lut == "INVERSE"

    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        arr = np.nan_to_num(arr)
    signed = bool(info.pixel_representation)
    mod_lut = _modality_lut(g.item, signed) if g.item is not None else None

    window: tuple[float, float, str] | None = None
    if params.window is not None:
        window = (params.window.center, params.window.width, params.window.function)
    elif g.center is not None:
        window = (g.center, g.width, g.function)  # type: ignore[assignment]

    if mod_lut is None:
        slope, intercept = g.slope, g.intercept
        sub = arr[region]
        if window is None:
            voi_seq = _get(g.item, 0x00283010)  # VOI LUT Sequence
            voi = _lut_from_item(voi_seq[0], signed) if voi_seq else None
            if voi is not None:
                m = sub.astype(np.float64) * slope + intercept
                return _voi_lut_u8(m, voi, invert, applied)
            lo = float(arr.min()) * slope + intercept
            hi = float(arr.max()) * slope + intercept
            lo, hi = min(lo, hi), max(lo, hi)
            if hi <= lo:  # flat image
                value = 255 if invert else 0
                applied["window"] = (lo, 0.0)
                return np.full(sub.shape, value, np.uint8)
            window = ((lo + hi) / 2.0, hi - lo, "LINEAR_EXACT")
        center, width, function = window
        applied["window"] = (center, width)
        kind, a, b = _window_coefficients(function, center, width, slope, intercept, invert)
        return _apply(kind, sub, a, b, invert)

    # Modality LUT Sequence (rare): look up, then window in LUT output units
    lut, first, _bits = mod_lut
    m_full = _lookup(arr, lut, first)
    sub = m_full[region]
    if window is None:
        voi_seq = _get(g.item, 0x00283010)
        voi = _lut_from_item(voi_seq[0], False) if voi_seq else None  # LUT output is unsigned
        if voi is not None:
            return _voi_lut_u8(sub.astype(np.float64), voi, invert, applied)
        lo, hi = float(m_full.min()), float(m_full.max())
        if hi <= lo:
            return np.full(sub.shape, 255 if invert else 0, np.uint8)
        window = ((lo + hi) / 2.0, hi - lo, "LINEAR_EXACT")
    center, width, function = window
    applied["window"] = (center, width)
    kind, a, b = _window_coefficients(function, center, width, 1.0, 0.0, invert)
    return _apply(kind, sub.astype(np.float64), a, b, invert)


def _voi_lut_u8(
    m: np.ndarray, voi: tuple[np.ndarray, int, int], invert: bool, applied: dict[str, Any]
) -> np.ndarray:
    lut, first, bits = voi
    top = float((1 << bits) - 1) if bits else float(max(int(lut.max()), 1))
    if lut.size and lut.max() > top:
        top = float(lut.max())
    scaled = np.rint(lut.astype(np.float64) * (255.0 / top))
    if invert:
        scaled = 255.0 - scaled
    table = np.clip(scaled, 0, 255).astype(np.uint8)
    applied["window"] = None
    idx = np.rint(m).astype(np.int64) - first
    np.clip(idx, 0, table.size - 1, out=idx)
    return np.take(table, idx)


# --------------------------------------------------------------------- colour


def _colour_u8(
    header: Dataset, info: ImageInfo, arr: np.ndarray, photometric: str | None
) -> np.ndarray:
    pi = (photometric or "RGB").upper()
    if arr.dtype != np.uint8:
        shift = max(info.bits_stored - 8, 0)
        if arr.dtype.kind == "f":
            arr = np.clip(arr, 0, 255).astype(np.uint8)
        else:
            arr = np.right_shift(arr, shift).astype(np.uint8) if shift else arr.astype(np.uint8)
    if pi.startswith("YBR_FULL"):
        from pydicom.pixels.processing import convert_color_space

        arr = convert_color_space(np.ascontiguousarray(arr), "YBR_FULL", "RGB")
    return arr


def _palette_u8(header: Dataset, arr: np.ndarray) -> np.ndarray:
    from pydicom.dataset import FileMetaDataset
    from pydicom.pixels.processing import apply_color_lut

    if not getattr(getattr(header, "file_meta", None), "TransferSyntaxUID", None):
        # pydicom needs the byte order of (segmented) LUT data: assume little endian
        header = Dataset({tag: header.get_item(tag) for tag in header.keys()})
        header.file_meta = FileMetaDataset()
        header.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    try:
        rgb = apply_color_lut(arr, header)
    except Exception as exc:  # noqa: BLE001 - malformed palette
        raise PixelDataError(f"cannot apply the palette colour lookup table: {exc}") from exc
    if rgb.ndim == 3 and rgb.shape[-1] == 4:
        rgb = rgb[..., :3]
    if rgb.dtype != np.uint8:
        # 16-bit entries; some writers store 8-bit values in them (keep those as is)
        rgb = rgb if int(rgb.max()) <= 255 else np.right_shift(rgb, 8)
        rgb = rgb.astype(np.uint8)
    return np.ascontiguousarray(rgb)


# ------------------------------------------------------------------------- display


def to_display(
    header: Dataset,
    array: np.ndarray,
    params: RenderParams | None = None,
    *,
    frame_number: int = 1,
    photometric: str | None = None,
) -> np.ndarray:
    """Map a decoded frame to 8-bit display values: uint8 (H, W) or (H, W, 3).

    Grayscale (MONOCHROME1/2): Modality LUT (Rescale Slope/Intercept, or the Modality
    LUT Sequence; for enhanced multi-frame the Pixel Value Transformation functional
    group of `frame_number`), then VOI: the request's window, else the first Window
    Center/Width pair of the header with its VOI LUT Function (or the Frame VOI LUT
    functional group), else the VOI LUT Sequence, else the min-max of the frame;
    then MONOCHROME1 / Presentation LUT Shape INVERSE inversion (PS3.3 C.11).

    Colour: RGB is used as is (more than 8 bits stored is shifted down); PALETTE
    COLOR goes through the palette (8 or 16-bit entries, segmented palettes too).
    `array` is what :func:`pixels.decode_frame` returns, where YBR_* is already RGB;
    pass ``photometric="YBR_FULL"`` for an array that is still YCbCr.
    """
    info = image_info(header)
    full = (slice(None), slice(None))
    return _display(
        header, info, array, params or RenderParams(), full, frame_number, photometric, {}
    )


def _display(
    header: Dataset,
    info: ImageInfo,
    array: np.ndarray,
    params: RenderParams,
    region: tuple[slice, slice],
    frame_number: int,
    photometric: str | None,
    applied: dict[str, Any],
) -> np.ndarray:
    pi = info.photometric_interpretation
    array = np.asarray(array)
    if pi in ("MONOCHROME1", "MONOCHROME2"):
        if array.ndim != 2:
            raise PixelDataError(f"expected a 2-D grayscale frame, got shape {array.shape}")
        return _grayscale_u8(header, info, array, params, region, frame_number, applied)
    if pi == "PALETTE COLOR":
        if array.ndim != 2:
            raise PixelDataError(f"expected a 2-D palette index frame, got shape {array.shape}")
        return _palette_u8(header, array[region])
    if array.ndim != 3 or array.shape[-1] != 3:
        raise PixelDataError(f"{pi}: expected a (rows, columns, 3) frame, got shape {array.shape}")
    return _colour_u8(header, info, array[region], photometric)


# -------------------------------------------------------------------------- render


def _region(
    info: ImageInfo, vp: Viewport | None
) -> tuple[tuple[slice, slice], bool, bool, int, int]:
    """Source region slices, (flip x, flip y) and its size, for a viewport."""
    rows, cols = info.rows, info.columns
    if vp is None:
        return (slice(None), slice(None)), False, False, cols, rows
    if vp.sx >= cols or vp.sy >= rows:
        raise InvalidRenderParameter(
            f"viewport source region starts at ({vp.sx},{vp.sy}), outside the {cols}x{rows} image"
        )
    w = abs(vp.sw) if vp.sw is not None else cols - vp.sx
    h = abs(vp.sh) if vp.sh is not None else rows - vp.sy
    x1, y1 = min(vp.sx + w, cols), min(vp.sy + h, rows)
    flip_x = vp.sw is not None and vp.sw < 0
    flip_y = vp.sh is not None and vp.sh < 0
    return (slice(vp.sy, y1), slice(vp.sx, x1)), flip_x, flip_y, x1 - vp.sx, y1 - vp.sy


def _fit(width: int, height: int, vp: Viewport | None) -> tuple[int, int]:
    if vp is None:
        return width, height
    scale = min(vp.vw / width, vp.vh / height)
    return (
        max(1, min(vp.vw, int(round(width * scale)))),
        max(1, min(vp.vh, int(round(height * scale)))),
    )


@lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except Exception:  # noqa: BLE001 - Pillow without FreeType
        return ImageFont.load_default()


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = str(value).replace("^", " ").strip()
    return " ".join(text.split())


def _number(value: Any) -> str:
    number = _first_float(value)
    return f"{number:g}" if number is not None else _text(value)


def _annotation_lines(
    header: Dataset, which: tuple[str, ...], applied: dict[str, Any]
) -> tuple[list[str], list[str]]:
    top: list[str] = []
    bottom: list[str] = []
    if "patient" in which:
        top = [
            _text(_get(header, 0x00100010)),  # Patient's Name
            "ID " + _text(_get(header, 0x00100020)) if _get(header, 0x00100020) else "",
            " ".join(
                t for t in (_text(_get(header, 0x00100030)), _text(_get(header, 0x00100040))) if t
            ),
        ]
    if "technique" in which:
        window = applied.get("window")
        kvp = _get(header, 0x00180060)
        thickness = _get(header, 0x00180050)
        bottom = [
            " ".join(
                t for t in (_text(_get(header, 0x00080060)), _text(_get(header, 0x0008103E))) if t
            ),
            f"C {window[0]:g} W {window[1]:g}" if window else "",
            " ".join(
                t
                for t in (
                    f"{_number(kvp)} kVp" if kvp is not None else "",
                    f"{_number(thickness)} mm" if thickness is not None else "",
                )
                if t
            ),
        ]
    return [t for t in top if t], [t for t in bottom if t]


def _annotate(
    img: Image.Image, header: Dataset, which: tuple[str, ...], applied: dict[str, Any]
) -> Image.Image:
    top, bottom = _annotation_lines(header, which, applied)
    if not top and not bottom:
        return img
    size = max(10, min(img.height, img.width * 2) // 32)
    font = _font(size)
    draw = ImageDraw.Draw(img)
    white: Any = 255 if img.mode == "L" else (255, 255, 255)
    black: Any = 0 if img.mode == "L" else (0, 0, 0)
    step = size + 2
    margin = max(2, size // 4)

    def put(y: int, line: str) -> None:
        try:
            draw.text((margin, y), line, fill=white, font=font, stroke_width=1, stroke_fill=black)
        except (UnicodeError, ValueError, OSError):
            safe = line.encode("ascii", "replace").decode("ascii")
            draw.text((margin, y), safe, fill=white, font=font, stroke_width=1, stroke_fill=black)

    for i, line in enumerate(top):
        put(margin + i * step, line)
    for i, line in enumerate(reversed(bottom)):
        put(img.height - margin - (i + 1) * step, line)
    return img


_SRGB_LOCK = threading.Lock()
_SRGB: bytes | None = None


def _srgb_profile() -> bytes:
    global _SRGB
    if _SRGB is None:
        from PIL import ImageCms

        with _SRGB_LOCK:
            if _SRGB is None:
                _SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    return _SRGB


_ICC_LOCK = threading.Lock()


@lru_cache(maxsize=16)
def _icc_transform(profile: bytes):
    from PIL import ImageCms

    src = ImageCms.ImageCmsProfile(io.BytesIO(profile))
    dst = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))
    return ImageCms.buildTransform(src, dst, "RGB", "RGB")


def _icc(img: Image.Image, header: Dataset, choice: str) -> tuple[Image.Image, bytes | None]:
    if choice == "no" or img.mode != "RGB":
        return img, None
    own = _get(header, 0x00282000)  # ICC Profile
    own = bytes(own) if isinstance(own, (bytes, bytearray)) and own else None
    if choice == "yes":
        return img, own or _srgb_profile()
    if own:
        try:
            transform = _icc_transform(own)
            with _ICC_LOCK:
                from PIL import ImageCms

                img = ImageCms.applyTransform(img, transform)
        except Exception:  # noqa: BLE001 - unusable embedded profile: leave pixels as they are
            pass
    return img, _srgb_profile()


def _frame_duration_ms(header: Dataset) -> int:
    frame_time = _first_float(_get(header, 0x00181063))  # Frame Time (ms)
    if frame_time and frame_time > 0:
        return max(int(round(frame_time)), 10)
    for tag in (0x00082144, 0x00180040):  # Recommended Display Frame Rate, Cine Rate
        rate = _first_float(_get(header, tag))
        if rate and rate > 0:
            return max(int(round(1000.0 / rate)), 10)
    return DEFAULT_FRAME_TIME_MS


def _picture(
    header: Dataset,
    info: ImageInfo,
    array: np.ndarray,
    params: RenderParams,
    frame_number: int,
    photometric: str | None,
) -> tuple[Image.Image, dict[str, Any]]:
    region, flip_x, flip_y, width, height = _region(info, params.viewport)
    applied: dict[str, Any] = {}
    out = _display(header, info, array, params, region, frame_number, photometric, applied)
    if flip_x:
        out = out[:, ::-1]
    if flip_y:
        out = out[::-1]
    if not out.flags.c_contiguous:
        out = np.ascontiguousarray(out)
    img = Image.fromarray(out, "L" if out.ndim == 2 else "RGB")
    size = _fit(width, height, params.viewport)
    if size != (width, height):
        factor = max(width / size[0], height / size[1])
        # Pillow's BILINEAR is antialiased when reducing; reducing_gap lets it
        # box-reduce first for large factors (thumbnails), several times faster.
        img = img.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0 if factor >= 2 else None)
    if params.annotation:
        img = _annotate(
            img if img.readonly == 0 else img.copy(), header, params.annotation, applied
        )
    return img, applied


def render(
    header: Dataset,
    frames: Sequence[np.ndarray],
    params: RenderParams | None,
    media_type: str,
    *,
    frame_numbers: Sequence[int] | None = None,
    photometric: str | None = None,
) -> bytes:
    """Render decoded frames as image/jpeg, image/png or image/gif bytes.

    `frames` are :func:`pixels.decode_frame` arrays in the order of
    :func:`frames_for_rendered` (`frame_numbers`, default 1, 2, ..., only matters for
    enhanced multi-frame per-frame rescale/window). JPEG and PNG use frames[0];
    GIF animates all of them. Raises NotAnImage (no pixel description),
    UnsupportedMediaType (406), InvalidRenderParameter (viewport outside the image:
    400).
    """
    mt = _media_type(media_type)
    params = params or RenderParams()
    info = image_info(header)
    if not frames:
        raise ValueError("no frames to render")
    numbers = list(frame_numbers) if frame_numbers is not None else list(range(1, len(frames) + 1))
    use = frames if mt == "image/gif" else frames[:1]

    pictures = []
    for i, array in enumerate(use):
        number = numbers[i] if i < len(numbers) else i + 1
        img, _ = _picture(header, info, array, params, number, photometric)
        pictures.append(img)

    buf = io.BytesIO()
    first = pictures[0]
    if mt == "image/jpeg":
        first, profile = _icc(first, header, params.iccprofile)
        kwargs: dict[str, Any] = {"quality": params.jpeg_quality}
        if profile:
            kwargs["icc_profile"] = profile
        first.save(buf, "JPEG", **kwargs)
    elif mt == "image/png":
        first, profile = _icc(first, header, params.iccprofile)
        return encode_png(np.asarray(first), profile)
    else:
        gif = [_gif_frame(p) for p in pictures]
        if len(gif) == 1:
            gif[0].save(buf, "GIF")
        else:
            gif[0].save(
                buf,
                "GIF",
                save_all=True,
                append_images=gif[1:],
                duration=_frame_duration_ms(header),
                loop=0,
                disposal=1,
                optimize=False,
            )
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return b"".join(
        (
            struct.pack(">I", len(data)),
            kind,
            data,
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF),
        )
    )


def encode_png(pixels: np.ndarray, icc_profile: bytes | None = None) -> bytes:
    """8-bit grayscale (H, W) or RGB (H, W, 3) array -> PNG bytes.

    A minimal PNG writer (IHDR, optional iCCP, one IDAT, IEND): every row uses the
    "Sub" filter computed with numpy, then zlib level :data:`PNG_COMPRESS_LEVEL`.
    About 3x faster than Pillow's encoder, whose adaptive per-row filter choice
    dominates its time, for the same size within a few percent.
    """
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3):
        raise ValueError("encode_png needs a uint8 (H, W) or (H, W, 3) array")
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    if channels not in (1, 3):
        raise ValueError("encode_png needs 1 or 3 channels")
    rows = np.ascontiguousarray(pixels).reshape(height, width * channels)
    filtered = np.empty((height, width * channels + 1), np.uint8)
    filtered[:, 0] = 1  # filter type Sub
    filtered[:, 1 : 1 + channels] = rows[:, :channels]
    np.subtract(rows[:, channels:], rows[:, :-channels], out=filtered[:, 1 + channels :])
    header = struct.pack(">IIBBBBB", width, height, 8, 0 if channels == 1 else 2, 0, 0, 0)
    parts = [b"\x89PNG\r\n\x1a\n", _png_chunk(b"IHDR", header)]
    if icc_profile:
        parts.append(_png_chunk(b"iCCP", b"ICC Profile\x00\x00" + zlib.compress(icc_profile)))
    parts.append(_png_chunk(b"IDAT", zlib.compress(filtered.data, PNG_COMPRESS_LEVEL)))
    parts.append(_png_chunk(b"IEND", b""))
    return b"".join(parts)


def _gif_frame(img: Image.Image) -> Image.Image:
    if img.mode == "L":
        return img  # saved with a 256-level gray palette: exact
    return img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)

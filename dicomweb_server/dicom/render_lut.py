"""Decoded frame -> 8-bit display values (PS3.4 N.2, PS3.3 C.11): Modality LUT
(rescale or LUT Sequence), VOI (window or VOI LUT Sequence), Presentation LUT
(MONOCHROME1 / INVERSE) for grayscale; RGB / YBR / PALETTE COLOR for colour.

Every data-set value used here is validated: an unusable value (a LUT Descriptor
that is not 3 numbers, more than 16 bits or fewer entries than it declares, a
non-finite or zero slope, a window width below the function's minimum) is ignored
and the next source in the order documented on :func:`to_display` is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydicom.dataset import Dataset

from .pixels import ImageInfo, PixelDataError, element_value, image_info
from .render_params import RenderParams

# ---------------------------------------------------------------- header look-ups


def _get(ds: Dataset | None, tag: int, default: Any = None) -> Any:
    return element_value(ds, tag, default)


def first_float(value: Any) -> float | None:
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


#: Rescale Slope magnitudes above this are ignored (slope 1 is used)
MAX_SLOPE = 1e12
#: Rescale Intercept, Window Center and Window Width magnitudes above this are ignored
MAX_VALUE = 1e15


def _bounded(value: float | None, limit: float) -> float | None:
    """`value` when finite and within +-limit, else None (the caller's fallback)."""
    return value if value is not None and abs(value) <= limit else None


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
    g.slope = _bounded(first_float(_get(source, 0x00281053)), MAX_SLOPE) or 1.0
    g.intercept = _bounded(first_float(_get(source, 0x00281052)), MAX_VALUE) or 0.0
    center = _bounded(first_float(_get(voi_source, 0x00281050)), MAX_VALUE)
    width = _bounded(first_float(_get(voi_source, 0x00281051)), MAX_VALUE)
    function = str(_get(voi_source, 0x00281056, "LINEAR")).strip().upper()
    if function not in ("LINEAR", "LINEAR_EXACT", "SIGMOID"):
        function = "LINEAR"
    if center is not None and width is not None:
        if width >= 1 or (function != "LINEAR" and width > 0):
            g.center, g.width, g.function = center, width, function
    return g


# ------------------------------------------------------------------ grayscale maths


def _finite(arr: np.ndarray) -> np.ndarray:
    """Float frames (Float / Double Float Pixel Data): NaN becomes the lowest finite
    value of the frame, -Inf / +Inf the lowest / highest; a frame without any finite
    value becomes 0. Integer frames are returned as they are."""
    if arr.dtype.kind != "f":
        return arr
    finite = np.isfinite(arr)
    if finite.all():
        return arr
    if not finite.any():
        return np.zeros(arr.shape, arr.dtype)
    values = arr[finite]
    lo, hi = values.min(), values.max()
    out = np.clip(arr, lo, hi)
    out[np.isnan(out)] = lo
    return out


def _affine_u8(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """uint8(round(clip(a*x + b, 0, 255))) in float32 (float64 for float64 input,
    whose range may exceed float32) with one buffer."""
    work = np.float64 if x.dtype == np.float64 else np.float32
    f = np.multiply(x, work(a), dtype=work)
    f += work(b + 0.5)
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
    """(LUT values as int64, first mapped value, bits) from a LUT Descriptor/Data item.

    PS3.3 C.11.1.1 / C.11.2.1.1: the descriptor is 3 numbers (entries, 0 meaning
    65536; first mapped value; bits per entry, 8 to 16). A LUT that is not usable
    (another descriptor, bits outside 8..16, no LUT Data) is ignored: None, and the
    caller falls back to the next source (rescale, window, pixel range).
    """
    desc = _get(lut_item, 0x00283002)
    data = _get(lut_item, 0x00283006)
    if desc is None or data is None or isinstance(desc, (int, float, str, bytes)):
        return None
    try:
        n, first, bits = (int(v) for v in list(desc)[:3])
        if len(desc) != 3 or not 0 <= n <= 65535 or not 8 <= bits <= 16:
            return None
        n = n or 65536
        if isinstance(data, (bytes, bytearray)):
            values = np.frombuffer(data, "<u2", count=len(data) // 2)
            if bits <= 8 and values.size * 2 == n:  # 8-bit entries packed two per word
                values = np.frombuffer(data, np.uint8)
        else:
            values = np.asarray(list(data) if not isinstance(data, (int, float)) else [data])
        values = values[:n].astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    if values.size == 0:
        return None
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

    arr = _finite(arr)
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

    Float and Double Float Pixel Data (float arrays) follow the same order: the
    request's window, else Window Center/Width, else linearly from the lowest to the
    highest finite value of the frame (LINEAR_EXACT); NaN is shown as the lowest
    value, -Inf / +Inf as the lowest / highest (:func:`_finite`).

    Colour: RGB is used as is (more than 8 bits stored is shifted down); PALETTE
    COLOR goes through the palette (8 or 16-bit entries, segmented palettes too).
    `array` is what :func:`pixels.decode_frame` returns, where YBR_* is already RGB;
    pass ``photometric="YBR_FULL"`` for an array that is still YCbCr.
    """
    info = image_info(header)
    full = (slice(None), slice(None))
    return display(
        header, info, array, params or RenderParams(), full, frame_number, photometric, {}
    )


def display(
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


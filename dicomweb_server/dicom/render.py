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

* Bounds (not from the standard; the origin server's choice): an answer holds at
  most :data:`MAX_RENDER_SAMPLES` 8-bit samples and an animated GIF at most
  :data:`MAX_GIF_FRAMES` frames, checked by :func:`check_size` on the header before
  any frame is read (:class:`RenderTooLarge`, web layer 413); frames are taken from
  an iterator one at a time.
* Data-set values the pipeline reads are validated in :mod:`.render_lut`; unusable
  ones are ignored with the fallback documented there and in :func:`to_display`.

Modules: :mod:`.render_params` (query parameters), :mod:`.render_lut` (decoded frame
-> 8-bit values), :mod:`.render_encode` (PNG, GIF frames, ICC profiles), this module
(viewport, annotation, the public entry points).

Everything here is pure and thread-safe (immutable parameters, no shared mutable
state besides lock-protected or idempotent caches), for use from a thread pool.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from pydicom.dataset import Dataset

from .pixels import ImageInfo, NotAnImage, element_value, image_info
from .render_encode import encode_png, gif_frame, icc
from .render_lut import display, first_float, to_display
from .render_params import (
    DEFAULT_QUALITY,
    MAX_VIEWPORT,
    RENDERED_MEDIA_TYPES,
    THUMBNAIL_SIZE,
    MAX_GIF_FRAMES,
    MAX_RENDER_SAMPLES,
    InvalidRenderParameter,
    RenderParams,
    RenderTooLarge,
    UnsupportedMediaType,
    Viewport,
    Window,
    _media_type,
    check_frame_count,
    frames_for_rendered,
    frames_for_thumbnail,
    thumbnail_params,
)

__all__ = [
    "DEFAULT_QUALITY",
    "MAX_VIEWPORT",
    "RENDERED_MEDIA_TYPES",
    "THUMBNAIL_SIZE",
    "InvalidRenderParameter",
    "MAX_GIF_FRAMES",
    "MAX_RENDER_SAMPLES",
    "RenderTooLarge",
    "check_size",
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

#: Animated GIF delay when the header has neither Frame Time nor a frame rate.
DEFAULT_FRAME_TIME_MS = 100
#: GIF frame delays are 16-bit centiseconds; browsers treat less than 10 ms as 100 ms
MIN_FRAME_TIME_MS, MAX_FRAME_TIME_MS = 10, 655_350

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
    number = first_float(value)
    return f"{number:g}" if number is not None else _text(value)


def _annotation_lines(
    header: Dataset, which: tuple[str, ...], applied: dict[str, Any]
) -> tuple[list[str], list[str]]:
    top: list[str] = []
    bottom: list[str] = []
    if "patient" in which:
        top = [
            _text(element_value(header, 0x00100010)),  # Patient's Name
            "ID " + _text(element_value(header, 0x00100020)) if element_value(header, 0x00100020) else "",
            " ".join(
                t for t in (_text(element_value(header, 0x00100030)), _text(element_value(header, 0x00100040))) if t
            ),
        ]
    if "technique" in which:
        window = applied.get("window")
        kvp = element_value(header, 0x00180060)
        thickness = element_value(header, 0x00180050)
        bottom = [
            " ".join(
                t for t in (_text(element_value(header, 0x00080060)), _text(element_value(header, 0x0008103E))) if t
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


def _frame_duration_ms(header: Dataset, frames: int) -> int:
    """GIF frame delay: Frame Time (ms), else 1000 / (Recommended Display Frame Rate
    or Cine Rate), else :data:`DEFAULT_FRAME_TIME_MS`. Values that are not positive
    finite numbers are skipped; the result is clamped to what a GIF can hold: 10 ms
    to 655,350 ms (16-bit centiseconds) divided by the number of `frames` (Pillow
    merges identical consecutive frames into one with the sum of their delays)."""
    delay: float | None = None
    frame_time = first_float(element_value(header, 0x00181063))  # Frame Time (ms)
    if frame_time and frame_time > 0:
        delay = frame_time
    else:
        for tag in (0x00082144, 0x00180040):  # Recommended Display Frame Rate, Cine Rate
            rate = first_float(element_value(header, tag))
            if rate and rate > 0:
                delay = 1000.0 / rate
                break
    if delay is None:
        return DEFAULT_FRAME_TIME_MS
    longest = max(MAX_FRAME_TIME_MS // max(frames, 1), MIN_FRAME_TIME_MS)
    return int(round(min(max(delay, MIN_FRAME_TIME_MS), longest)))


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
    out = display(header, info, array, params, region, frame_number, photometric, applied)
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


def check_size(
    header: Dataset, frame_count: int, params: RenderParams | None, media_type: str, pictures: int = 1
) -> None:
    """Raise RenderTooLarge when the answer would exceed the bounds, before any work.

    The answer holds ``pictures x frames x width x height x channels`` 8-bit samples,
    where frames is `frame_count` for image/gif (1 otherwise), `pictures` the number
    of such pictures in the answer (a multipart frame list) and width x height the
    picture's size after the viewport: at most :data:`MAX_RENDER_SAMPLES`; an
    animated GIF has at most :data:`MAX_GIF_FRAMES` frames. Also raises
    InvalidRenderParameter / UnsupportedMediaType / NotAnImage as :func:`render` does.
    """
    mt = _media_type(media_type)
    params = params or RenderParams()
    info = image_info(header)
    frames = max(int(frame_count), 1) if mt == "image/gif" else 1
    check_frame_count(frames)
    _, _, _, width, height = _region(info, params.viewport)
    out_w, out_h = _fit(width, height, params.viewport)
    grey = info.photometric_interpretation in ("MONOCHROME1", "MONOCHROME2") or mt == "image/gif"
    count = frames * max(int(pictures), 1)
    samples = count * out_w * out_h * (1 if grey else 3)
    if samples > MAX_RENDER_SAMPLES:
        raise RenderTooLarge(
            f"the rendered answer would be {count} picture(s) of {out_w}x{out_h}"
            f"{'' if grey else ' RGB'}: {samples:,} samples, more than the bound of "
            f"{MAX_RENDER_SAMPLES:,}; ask for a smaller viewport or fewer frames"
        )


def render(
    header: Dataset,
    frames: Iterable[np.ndarray],
    params: RenderParams | None,
    media_type: str,
    *,
    frame_numbers: Sequence[int] | None = None,
    photometric: str | None = None,
) -> bytes:
    """Render decoded frames as image/jpeg, image/png or image/gif bytes.

    `frames` are :func:`pixels.decode_frame` arrays in the order of
    :func:`frames_for_rendered` (`frame_numbers`, default 1, 2, ..., only matters for
    enhanced multi-frame per-frame rescale/window); an iterator is consumed one
    frame at a time (each becomes its picture before the next is taken). JPEG and
    PNG use the first; GIF animates all of them. The size is checked first
    (:func:`check_size`, with len(`frame_numbers`) or len(`frames`)). Raises
    NotAnImage (no pixel description), UnsupportedMediaType (406),
    InvalidRenderParameter (viewport outside the image: 400), RenderTooLarge (413).
    """
    mt = _media_type(media_type)
    params = params or RenderParams()
    info = image_info(header)
    count = len(frame_numbers) if frame_numbers is not None else len(frames) if isinstance(frames, Sequence) else 1
    check_size(header, count, params, mt)
    numbers = list(frame_numbers) if frame_numbers is not None else []

    pictures = []
    for i, array in enumerate(frames):
        number = numbers[i] if i < len(numbers) else i + 1
        img, _ = _picture(header, info, array, params, number, photometric)
        if mt != "image/gif":
            pictures.append(img)
            break
        pictures.append(gif_frame(img))  # 1 byte per pixel from here on
        if len(pictures) > MAX_GIF_FRAMES:
            raise RenderTooLarge(f"more than {MAX_GIF_FRAMES} frames for one animated GIF")
    if not pictures:
        raise ValueError("no frames to render")

    buf = io.BytesIO()
    first = pictures[0]
    if mt == "image/jpeg":
        first, profile = icc(first, header, params.iccprofile)
        kwargs: dict[str, Any] = {"quality": params.jpeg_quality}
        if profile:
            kwargs["icc_profile"] = profile
        first.save(buf, "JPEG", **kwargs)
    elif mt == "image/png":
        first, profile = icc(first, header, params.iccprofile)
        return encode_png(np.asarray(first), profile)
    else:
        gif = pictures
        if len(gif) == 1:
            gif[0].save(buf, "GIF")
        else:
            gif[0].save(
                buf,
                "GIF",
                save_all=True,
                append_images=gif[1:],
                duration=_frame_duration_ms(header, len(gif)),
                loop=0,
                disposal=1,
                optimize=False,
            )
    return buf.getvalue()



"""Rendering query parameters (PS3.18 8.3.5.1, Table 8.3.5-1) and which frames a
rendered or thumbnail resource shows. See :mod:`dicomweb_server.dicom.render` for the
whole pipeline and the documented choices."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_QUALITY = 90
THUMBNAIL_SIZE = (128, 128)
MAX_VIEWPORT = 8192
#: Bound of one rendered answer in 8-bit output samples (frames x width x height x
#: channels, 128 Mi: e.g. one 8192 x 8192 grayscale picture, 2,048 GIF frames of 256 x 256):
#: the pictures of an answer are held in memory until encoded.
MAX_RENDER_SAMPLES = 1 << 27
#: Bound of the frames of one animated GIF (an instance with more: ask for a frame list).
MAX_GIF_FRAMES = 4096
RENDERED_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif")
#: PNG zlib level: 1 is several times faster than the default 6 on CT/MR-sized


class InvalidRenderParameter(ValueError):
    """A rendering query parameter has an invalid value (400 Bad Request)."""


class RenderTooLarge(ValueError):
    """The rendered answer would exceed :data:`MAX_RENDER_SAMPLES` or
    :data:`MAX_GIF_FRAMES` (413 Content Too Large), refused before any frame is read."""


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


def _parts(text: str, counts: tuple[int, ...], usage: str) -> list[str]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in counts:
        raise InvalidRenderParameter(f"{usage}; got {len(parts)} values")
    return parts


def _parse_viewport(text: str) -> Viewport:
    parts = _parts(text, (2, 6), "viewport must be vw,vh or vw,vh,sx,sy,sw,sh")
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
    parts = _parts(text, (2, 3), "window must be center,width[,function]")
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
        check_frame_count(n)
        return list(range(1, n + 1))
    return [1]


def check_frame_count(frames: int) -> None:
    """Raise RenderTooLarge for an animated GIF of more than MAX_GIF_FRAMES frames."""
    if frames > MAX_GIF_FRAMES:
        raise RenderTooLarge(
            f"an animated GIF of {frames} frames is more than the {MAX_GIF_FRAMES} this server "
            "renders; ask for a list of frames (.../frames/{list}/rendered)"
        )


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


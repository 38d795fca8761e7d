"""The Image Pixel module of a data set (PS3.3 C.7.6.3) as this package reads it:
:class:`ImageInfo`, the pixel errors, safe element look-ups. Shared by
:mod:`.pixels` (native frames, the public API) and :mod:`.compressed` (encapsulated
frames)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.uid import (
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)

__all__ = [
    "ENCAPSULATED_UNCOMPRESSED_LE",
    "NATIVE_LITTLE_ENDIAN",
    "ImageInfo",
    "NotAnImage",
    "PixelDataError",
    "UnsupportedTransferSyntax",
    "element_value",
    "fix_unused_bits",
    "image_info",
    "normalise_ts",
]


class UnsupportedTransferSyntax(ValueError):
    """Nothing available here can decode pixel data in this transfer syntax (406)."""


class NotAnImage(ValueError):
    """The header has no pixel description (Rows, Columns, ...): not an image (404/406)."""


class PixelDataError(UnsupportedTransferSyntax):
    """The frame is truncated/corrupt or uses a pixel layout this module cannot handle."""


#: Encapsulated Uncompressed Explicit VR Little Endian (PS3.5 A.4.11): each frame is
#: a fragment holding native little-endian bytes. Not named in pydicom 3.0.
ENCAPSULATED_UNCOMPRESSED_LE = UID("1.2.840.10008.1.2.1.98")

#: Frames in these transfer syntaxes are native little-endian bytes.
NATIVE_LITTLE_ENDIAN = frozenset(
    {
        ImplicitVRLittleEndian,
        ExplicitVRLittleEndian,
        DeflatedExplicitVRLittleEndian,
        ENCAPSULATED_UNCOMPRESSED_LE,
    }
)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """The Image Pixel module attributes (PS3.3 C.7.6.3) needed to decode a frame."""

    rows: int
    columns: int
    samples_per_pixel: int
    bits_allocated: int
    bits_stored: int
    pixel_representation: int
    photometric_interpretation: str
    planar_configuration: int
    number_of_frames: int

    @property
    def native_frame_length(self) -> int:
        """Bytes of one native frame as stored (bit-packed for Bits Allocated 1)."""
        pixels = self.rows * self.columns
        if self.bits_allocated == 1:
            return (pixels + 7) // 8
        if self.photometric_interpretation == "YBR_FULL_422" and self.samples_per_pixel == 3:
            # PS3.3 C.7.6.3.1.2: native YBR_FULL_422 stores Y Y Cb Cr per 2 pixels
            return pixels * 2 * (self.bits_allocated // 8)
        return pixels * self.samples_per_pixel * (self.bits_allocated // 8)

    def decode_options(self) -> dict[str, Any]:
        """Options for ``pydicom.pixels`` decoders, for a one-frame source."""
        opts: dict[str, Any] = {
            "rows": self.rows,
            "columns": self.columns,
            "samples_per_pixel": self.samples_per_pixel,
            "bits_allocated": self.bits_allocated,
            "bits_stored": self.bits_stored,
            "pixel_representation": self.pixel_representation,
            "photometric_interpretation": self.photometric_interpretation,
            "number_of_frames": 1,
        }
        if self.samples_per_pixel > 1:
            opts["planar_configuration"] = self.planar_configuration
        return opts


_TAGS = {
    "Rows": 0x00280010,
    "Columns": 0x00280011,
    "BitsAllocated": 0x00280100,
    "BitsStored": 0x00280101,
    "PixelRepresentation": 0x00280103,
    "SamplesPerPixel": 0x00280002,
    "PhotometricInterpretation": 0x00280004,
    "PlanarConfiguration": 0x00280006,
    "NumberOfFrames": 0x00280008,
}


def element_value(ds: Dataset | None, tag: int, default: Any = None) -> Any:
    """Value of the element `tag` in `ds` (``default`` when absent or empty).

    Reads pydicom's element dict directly (about 10x cheaper than ``ds[tag]``),
    falling back to ``ds[tag]`` for elements still in raw (undecoded) form. A value
    pydicom cannot convert (a DS/IS that is not a number ...) counts as absent.
    """
    if ds is None:
        return default
    try:
        store = getattr(ds, "_dict", None)
        if store is not None:
            elem = store.get(tag)
            if elem is None:
                return default
            if not isinstance(elem, DataElement):
                us = _raw_us(elem)
                if us is not None:
                    return us
                elem = ds[tag]
        else:
            elem = ds[tag]
        value = elem.value
    except (KeyError, ValueError, TypeError, OverflowError):
        # absent, or a stored value pydicom cannot convert (e.g. DS "abc"): as absent
        return default
    return default if value is None or value == "" else value


def _raw_us(raw: Any) -> int | None:
    """The value of a raw (not yet converted) single-valued US element of an explicit VR
    little endian data set, as pydicom converts it (PS3.5 §6.2: US, a 16-bit unsigned
    binary integer), without converting the element; None for anything else (pydicom
    converts it). Rows, Columns, Bits Allocated... are read this way several times per
    rendered picture: pydicom's conversion of each was ~10-15 us (issue 33)."""
    if raw.VR == "US" and raw.is_little_endian and not raw.is_implicit_VR and raw.length == 2:
        value = raw.value
        if isinstance(value, bytes) and len(value) == 2:
            return value[0] | value[1] << 8
    return None


def _value(header: Dataset, keyword: str) -> Any:
    return element_value(header, _TAGS[keyword])


def _int(header: Dataset, keyword: str, default: int | None = None) -> int | None:
    value = _value(header, keyword)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def image_info(header: Dataset) -> ImageInfo:
    """Read the pixel description from `header`; raise NotAnImage if there is none."""
    rows = _int(header, "Rows")
    columns = _int(header, "Columns")
    bits_allocated = _int(header, "BitsAllocated")
    photometric = _value(header, "PhotometricInterpretation")
    if not rows or not columns or not bits_allocated or not photometric:
        raise NotAnImage(
            "the instance has no image pixel description "
            "(Rows, Columns, Bits Allocated, Photometric Interpretation)"
        )
    photometric = str(photometric).strip().upper()
    default_spp = (
        3 if photometric in ("RGB", "YBR_FULL", "YBR_FULL_422", "YBR_ICT", "YBR_RCT") else 1
    )
    spp = _int(header, "SamplesPerPixel", default_spp) or default_spp
    bits_stored = _int(header, "BitsStored", bits_allocated) or bits_allocated
    pixel_representation = _int(header, "PixelRepresentation", 0) or 0
    planar = _int(header, "PlanarConfiguration", 0) or 0
    frames = _int(header, "NumberOfFrames", 1) or 1

    if bits_allocated not in (1, 8, 16, 32, 64):
        raise PixelDataError(f"Bits Allocated {bits_allocated} is not supported")
    if not 1 <= bits_stored <= bits_allocated:
        raise PixelDataError(
            f"Bits Stored {bits_stored} is invalid for Bits Allocated {bits_allocated}"
        )
    if spp not in (1, 3):
        raise PixelDataError(f"Samples per Pixel {spp} is not supported")
    return ImageInfo(
        rows=rows,
        columns=columns,
        samples_per_pixel=spp,
        bits_allocated=bits_allocated,
        bits_stored=bits_stored,
        pixel_representation=1 if pixel_representation else 0,
        photometric_interpretation=photometric,
        planar_configuration=1 if planar else 0,
        number_of_frames=max(frames, 1),
    )


def normalise_ts(transfer_syntax_uid: str) -> UID:
    return UID(str(transfer_syntax_uid).strip().rstrip("\x00").strip())


def fix_unused_bits(arr: np.ndarray, info: ImageInfo) -> np.ndarray:
    """Sign-extend (signed) or mask (unsigned) when Bits Stored < Bits Allocated.

    Same result as pydicom's shift correction; skipped when the high bits are
    already clean, which is the common case (two cheap reductions, no copy).
    """
    ba = arr.dtype.itemsize * 8
    bs = info.bits_stored
    if bs >= ba or arr.size == 0:
        return arr
    if info.pixel_representation:
        lo, hi = -(1 << (bs - 1)), (1 << (bs - 1)) - 1
    else:
        lo, hi = 0, (1 << bs) - 1
    if int(arr.min()) >= lo and int(arr.max()) <= hi:
        return arr
    shift = ba - bs
    out = np.left_shift(arr, shift)
    np.right_shift(out, shift, out=out)
    return out

"""Bulk data behind the BulkDataURIs of the DICOM JSON Model (PS3.18 F.2.6, F.2.7).

Split from :mod:`.json_model`, which emits the URIs; this module resolves them back to
bytes: tag-path parsing (the path form of those URIs), the raw value of a binary
element (little endian, PS3.18 8.7.3.3.1) and the compressed frames of encapsulated
Pixel Data (PS3.18 8.7.3.3.2, PS3.5 A.4). Pure: pydicom and the standard library, no I/O.
The value bytes are captured by the same element walk that builds the JSON, so what a
BulkDataURI returns is exactly what the metadata described.

Tag paths: ``"7FE00010"``, ``"00091010"``, ``"00540016/0/00181072"``: 8 uppercase hex
digits per tag, joined by ``/``, with the 0-based item index after each sequence tag.
"""

from __future__ import annotations

from typing import Any

from pydicom import Dataset
from pydicom.dataelem import RawDataElement
from pydicom.encaps import generate_frames

from .json_model import (
    _DEFAULT_ENCODING,
    _INDEX_RE,
    _PIXEL_DATA,
    _TAG_RE,
    _UNDEFINED_LENGTH,
    MAX_ITEM_INDEX,
    MAX_TAGPATH_DEPTH,
    _as_bytes,
    _Ctx,
    _element_json,
    _fallback_json,
    _is_value,
    _number_texts,
    _raw_bytes,
    _to_little_endian,
)

__all__ = [
    "bulkdata_tagpath_parse",
    "is_encapsulated_pixel_data",
    "resolve_bulkdata",
    "resolve_pixel_data_frames",
]


def bulkdata_tagpath_parse(tagpath: str) -> list[tuple[int, int | None]]:
    """Parse and validate a bulk data tag path.

    ``"00540016/0/00181072"`` -> ``[(0x00540016, 0), (0x00181072, None)]``:
    tags of 8 hex digits, each sequence tag followed by a 0-based decimal item
    index (no sign, no leading zeros, at most :data:`MAX_ITEM_INDEX`), ending
    with the tag of the element itself, at most :data:`MAX_TAGPATH_DEPTH` tags
    (the path format of the BulkDataURIs of :func:`dataset_to_json`, PS3.18
    F.2.6; the URI's form is left to the origin server).

    Parameters
    ----------
    tagpath : str
        The path after the bulk data prefix, e.g. ``"7FE00010"``.

    Returns
    -------
    list of (int, int or None)
        One ``(tag, item_index)`` per level; ``item_index`` is None for the
        last entry.

    Raises
    ------
    ValueError
        Anything malformed (empty, non-hex or wrongly sized tag, a path ending
        in an index, negative/huge/non-decimal index, too deep); the message
        says what (the web layer answers 400).
    """
    if not isinstance(tagpath, str) or not tagpath:
        raise ValueError("empty bulk data tag path")
    if len(tagpath) > MAX_TAGPATH_DEPTH * 16:
        raise ValueError("bulk data tag path too long")
    parts = tagpath.split("/")
    if len(parts) % 2 == 0:
        raise ValueError(
            f"bulk data tag path {tagpath!r} must alternate tag/index and end with a tag"
        )
    if (len(parts) + 1) // 2 > MAX_TAGPATH_DEPTH:
        raise ValueError(f"bulk data tag path nests deeper than {MAX_TAGPATH_DEPTH} levels")
    out: list[tuple[int, int | None]] = []
    for i in range(0, len(parts), 2):
        t = parts[i]
        if not _TAG_RE.fullmatch(t):
            raise ValueError(f"invalid tag {t!r} in bulk data tag path: need 8 hex digits")
        idx: int | None = None
        if i + 1 < len(parts):
            s = parts[i + 1]
            if not _INDEX_RE.fullmatch(s) or int(s) > MAX_ITEM_INDEX:
                raise ValueError(
                    f"invalid item index {s!r} in bulk data tag path: need 0..{MAX_ITEM_INDEX}"
                )
            idx = int(s)
        out.append((int(t, 16), idx))
    return out


def _locate(ds: Dataset, tagpath: str) -> tuple[Dataset, int, str]:
    """Walk `tagpath`: (dataset holding the element, its tag, canonical path)."""
    steps = bulkdata_tagpath_parse(tagpath)
    cur = ds
    canon: list[str] = []
    for tag, idx in steps:
        if not (tag & 0xFFFF) or (tag >> 16) == 0x0002 or tag not in cur:
            raise KeyError(f"no element {tag:08X} in bulk data path {tagpath!r}")
        canon.append(f"{tag:08X}")
        if idx is None:
            break
        raw = cur.get_item(tag)
        if isinstance(raw, RawDataElement) and raw.VR == "UN":
            # the model keeps an explicit UN as bytes: it has no items
            raise KeyError(f"{tag:08X} in bulk data path {tagpath!r} is not a sequence")
        elem = cur[tag]
        if elem.VR != "SQ" or idx >= len(elem.value):
            raise KeyError(f"no item {idx} in {tag:08X} of bulk data path {tagpath!r}")
        cur = elem.value[idx]
        canon.append(str(idx))
    return cur, tag, "/".join(canon)


def resolve_bulkdata(ds: Dataset, tagpath: str) -> bytes:
    """Return the value bytes behind a BulkDataURI of :func:`dataset_to_json`.

    The bytes are those the JSON model described (PS3.18 F.2.6): the value of
    a binary-VR element (OB OD OF OL OV OW UN, or an unconvertible element
    emitted as UN), little endian (PS3.18 8.7.3.3.1: OW/OF/OL/OD/OV values of a
    big-endian file are byte-swapped).  For native Pixel Data this is the raw
    pixel bytes.  For encapsulated Pixel Data it is the element's raw
    encapsulated value (Basic Offset Table and fragment items); the Bulkdata
    resource itself must answer with the frames, each in its compressed media
    type (PS3.18 8.7.3.3.2, Table 8.7.3-5): use
    :func:`resolve_pixel_data_frames` / :func:`is_encapsulated_pixel_data`.

    Parameters
    ----------
    ds : pydicom.Dataset
        The instance, read from its file.
    tagpath : str
        E.g. ``"7FE00010"`` or ``"00540016/0/00181072"``.

    Returns
    -------
    bytes
        Empty for an empty binary element.

    Raises
    ------
    ValueError
        Malformed `tagpath` (see :func:`bulkdata_tagpath_parse`; HTTP 400).
    KeyError
        The path does not exist, or names a sequence or an element that is
        not bulk data (text, numbers, ...; HTTP 404).
    """
    holder, tag, canon = _locate(ds, tagpath)
    elem = holder.get_item(tag)
    if getattr(elem, "VR", None) == "SQ":
        raise KeyError(f"{tagpath!r} is a sequence, not bulk data")
    try:
        encoding = holder._character_set or _DEFAULT_ENCODING
    except Exception:
        encoding = _DEFAULT_ENCODING
    ctx = _Ctx("", -1, {})
    try:
        _element_json(holder, tag, canon, ctx, encoding)
    except Exception as exc:
        _fallback_json(holder, tag, canon, ctx, exc)
    if canon not in ctx.capture:
        raise KeyError(f"{tagpath!r} is not a bulk data element")
    vr, data, big = ctx.capture[canon]
    if big:
        return _to_little_endian(vr, data)
    return bytes(data)


def _pixel_element(ds: Dataset, tagpath: str) -> tuple[Dataset, Any]:
    holder, tag, _ = _locate(ds, tagpath)
    if tag != _PIXEL_DATA:
        raise KeyError(f"{tagpath!r} is not Pixel Data (7FE00010)")
    return holder, holder.get_item(tag)


def _encapsulated(holder: Dataset, elem: Any, top_level: bool) -> bool:
    if isinstance(elem, RawDataElement):
        if elem.length == _UNDEFINED_LENGTH:
            return True
    elif getattr(elem, "is_undefined_length", False):
        return True
    if top_level:
        ts = getattr(getattr(holder, "file_meta", None), "TransferSyntaxUID", None)
        return bool(ts is not None and getattr(ts, "is_encapsulated", False))
    return False


def is_encapsulated_pixel_data(ds: Dataset, tagpath: str = "7FE00010") -> bool:
    """True if the Pixel Data at `tagpath` is encapsulated (PS3.5 A.4).

    Encapsulated means undefined length (or, at top level, an encapsulated
    Transfer Syntax in ``ds.file_meta``).  Raises ``KeyError`` / ``ValueError``
    as :func:`resolve_bulkdata`, and ``KeyError`` if `tagpath` is not a Pixel
    Data element.
    """
    holder, elem = _pixel_element(ds, tagpath)
    return _encapsulated(holder, elem, holder is ds)


def resolve_pixel_data_frames(ds: Dataset, tagpath: str = "7FE00010") -> list[bytes]:
    """Return the compressed frames of encapsulated Pixel Data.

    This is what a BulkDataURI to encapsulated Pixel Data retrieves: PS3.18
    8.7.3.3.2 "Compressed Bulkdata contains only the compressed octet stream
    without the fragment delimiters", each frame in the media type Table
    8.7.3-5 pairs with the Transfer Syntax (e.g. image/jpeg for
    1.2.840.10008.1.2.4.50), one part per frame (PS3.18 8.6.1, 10.4.3.3.5).

    Parameters
    ----------
    ds : pydicom.Dataset
        The instance, read from its file.
    tagpath : str, optional
        Path of the Pixel Data element, default top level ``"7FE00010"``
        (an icon image's Pixel Data sits inside a sequence item).

    Returns
    -------
    list of bytes
        One codestream per frame, fragments of a frame joined, in frame order
        (``pydicom.encaps.generate_frames`` with Number of Frames and the
        Extended Offset Table when present); the NUL padding an odd-length
        JPEG / JPEG-LS / JPEG 2000 codestream to even length is removed.

    Raises
    ------
    KeyError
        No such element, or not Pixel Data.
    ValueError
        Malformed `tagpath`, Pixel Data not encapsulated, or the encapsulated
        value cannot be parsed.
    """
    holder, elem = _pixel_element(ds, tagpath)
    if not _encapsulated(holder, elem, holder is ds):
        raise ValueError("Pixel Data is not encapsulated")
    data = elem.value if isinstance(elem, RawDataElement) else _as_bytes(elem.value)
    if not data:
        return []
    nframes = None
    if 0x00280008 in holder:
        nf_elem = holder.get_item(0x00280008)
        texts = _number_texts(nf_elem, isinstance(nf_elem, RawDataElement))
        if texts:
            n = _is_value(texts[0])
            if isinstance(n, int) and n >= 1:
                nframes = n
    ext = None
    if 0x7FE00001 in holder and 0x7FE00002 in holder:
        offsets = _raw_bytes(holder, 0x7FE00001)
        lengths = _raw_bytes(holder, 0x7FE00002)
        if offsets and lengths:
            ext = (bytes(offsets), bytes(lengths))
    try:
        frames = generate_frames(bytes(data), number_of_frames=nframes or 1, extended_offsets=ext)
        return [_strip_fragment_padding(f) for f in frames]
    except Exception as exc:
        raise ValueError(f"cannot parse encapsulated Pixel Data: {exc}") from exc


def _strip_fragment_padding(frame: bytes) -> bytes:
    """Drop the NUL that pads an odd-length JPEG-family codestream to even length.

    Fragments have even length (PS3.5 A.4), so an odd codestream is stored with
    one trailing 0x00 after its end marker.  JPEG, JPEG-LS and JPEG 2000 /
    HTJ2K codestreams all end with FFD9 (EOI/EOC), so the byte after it is not
    part of the codestream; other encodings (RLE, MPEG) are left as they are.
    """
    if frame.endswith(b"\xff\xd9\x00") and (
        frame.startswith((b"\xff\xd8", b"\xff\x4f\xff\x51")) or frame[4:8] == b"jP  "
    ):
        return frame[:-1]
    return frame

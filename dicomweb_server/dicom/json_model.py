"""DICOM JSON Model (PS3.18 Annex F) for stored instances.

This module is pure: it imports only pydicom, numpy and the standard library,
and does no I/O.  It turns a :class:`pydicom.Dataset` read from a PS3.10 file
into the DICOM JSON Model object of PS3.18 F.2 and resolves the BulkDataURIs it
emits back to bytes.

Design decisions (each one cites the part of the standard it relies on)
------------------------------------------------------------------------
* **Raw walk.**  The dataset is walked element by element from pydicom's
  ``RawDataElement`` values, not through ``Dataset.to_json_dict``: in pydicom
  3.0.2 that fails the whole dataset on one invalid DS (``float('@1.7')``),
  lets ``NaN`` through (a bare ``NaN`` token, or ``null`` with orjson), emits
  ``"Value": []`` for zero-item sequences, turns an empty value inside a
  multi-value into ``""``, measures the threshold on the base64 length, never
  tells the bulk data handler the item path, and is ~10x slower.  Common VRs
  are decoded here from the raw bytes exactly as pydicom would (same
  character-set shortcut, same padding rules); pydicom
  (``convert_raw_data_element`` / ``ds[tag]``) decodes the rest: values with
  ISO 2022 escape sequences or undecodable bytes, ambiguous VRs ('US or SS',
  'OB or OW': PS3.5 Annex A rules), sequences.  Elements pydicom already
  converted are read from their converted values (DS/IS from
  ``original_string``), giving the same JSON.
* **DS / IS** (PS3.18 F.2.3, Table F.2.3-1 and the note below it): a value that
  is valid per PS3.5 6.2 becomes a JSON Number (``int`` for IS and for an
  integer-looking DS, ``float`` otherwise, only when the double represents the
  decimal text exactly); anything else -- ``@1.7``, ``2.0`` for IS, ``NaN``,
  ``Inf``, an IS outside -2**31..2**31-1, a DS whose value a double cannot hold
  exactly -- is a JSON String holding the original text without its padding
  (F.2.3: "a JSON String representation can be used to preserve the original
  format").  The raw bytes are read, so pydicom's DS/IS classes never run.
* **FL / FD NaN and infinities** have no JSON Number form (RFC 8259 section 6);
  they are emitted as the JSON Strings ``"NaN"``, ``"Infinity"`` and
  ``"-Infinity"``.  Bare ``NaN`` / ``Infinity`` are never produced.
* **Empty values** (PS3.18 F.2.5): an element of zero length has no ``Value``
  key; an empty value inside a multi-valued element is ``null``; an empty
  sequence item is ``{}``; a zero-item sequence has no ``Value`` key.
* **Unconvertible element**: if pydicom cannot decode an element (wrong length
  for its VR, unknown VR, ...), it is emitted as VR ``UN`` with its raw bytes
  as ``InlineBinary``/``BulkDataURI`` (PS3.5 6.2.2: UN is "a Value whose VR is
  unknown"; F.2.7 allows InlineBinary for UN) and a warning is logged.  One bad
  element never fails the dataset.  (Only an element that pydicom already
  converted and whose raw bytes are gone is emitted as ``{"vr": ...}`` alone.)
* **Private elements** (PS3.5 7.8.1, 6.2.2): explicit-VR files keep the VR the
  file gives (also ``UN``: no "replace UN with known VR"); in implicit-VR files
  a private element whose creator and element are in pydicom's private
  dictionary gets that VR, a private creator element is ``LO``, and any other
  private element is ``UN`` with its raw bytes.
* **Bulk data** (PS3.18 F.2.6, F.2.7): binary VRs (OB OD OF OL OV OW UN) longer
  than ``bulk_threshold`` bytes become ``BulkDataURI`` =
  ``bulkdata_uri_prefix + "/" + tagpath``, shorter ones ``InlineBinary``
  (base64, little endian -- OW/OF/OL/OD/OV values of a big-endian file are
  byte-swapped, PS3.18 8.7.3.3.1).  Pixel Data (7FE0,0010), Float Pixel Data
  (7FE0,0008) and Double Float Pixel Data (7FE0,0009) are always a
  BulkDataURI, native or encapsulated, at any nesting level.
* **Encapsulated Pixel Data** is described by one BulkDataURI (F.2.6).  What
  that URI returns is, per PS3.18 8.7.3.3.2 ("Compressed Bulkdata contains only
  the compressed octet stream without the fragment delimiters") and
  Table 8.7.3-5, the frames each in its compressed media type (image/jpeg,
  image/jls, image/jp2, ...), one part per frame in a multipart/related
  response (PS3.18 8.6.1, 10.4.3.3.5 Bulkdata Resource Payload).
  :func:`.bulkdata.resolve_pixel_data_frames` gives those codestreams;
  :func:`.bulkdata.resolve_bulkdata` gives the element's raw encapsulated value.
  Encapsulated means undefined length (PS3.5 A.4); such Pixel Data is given
  VR ``OB`` even in a (non-conformant) implicit-VR file.

Tag paths
---------
``"7FE00010"``, ``"00091010"``, ``"00540016/0/00181072"``: 8 uppercase hex
digits per tag, joined by ``/``, with the 0-based item index after each
sequence tag.
"""

from __future__ import annotations

import base64
import logging
import math
import re
from collections.abc import Iterable
from decimal import Decimal
from struct import unpack
from typing import Any

import numpy as np
from pydicom import Dataset
from pydicom.datadict import dictionary_VR, private_dictionary_VR
from pydicom.dataelem import RawDataElement, convert_raw_data_element
from pydicom.multival import MultiValue

__all__ = [
    "MAX_ITEM_INDEX",
    "MAX_TAGPATH_DEPTH",
    "dataset_to_json",
    "level_attributes",
]

logger = logging.getLogger(__name__)

#: Maximum number of tags (nesting levels) in a bulk data tag path.
MAX_TAGPATH_DEPTH = 8
#: Largest sequence item index accepted in a tag path.
MAX_ITEM_INDEX = 999_999

_BINARY_VRS = frozenset({"OB", "OD", "OF", "OL", "OV", "OW", "UN"})
# VRs whose values are byte-swapped between little and big endian (PS3.5 7.3)
_SWAP_WIDTH = {"OW": 2, "OF": 4, "OL": 4, "OD": 8, "OV": 8}
_FLOAT_VRS = frozenset({"FL", "FD"})
# Pixel Data, Float Pixel Data, Double Float Pixel Data: always bulk data
_PIXEL_TAGS = frozenset({0x7FE00010, 0x7FE00008, 0x7FE00009})
#: always a BulkDataURI at the top level, whatever its length: the Encapsulated Document (0042,0011)
#: of a PDF/CDA/STL/OBJ/MTL instance, which the bulk data resource answers in the document's own
#: media type (dicom/documents.py); one nested in a sequence item follows the threshold
_DOCUMENT_PATH = "00420011"
_PIXEL_DATA = 0x7FE00010
_UNDEFINED_LENGTH = 0xFFFFFFFF

_IS_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DS_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_IS_MIN, _IS_MAX = -(2**31), 2**31 - 1  # PS3.5 Table 6.2-1, IS
_INT64_MAX = 2**63 - 1
_TAG_RE = re.compile(r"[0-9A-Fa-f]{8}", re.ASCII)
_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,5}", re.ASCII)

_PAD = " \x00"
_PN_GROUPS = ("Alphabetic", "Ideographic", "Phonetic")
_DEFAULT_ENCODING = "iso8859"  # pydicom's name for the default repertoire

# Cache of public-dictionary VRs (implicit VR lookups); None = unknown tag.
_PUBLIC_VR_CACHE: dict[int, str | None] = {}


class _UsePydicom(Exception):
    """Raised by a fast decoder when pydicom has to decode the value."""


# --------------------------------------------------------------------------
# DS / IS  (PS3.18 F.2.3; PS3.5 6.2 Table 6.2-1)
# --------------------------------------------------------------------------
def _is_value(text: str) -> int | str | None:
    """One IS value: int if valid (PS3.5 6.2), else the stripped text."""
    t = text.strip(_PAD)
    if not t:
        return None
    if _IS_RE.fullmatch(t):
        n = int(t)
        if _IS_MIN <= n <= _IS_MAX:
            return n
    return t


def _ds_value(text: str) -> int | float | str | None:
    """One DS value: a JSON-exact number if valid (PS3.5 6.2), else the text."""
    t = text.strip(_PAD)
    if not t:
        return None
    if not _DS_RE.fullmatch(t):
        return t  # '@1.7', 'NaN', 'Inf', '1,5', ...
    if "." not in t and "e" not in t and "E" not in t:
        n = int(t)
        return n if -_INT64_MAX <= n <= _INT64_MAX else t
    f = float(t)
    if len(t) <= 15 and f != 0.0 and 1e-300 < abs(f) < 1e300:
        return f  # <= 15 significant digits always round-trip through a double
    if not math.isfinite(f):
        return t  # '1e999'
    mantissa = t.split("e", 1)[0].split("E", 1)[0]
    if not mantissa.strip("+-0."):
        return f  # a zero
    if Decimal(repr(f)) == Decimal(t):
        return f
    return t  # a double cannot hold this decimal exactly: keep the text


def _number_texts(elem: Any, raw: bool) -> list[str]:
    """The DS/IS value texts of an element, raw or already converted."""
    value = elem.value
    if raw:
        if not value:
            return []
        return bytes(value).decode("latin-1").split("\\")
    if value is None or value == "":
        return []
    if not isinstance(value, (list, tuple, MultiValue)):
        value = [value]
    out = []
    for v in value:
        if v is None:
            out.append("")
        elif isinstance(v, str):
            out.append(v)
        else:
            orig = getattr(v, "original_string", None)
            if isinstance(orig, str):
                out.append(orig)
            else:
                out.append(repr(v) if isinstance(v, float) else str(v))
    return out


def _numbers_json(vr: str, texts: list[str]) -> dict[str, Any]:
    conv = _ds_value if vr == "DS" else _is_value
    vals = [conv(t) for t in texts]
    if not vals or (len(vals) == 1 and vals[0] is None):
        return {"vr": vr}
    return {"vr": vr, "Value": vals}


# --------------------------------------------------------------------------
# Fast decoders for raw (unconverted) elements, keyed by VR
# --------------------------------------------------------------------------
def _finish(vr: str, vals: list[Any]) -> dict[str, Any]:
    if not vals or (len(vals) == 1 and vals[0] is None):
        return {"vr": vr}
    return {"vr": vr, "Value": vals}


def _float_json(v: Any) -> float | str | None:
    if v is None:
        return None
    f = float(v)
    if math.isfinite(f):
        return f
    return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")


def _make_struct_decoder(code: str, size: int, floats: bool):
    def decode(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
        data = elem.value
        n = len(data)
        if not n:
            return {"vr": vr}
        if n % size:
            raise ValueError(f"value length {n} is not a multiple of {size} for VR {vr}")
        vals = list(unpack(f"{'<' if elem.is_little_endian else '>'}{n // size}{code}", data))
        if floats:
            vals = [_float_json(v) for v in vals]
        return {"vr": vr, "Value": vals}

    return decode


def _dec_ascii_multi(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    if not data:
        return {"vr": vr}
    return _finish(vr, [v.rstrip(_PAD) or None for v in data.decode("latin-1").split("\\")])


def _dec_ur(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    if not data:
        return {"vr": vr}
    return _finish(vr, [data.decode("latin-1").rstrip() or None])


def _text(data: bytes, encoding: str) -> str:
    """Decode like pydicom's shortcut (no ISO 2022 escapes), else defer."""
    if b"\x1b" in data:
        raise _UsePydicom
    try:
        return data.decode(encoding)
    except (LookupError, UnicodeError):
        raise _UsePydicom from None  # pydicom warns and uses replacement chars


def _dec_text_multi(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    if not data:
        return {"vr": vr}
    return _finish(vr, [v.rstrip(_PAD) or None for v in _text(data, encoding).split("\\")])


def _dec_text_single(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    if not data:
        return {"vr": vr}
    return _finish(vr, [_text(data, encoding).rstrip(_PAD) or None])


def _pn_groups(value: str) -> dict[str, str] | None:
    out = {}
    for name, comp in zip(_PN_GROUPS, value.split("=")):
        if comp:
            out[name] = comp
    return out or None


def _dec_pn(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    if not data:
        return {"vr": vr}
    text = _text(data, encoding).rstrip(_PAD)
    return _finish(vr, [_pn_groups(v) for v in text.split("\\")])


def _dec_at(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    n = len(data)
    if not n:
        return {"vr": vr}
    if n % 4:
        raise ValueError(f"value length {n} is not a multiple of 4 for VR AT")
    v = unpack(f"{'<' if elem.is_little_endian else '>'}{n // 2}H", data)
    return {"vr": vr, "Value": [f"{v[i]:04X}{v[i + 1]:04X}" for i in range(0, len(v), 2)]}


def _dec_ds_is(vr: str, elem: RawDataElement, encoding: str) -> dict[str, Any]:
    data = elem.value
    if not data:
        return {"vr": vr}
    return _numbers_json(vr, data.decode("latin-1").split("\\"))


_FAST: dict[str, Any] = {
    "US": _make_struct_decoder("H", 2, False),
    "SS": _make_struct_decoder("h", 2, False),
    "UL": _make_struct_decoder("I", 4, False),
    "SL": _make_struct_decoder("i", 4, False),
    "SV": _make_struct_decoder("q", 8, False),
    "UV": _make_struct_decoder("Q", 8, False),
    "FL": _make_struct_decoder("f", 4, True),
    "FD": _make_struct_decoder("d", 8, True),
    "DS": _dec_ds_is,
    "IS": _dec_ds_is,
    "AT": _dec_at,
    "UR": _dec_ur,
    "PN": _dec_pn,
    "ST": _dec_text_single,
    "LT": _dec_text_single,
    "UT": _dec_text_single,
    "SH": _dec_text_multi,
    "LO": _dec_text_multi,
    "UC": _dec_text_multi,
}
for _vr in ("AE", "AS", "CS", "DA", "DT", "TM", "UI"):  # default repertoire (PS3.5 6.2)
    _FAST[_vr] = _dec_ascii_multi
del _vr


# --------------------------------------------------------------------------
# VR lookup
# --------------------------------------------------------------------------
def _public_vr(tag: int) -> str | None:
    try:
        return _PUBLIC_VR_CACHE[tag]
    except KeyError:
        pass
    try:
        vr: str | None = dictionary_VR(tag)
    except KeyError:
        vr = None
    _PUBLIC_VR_CACHE[int(tag)] = vr
    return vr


def _private_creator(ds: Dataset, creator_tag: int) -> str | None:
    """The private creator string in (gggg,00xx), read without converting it."""
    d = getattr(ds, "_dict", None)
    elem = d.get(creator_tag) if d is not None else None
    if elem is None:
        if creator_tag not in ds:
            return None
        elem = ds.get_item(creator_tag)
    value = elem.value
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("latin-1")
    if isinstance(value, (list, MultiValue)):  # a multi-valued creator: use the first
        value = value[0] if value else None
    if not isinstance(value, str):
        return None
    return value.strip(_PAD) or None


def _implicit_vr(ds: Dataset, tag: int) -> str:
    """VR for an element read without one (implicit VR), PS3.5 6.2.2 / 7.8.1."""
    group, element = tag >> 16, tag & 0xFFFF
    if group & 1:  # private group
        if 0x0010 <= element <= 0x00FF:
            return "LO"  # private creator
        if element >= 0x1000:
            creator = _private_creator(ds, (group << 16) | (element >> 8))
            if creator:
                try:
                    return private_dictionary_VR(tag, creator)
                except KeyError:  # creator or element not in the dictionary
                    pass
        return "UN"
    return _public_vr(tag) or "UN"


# --------------------------------------------------------------------------
# Walk
# --------------------------------------------------------------------------
class _Ctx:
    __slots__ = ("capture", "prefix", "threshold")

    def __init__(self, prefix: str, threshold: int, capture: dict | None = None):
        self.prefix = prefix
        self.threshold = threshold
        # path -> (vr, data, big_endian) for every BulkDataURI emitted
        self.capture = capture


def _as_bytes(value: Any) -> bytes | bytearray | memoryview | None:
    if value is None or isinstance(value, (bytes, bytearray, memoryview)):
        return value
    read = getattr(value, "read", None)
    if read is not None:  # buffered value (pydicom >= 3)
        pos = value.tell()
        try:
            value.seek(0)
            return read()
        finally:
            value.seek(pos)
    return None


def _is_big_endian(ds: Dataset, elem: Any) -> bool:
    if isinstance(elem, RawDataElement):
        return not elem.is_little_endian
    return ds.original_encoding[1] is False


def _binary_json(
    tag: int, vr: str, data: Any, big: bool, path: str, ctx: _Ctx
) -> dict[str, Any]:
    if not data:
        if ctx.capture is not None:
            ctx.capture[path] = (vr, b"", False)
        return {"vr": vr}
    if tag in _PIXEL_TAGS or path == _DOCUMENT_PATH or len(data) > ctx.threshold:
        if ctx.capture is not None:
            ctx.capture[path] = (vr, data, big)
        return {"vr": vr, "BulkDataURI": f"{ctx.prefix}/{path}"}
    if big:
        data = _to_little_endian(vr, data)
    return {"vr": vr, "InlineBinary": base64.b64encode(data).decode("ascii")}


def _to_little_endian(vr: str, data: Any) -> bytes:
    width = _SWAP_WIDTH.get(vr)
    if width is None or len(data) % width:
        return bytes(data)
    return np.frombuffer(data, dtype=f">u{width}").astype(f"<u{width}").tobytes()


def _values(value: Any) -> list[Any]:
    if value is None or value == "":
        return []
    if isinstance(value, (MultiValue, list, tuple)):
        return list(value)
    return [value]


def _pn_json(pn: Any) -> dict[str, str] | None:
    if pn is None:
        return None
    comps = getattr(pn, "components", None)
    if comps is None:
        comps = str(pn).split("=")
    out = {}
    for name, comp in zip(_PN_GROUPS, comps):
        if comp:
            out[name] = comp
    return out or None


def _as_text(v: Any) -> str:
    """A DA/DT/TM/... object (config.datetime_conversion) back to its text."""
    orig = getattr(v, "original_string", None)
    return orig if isinstance(orig, str) else str(v)


def _converted_json(vr: str, value: Any) -> dict[str, Any]:
    """JSON of a value pydicom already decoded (non-SQ, non-binary, non-DS/IS)."""
    vals = _values(value)
    if vr == "PN":
        out = [_pn_json(v) for v in vals]
    elif vr == "AT":
        out = [None if v is None else f"{int(v):08X}" for v in vals]
    elif vr in _FLOAT_VRS:
        out = [_float_json(v) for v in vals]
    elif vr in _BINARY_VRS:  # non-bytes under a binary VR (in-memory only)
        raise ValueError(f"unexpected {type(value).__name__} value for VR {vr}")
    else:
        out = [
            None if (v is None or v == "") else v if isinstance(v, (str, int)) else _as_text(v)
            for v in vals
        ]
    return _finish(vr, out)


def _plain_vr(vr: Any) -> str:
    """A 2-character plain str VR (pydicom gives ``VR`` enums, 'OB or OW')."""
    vr = str.__str__(vr) if vr else "UN"
    return vr if len(vr) == 2 else vr[:2]


def _element_json(
    ds: Dataset, tag: int, path: str, ctx: _Ctx, encoding: Any
) -> dict[str, Any]:
    """JSON of one element (general path, any element)."""
    elem = ds.get_item(tag)
    raw = isinstance(elem, RawDataElement)
    if raw:
        vr = elem.VR
        if vr is None or len(vr) != 2:  # implicit VR, or pydicom's 'OB or OW'
            if tag == _PIXEL_DATA and elem.length == _UNDEFINED_LENGTH:
                vr = "OB"  # encapsulated (PS3.5 A.4)
            else:
                vr = _implicit_vr(ds, tag) if vr is None else vr
                if len(vr) != 2:  # ambiguous: let pydicom resolve (PS3.5 A.1)
                    elem = ds[tag]
                    raw = False
                    vr = _plain_vr(elem.VR)
        elif type(vr) is not str:
            vr = str.__str__(vr)
    else:
        vr = _plain_vr(elem.VR)
        if tag == _PIXEL_DATA and elem.is_undefined_length and vr in _BINARY_VRS:
            vr = "OB"  # encapsulated (PS3.5 A.4), whatever pydicom guessed

    if vr == "SQ":
        if raw:
            elem = ds[tag]
        items = elem.value
        if not items:
            return {"vr": "SQ"}
        return {
            "vr": "SQ",
            "Value": [
                _dataset_json(item, f"{path}/{i}/", ctx) for i, item in enumerate(items)
            ],
        }

    if vr == "DS" or vr == "IS":
        return _numbers_json(vr, _number_texts(elem, raw))

    if vr in _BINARY_VRS:
        value = elem.value
        data = value if raw else _as_bytes(value)
        if data is not None or raw or value is None:
            return _binary_json(tag, vr, data, _is_big_endian(ds, elem), path, ctx)
        # a converted non-bytes value under a binary VR: _converted_json raises

    if raw:
        fast = _FAST.get(vr)
        if fast is not None:
            try:
                return fast(vr, elem, encoding if isinstance(encoding, str) else encoding[0])
            except _UsePydicom:
                pass
        if elem.VR != vr:
            elem = elem._replace(VR=vr)
        conv = convert_raw_data_element(elem, encoding=encoding, ds=ds)
        if conv.VR != vr and conv.VR in _BINARY_VRS:
            # pydicom gave up on the value (config.convert_wrong_length_to_UN)
            raise ValueError(f"cannot decode value as {vr}")
        return _converted_json(vr, conv.value)
    return _converted_json(vr, elem.value)


def _raw_bytes(ds: Dataset, tag: int) -> Any:
    elem = ds.get_item(tag)
    if isinstance(elem, RawDataElement):
        return elem.value if elem.value is not None else b""
    return _as_bytes(elem.value) if elem is not None else None


def _dataset_json(ds: Dataset, prefix: str, ctx: _Ctx) -> dict[str, Any]:
    """JSON of a dataset; `prefix` is "" or the item path ending in "/"."""
    out: dict[str, Any] = {}
    try:
        encoding = ds._character_set or _DEFAULT_ENCODING
    except Exception:  # bad Specific Character Set: pydicom's default
        encoding = _DEFAULT_ENCODING
    enc0 = encoding if isinstance(encoding, str) else encoding[0]
    d = getattr(ds, "_dict", None)
    if d is None:  # pragma: no cover - not a pydicom 3 Dataset
        d = dict.fromkeys(ds.keys())  # noqa: SIM118 (iterating yields elements)
    fast_get = _FAST.get
    for tag in sorted(d, key=int):
        if not (tag & 0xFFFF) or (tag >> 16) == 0x0002:
            continue  # group lengths (F.2.2) and file meta information
        key = f"{tag:08X}"
        try:
            elem = d[tag]
            # fast path: raw element with a plain VR and its bytes in memory
            if type(elem) is RawDataElement and elem.value is not None:
                vr = elem.VR
                if vr is None:
                    vr = _implicit_vr(ds, tag)
                elif type(vr) is not str:
                    vr = str.__str__(vr)
                fast = fast_get(vr)
                if fast is not None:
                    try:
                        out[key] = fast(vr, elem, enc0)
                        continue
                    except _UsePydicom:
                        pass
            out[key] = _element_json(ds, tag, prefix + key, ctx, encoding)
        except Exception as exc:
            out[key] = _fallback_json(ds, tag, prefix + key, ctx, exc)
    return out


def _fallback_json(
    ds: Dataset, tag: int, path: str, ctx: _Ctx, exc: Exception
) -> dict[str, Any]:
    try:
        data = _raw_bytes(ds, tag)
    except Exception:
        data = None
    if data is None:
        elem = ds.get_item(tag)
        vr = _plain_vr(getattr(elem, "VR", None))
        logger.warning(
            "DICOM JSON: element %s (%s) not convertible, emitted without value: %s",
            path, vr, exc,
        )
        return {"vr": vr}
    logger.warning("DICOM JSON: element %s not convertible, emitted as UN bytes: %s", path, exc)
    return _binary_json(tag, "UN", data, False, path, ctx)


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------
def dataset_to_json(
    ds: Dataset, bulkdata_uri_prefix: str, *, bulk_threshold: int = 1024
) -> dict[str, Any]:
    """Return the DICOM JSON Model object (PS3.18 F.2) of a dataset.

    Parameters
    ----------
    ds : pydicom.Dataset
        A dataset read from a PS3.10 file (``dcmread``).  ``ds.file_meta`` is
        not part of the model; group 0002 and all group length elements
        (gggg,0000) are left out (F.2.2).  Elements still raw are read from
        their bytes; the dataset may have some elements converted by pydicom
        (sequences, ambiguous VRs) as a side effect, as with ``ds[tag]``.
    bulkdata_uri_prefix : str
        Used verbatim: a BulkDataURI (F.2.6) is ``bulkdata_uri_prefix + "/" +
        tagpath``, e.g. ``"@@BASE@@/studies/1/series/2/instances/3/bulkdata"``
        + ``"/00540016/0/00181072"``.
    bulk_threshold : int, optional
        A binary-VR value (OB OD OF OL OV OW UN) longer than this many bytes is
        a BulkDataURI, otherwise InlineBinary (F.2.7).  Pixel Data (7FE0,0010),
        (7FE0,0008) and (7FE0,0009) are always a BulkDataURI.

    Returns
    -------
    dict
        ``{"GGGGEEEE": {"vr": ..., "Value"|"InlineBinary"|"BulkDataURI": ...}}``
        with keys in ascending order (F.2.2); directly serialisable by
        ``orjson.dumps`` (no NaN/Infinity, ints within 64 bits).  Empty
        elements have no value key (F.2.5); empty values in a multi-value are
        ``None``; DS/IS follow F.2.3 (numbers, or the original text when not a
        valid DS/IS); PN values are ``{"Alphabetic", "Ideographic",
        "Phonetic"}`` objects holding only non-empty groups (F.2.2); AT values
        are 8-hex-digit strings (F.2.3).

    Raises
    ------
    TypeError
        If `ds` is not a pydicom Dataset.  Bad element values never raise: an
        element that cannot be decoded is emitted as VR ``UN`` with its raw
        bytes and a warning is logged (see the module docstring).
    """
    if not isinstance(ds, Dataset):
        raise TypeError(f"expected a pydicom Dataset, got {type(ds).__name__}")
    return _dataset_json(ds, "", _Ctx(bulkdata_uri_prefix, bulk_threshold))


def level_attributes(json: dict[str, Any], tags: frozenset[str] | Iterable[str]) -> dict[str, Any]:
    """Top-level entries of a DICOM JSON object whose tag is in `tags`.

    Parameters
    ----------
    json : dict
        A DICOM JSON Model object (PS3.18 F.2), e.g. an instance's.
    tags : frozenset of str
        8-digit uppercase hex tags, e.g. the study-level attributes.

    Returns
    -------
    dict
        The selected entries (same value objects, not copies), in the
        ascending key order of `json` (F.2.2).
    """
    return {k: v for k, v in json.items() if k in tags}

"""Lean header walker: the DICOM JSON (PS3.18 Annex F) of a received PS3.10 file
held in memory, without building a pydicom Dataset, for the common case only.

Why hand-written (issue 11): describing an instance was 42 % of the STOW-RS
server's GIL time (py-spy --gil, 8 connections, one 256x256 MR per request);
cProfile of :func:`.instance.describe_instance` on that 132 KB MR put pydicom's
read at ~50 % of it and :func:`.json_model.dataset_to_json` at 17 %. pydicom
offers no way to walk raw elements without building its Dataset (``dcmread``,
``read_dataset`` and the RawDataElement generator each cost most of that), so
this module reads the elements itself. Measured on the Intel VM (2 vCPU): describing
the test MR (make_dataset, 256x256) 665 us on the pydicom path, 136 us here; describe's
share of the STOW workers' GIL time 27.5 % -> 8.6 % (loadtests/results/profiles/summary.txt,
stow-fastpath-*). It hands the elements' bytes to the very same
value decoders :mod:`.json_model` uses (``_FAST``, ``_binary_json``): the values
are decoded by one piece of code whichever path ran.

The walker covers exactly: a 128-byte preamble + ``DICM`` + a group 0002 in
Explicit VR Little Endian starting with its group length (PS3.10 §7.1), then a data
set in Explicit VR Little Endian (PS3.5 §7.1.2, A.2; also the encapsulated syntaxes,
whose data set is Explicit VR Little Endian, PS3.5 A.4), elements in ascending
tag order (PS3.5 §7.1), every value of defined length and inside the file, up
to the pixel data (7FE0,0010 / 0008 / 0009), which :func:`.frames.scan_pixel_data`
then describes, with nothing after it.

It *declines* (returns None, and the caller takes the pydicom path, which gives
the answer or the error of today) on anything else: Implicit VR (see _DECLINED_TS),
Deflated or Big Endian or private or unknown transfer syntaxes, the key UIDs and
pixel description attributes in another VR than their dictionary's, a public element
in UN, a NUL inside the Specific Character Set, sequences, undefined lengths, command set
elements, unknown explicit VRs, a Specific Character Set other than a
single non-ISO-2022 term, values a fast decoder refuses (ISO 2022 escapes,
undecodable bytes, wrong lengths), a truncated element, elements out of order,
elements after the pixel data. Only successes are produced here: a UID that is
missing or invalid, a study mismatch or a frame count mismatch also declines, so
that every error message still comes from the one pydicom path.
``tests/dicom/test_lean.py`` proves the record equal to the pydicom path's, or a
decline, for pydicom's test corpus and synthetic edge cases.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import pydicom.uid
from pydicom.charset import python_encoding

from .frames import PIXEL_TAGS, PixelLayout, Truncated, scan_pixel_data
from .json_model import (
    _BINARY_VRS,
    _DEFAULT_ENCODING,
    _FAST,
    _binary_json,
    _Ctx,
    _UsePydicom,
)

_UNDEFINED = 0xFFFFFFFF
# PS3.5 Table 7.1-1: VRs with a 2-byte reserved field and a 4-byte length
_LONG_VRS = frozenset(b.encode() for b in ("OB", "OD", "OF", "OL", "OV", "OW", "SQ", "UC", "UN", "UR", "UT", "SV", "UV"))
_SHORT_VRS = frozenset(b.encode() for b in ("AE", "AS", "AT", "CS", "DA", "DS", "DT", "FL", "FD", "IS", "LO", "LT",
                                            "PN", "SH", "SL", "SS", "ST", "TM", "UI", "UL", "US"))
_IMPLICIT = pydicom.uid.ImplicitVRLittleEndian
#: data sets not in Explicit VR Little Endian: Deflated (A.5), Big Endian (A.3), JPIP Deflate, and
#: Implicit VR Little Endian (A.1): the pydicom path converts every implicit element to its
#: dictionary VR's value (reading.check_complete) and builds the JSON from those, which
#: strips, refuses or decodes otherwise than the raw decoders here (a fuzzer found ' 1.2.3'
#: kept in a UI, 'inf' in an IS accepted, a 3-byte group length accepted): declined
_DECLINED_TS = frozenset({"1.2.840.10008.1.2.1.99", "1.2.840.10008.1.2.2", "1.2.840.10008.1.2.4.95", _IMPLICIT})
#: the VR each of these must have here; another VR (UN, OB, AE, ...) is read by the
#: pydicom path through its dictionary, with other results: declined
_EXPECTED_VR = {0x00080016: "UI", 0x00080018: "UI", 0x0020000D: "UI", 0x0020000E: "UI",
                0x00280002: "US", 0x00280008: "IS", 0x00280010: "US", 0x00280011: "US", 0x00280100: "US"}
#: the first file meta element: (0002,0000) File Meta Information Group Length, UL, 4 bytes
#: (PS3.10 §7.1), which pydicom decodes (and refuses when malformed)
_META_GROUP_LENGTH = struct.pack("<HH2sH", 0x0002, 0x0000, b"UL", 4)
_KNOWN_TS = frozenset(str(u) for u in pydicom.uid.AllTransferSyntaxes)
_CHARSET = 0x00080005
_unpack = struct.unpack_from


class _Elem:
    """What a ``json_model`` fast decoder reads of a RawDataElement."""

    __slots__ = ("value",)
    is_little_endian = True

    def __init__(self, value: bytes) -> None:
        self.value = value


class Decline(Exception):
    """The lean path does not handle this file exactly; use the pydicom path."""


def _explicit_header(data: bytes, pos: int, n: int, sequences: bool = False) -> tuple[bytes, int, int]:
    """VR, defined length and value offset of the Explicit VR element at ``pos`` (PS3.5
    §7.1.2); declines a sequence (unless ``sequences``: then one of defined length is an
    element like any other), an unknown VR or a length past the end."""
    vrb = data[pos + 4:pos + 6]
    if vrb in _SHORT_VRS:
        (length,) = _unpack("<H", data, pos + 6)
        pos += 8
    elif vrb in _LONG_VRS and (sequences or vrb != b"SQ") and pos + 12 <= n:
        (length,) = _unpack("<I", data, pos + 8)
        pos += 12
    else:
        raise Decline
    if length == _UNDEFINED or pos + length > n:
        raise Decline
    return vrb, length, pos


def transfer_syntax_and_start(data: bytes) -> tuple[str, int]:
    """The Transfer Syntax UID in the file meta (PS3.10 §7.1) and where the data set starts."""
    if len(data) < 144 or data[128:132] != b"DICM" or data[132:140] != _META_GROUP_LENGTH:
        raise Decline
    pos, n, ts = 132, len(data), None
    while pos + 8 <= n:
        group, element = _unpack("<HH", data, pos)
        if group != 0x0002:
            break
        vrb, length, pos = _explicit_header(data, pos, n)
        if element == 0x0010:
            if vrb != b"UI":
                raise Decline
            ts = data[pos:pos + length].decode("latin-1").rstrip("\0 ")
        pos += length
    if not ts or "\\" in ts or ts in _DECLINED_TS or ts not in _KNOWN_TS:
        raise Decline
    return ts, pos


def walk(data: bytes, pos: int, sequences: bool = False) -> tuple[list[tuple[int, str, bytes]], int]:
    """The top-level elements (tag, VR, value bytes) of an Explicit VR Little Endian data
    set from ``pos`` up to the pixel data or the end, and where they stopped.
    ``sequences``: a sequence of defined length is one more element (its value: the
    encoded items), else declined."""
    n, out, last = len(data), [], -1
    while pos < n:
        if pos + 8 > n:
            raise Decline
        group, element = _unpack("<HH", data, pos)
        tag = group << 16 | element
        if tag in PIXEL_TAGS:
            break
        if tag <= last or group in (0x0000, 0x0002, 0xFFFE):
            raise Decline
        last = tag
        vrb, length, pos = _explicit_header(data, pos, n, sequences)
        vr = vrb.decode("ascii")
        if vr == "UN" and not group & 1:
            raise Decline  # pydicom reads a public UN through its dictionary VR
        if _EXPECTED_VR.get(tag, vr) != vr:
            raise Decline
        if length == _UNDEFINED or pos + length > n:
            raise Decline
        out.append((tag, vr, data[pos:pos + length]))
        pos += length
    return out, pos


def _encoding(elements: list[tuple[int, str, bytes]]) -> str:
    for tag, vr, value in elements:
        if tag == _CHARSET:
            terms = value.decode("latin-1").split("\\")
            if vr != "CS" or len(terms) != 1 or b"\0" in value.rstrip(b" \0"):
                raise Decline  # a NUL that is not trailing padding: pydicom keeps it (and refuses)
            term = terms[0].strip(" \0")
            if not term or term.startswith("ISO 2022") or term not in python_encoding:
                raise Decline
            return python_encoding[term]
        if tag > _CHARSET:
            break
    return _DEFAULT_ENCODING


def to_json(elements: list[tuple[int, str, bytes]], prefix: str, threshold: int, encoding: str) -> dict[str, Any]:
    """The DICOM JSON object, as :func:`.json_model.dataset_to_json` gives it for the
    same elements (same decoders); keys ascending (PS3.18 F.2.2)."""
    ctx = _Ctx(prefix, threshold)
    out: dict[str, Any] = {}
    fast_get = _FAST.get
    for tag, vr, value in elements:
        if not tag & 0xFFFF:
            continue  # group lengths (F.2.2)
        key = f"{tag:08X}"
        fast = fast_get(vr)
        if fast is not None:
            try:
                out[key] = fast(vr, _Elem(value), encoding)
            except (_UsePydicom, ValueError, UnicodeError, struct.error):
                raise Decline from None
        elif vr in _BINARY_VRS:
            out[key] = _binary_json(tag, vr, value, False, key, ctx)
        else:
            raise Decline
    return out


def first_value(meta: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """The single value of a top-level element as pydicom's ``ds.get`` would give it
    to :func:`.instance.describe_instance`; ``default`` when absent or empty."""
    entry = meta.get(key)
    if entry is None or "Value" not in entry:
        return default
    values = entry["Value"]
    if len(values) != 1 or type(values[0]) is not kind:
        raise Decline
    return values[0]


def pixel_layout(data: bytes, pos: int, number_of_frames: int) -> PixelLayout | None:
    """The pixel data's layout when it is the last element of the file, or None for no pixel data."""
    if pos >= len(data):
        return None
    try:
        layout = scan_pixel_data(io.BytesIO(data), pos, len(data), implicit_vr=False, little_endian=True,
                                 number_of_frames=number_of_frames)
    except Truncated:
        raise Decline from None
    if layout is None or layout.end != len(data):
        raise Decline  # elements after the pixel data: the pydicom path reads them
    return layout

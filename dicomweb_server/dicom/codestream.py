"""Codestream headers checked against the data set before a native decoder runs.

Native decoders (GDCM above all, reached as a fallback when the first plugin
refuses a frame) trust the image size, component count and precision the caller
gives them; a codestream whose own header disagrees makes them write past their
buffers or abort the process (a single-component JPEG 2000 frame in an RGB data set
aborts GDCM: ``image->numcomps == GetSamplesPerPixel()``; a JPEG-LS frame larger than
Rows x Columns aborts it in ``gdcmBitmap.cxx``). So the header of every encapsulated
frame is read here, with plain byte parsing (a few dozen bytes, no decoder), and a
frame that does not describe the same picture as the data set is refused with
:class:`CodestreamMismatch` naming the difference:

============================ =====================================================
JPEG (PS3.5 A.4.1, 8.2.1)    the frame header (SOFn, ISO 10918-1 B.2.2): the SOF
                             kind must fit the transfer syntax (DCT SOF0-2 for
                             Baseline/Extended, lossless SOF3 for .57/.70), lines Y
                             = Rows, samples per line X = Columns, Nf = Samples per
                             Pixel, precision P <= Bits Allocated
JPEG-LS (PS3.5 A.4.3)        SOF55 (ISO 14495-1 C.2.2), same fields and rules
JPEG 2000, HTJ2K (A.4.4,     the SIZ marker (ISO 15444-1 A.5.1) of the codestream
A.4.6)                       (after a JP2 header too, which some writers add):
                             Xsiz-XOsiz = Columns, Ysiz-YOsiz = Rows, Csiz =
                             Samples per Pixel, every component's precision <= Bits
                             Allocated and not subsampled (XRsiz = YRsiz = 1)
RLE Lossless (A.4.2, G.3)    the 64-byte RLE header: segment count = Samples per
                             Pixel x Bits Allocated/8, first offset 64, offsets
                             increasing and inside the frame
============================ =====================================================

The module is pure (bytes in, exception or None out) and only reads the header.

:func:`coding_style` reads the JPEG 2000 main header further (COD and TLM marker
segments, ISO 15444-1 A.6.1 and A.7.1): what an encoder wrote is checked before a
codestream is stored as HTJ2K Lossless RPCL (PS3.5 A.4.x / 10.18: RPCL progression,
decompositions down to 64 pixels, TLM present).
"""

from __future__ import annotations

import struct

from dataclasses import dataclass

__all__ = ["CodestreamMismatch", "CodingStyle", "check_frame", "coding_style"]

JPEG_DCT = ("1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51")
JPEG_LOSSLESS = ("1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70")
JPEG_LS = ("1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81")
J2K = (
    "1.2.840.10008.1.2.4.90",
    "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.201",  # HTJ2K Lossless
    "1.2.840.10008.1.2.4.202",  # HTJ2K Lossless RPCL
    "1.2.840.10008.1.2.4.203",  # HTJ2K
)
RLE = "1.2.840.10008.1.2.5"

#: SOF markers allowed per JPEG transfer syntax family (ISO 10918-1 Table B.1)
_SOF_DCT = {0xC0: "SOF0 baseline", 0xC1: "SOF1 extended", 0xC2: "SOF2 progressive"}
_SOF_LOSSLESS = {0xC3: "SOF3 lossless"}
_SOF_LS = {0xF7: "SOF55 JPEG-LS"}
_SOF_ANY = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xF7}
#: how far into a frame the header is looked for (tables come before it; a JP2
#: header before a J2K codestream is a few hundred bytes)
_SCAN_LIMIT = 1 << 20


class CodestreamMismatch(ValueError):
    """The frame's codestream header does not describe the picture of the data set."""


def check_frame(
    frame: bytes | bytearray | memoryview,
    transfer_syntax: str,
    *,
    rows: int,
    columns: int,
    samples_per_pixel: int,
    bits_allocated: int,
) -> None:
    """Raise CodestreamMismatch unless `frame` fits the data set's Image Pixel module."""
    data = bytes(frame[:_SCAN_LIMIT])
    expect = (rows, columns, samples_per_pixel, bits_allocated)
    if transfer_syntax in JPEG_DCT:
        _check_jpeg(data, _SOF_DCT, *expect)
    elif transfer_syntax in JPEG_LOSSLESS:
        _check_jpeg(data, _SOF_LOSSLESS, *expect)
    elif transfer_syntax in JPEG_LS:
        _check_jpeg(data, _SOF_LS, *expect)
    elif transfer_syntax in J2K:
        _check_j2k(data, *expect)
    elif transfer_syntax == RLE:
        _check_rle(frame, samples_per_pixel, bits_allocated)


def _compare(what: str, found: list[tuple[str, int, int]]) -> None:
    wrong = [f"{name} {got} (the data set says {want})" for name, got, want in found if got != want]
    if wrong:
        raise CodestreamMismatch(f"the {what} does not match the data set: " + ", ".join(wrong))


def _check_jpeg(
    data: bytes, allowed: dict[int, str], rows: int, columns: int, spp: int, bits_allocated: int
) -> None:
    if data[:2] != b"\xff\xd8":
        raise CodestreamMismatch("the frame is not a JPEG codestream (no SOI marker FFD8)")
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise CodestreamMismatch(f"JPEG marker expected at byte {pos}, found 0x{data[pos]:02X}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte (ISO 10918-1 B.1.1.2)
            pos += 1
            continue
        if marker in (0x01,) or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # SOS / EOI before any frame header
            break
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if length < 2:
            raise CodestreamMismatch(f"JPEG segment FF{marker:02X} has length {length}")
        if marker in _SOF_ANY:
            if marker not in allowed:
                raise CodestreamMismatch(
                    f"the JPEG frame header is SOF marker FF{marker:02X}; this transfer syntax "
                    f"holds {' or '.join(allowed.values())} codestreams"
                )
            if length < 8 or pos + 10 > len(data):
                raise CodestreamMismatch("the JPEG frame header is truncated")
            precision, y, x, nf = struct.unpack_from(">BHHB", data, pos + 4)
            _compare(
                f"JPEG frame header ({allowed[marker]})",
                [("lines", y, rows), ("samples per line", x, columns), ("components", nf, spp)],
            )
            if not 2 <= precision <= bits_allocated:
                raise CodestreamMismatch(
                    f"the JPEG sample precision {precision} does not fit Bits Allocated {bits_allocated}"
                )
            return
        pos += 2 + length
    raise CodestreamMismatch("the JPEG codestream has no frame header (SOF marker) before its scan")


def _j2k_codestream_start(data: bytes) -> int:
    if data[:4] == b"\xff\x4f\xff\x51":
        return 0
    # JP2 file format (ISO 15444-1 Annex I): boxes; the codestream is in 'jp2c'
    pos = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        header = 8
        if length == 1 and pos + 16 <= len(data):
            (length,) = struct.unpack_from(">Q", data, pos + 8)
            header = 16
        if kind == b"jp2c":
            return pos + header
        if length < header:
            break
        pos += length
    raise CodestreamMismatch("the frame is not a JPEG 2000 codestream (no SOC and SIZ markers)")


def _check_j2k(data: bytes, rows: int, columns: int, spp: int, bits_allocated: int) -> None:
    start = _j2k_codestream_start(data)
    if data[start : start + 4] != b"\xff\x4f\xff\x51":
        raise CodestreamMismatch("the JPEG 2000 codestream does not start with SOC and SIZ markers")
    siz = start + 4
    if siz + 38 > len(data):
        raise CodestreamMismatch("the JPEG 2000 SIZ marker segment is truncated")
    (lsiz, _rsiz, xsiz, ysiz, xo, yo, xt, yt, _xto, _yto, csiz) = struct.unpack_from(
        ">HHIIIIIIIIH", data, siz
    )
    if lsiz != 38 + 3 * csiz or siz + lsiz > len(data) or xsiz <= xo or ysiz <= yo or not xt or not yt:
        raise CodestreamMismatch("the JPEG 2000 SIZ marker segment is malformed")
    _compare(
        "JPEG 2000 image header (SIZ)",
        [("height", ysiz - yo, rows), ("width", xsiz - xo, columns), ("components", csiz, spp)],
    )
    for i in range(csiz):
        ssiz, xr, yr = struct.unpack_from(">BBB", data, siz + 38 + 3 * i)
        precision = (ssiz & 0x7F) + 1
        if precision > bits_allocated:
            raise CodestreamMismatch(
                f"JPEG 2000 component {i} has precision {precision}, more than Bits Allocated "
                f"{bits_allocated}"
            )
        if xr != 1 or yr != 1:
            raise CodestreamMismatch(f"JPEG 2000 component {i} is subsampled ({xr}x{yr}): not supported")


def _check_rle(frame: bytes | bytearray | memoryview, spp: int, bits_allocated: int) -> None:
    if len(frame) < 64:
        raise CodestreamMismatch(f"the RLE frame has {len(frame)} bytes, less than its 64-byte header")
    header = struct.unpack_from("<16I", bytes(frame[:64]))
    count, offsets = header[0], header[1 : 1 + min(header[0], 15)]
    want = spp * max(bits_allocated // 8, 1)
    _compare("RLE header", [("segment count", count, want)])
    if offsets[0] != 64 or any(b <= a for a, b in zip(offsets, offsets[1:])) or offsets[-1] >= len(frame):
        raise CodestreamMismatch(f"the RLE header has invalid segment offsets {list(offsets)}")


#: SGcod progression order values (ISO 15444-1 Table A.16)
PROGRESSION_ORDERS = ("LRCP", "RLCP", "RPCL", "PCRL", "CPRL")


@dataclass(frozen=True, slots=True)
class CodingStyle:
    """The coding style default (COD) of a JPEG 2000 / HTJ2K main header, and whether
    it has tile-part lengths (TLM)."""

    progression_order: str  # LRCP, RLCP, RPCL, PCRL or CPRL
    layers: int
    multiple_component_transform: bool
    decompositions: int
    reversible: bool  # the 5-3 wavelet (ISO 15444-1 Table A.20)
    tlm: bool
    precision: tuple[int, ...]  # per component, from SIZ


def coding_style(frame: bytes | bytearray | memoryview) -> CodingStyle:
    """The COD (ISO 15444-1 A.6.1) and TLM (A.7.1) marker segments of the main header
    of a JPEG 2000 codestream (raw, or in a JP2 file), and the precision of its
    components (SIZ, A.5.1). Raises CodestreamMismatch when the header has no COD."""
    data = bytes(frame[:_SCAN_LIMIT])
    start = _j2k_codestream_start(data)
    if data[start : start + 4] != b"\xff\x4f\xff\x51":
        raise CodestreamMismatch("the JPEG 2000 codestream does not start with SOC and SIZ markers")
    pos, cod, tlm, precision = start + 2, None, False, ()
    while pos + 4 <= len(data):
        marker, length = struct.unpack_from(">HH", data, pos)
        if marker == 0xFF90:  # SOT: the main header ends
            break
        body = data[pos + 4 : pos + 2 + length]
        if marker == 0xFF51 and len(body) >= 36:
            csiz = struct.unpack_from(">H", body, 34)[0]
            precision = tuple((body[36 + 3 * i] & 0x7F) + 1 for i in range(csiz) if 36 + 3 * i < len(body))
        elif marker == 0xFF52 and len(body) >= 10:
            cod = body
        elif marker == 0xFF55:
            tlm = True
        pos += 2 + length
    if cod is None:
        raise CodestreamMismatch("the JPEG 2000 main header has no COD marker segment")
    order = cod[1]
    return CodingStyle(
        progression_order=PROGRESSION_ORDERS[order] if order < len(PROGRESSION_ORDERS) else f"unknown ({order})",
        layers=struct.unpack_from(">H", cod, 2)[0],
        multiple_component_transform=bool(cod[4]),
        decompositions=cod[5],
        reversible=cod[9] == 1,
        tlm=tlm,
        precision=precision,
    )

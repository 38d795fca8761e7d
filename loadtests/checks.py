"""The checks of LOAD-03 answers, without locust (the tests import them)."""

from __future__ import annotations

import io

_PIXEL_TAG = b"\xe0\x7f\x10\x00"


def _param(content_type: str, name: str) -> str | None:
    for piece in content_type.split(";")[1:]:
        k, _, v = piece.strip().partition("=")
        if k.strip().lower() == name:
            return v.strip().strip('"')
    return None


def dicom_part(body: bytes, content_type: str) -> tuple[int, int]:
    """(start, end) of the single application/dicom part of a WADO-RS answer.

    Raises
    ------
    ValueError
        Not one part of application/dicom.
    """
    ct = content_type.lower()
    if ct.startswith("application/dicom"):
        return 0, len(body)
    if not ct.startswith("multipart/related"):
        raise ValueError(f"Content-Type {content_type!r}")
    boundary = _param(content_type, "boundary")
    if not boundary:
        raise ValueError("multipart answer without a boundary")
    delim = b"--" + boundary.encode()
    s = body.find(delim)
    if s < 0:
        raise ValueError("boundary not found in the body")
    h = body.find(b"\r\n\r\n", s)
    if h < 0:
        raise ValueError("part headers not terminated")
    headers = body[s + len(delim):h].decode("latin-1").lower()
    if "content-type:" in headers and "application/dicom" not in headers:
        raise ValueError(f"part is not application/dicom: {headers.strip()[:120]!r}")
    start = h + 4
    end = body.rfind(b"\r\n" + delim + b"--")
    if end < start:
        raise ValueError("closing boundary missing (truncated answer?)")
    if body.find(b"\r\n" + delim, start, end) >= 0:
        raise ValueError("more than one part")
    return start, end


def pixel_data(body: bytes, start: int, end: int, expected: int) -> int:
    """Offset of the Pixel Data value, checked to be ``expected`` bytes long and the
    last element of the part (Explicit VR Little Endian, as stored).

    Raises
    ------
    ValueError
        Another length, or no Pixel Data element where it should be.
    """
    v = end - expected
    if v >= 12 + start and body[v - 12:v - 8] == _PIXEL_TAG and body[v - 8:v - 6] in (b"OW", b"OB") \
            and int.from_bytes(body[v - 4:v], "little") == expected:
        return v
    p = body.rfind(_PIXEL_TAG + b"O", start, end)
    if p < 0:
        raise ValueError("no Pixel Data element")
    got = int.from_bytes(body[p + 8:p + 12], "little")
    raise ValueError(f"Pixel Data length {got}, expected {expected} (part of {end - start} bytes)")


def check_jpeg(body: bytes, rows: int, columns: int, full: bool = True) -> None:
    """A complete JPEG of columns x rows that decodes.

    Raises
    ------
    ValueError
    """
    from PIL import Image

    if body[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no SOI marker)")
    if body[-2:] != b"\xff\xd9":
        raise ValueError("incomplete JPEG (no EOI marker at the end)")
    try:
        im = Image.open(io.BytesIO(body), formats=["JPEG"])
        if im.size != (columns, rows):
            raise ValueError(f"JPEG is {im.size[0]}x{im.size[1]}, expected {columns}x{rows}")
        if not full:
            im.draft(im.mode, (max(1, columns // 8), max(1, rows // 8)))
        im.load()
    except ValueError:
        raise
    except Exception as e:  # Pillow: OSError (truncated, broken data), SyntaxError, ...
        raise ValueError(f"JPEG does not decode: {e}") from None

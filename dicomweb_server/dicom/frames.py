"""Where each frame of an instance lies in its PS3.10 file, computed once at
store time so that WADO-RS frame retrieval is a seek and a read, not a DICOM parse.

References
----------
PS3.5 §7.1 (data element encoding), §A.4 (encapsulated pixel data: item tags,
Basic Offset Table, sequence delimiter), PS3.5 §8.1.1 (native frame layout);
PS3.18 §10.4.1.1.2 (frames resource).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

PIXEL_DATA = 0x7FE00010
FLOAT_PIXEL_DATA = 0x7FE00008
DOUBLE_FLOAT_PIXEL_DATA = 0x7FE00009
#: the three pixel data elements (PS3.3 C.7.6.3; PS3.18 §10.4.3.3.6 names all three)
PIXEL_TAGS = frozenset({PIXEL_DATA, FLOAT_PIXEL_DATA, DOUBLE_FLOAT_PIXEL_DATA})
_ITEM = 0xFFFEE000
_SEQ_DELIM = 0xFFFEE0DD


class Truncated(ValueError):
    """The file ends inside its pixel data (STOW failure 0xC000)."""


@dataclass(frozen=True, slots=True)
class PixelLayout:
    """Location of the pixel data of one file.

    ``tag``: which pixel data element (7FE00010, or Float / Double Float Pixel Data
    7FE00008 / 7FE00009, which are always native); ``vr``: OB/OW/OF/OD;
    ``value_offset``/``value_length``: the pixel data value (native);
    ``end``: file offset just past the element; ``fragments``: (offset, length) of each
    encapsulated fragment (Basic Offset Table excluded); ``frames``: for
    encapsulated data, the fragment index range (first, count) of each frame, or
    None when the frame boundaries cannot be known without decoding.
    """

    vr: str
    value_offset: int
    value_length: int | None
    end: int
    fragments: tuple[tuple[int, int], ...] | None = None
    frames: tuple[tuple[int, int], ...] | None = None
    tag: int = PIXEL_DATA

    @property
    def keyword_tag(self) -> str:
        """The tag as DICOM JSON and BulkDataURIs write it, e.g. ``7FE00008``."""
        return f"{self.tag:08X}"

    def to_json(self) -> dict:
        return {
            "tag": self.keyword_tag, "vr": self.vr, "offset": self.value_offset, "length": self.value_length,
            "end": self.end, "fragments": self.fragments, "frames": self.frames,
        }

    @classmethod
    def from_json(cls, d: dict) -> "PixelLayout":
        frag = d.get("fragments")
        frames = d.get("frames")
        return cls(
            d["vr"], d["offset"], d["length"], d["end"],
            tuple(tuple(x) for x in frag) if frag is not None else None,  # type: ignore[misc]
            tuple(tuple(x) for x in frames) if frames is not None else None,  # type: ignore[misc]
            int(d.get("tag", "7FE00010"), 16),
        )


def _read_exact(fp: BinaryIO, n: int) -> bytes:
    b = fp.read(n)
    if len(b) != n:
        raise Truncated("the file ends inside its pixel data")
    return b


def scan_pixel_data(
    fp: BinaryIO, pos: int, file_size: int, *, implicit_vr: bool, little_endian: bool, number_of_frames: int
) -> PixelLayout | None:
    """Describe the pixel data element (Pixel Data, Float Pixel Data or Double Float
    Pixel Data) that starts at ``pos`` (where pydicom's ``stop_before_pixels`` left the
    file), or None when ``pos`` holds another element.

    Raises
    ------
    Truncated
        The value, an item or the sequence delimiter lies beyond the end of the file.
    """
    e = "<" if little_endian else ">"
    fp.seek(pos)
    head = fp.read(8)
    if len(head) < 8:
        return None
    group, elem = struct.unpack(e + "HH", head[:4])
    tag = group << 16 | elem
    if tag not in PIXEL_TAGS:
        return None
    if not implicit_vr and head[4:6] not in (b"OB", b"OW", b"UN", b"OV", b"OD", b"OF", b"OL"):
        implicit_vr = True  # some writers encode this element implicitly despite the transfer syntax
    if implicit_vr:
        vr = {FLOAT_PIXEL_DATA: "OF", DOUBLE_FLOAT_PIXEL_DATA: "OD"}.get(tag, "OW")
        (length,) = struct.unpack(e + "L", head[4:8])
        value_offset = pos + 8
    else:
        vr = head[4:6].decode("latin-1")
        (length,) = struct.unpack(e + "L", _read_exact(fp, 4))
        value_offset = pos + 12
    if length != 0xFFFFFFFF:
        if value_offset + length > file_size:
            raise Truncated(
                f"Pixel Data is {length} bytes but the file ends {file_size - value_offset} bytes into it"
            )
        return PixelLayout(vr, value_offset, length, value_offset + length, tag=tag)
    if tag != PIXEL_DATA:
        raise Truncated(f"({tag >> 16:04X},{tag & 0xFFFF:04X}) has an undefined length; only Pixel Data "
                        "may be encapsulated (PS3.5 A.4)")
    # encapsulated: a sequence of items, the first being the Basic Offset Table (PS3.5 A.4)
    fp.seek(value_offset)
    items: list[tuple[int, int]] = []
    while True:
        tag_len = _read_exact(fp, 8)
        g, el, ln = struct.unpack("<HHL", tag_len)
        tag = g << 16 | el
        here = fp.tell()
        if tag == _SEQ_DELIM:
            end = here
            break
        if tag != _ITEM or ln == 0xFFFFFFFF:
            raise Truncated(f"unexpected tag ({g:04X},{el:04X}) inside encapsulated Pixel Data")
        if here + ln > file_size:
            raise Truncated("the file ends inside an encapsulated pixel data fragment")
        items.append((here, ln))
        fp.seek(here + ln)
    if not items:
        raise Truncated("encapsulated Pixel Data without a Basic Offset Table item")
    bot_off, bot_len = items[0]
    fragments = tuple(items[1:])
    frames: tuple[tuple[int, int], ...] | None = None
    n = max(1, number_of_frames)
    if bot_len >= 4 * n and bot_len % 4 == 0:
        fp.seek(bot_off)
        offsets = struct.unpack(f"<{bot_len // 4}L", _read_exact(fp, bot_len))
        first_item = bot_off + bot_len  # offsets count from the first fragment's item tag
        starts = {off - 8 - first_item: i for i, (off, _ln) in enumerate(fragments)}
        idx = [starts.get(o) for o in offsets]
        if None not in idx and len(idx) == n:
            bounds = list(idx) + [len(fragments)]
            frames = tuple((bounds[i], bounds[i + 1] - bounds[i]) for i in range(n))  # type: ignore[operator]
    if frames is None:
        if n == 1:
            frames = ((0, len(fragments)),)
        elif len(fragments) == n:
            frames = tuple((i, 1) for i in range(n))
    return PixelLayout(vr, value_offset, None, end, fragments, frames)


def native_frame_length(rows: int, columns: int, samples: int, bits_allocated: int) -> int | None:
    """Bytes of one native frame (PS3.5 §8.1.1); None for bit-packed (1-bit) data."""
    bits = rows * columns * samples * bits_allocated
    return bits // 8 if bits % 8 == 0 and bits_allocated % 8 == 0 else None


def native_pixel_bytes(rows: int, columns: int, samples: int, bits_allocated: int, frames: int) -> int:
    """Bytes the native pixel data of ``frames`` frames needs (PS3.5 §8.1.1; bit-packed
    data is packed across frame boundaries, PS3.5 §8.1.1 Note)."""
    return (rows * columns * samples * bits_allocated * frames + 7) // 8


def bit_packed_frame(data: bytes | bytearray | memoryview, frame_number: int, bits_per_frame: int) -> bytes:
    """Frame ``frame_number`` (1-based) of native bit-packed pixel data (Bits Allocated 1),
    byte aligned: ``ceil(bits_per_frame / 8)`` bytes, pixel 0 in the least significant bit
    of the first byte, unused high bits of the last byte 0.

    PS3.5 §8.1.1 packs 1-bit pixels across frame boundaries: frame k starts at bit
    ``(k - 1) * Rows * Columns * SamplesPerPixel`` of the value, in the middle of a byte
    when that is not a multiple of 8 (e.g. 5 x 5 frames start at bits 0, 25, 50).
    """
    start = (frame_number - 1) * bits_per_frame
    first, shift = divmod(start, 8)
    end = (start + bits_per_frame + 7) // 8
    if frame_number < 1 or end > len(data):
        raise IndexError(frame_number)
    value = int.from_bytes(bytes(data[first:end]), "little") >> shift
    return (value & ((1 << bits_per_frame) - 1)).to_bytes((bits_per_frame + 7) // 8, "little")


class FrameCountMismatch(ValueError):
    """NumberOfFrames and the pixel data disagree (STOW failure 0xC000)."""


def check_frame_count(layout: PixelLayout, number_of_frames: int, native_bytes: int, video: bool) -> None:
    """Check at store time that the pixel data holds ``number_of_frames`` frames, so that
    no read has to trust a declared count (PS3.5 §8.1.1, A.4: each frame of an
    encapsulated non-video syntax is at least one fragment; video syntaxes hold all
    frames in one stream).

    Raises
    ------
    FrameCountMismatch
        A NumberOfFrames below 1 or beyond what the pixel data holds.
    """
    if number_of_frames < 1:
        raise FrameCountMismatch(f"NumberOfFrames is {number_of_frames}; it must be at least 1")
    if layout.fragments is None:
        if layout.value_length is not None and layout.value_length < native_bytes:
            raise FrameCountMismatch(
                f"{layout.keyword_tag} holds {layout.value_length} bytes; Rows x Columns x Samples x "
                f"BitsAllocated x NumberOfFrames needs {native_bytes}")
        return
    have = len(layout.fragments)
    if have == 0:
        raise FrameCountMismatch("encapsulated Pixel Data without any fragment")
    if not video and have < number_of_frames:
        raise FrameCountMismatch(
            f"NumberOfFrames is {number_of_frames} but the encapsulated Pixel Data has only {have} "
            "fragment(s); each frame needs at least one (PS3.5 A.4)")


def read_spans(fp: BinaryIO, spans: list[tuple[int, int]]) -> bytes:
    """The (file offset, length) pieces of ``fp`` concatenated, e.g. a frame's
    :func:`frame_spans`: native pixels, or the fragments of an encapsulated frame."""
    out = []
    for off, ln in spans:
        fp.seek(off)
        out.append(fp.read(ln))
    return b"".join(out)


def frame_spans(layout: PixelLayout, frame_number: int, frame_length: int | None) -> list[tuple[int, int]]:
    """(file offset, length) of the stored bytes of frame ``frame_number`` (1-based):
    one span of native pixels, or the fragments of an encapsulated frame.

    Raises
    ------
    IndexError
        No such frame (HTTP 404).
    LookupError
        Frame boundaries unknown (caller falls back to decoding with pydicom).
    """
    if layout.fragments is None:
        if frame_length is None:
            raise LookupError("bit-packed frames")
        start = layout.value_offset + (frame_number - 1) * frame_length
        if frame_number < 1 or start + frame_length > layout.value_offset + (layout.value_length or 0):
            raise IndexError(frame_number)
        return [(start, frame_length)]
    if layout.frames is None:
        raise LookupError("frame boundaries not known")
    if not 1 <= frame_number <= len(layout.frames):
        raise IndexError(frame_number)
    first, count = layout.frames[frame_number - 1]
    return list(layout.fragments[first : first + count])


#: the VRs :func:`scan_pixel_data` reads as an Explicit VR pixel data element header
_PIXEL_VRS = (b"OB", b"OW", b"UN", b"OV", b"OD", b"OF", b"OL")


def pixel_element_start(head: bytes, pixel: dict, implicit_vr: bool, little_endian: bool) -> int | None:
    """Where the pixel data element recorded at store time (``pixel``: a
    :meth:`PixelLayout.to_json` record: ``tag``, ``vr``, ``offset`` of its value,
    ``length``, None when encapsulated) starts, when ``head`` (a file's bytes up to
    that offset) ends with exactly that element's header, else None.

    The header is the tag, then in Explicit VR the VR, 2 reserved bytes and a 4-byte
    length (PS3.5 §7.1.2, Table 7.1-1), in Implicit VR a 4-byte length (§7.1.3), in the
    transfer syntax's byte order; an encapsulated value has the undefined length
    (PS3.5 A.4). As :func:`scan_pixel_data`, an Explicit VR file whose pixel data
    element is written implicitly is accepted.
    """
    offset = pixel.get("offset")
    if not isinstance(offset, int) or len(head) != offset or offset < 12:
        return None
    e = "<" if little_endian else ">"
    tag = int(pixel.get("tag") or "7FE00010", 16)
    tag_bytes = struct.pack(e + "HH", tag >> 16, tag & 0xFFFF)
    length = pixel.get("length")
    if struct.unpack_from(e + "L", head, offset - 4)[0] != (0xFFFFFFFF if length is None else length):
        return None
    if not implicit_vr and head[offset - 12:offset - 8] == tag_bytes and head[offset - 8:offset - 6] in _PIXEL_VRS:
        return offset - 12 if head[offset - 8:offset - 6].decode("latin-1") == pixel.get("vr") else None
    if head[offset - 8:offset - 4] == tag_bytes and (implicit_vr or head[offset - 4:offset - 2] not in _PIXEL_VRS):
        return offset - 8
    return None

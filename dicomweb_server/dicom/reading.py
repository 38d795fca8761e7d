"""Read a received PS3.10 file without trusting it: the data set up to its pixel
data (pixels stay on disk), where the pixel data lies, with bounded inflation of a
Deflated data set, no truncated element anywhere, and bounded sequence nesting.

pydicom parses; this module adds the bounds pydicom does not have: it inflates a
Deflated Explicit VR Little Endian data set whole into memory (a 1 MB part can hold
1 GiB), it keeps an element whose declared length runs past the end of the file
with whatever bytes were there, and it nests sequences as deep as the file does.

References
----------
PS3.10 §7.1 (file meta information), PS3.5 §7.1 (element lengths), §7.5 (sequences),
§A.5 (Deflated Explicit VR Little Endian: the data set after the file meta is one
raw deflate stream, RFC 1951), PS3.4 B.2.3 (0xC000 cannot understand).

Parsing costs per element, not per byte: an element can be 8 bytes (a tag and a zero
length), and deflate shrinks a run of them about 1000:1, so a 100 KB Deflated part or
C-FIND identifier once held a worker or a DIMSE association for minutes. Every parse
here reads through a :class:`ReadBudget` (:data:`MAX_ELEMENT_READS` reads of the file,
at every sequence depth) and is refused (0xC000) when it runs out.
"""

from __future__ import annotations

import contextvars
import io
import os
import tempfile
import zlib
from pathlib import Path
from typing import BinaryIO

import pydicom
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset, FileDataset, FileMetaDataset
from pydicom.errors import InvalidDicomError
from pydicom.filereader import (
    _at_pixel_data,
    _read_command_set_elements,
    _read_file_meta_info,
    read_dataset,
    read_preamble,
    read_sequence,
)
from pydicom.filewriter import write_file_meta_info

from .frames import PIXEL_TAGS, PixelLayout, scan_pixel_data

DEFLATED_LE = "1.2.840.10008.1.2.1.99"
EXPLICIT_VR_LE = "1.2.840.10008.1.2.1"
#: the inflated data set of a Deflated file may be at most this large (0xC000 beyond)
MAX_INFLATED_BYTES = 256 * 1024 * 1024
#: the inflated identifier of a C-FIND, C-GET or C-MOVE request (or data set of an
#: N-ACTION, N-CREATE, N-SET request) in Deflated Explicit VR Little Endian may be at most
#: this large (real ones are a few KB); pynetdicom inflates it whole, without a bound
MAX_IDENTIFIER_BYTES = 1024 * 1024
#: sequences may nest at most this deep (0xC000 beyond): DICOM JSON nests three JSON
#: levels per sequence and common JSON parsers (orjson) stop at 255 levels
MAX_SEQUENCE_DEPTH = 64
#: read() calls one data set's parse may make (an element's header, its value when not
#: empty, an item's header, at every depth; about a million elements): no real header
#: comes near it, and it bounds a deflate bomb's parse to seconds (module docstring)
MAX_ELEMENT_READS = 2_000_000
_UNDEFINED = 0xFFFFFFFF
_CHUNK = 1024 * 1024


class Unacceptable(ValueError):
    """The file cannot be understood or breaks a documented bound (STOW 0xC000)."""


class _OutOfReads(Exception):
    """A :class:`ReadBudget` ran out. Not a ValueError: pydicom takes a ValueError from a
    value converter as a wrong VR and tries the others (``convert_retry_VR_order``)."""


def _refused(e: _OutOfReads) -> Unacceptable:
    return Unacceptable(str(e))


class ReadBudget:
    """The read() calls left to one data set's parse (:data:`MAX_ELEMENT_READS`)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = self.left = MAX_ELEMENT_READS if limit is None else limit

    def wrap(self, fp: BinaryIO) -> BinaryIO:
        return _Counted(fp, self)  # type: ignore[return-value]

    def __enter__(self) -> ReadBudget:
        """Also count the parse of sequences pydicom reads later, from their bytes (a
        sequence of defined length is parsed when first accessed)."""
        self._token = _BUDGET.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _BUDGET.reset(self._token)


class _Counted:
    """``fp`` whose read() calls are charged to a :class:`ReadBudget`."""

    def __init__(self, fp: BinaryIO, budget: ReadBudget) -> None:
        self._fp, self._budget = fp, budget

    def read(self, size: int = -1) -> bytes:
        budget = self._budget
        budget.left -= 1
        if budget.left < 0:
            raise _OutOfReads(f"the data set needs more than {budget.limit} reads to parse (more elements than "
                              "any real data set: a deflate bomb?)")
        return self._fp.read(size)

    def __getattr__(self, name: str):
        return getattr(self._fp, name)


_BUDGET: contextvars.ContextVar[ReadBudget | None] = contextvars.ContextVar("dicom_read_budget", default=None)
_convert_sq = pydicom.values.converters["SQ"]


def _budgeted_convert_sq(byte_string: bytes, is_implicit_VR: bool, is_little_endian: bool,
                         encoding: list[str] | None = None, offset: int = 0):
    """pydicom's SQ converter (``pydicom.values.convert_SQ``), its reads charged to the
    budget of the parse under way, if any."""
    budget = _BUDGET.get()
    if budget is None:
        return _convert_sq(byte_string, is_implicit_VR, is_little_endian, encoding, offset)
    fp = budget.wrap(io.BytesIO(byte_string))
    return read_sequence(fp, is_implicit_VR, is_little_endian, len(byte_string),
                         encoding or [pydicom.charset.default_encoding], offset)


pydicom.values.converters["SQ"] = _budgeted_convert_sq


class TruncatedElement(Unacceptable):
    """An element whose value is shorter than its declared length: ``tag``, ``declared``
    (its length) and ``present`` (the bytes there were)."""

    def __init__(self, message: str, tag: int, declared: int, present: int) -> None:
        super().__init__(message)
        self.tag, self.declared, self.present = tag, declared, present


def read_instance(path: Path, data: bytes | None = None) -> tuple[Dataset, str, PixelLayout | None]:
    """The data set without pixel values, its transfer syntax, and the pixel data
    layout (None for no pixel data, or for a Deflated file whose offsets only exist
    in the inflated stream: the layout returned then describes that stream and is
    for checks only). ``data``: the bytes of the file at ``path``, when in memory.

    Raises
    ------
    Unacceptable
        No transfer syntax, an inflated data set over :data:`MAX_INFLATED_BYTES`, a
        truncated element, sequences deeper than :data:`MAX_SEQUENCE_DEPTH`.
    Truncated
        The file ends inside its pixel data.
    pydicom.errors.InvalidDicomError, other exceptions
        Not parseable (the caller maps them to 0xC000).
    """
    try:
        return _read_instance(path, data)
    except _OutOfReads as e:
        raise _refused(e) from None


def _read_instance(path: Path, data: bytes | None) -> tuple[Dataset, str, PixelLayout | None]:
    with (open(path, "rb") if data is None else io.BytesIO(data)) as fp, ReadBudget() as budget:
        preamble, meta = _read_meta(fp)
        ts = str(meta.get("TransferSyntaxUID", "") or "")
        if not ts:
            raise Unacceptable("no TransferSyntaxUID in the file meta information (PS3.10 §7.1)")
        if ts == DEFLATED_LE:
            with _inflated_copy(fp, meta, path.parent) as tmp:
                ds, layout = _read(budget.wrap(tmp), os.fstat(tmp.fileno()).st_size)
            return ds, ts, layout
        size = os.fstat(fp.fileno()).st_size if data is None else len(data)
        ds, layout = _read(budget.wrap(fp), size, (preamble, meta))
        return ds, ts, layout


def _read(fp: BinaryIO, size: int, head: tuple[bytes | None, FileMetaDataset] | None = None) -> tuple[Dataset, PixelLayout | None]:
    """The data set up to its pixel data, and the pixel data layout. With ``head``
    (the preamble and file meta already read, ``fp`` just after them) the data set is read from
    there: ``dcmread`` would read the preamble and file meta a second time (~15% of
    describing an instance, issue 11); the result is the same ``FileDataset``."""
    try:
        ds = pydicom.dcmread(fp, stop_before_pixels=True) if head is None else _read_after_meta(fp, *head)
    except RecursionError:
        raise Unacceptable(f"sequences nested deeper than {MAX_SEQUENCE_DEPTH} levels") from None
    pos = fp.tell()
    implicit, little = ds.original_encoding[0] is True, ds.original_encoding[1] is not False
    check_complete(ds)
    layout = None
    if pos < size:
        layout = scan_pixel_data(fp, pos, size, implicit_vr=implicit, little_endian=little,
                                 number_of_frames=_int(ds.get("NumberOfFrames"), 1))
        trailing_at = layout.end if layout is not None else pos
        if trailing_at < size:
            # elements after the pixel data (e.g. padding): read them too, pixels stay on disk
            fp.seek(trailing_at)
            trailing = read_dataset(fp, implicit, little)
            check_complete(trailing)
            for elem in trailing.elements():
                if elem.tag not in PIXEL_TAGS:
                    ds[elem.tag] = trailing[elem.tag]
    return ds, layout


def _read_after_meta(fp: BinaryIO, preamble: bytes | None, meta: FileMetaDataset) -> FileDataset:
    """What ``pydicom.filereader.read_partial`` does after the file meta (command set
    elements, the encoding from the transfer syntax, the data set up to the pixel
    data), for a transfer syntax other than Deflated."""
    command_set = _read_command_set_elements(fp)
    ts = pydicom.uid.UID(str(meta.get("TransferSyntaxUID", "")))
    implicit, little = False, True  # PS3.5 A.4: every other syntax is Explicit VR Little Endian
    if ts == pydicom.uid.ImplicitVRLittleEndian:
        implicit = True
    elif ts == pydicom.uid.ExplicitVRBigEndian:
        little = False
    elif ts in pydicom.uid.PrivateTransferSyntaxes:
        private = pydicom.uid.PrivateTransferSyntaxes[pydicom.uid.PrivateTransferSyntaxes.index(ts)]
        implicit, little = private.is_implicit_VR, private.is_little_endian
    dataset = read_dataset(fp, implicit, little, stop_when=_at_pixel_data)
    if command_set:
        dataset.update(command_set)
    ds = FileDataset(fp, dataset, preamble, meta, implicit, little)
    ds.set_original_encoding(implicit, little, dataset._character_set)
    return ds


def read_identifier(raw: bytes, implicit_vr: bool, little_endian: bool, deflated: bool) -> Dataset:
    """The identifier of a C-FIND, C-GET or C-MOVE request (PS3.7 §9.1.2.1, §9.1.3.1,
    §9.1.4.1), encoded in its presentation context's transfer syntax, parsed whole and
    checked (:func:`check_complete`): what pynetdicom's ``event.identifier`` decodes, with
    the inflation of a Deflated one (PS3.5 §A.5) bounded by :data:`MAX_IDENTIFIER_BYTES`
    and the parse by a :class:`ReadBudget`.

    Raises
    ------
    Unacceptable
        Inflates past the bound, a parse past the budget, a truncated element, sequences
        nested too deep.
    """
    if deflated:
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        raw = inflater.decompress(raw, MAX_IDENTIFIER_BYTES + 1)
        if len(raw) > MAX_IDENTIFIER_BYTES:
            raise Unacceptable(f"the Deflated data set inflates to more than {MAX_IDENTIFIER_BYTES} bytes")
        implicit_vr, little_endian = False, True
    try:
        with ReadBudget() as budget:
            ds = read_dataset(budget.wrap(io.BytesIO(raw)), implicit_vr, little_endian)
            check_complete(ds)
    except _OutOfReads as e:
        raise _refused(e) from None
    return ds


def check_complete(ds: Dataset) -> None:
    """Refuse a data set holding an element whose value is shorter than its declared
    length (the file ended inside it: pydicom keeps the bytes that were there), at any
    depth, and sequences nested deeper than :data:`MAX_SEQUENCE_DEPTH`. Iterative, so
    depth never costs Python stack.

    Raises
    ------
    Unacceptable
        :class:`TruncatedElement` for a short value.
    """
    stack: list[tuple[Dataset, int, str]] = [(ds, 0, "")]
    while stack:
        current, depth, where = stack.pop()
        for elem in list(current.elements()):
            if isinstance(elem, RawDataElement):
                if elem.length != _UNDEFINED and elem.value is not None and len(elem.value) < elem.length:
                    raise TruncatedElement(
                        f"element {where}({elem.tag.group:04X},{elem.tag.element:04X}) declares {elem.length} "
                        f"bytes but the file ends {len(elem.value)} bytes into it (truncated)",
                        int(elem.tag), elem.length, len(elem.value))
                if elem.VR not in ("SQ", None) and not (elem.VR == "UN" and elem.length == _UNDEFINED):
                    continue
                elem = current[elem.tag]  # converts: items are parsed now
            if elem.VR != "SQ":
                continue
            if depth + 1 > MAX_SEQUENCE_DEPTH:
                raise Unacceptable(f"sequences nested deeper than {MAX_SEQUENCE_DEPTH} levels")
            for i, item in enumerate(elem.value or ()):
                stack.append((item, depth + 1, f"{where}({elem.tag.group:04X},{elem.tag.element:04X})[{i}]/"))


class _inflated_copy:
    """A PS3.10 file (unnamed temporary file next to ``folder``'s other files) holding
    the file meta with Explicit VR Little Endian and the inflated data set, inflated in
    1 MiB pieces and refused past :data:`MAX_INFLATED_BYTES` (a deflate bomb never
    reaches memory or a full disk)."""

    def __init__(self, fp: BinaryIO, meta: Dataset, folder: Path) -> None:
        self.fp, self.meta, self.folder = fp, meta, folder
        self.tmp: BinaryIO | None = None

    def __enter__(self) -> BinaryIO:
        try:
            self.tmp = tempfile.TemporaryFile(dir=self.folder)  # O_TMPFILE: nothing is left behind
        except OSError:  # e.g. a read-only archive being checked
            self.tmp = tempfile.TemporaryFile()
        meta = Dataset(self.meta)
        meta.TransferSyntaxUID = EXPLICIT_VR_LE
        self.tmp.write(b"\0" * 128 + b"DICM")
        write_file_meta_info(self.tmp, meta, enforce_standard=False)  # type: ignore[arg-type]
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        written = 0
        while True:
            data = self.fp.read(_CHUNK)
            if not data:
                break
            while data:
                out = inflater.decompress(data, _CHUNK)
                written += len(out)
                if written > MAX_INFLATED_BYTES:
                    raise Unacceptable(
                        f"the Deflated data set inflates to more than {MAX_INFLATED_BYTES} bytes (deflate bomb)")
                self.tmp.write(out)
                data = inflater.unconsumed_tail
            if inflater.eof:
                break
        self.tmp.write(inflater.flush())  # at most what one bounded call left behind
        self.tmp.seek(0)
        return self.tmp

    def __exit__(self, *exc) -> None:
        if self.tmp is not None:
            self.tmp.close()


def _int(value: object, default: int) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


def _read_meta(fp: BinaryIO) -> tuple[bytes | None, FileMetaDataset]:
    """The preamble and file meta (PS3.10 §7.1) of the PS3.10 file ``fp``, leaving ``fp``
    at the first byte of its data set."""
    return read_preamble(fp, False), _read_file_meta_info(fp)


def file_meta_uids(path: Path, data: bytes | None = None) -> tuple[str | None, str | None]:
    """(Media Storage SOP Class UID, Media Storage SOP Instance UID) of a PS3.10 file
    whose data set could not be read, from its file meta (PS3.10 §7.1), each None when
    absent or not a valid UID: what a FailedSOPSequence item can name (PS3.18 §10.5.3)."""
    from .uids import validate_uid

    try:
        with (open(path, "rb") if data is None else io.BytesIO(data)) as fp:
            _, meta = _read_meta(fp)
    except Exception:  # noqa: BLE001 - not even the file meta: nothing to name
        return None, None
    out = []
    for keyword in ("MediaStorageSOPClassUID", "MediaStorageSOPInstanceUID"):
        try:
            out.append(validate_uid(str(meta.get(keyword, "") or "")))
        except ValueError:
            out.append(None)
    return out[0], out[1]


def same_data_set(a: Path, b: Path) -> bool:
    """Whether two PS3.10 files hold byte-identical data sets in the same transfer
    syntax, whatever their file meta information and but for a Data Set Trailing
    Padding element that one of them ends with and the other lacks.

    The file meta (PS3.10 §7.1) describes how a file was made, not the SOP Instance:
    Source Application Entity Title, Implementation Class UID and Version Name,
    Private Information differ between a copy received by STOW-RS (the sender's
    file) and one received by C-STORE (file meta built from the association) of the
    very same instance. Data Set Trailing Padding (FFFC,FFFC) has no meaning
    (PS3.10 §7) and senders drop it (DCMTK's storescu does: pydicom's
    ``CT_small.dcm`` ends with 138 bytes of it). Anything else that differs, even an
    equivalent encoding, is other content. Files that do not parse compare as
    different.
    """
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            ts_a, ts_b = (str(_read_meta(f)[1].get("TransferSyntaxUID", "") or "") for f in (fa, fb))
            if not ts_a or ts_a != ts_b:
                return False
            while True:
                pa, pb = fa.read(_CHUNK), fb.read(_CHUNK)
                if pa == pb:
                    if not pa:
                        return True
                    continue
                n = min(len(pa), len(pb))
                if len(pa) == len(pb) or pa[:n] != pb[:n]:
                    return False  # different bytes (not one data set ending where the other goes on)
                # a short read of a regular file is its end: the shorter data set ended here
                longer, rest = (fa, pa[n:]) if len(pa) > n else (fb, pb[n:])
                return _only_trailing_padding(longer, rest, implicit=ts_a == "1.2.840.10008.1.2")
    except (OSError, ValueError, InvalidDicomError):
        return False


def _only_trailing_padding(fp: BinaryIO, head: bytes, implicit: bool) -> bool:
    """Whether ``head`` + the rest of ``fp`` is exactly one Data Set Trailing Padding
    element (FFFC,FFFC), in the data set's VR encoding (PS3.5 §7.1.2-3)."""
    head += fp.read(12)
    if implicit:
        ok = head[:4] == b"\xfc\xff\xfc\xff" and len(head) >= 8
        length, header = (int.from_bytes(head[4:8], "little"), 8) if ok else (0, 0)
    else:
        ok = head[:6] == b"\xfc\xff\xfc\xffOB" and len(head) >= 12
        length, header = (int.from_bytes(head[8:12], "little"), 12) if ok else (0, 0)
    if not ok or length == _UNDEFINED:
        return False
    here = fp.tell() - (len(head) - header)  # the first byte of the padding's value
    return os.fstat(fp.fileno()).st_size - here == length

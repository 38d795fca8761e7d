"""Reading what the archive stores: whole files, frames, bulk data, transcoded
instances. Blocking functions; the web layer runs them in worker threads.

Frames are read with the layout computed at store time (a seek and a read);
only files whose frame boundaries are unknown (deflated, bit-packed, ambiguous
fragments) are parsed with pydicom at read time.

Reads racing DELETE: the index look-up and the file read are not one transaction,
so each function opens the file once, up front, and works on that open file (a
file removed afterwards stays readable through it). A file already gone, or
replaced by a new store of the same SOP Instance UID (another size than the row
looked up), raises :class:`Gone`: 404 for a single resource; multi-instance
streams skip the instance (it is no longer part of the study). When the index still
holds the row, the file is not deleted but missing (damaged storage): the web layer
and the DIMSE listener tell the two apart (missing_data.py).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import itertools
import logging
import mmap
import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pydicom
from pydicom.dataset import Dataset
from pydicom.encaps import generate_frames

from .dicom import lean_header, pixels
from .dicom.bulkdata import resolve_bulkdata
from .dicom.frames import (
    PixelLayout,
    Truncated,
    bit_packed_frame,
    frame_spans,
    pixel_element_start,
    read_spans,
    scan_pixel_data,
)
from .dicom.instance import pixel_record
from .dicom.status import InstanceError
from .dicom.media_types import (
    EXPLICIT_VR_LE,
    NATIVE_LE,
    OCTET_STREAM,
    UNENCAPSULATED,
    Choice,
    NotAcceptable,
    is_video,
    pixel_media_type,
)
from .policy import transcode
from .render_cache import RenderCache, file_version
from .store.base import InstanceLocation
from .store.objects import StoredObject

_log = logging.getLogger(__name__)


class NotFound(LookupError):
    """A frame, bulk data element or pixel data that does not exist (HTTP 404)."""


class Gone(NotFound):
    """The instance's file was removed (or replaced) after its index look-up: a
    DELETE raced this read (HTTP 404)."""


def open_stored(path: Path | StoredObject, loc: InstanceLocation) -> BinaryIO:
    """The stored file of ``loc``, opened for reading. ``path`` is what
    ``BlobStorage.source`` gives: a local file, or an object (store/s3.py), whose
    reader makes each read a ranged GET of the object version its first read found.

    Raises
    ------
    Gone
        The file is missing, unreadable, or not the file the index row describes
        (the caller tells a DELETE from damaged storage: missing_data.confirm).
    """
    if not isinstance(path, Path):
        # an object: no request yet; its first ranged GET checks the size against the row's
        # (FileNotFoundError from that read: see _started, instance_payload)
        return path.open("rb", size=loc.size)
    try:
        f = path.open("rb")
    except OSError as e:
        raise _open_error(e, loc) from None
    if os.fstat(f.fileno()).st_size != loc.size:
        f.close()
        raise Gone(f"instance {loc.sop_uid} was replaced while being read")
    return f


def _open_error(e: OSError, loc: InstanceLocation) -> OSError | Gone:
    """What the failed open of ``loc``'s file raises: out of descriptors as itself, else Gone."""
    if isinstance(e, FileNotFoundError):
        return Gone(f"instance {loc.sop_uid} was deleted")
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return e
    return Gone(f"instance {loc.sop_uid}: its stored file cannot be read: {e.strerror}")


def can_decode(ts: str) -> bool:
    """Whether pixel data in ``ts`` can be decoded to native pixels here."""
    return ts in UNENCAPSULATED or pixels.is_supported_transfer_syntax(ts)


#: files larger than LARGE_FILE are streamed from disk in CHUNK pieces as the client
#: reads, so that a slow reader holds about one piece in the server (each send waits
#: for the transport's write buffer to drain). Smaller files (typical CT/MR) are read
#: whole in one thread hop: streaming a 512 KB file costs several hops.
CHUNK = 256 * 1024
LARGE_FILE = 4 * CHUNK
#: native Pixel Data larger than this is streamed (smaller values can be ranged: RFC 9110 §14)
LARGE_VALUE = 16 * 1024 * 1024


def file_chunks(path: Path, loc: InstanceLocation, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
    """The stored file of ``loc`` (or ``length`` bytes from ``offset``) in CHUNK
    pieces. The file is opened and its first piece read now (so :class:`Gone` is
    raised here, before an answer starts); the rest as the iterator is consumed."""
    f = open_stored(path, loc)
    return _started(f, _chunks(f, offset, length))


def _chunks(f: BinaryIO, offset: int, length: int | None) -> Iterator[bytes]:
    with f:
        yield from _read_span(f, offset, length)


def _read_span(f: BinaryIO, offset: int, length: int | None) -> Iterator[bytes]:
    ranged = getattr(f, "iter_range", None)
    if ranged is not None:  # an object (store/s3.py): one ranged GET, handed on in CHUNK pieces
        yield from ranged(offset, length, CHUNK)
        return
    f.seek(offset)
    left = length if length is not None else -1
    while left != 0:
        chunk = f.read(CHUNK if left < 0 else min(CHUNK, left))
        if not chunk:
            break
        left -= len(chunk) if left > 0 else 0
        yield chunk


#: a study or series answer opens at most this many files before it starts; its length
#: is then known and sent as Content-Length (no chunked framing: uvicorn copies every byte
#: of a chunked body once more to frame it, a third of a study retrieve's CPU, issue 11)
MAX_OPEN_FILES = 256
#: bytes of mapped files read in (:func:`populate`) per worker-thread hop when sending
#: opened files: whole files while they fit, else READ_BATCH bytes of one. 4 MiB (was 1 MiB
#: of ``os.pread``): a 25-file CT study is 7 hops instead of 25, and the app's CPU per such
#: answer (benchmarks/study_send_overhead.py) 6.5-8.5 -> 3.2-4.3 ms; an answer holds at most
#: two batches of page-cache pages mapped (reclaimable, not the heap: see map_files).
#: With pread, 4 MiB batches cost more than 1 MiB ones (8.5-9.8 ms): fresh heap per read.
READ_BATCH = 4 * 1024 * 1024
#: the largest piece (one bytes object, one ASGI send) of an opened file's content
SEND_PIECE = 1024 * 1024


#: share of the process's RLIMIT_NOFILE soft limit that opened-file answers may hold
#: together (the rest: connections, the index's SQLite files, spool files, sockets)
OPEN_FILES_SHARE = 4


class DescriptorBudget:
    """How many descriptors the study/series answers of this process hold at once.

    An opened-file answer keeps up to MAX_OPEN_FILES descriptors until its client
    has read it, however slowly: without a bound, a few dozen slow (or stalled)
    whole-study readers exhaust RLIMIT_NOFILE, and every other request of the
    process (accept, SQLite, spool files) then fails with EMFILE. An answer takes
    its descriptors here before opening them; one that does not fit is streamed
    file by file instead (one descriptor at a time). Thread-safe: descriptors are
    given back from the threads that close them."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self.in_use = 0

    @property
    def limit(self) -> int:
        if self._limit is None:  # read late: serve raises the soft limit at start-up
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            self._limit = (1 << 20 if soft == resource.RLIM_INFINITY else soft) // OPEN_FILES_SHARE
        return self._limit

    def take(self, n: int) -> bool:
        with self._lock:
            if self.in_use + n > self.limit:
                return False
            self.in_use += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.in_use -= n


#: the budget of this process (worker processes each have their own)
DESCRIPTORS = DescriptorBudget()


class OutOfDescriptors(OSError):
    """The process has no descriptor left (EMFILE/ENFILE) to open a stored file:
    a temporary condition (503 with Retry-After), not a server fault."""


#: Linux's MADV_POPULATE_READ (5.14+; Python 3.11's mmap module does not name it)
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def map_files(items: list[tuple[str | Path, InstanceLocation]]) -> list[tuple[InstanceLocation, mmap.mmap | None]]:
    """The stored files of ``items`` (in order), each mapped read-only in memory
    (``mmap``, MAP_SHARED; None for an empty file); a file already gone or replaced
    since the look-up (see module docstring) is left out. A map stays readable
    whatever happens to the file's name afterwards: an answer sends what the study
    held when it started. Nothing is read yet (:func:`populate` reads).

    Why maps and not ``os.pread`` into new bytes: the views of a map go to the socket
    straight from the page cache (uvloop hands any buffer to ``writev`` without a copy
    and holds it until written), one copy of every byte fewer; and a slow reader holds
    page-cache pages, reclaimable, rather than the process's heap.

    Each map holds a duplicate of its descriptor (CPython's mmap) until it is freed:
    the caller counts one descriptor per map (:class:`DescriptorBudget`) until then.

    SIGBUS: touching a mapped page past the end of a file cut short underneath
    raises SIGBUS in *user space*. The archive never writes a stored file in place (a
    store links a new file; DELETE and ``check --repair`` unlink or rename), each size
    is checked here against the open file, and only the kernel reads these pages
    (MADV_POPULATE_READ, the socket's ``writev``): a file truncated by hand meanwhile
    makes those fail with EFAULT, which ends that answer's connection, never the
    process (tests/server/test_mapped_files.py).

    Raises
    ------
    OutOfDescriptors
        EMFILE/ENFILE (nothing left open).
    """
    out: list[tuple[InstanceLocation, mmap.mmap | None]] = []
    try:
        for path, loc in items:
            fd = _open_stored_fd(path, loc)
            if fd is None:
                continue
            try:
                out.append((loc, mmap.mmap(fd, loc.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                            if loc.size else None))
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):  # no descriptor (dup) or map left
                    raise OutOfDescriptors(e.errno, f"cannot map stored files now: {e.strerror}") from None
                raise
            finally:
                os.close(fd)
    except BaseException:
        for _, m in out:
            if m is not None:
                m.close()
        raise
    return out


def open_files(items: list[tuple[str | Path, InstanceLocation]]) -> list[tuple[InstanceLocation, int]]:
    """The stored files of ``items`` (in order), each opened read-only: ``(loc,
    descriptor)``, for the kernel to send (``sendfile``: api/sendfile.py). A file
    already gone or replaced since the look-up is left out, as in :func:`map_files`;
    an open descriptor reads what the file held whatever happens to its name later.
    The caller closes the descriptors (one each of :class:`DescriptorBudget`).

    Raises
    ------
    OutOfDescriptors
        EMFILE/ENFILE (nothing left open).
    """
    out: list[tuple[InstanceLocation, int]] = []
    try:
        for path, loc in items:
            fd = _open_stored_fd(path, loc)
            if fd is not None:
                out.append((loc, fd))
    except BaseException:
        for _, fd in out:
            os.close(fd)
        raise
    return out


def _open_stored_fd(path: str | Path, loc: InstanceLocation) -> int | None:
    """``path`` opened read-only; None when it is gone, unreadable or not ``loc.size`` long."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise OutOfDescriptors(e.errno, f"cannot open stored files now: {e.strerror}") from None
        return None  # unreadable (EACCES, EIO...): left out as a missing file (missing_data.py)
    try:
        if os.fstat(fd).st_size == loc.size:
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def populate(spans: list[tuple[mmap.mmap, int, int]]) -> None:
    """Read ``(map, start, end)`` ranges into the page cache and map them
    (MADV_POPULATE_READ), in a worker thread, so that the event loop's socket write
    then copies from memory and never waits for the disk (nor takes a page fault per
    4 KiB). Kernels without MADV_POPULATE_READ (EINVAL) get MADV_WILLNEED (read-ahead).

    Raises
    ------
    OSError
        EFAULT: the file is shorter than its map (stored files never change).
    """
    for m, start, end in spans:
        if end <= start:
            continue
        at = start - start % mmap.PAGESIZE  # madvise takes a page-aligned start
        try:
            m.madvise(MADV_POPULATE_READ, at, end - at)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            m.madvise(mmap.MADV_WILLNEED, at, end - at)


def large_native_pixel_data(loc: InstanceLocation) -> tuple[int, int] | None:
    """(offset, length) of Pixel Data to stream, when it is native little endian
    and larger than LARGE_VALUE; else None."""
    pix = loc.pixel or {}
    if loc.transfer_syntax_uid in NATIVE_LE and pix.get("length") and pix["length"] > LARGE_VALUE:
        return pix["offset"], pix["length"]
    return None


#: the bytes before the pixel data are read in one piece up to this size (a larger header: pydicom reads the file)
HEADER_READ_MAX = 4 * 1024**2


def _header(f: BinaryIO, loc: InstanceLocation) -> tuple[Dataset, InstanceLocation]:
    """The dataset without pixel data (for decoding and rendering), and ``loc`` or, when
    the file's pixel data is not where ``loc`` says, ``loc`` with the file's own.

    With the pixel data's file offset recorded at store time (``loc.pixel``), the bytes
    before it are read with one read (an object store, store/s3.py, answers one ranged
    GET) and, when the lean walker reads them exactly, handed to pydicom as raw elements
    without its file parse (dicom/lean_header.py: a rendered CT's header 455 -> ~60 us);
    else pydicom parses them from memory (pydicom's many small reads of a buffered file
    were ~25% of its parse). Either way the bytes read must end with the recorded pixel
    data element's header and the parse must stop exactly at it
    (:func:`.frames.pixel_element_start`): a wrong recorded offset or a file rewritten
    with the same size (whose header would be cut or shifted: a missing Window Center
    or Rescale Slope renders a wrong picture) is read from the file with pydicom, and
    its pixel data located again (:func:`_relocated`)."""
    f.seek(0)
    pixel = loc.pixel or {}
    offset = pixel.get("offset")
    ts = loc.transfer_syntax_uid
    if not isinstance(offset, int) or not 0 < offset <= HEADER_READ_MAX \
            or ts == pydicom.uid.DeflatedExplicitVRLittleEndian:
        return pydicom.dcmread(f, stop_before_pixels=True), loc
    head = f.read(offset)
    start = None
    try:
        uid = pydicom.uid.UID(ts)
        start = pixel_element_start(head, pixel, uid.is_implicit_VR, uid.is_little_endian)
    except ValueError:  # a transfer syntax pydicom does not know: read the file
        pass
    hdr = _head_dataset(head, start) if start is not None else None
    if hdr is not None:
        return hdr, loc
    _log.debug("instance %s: the %d bytes before its recorded pixel data offset are not its header up to the "
               "pixel data element (a wrong offset or a rewritten file): reading the file", loc.sop_uid, offset)
    f.seek(0)
    hdr = pydicom.dcmread(f, stop_before_pixels=True)
    return hdr, _relocated(f, hdr, loc)


def _head_dataset(head: bytes, start: int) -> Dataset | None:
    """The data set of ``head`` (a file's bytes up to its pixel data value) when its
    parse stops exactly at ``start``, the pixel data element; else None."""
    try:
        return lean_header.header_dataset(head, start)
    except lean_header.Decline:
        pass
    bio = io.BytesIO(head)
    try:
        hdr = pydicom.dcmread(bio, stop_before_pixels=True)
    except Exception:  # noqa: BLE001 - not a header up to the pixel data: the file read gives pydicom's answer
        return None
    return hdr if bio.tell() == start else None


def _relocated(f: BinaryIO, hdr: Dataset, loc: InstanceLocation) -> InstanceLocation:
    """``loc`` with the transfer syntax and pixel data layout of the file ``f`` as it is,
    ``f`` positioned where ``dcmread(stop_before_pixels=True)`` of ``hdr`` stopped (as at
    store time: dicom/reading.py, dicom/instance.py).

    Raises
    ------
    Gone
        The file's pixel data cannot be located as at store time: it is not the file
        the index row describes.
    """
    pos = f.tell()
    ts = str(hdr.file_meta.get("TransferSyntaxUID", "") or "")
    implicit, little = hdr.original_encoding[0] is True, hdr.original_encoding[1] is not False
    try:
        if ts == pydicom.uid.DeflatedExplicitVRLittleEndian:
            raise Truncated("deflated: the offsets of its inflated data set are not file offsets")
        layout = scan_pixel_data(f, pos, loc.size, implicit_vr=implicit, little_endian=little,
                                 number_of_frames=int(hdr.get("NumberOfFrames") or 1))
        pixel = None if layout is None else pixel_record(hdr, ts, layout, loc.sop_class_uid, loc.sop_uid)
    except (Truncated, InstanceError, ValueError, TypeError) as e:
        raise Gone(f"instance {loc.sop_uid}: its stored file is not the one its index row describes ({e})") from None
    return dataclasses.replace(loc, transfer_syntax_uid=ts, pixel=pixel)


def instance_payload(path: Path, loc: InstanceLocation, choice: Choice) -> bytes:
    """The PS3.10 file as stored, or converted to Explicit VR Little Endian.

    Raises
    ------
    pixels.UnsupportedTransferSyntax
        The stored pixel data cannot be decoded (HTTP 406).
    """
    try:
        with open_stored(path, loc) as f:
            if not choice.transcode:
                return f.read()
            ds = pydicom.dcmread(f)
    except FileNotFoundError:  # an object deleted or replaced since the look-up
        raise Gone(f"instance {loc.sop_uid} was deleted") from None
    if choice.transfer_syntax != EXPLICIT_VR_LE:  # Implicit VR LE or a compressed syntax (policy/transcode.py)
        ds = transcode.transcode(ds, choice.transfer_syntax)
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        return buf.getvalue()
    if "PixelData" in ds or loc.transfer_syntax_uid not in NATIVE_LE:
        ds = pixels.transcode_to_explicit_le(ds)
    ds.file_meta.TransferSyntaxUID = EXPLICIT_VR_LE
    buf = io.BytesIO()
    ds.save_as(buf, implicit_vr=False, little_endian=True, enforce_file_format=True)
    return buf.getvalue()


def _frames_addressable(loc: InstanceLocation) -> bool:
    """Whether each frame can be read with a seek (the layout computed at store time)."""
    pix = loc.pixel or {}
    if "offset" not in pix:
        return False
    layout = PixelLayout.from_json(pix)
    return layout.frames is not None if layout.fragments is not None else pix.get("frame_length") is not None


#: NumberOfFrames is an IS (PS3.5 §6.2): at most 2^31 - 1; a requested frame number of more
#: digits is kept as this, and named as such (not as the number the client did not send)
NO_FRAME = 2**31


def frame_name(k: int) -> str:
    """Frame number ``k`` as an error message names it (PS3.18 §10.4.1.1.2 frame list)."""
    return str(k) if k < NO_FRAME else f"numbered above {NO_FRAME - 1}"


def _check_frames(loc: InstanceLocation, numbers: list[int]) -> int:
    if loc.pixel is None:
        raise NotFound(f"instance {loc.sop_uid} has no pixel data")
    n = int(loc.pixel.get("number_of_frames") or 1)
    bad = [k for k in numbers if k > n]
    if bad:
        raise NotFound(f"instance {loc.sop_uid} has {n} frame(s); no frame {frame_name(bad[0])}")
    return n


_RLE = "1.2.840.10008.1.2.5"


def _unpad(frame: bytes, ts: str) -> bytes:
    """Drop the 0x00 that encapsulation adds after an odd-length codestream (PS3.5
    §A.4), so a JPEG/JPEG-LS/JPEG 2000 frame is its codestream byte-for-byte (the
    codestream ends with the EOI/EOC marker FFD9)."""
    if ts != _RLE and ts not in UNENCAPSULATED and frame.endswith(b"\xff\xd9\x00"):
        return frame[:-1]
    return frame


def pixel_tag(loc: InstanceLocation) -> str:
    """Which pixel data element the instance has: ``7FE00010`` (Pixel Data), or
    ``7FE00008``/``7FE00009`` (Float / Double Float Pixel Data), as recorded at store time."""
    return str((loc.pixel or {}).get("tag", "7FE00010"))


def _spans(loc: InstanceLocation, numbers: list[int]) -> list[list[tuple[int, int]]] | None:
    """(file offset, length) pieces of each frame asked, from the layout computed at
    store time; None when the frame boundaries are known only by parsing the file.

    Raises
    ------
    NotFound
        A frame number beyond the recorded layout.
    """
    if not _frames_addressable(loc):
        return None
    pix = loc.pixel or {}
    layout = PixelLayout.from_json(pix)
    try:
        return [frame_spans(layout, k, pix.get("frame_length")) for k in numbers]
    except IndexError as e:
        raise NotFound(f"no frame {e}") from None


def _stored_frames(f: BinaryIO, loc: InstanceLocation, numbers: list[int]) -> Iterator[bytes]:
    """Frames (1-based numbers, in the order asked) exactly as stored, read through
    the open file ``f`` one whole frame at a time: native bytes in the stored byte
    order, or each frame's compressed codestream. The frame numbers are checked
    when the first frame is asked for.

    Raises
    ------
    NotFound
        No pixel data, or a frame number beyond NumberOfFrames.
    """
    n = _check_frames(loc, numbers)
    ts = loc.transfer_syntax_uid
    spans = _spans(loc, numbers)
    if spans is not None:
        for frame in spans:
            yield _unpad(read_spans(f, frame), ts)
        return
    f.seek(0)
    ds = pydicom.dcmread(f)  # deflated, bit-packed or ambiguous fragments: sizes checked at STOW
    data = ds[int(pixel_tag(loc), 16)].value
    if ts in UNENCAPSULATED and ds.get("BitsAllocated") == 1:
        # bit-packed across frame boundaries (PS3.5 §8.1.1): each frame re-packed byte aligned
        bits = int(ds.Rows) * int(ds.Columns) * int(ds.get("SamplesPerPixel") or 1)
        for k in numbers:
            yield bit_packed_frame(data, k, bits)
        return
    if ts in UNENCAPSULATED:
        flen = (loc.pixel or {}).get("frame_length") or len(data) // n
        for k in numbers:
            yield bytes(data[(k - 1) * flen : k * flen])
        return
    frames = list(generate_frames(data, number_of_frames=n))
    for k in numbers:
        yield _unpad(frames[k - 1], ts)


def _started(f: BinaryIO, items: Iterator) -> Iterator:
    """``items`` with its first item produced now, so that its errors (404/406) are
    raised before an answer starts; ``f`` is closed when that fails."""
    try:
        first = next(items)
    except StopIteration:
        f.close()
        return iter(())
    except FileNotFoundError:  # an object deleted or replaced since the look-up (store/s3.py)
        f.close()
        raise Gone("the instance was deleted or replaced") from None
    except BaseException:
        f.close()
        raise
    return itertools.chain([first], items)


def frames_payload(path: Path, loc: InstanceLocation, numbers: list[int], choice: Choice,
                   cache: RenderCache | None = None) -> Iterator[bytes | None]:
    """Frames in the negotiated representation (PS3.18 §10.4.1.1.2): as stored,
    or decoded to native little-endian bytes for application/octet-stream; as a
    stream of ``None`` (a frame starts) and byte pieces
    (:func:`api.responses.multipart_stream`).

    The file is opened and every frame number checked now, so that a missing
    frame, a deleted file or undecodable pixel data raise here (404/406) before
    an answer starts. Frames stored with a known layout and sent as stored are
    read from disk in CHUNK pieces as the client reads; decoded frames (and
    files whose frame boundaries need a parse) are produced one frame at a time.

    Frames transcoded to a compressed syntax (a ``choice`` of another media type
    than the stored one, policy/transcode.py) are kept in ``cache`` (bounded LRU,
    keyed by instance, stored file version, frame number and syntax), so a hot
    study's frames are encoded once per worker process.
    """
    f = open_stored(path, loc)
    if choice.transcode and choice.media_type != OCTET_STREAM:
        return _started(f, _encoded_frames(f, path, loc, numbers, choice, cache))
    return _started(f, _frames(f, loc, numbers, choice))


def _encoded_frames(f: BinaryIO, path, loc: InstanceLocation, numbers: list[int], choice: Choice,
                    cache: RenderCache | None) -> Iterator[bytes | None]:
    with f:
        _check_frames(loc, numbers)
        ts, target = loc.transfer_syntax_uid, choice.transfer_syntax
        version = file_version(path) if cache is not None else None
        hdr: Dataset | None = None
        vr = (loc.pixel or {}).get("vr")
        for k in numbers:
            key = ("transcoded-frame", loc.sop_uid, version, k, target)
            value = cache.get(key) if cache is not None else None
            if value is None:
                if hdr is None:
                    hdr, loc = _header(f, loc)
                    ts = loc.transfer_syntax_uid
                    vr = (loc.pixel or {}).get("vr")
                raw = next(_stored_frames(f, loc, [k]))
                # encoded before its part starts: a frame the encoder refuses is a 406, not a cut answer
                value = transcode.transcode_frame(hdr, raw, ts, target, pixel_vr=vr)
                if cache is not None:
                    cache.put(key, value)
            yield None
            yield value


def _frames(f: BinaryIO, loc: InstanceLocation, numbers: list[int], choice: Choice) -> Iterator[bytes | None]:
    with f:
        _check_frames(loc, numbers)  # every number, before the first frame is sent
        ts = loc.transfer_syntax_uid
        decode = choice.media_type == OCTET_STREAM and choice.transfer_syntax == EXPLICIT_VR_LE \
            and ts not in NATIVE_LE
        spans = None if decode else _spans(loc, numbers)
        if spans is not None:
            for frame in spans:
                pieces = (piece for off, ln in _unpadded(f, frame, ts) for piece in _read_span(f, off, ln))
                first = next(pieces, b"")  # read before its part starts (a gone object: 404, not a cut answer)
                yield None
                yield first
                yield from pieces
            return
        hdr = None
        if decode:
            hdr, loc = _header(f, loc)
            ts = loc.transfer_syntax_uid
        vr = (loc.pixel or {}).get("vr")
        for raw in _stored_frames(f, loc, numbers):
            # decoded before its part starts: an undecodable first frame is a 406, not a cut answer
            value = pixels.frame_to_native_bytes(hdr, raw, ts, pixel_vr=vr)[0] if decode else raw
            yield None
            yield value


def _unpadded(f: BinaryIO, spans: list[tuple[int, int]], ts: str) -> list[tuple[int, int]]:
    """The spans of a frame without the 0x00 that encapsulation adds after an
    odd-length codestream (see :func:`_unpad`)."""
    if ts == _RLE or ts in UNENCAPSULATED or not spans or spans[-1][1] < 3:
        return spans
    off, ln = spans[-1]
    f.seek(off + ln - 3)
    return spans[:-1] + [(off, ln - 1)] if f.read(3) == b"\xff\xd9\x00" else spans


def frame_part_type(choice: Choice) -> str:
    """Content-Type of each frame part, naming the real transfer syntax."""
    return f"{choice.media_type}; transfer-syntax={choice.transfer_syntax}"


def bulkdata(path: Path, loc: InstanceLocation, tagpath: str) -> Iterator[tuple[str, bytes]]:
    """The value behind a BulkDataURI as (content type, bytes) parts, one at a time.

    Pixel data (Pixel Data, Float or Double Float Pixel Data) of a native instance
    is one ``application/octet-stream`` part; encapsulated Pixel Data is one part per
    frame in its compressed media type (PS3.18 §8.7.3.3.2 / §10.4.1.1.5), or one part
    holding the whole stream for video syntaxes. Other elements are read from the
    file (a read-time parse, only for bulk data other than pixels). Errors are raised
    before the first part.

    Raises
    ------
    ValueError
        Malformed tag path (HTTP 400).
    NotFound
        No such element, or the file is gone (HTTP 404).
    NotAcceptable
        Compressed pixel data in a syntax without a media type (HTTP 406).
    """
    f = open_stored(path, loc)
    return _started(f, _bulkdata(f, loc, tagpath))


def _bulkdata(fp: BinaryIO, loc: InstanceLocation, tagpath: str) -> Iterator[tuple[str, bytes]]:
    with fp:
        if tagpath.upper() == pixel_tag(loc) and loc.pixel is not None:
            ts = loc.transfer_syntax_uid
            n = int(loc.pixel.get("number_of_frames") or 1)
            if ts not in UNENCAPSULATED:
                media = pixel_media_type(ts)
                if media is None:
                    raise NotAcceptable(f"pixel data stored as {ts}, a compressed syntax without a PS3.18 media type")
                label = f"{media}; transfer-syntax={ts}"
                if is_video(ts):  # all frames are one stream: every fragment in order (PS3.18 §8.7.3.3.2)
                    spans = loc.pixel.get("fragments")
                    yield label, read_spans(fp, spans) if spans else next(_stored_frames(fp, loc, [1]))
                    return
                for frame in _stored_frames(fp, loc, list(range(1, n + 1))):
                    yield label, frame
                return
            pix = loc.pixel
            if ts in NATIVE_LE and "offset" in pix and pix.get("length") is not None:
                fp.seek(pix["offset"])
                yield f"{OCTET_STREAM}; transfer-syntax={ts}", fp.read(pix["length"])
                return
        fp.seek(0)
        ds = pydicom.dcmread(fp)
        try:
            value = resolve_bulkdata(ds, tagpath)
        except KeyError as e:
            raise NotFound(f"no bulk data at {tagpath}: {e}") from None
        yield OCTET_STREAM, value


def document(path: Path, loc: InstanceLocation) -> bytes:
    """The document an Encapsulated PDF/CDA/STL/OBJ/MTL instance holds, byte for byte
    (dicom.documents.document_bytes: cut to Encapsulated Document Length).

    Raises
    ------
    NotFound
        No Encapsulated Document, or the file is gone (HTTP 404).
    """
    from .dicom.documents import document_bytes

    try:
        with open_stored(path, loc) as f:
            ds = pydicom.dcmread(f, specific_tags=["SOPClassUID", "EncapsulatedDocument",
                                                   "EncapsulatedDocumentLength"])
    except FileNotFoundError:
        raise Gone(f"instance {loc.sop_uid} was deleted") from None
    try:
        return document_bytes(ds)
    except KeyError as e:
        raise NotFound(f"instance {loc.sop_uid}: {e.args[0]}") from None


def rendered(path: Path, loc: InstanceLocation, frame_numbers: list[int] | None, params, media_type: str,
             thumbnail: bool = False, pictures: int = 1) -> bytes:
    """Render frames of an instance (PS3.18 §10.4.1.1.3): the frames asked, or
    those PS3.18 gives for an instance-level request of this media type.
    ``pictures``: how many such pictures the answer holds (for the size bound).

    Raises
    ------
    NotFound
        No pixel data or no such frame.
    pixels.NotAnImage, pixels.UnsupportedTransferSyntax, render.UnsupportedMediaType
        Cannot be rendered (HTTP 406).
    render.InvalidRenderParameter
        e.g. a viewport region outside the image (HTTP 400).
    render.RenderTooLarge
        The answer would exceed the rendering bounds (HTTP 413).
    """
    from .dicom import render

    with open_stored(path, loc) as f:  # open once: a DELETE meanwhile is NotFound, not a 500
        hdr, loc = _header(f, loc)
        if loc.pixel is None:
            # Float / Double Float Pixel Data (PS3.3 C.7.6.24) of a record with no pixel layout
            # (stored before such records existed): the whole file is read, once the header
            # shows a 32/64-bit image
            if pixels.image_info(hdr).bits_allocated not in (32, 64):
                raise pixels.NotAnImage(f"instance {loc.sop_uid} (SOP Class {loc.sop_class_uid}) has no pixel data")
            f.seek(0)
            hdr = pydicom.dcmread(f)
        n = int((loc.pixel or {}).get("number_of_frames") or pixels.image_info(hdr).number_of_frames)
        if frame_numbers is None:
            frame_numbers = render.frames_for_thumbnail(n) if thumbnail else render.frames_for_rendered(n, media_type)
        render.check_size(hdr, len(frame_numbers), params, media_type, pictures)  # 413 before any frame is read
        if loc.pixel is None:
            if any(k > n for k in frame_numbers):
                raise NotFound(f"instance {loc.sop_uid} has {n} frame(s); no frame {frame_name(max(frame_numbers))}")
            return render.render(hdr, pixels.float_frames(hdr, frame_numbers), params, media_type,
                                 frame_numbers=frame_numbers)
        vr = loc.pixel.get("vr")
        # frames read one at a time as the renderer asks, each decoded only when rendered
        decoded = (pixels.decode_frame(hdr, raw, loc.transfer_syntax_uid, pixel_vr=vr)
                   for raw in _stored_frames(f, loc, frame_numbers))
        return render.render(hdr, decoded, params, media_type, frame_numbers=frame_numbers)

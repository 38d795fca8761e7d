"""Streaming ``multipart/related`` encoding: STOW-RS request bodies (RFC 2387).

:func:`encode_multipart` yields a body chunk by chunk from part sources
(bytes, file paths streamed from disk, binary file objects, or iterables of
bytes). :func:`stow_body` builds a STOW-RS body from pydicom datasets and/or
files, encoding datasets one at a time, so memory stays at one instance.
Decoding lives in :mod:`dicomweb_client.multipart`.

References
----------
PS3.18 Section 8.7.1.2 (multipart/related), 10.5.2 (Store Instances request);
RFC 2046 Section 5.1.1; RFC 2387.
"""
from __future__ import annotations

import io
import os
import uuid
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Union

from .media_type import format_media_type

__all__ = ["DEFAULT_CHUNK_SIZE", "PartSource", "StowBody", "encode_multipart", "make_boundary", "stow_body"]

PartSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", BinaryIO, Iterable[bytes]]

DEFAULT_CHUNK_SIZE = 1 << 20


def make_boundary() -> str:
    """A random boundary (32 hex digits plus a fixed prefix) that will not occur in binary data."""
    return "dicomweb-" + uuid.uuid4().hex


def _source_length(src: Any) -> int | None:
    if isinstance(src, (bytes, bytearray)):
        return len(src)
    if isinstance(src, memoryview):
        return src.nbytes
    if isinstance(src, (str, os.PathLike)):
        return os.path.getsize(src)
    return None


def _iter_source(src: Any, chunk_size: int) -> Iterator[bytes]:
    if isinstance(src, (bytes, bytearray, memoryview)):
        mv = memoryview(src).cast("B")
        for off in range(0, len(mv), chunk_size):
            yield bytes(mv[off : off + chunk_size])
        return
    if isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as fh:
            while True:
                chunk = fh.read(chunk_size)
                if not chunk:
                    return
                yield chunk
    if hasattr(src, "read"):
        while True:
            chunk = src.read(chunk_size)
            if not chunk:
                return
            yield bytes(chunk)
    for chunk in src:
        if chunk:
            yield bytes(chunk)


def encode_multipart(
    parts: Iterable[tuple[Mapping[str, str], Any]],
    boundary: str,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[bytes]:
    """Encode a ``multipart/related`` body as a stream of chunks.

    Parameters
    ----------
    parts : iterable of (headers, source)
        Part headers (e.g. ``{"Content-Type": "application/dicom"}``) and the
        part body: bytes-like, a file path (read in ``chunk_size`` pieces), a
        binary file object, or an iterable of bytes. Consumed lazily.
    boundary : str
        The boundary (must not occur in any part).
    chunk_size : int
        Size of the pieces read from files.

    Yields
    ------
    bytes
        The body: ``--b CRLF headers CRLF CRLF body CRLF --b ... --b-- CRLF``.
    """
    b = boundary.encode("latin-1")
    first = True
    for headers, src in parts:
        head = b"" if first else b"\r\n"
        first = False
        lines = [head + b"--" + b]
        for name, value in headers.items():
            lines.append(f"{name}: {value}".encode("latin-1"))
        yield b"\r\n".join(lines) + b"\r\n\r\n"
        yield from _iter_source(src, chunk_size)
    yield (b"--" if first else b"\r\n--") + b + b"--\r\n"


def _encoded_part_overhead(headers: Mapping[str, str], boundary: str, first: bool) -> int:
    size = (0 if first else 2) + 2 + len(boundary.encode("latin-1")) + 2
    for name, value in headers.items():
        size += len(f"{name}: {value}".encode("latin-1")) + 2
    return size + 2


class StowBody:
    """A STOW-RS request body, produced lazily.

    Attributes
    ----------
    content_type : str
        ``multipart/related; type="application/dicom"; boundary=...``
    length : int or None
        Exact body length when every source has a known size (files, bytes),
        else None (sent with chunked transfer encoding).
    """

    def __init__(self, content_type: str, length: int | None, factory) -> None:
        self.content_type = content_type
        self.length = length
        self._factory = factory

    def __iter__(self) -> Iterator[bytes]:
        return self._factory()


def _encode_dataset(ds: Any) -> bytes:
    """Write one pydicom Dataset as a PS3.10 file (preamble + file meta)."""
    import copy

    from pydicom.dataset import FileMetaDataset
    from pydicom.filewriter import dcmwrite
    from pydicom.uid import ExplicitVRLittleEndian

    meta = getattr(ds, "file_meta", None)
    if meta is None or "TransferSyntaxUID" not in meta or "MediaStorageSOPInstanceUID" not in meta:
        ds = copy.copy(ds)
        new_meta = FileMetaDataset(meta) if meta is not None else FileMetaDataset()
        if "TransferSyntaxUID" not in new_meta:
            new_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        if "MediaStorageSOPClassUID" not in new_meta and "SOPClassUID" in ds:
            new_meta.MediaStorageSOPClassUID = ds.SOPClassUID
        if "MediaStorageSOPInstanceUID" not in new_meta and "SOPInstanceUID" in ds:
            new_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.file_meta = new_meta
    buf = io.BytesIO()
    dcmwrite(buf, ds, enforce_file_format=True)
    return buf.getvalue()


def _is_dataset(obj: Any) -> bool:
    try:
        from pydicom.dataset import Dataset
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, Dataset)


def stow_body(
    instances: Iterable[Any],
    *,
    boundary: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> StowBody:
    """Build a STOW-RS body (PS3.18 10.5.2) that is produced while it is sent.

    Parameters
    ----------
    instances : iterable
        Each item is a ``pydicom.Dataset`` (written to PS3.10 one at a time,
        file meta added when missing), a path to a DICOM file (streamed in
        ``chunk_size`` pieces), PS3.10 bytes, or a binary file object. A
        generator is consumed lazily (only when the body is sent).
    boundary : str, optional
        Multipart boundary (random by default).
    chunk_size : int
        Size of file reads.

    Returns
    -------
    StowBody
        Iterable of body chunks with ``content_type`` and ``length``.
        Iterating more than once re-encodes from the sources (only possible
        when ``instances`` is a sequence).
    """
    boundary = boundary or make_boundary()
    headers = {"Content-Type": "application/dicom"}
    content_type = format_media_type(
        "multipart/related", {"type": "application/dicom", "boundary": boundary}
    )
    length: int | None = None
    if isinstance(instances, (list, tuple)):
        total = 0
        for idx, item in enumerate(instances):
            if _is_dataset(item):
                total = -1
                break
            size = _source_length(item)
            if size is None:
                total = -1
                break
            total += _encoded_part_overhead(headers, boundary, idx == 0) + size
        if total >= 0:
            total += (0 if not instances else 2) + 2 + len(boundary) + 4
            length = total

    def parts() -> Iterator[tuple[Mapping[str, str], Any]]:
        for item in instances:
            if _is_dataset(item):
                yield headers, _encode_dataset(item)
            else:
                yield headers, item

    def factory() -> Iterator[bytes]:
        return encode_multipart(parts(), boundary, chunk_size=chunk_size)

    return StowBody(content_type, length, factory)

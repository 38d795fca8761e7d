"""Response classes for the web layer: pre-encoded DICOM JSON, and bodies sent as
a list of chunks (multipart framing around file bytes without concatenating them).

Back-pressure: uvicorn's ``send`` waits until the transport's write buffer has
drained below its high-water mark before it writes, but whatever one ``send``
hands over is buffered whole. Bodies are therefore sent in pieces of at most
``SEND_PIECE`` bytes, so a client that reads slowly costs the server at most one
piece in the transport beyond the answer's own data (case "slow readers")."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from starlette.background import BackgroundTask
from starlette.concurrency import iterate_in_threadpool
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..dicom.media_types import DICOM_JSON
from ..dicom.multipart import closing, content_type, new_boundary, part_header
from .sendfile import SENDFILE, Piece, piece_length

#: largest body piece handed to the server's transport at once
SEND_PIECE = 256 * 1024


def pieces(data: bytes) -> Iterator[bytes]:
    """``data`` in slices of at most SEND_PIECE bytes (itself when smaller)."""
    if len(data) <= SEND_PIECE:
        yield data
        return
    for i in range(0, len(data), SEND_PIECE):
        yield data[i : i + SEND_PIECE]


class DicomJSONResponse(Response):
    """``application/dicom+json`` from bytes already serialised with orjson."""

    media_type = DICOM_JSON


class ChunksResponse(Response):
    """A body made of several byte strings, sent in order without joining them
    (saves one copy of each file; PS3.18 multipart bodies are header+file+closing)."""

    def __init__(self, chunks: Sequence[bytes], status_code: int = 200, headers: dict[str, str] | None = None,
                 media_type: str | None = None, background: BackgroundTask | None = None) -> None:
        self.chunks = [c for c in chunks if c]
        super().__init__(b"", status_code, headers, media_type, background)
        self.headers["content-length"] = str(sum(len(c) for c in self.chunks))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            for chunk in self.chunks:
                for piece in pieces(chunk):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        if self.background is not None:
            await self.background()


class FilesResponse(Response):
    """A body of framing bytes and open files, sent by the server's kernel
    (``sendfile``) in one SENDFILE message (:mod:`.sendfile`); only where the scope
    offers that extension. The descriptors are closed, and ``release(n)`` called
    with their count, when the answer ends or is dropped unsent."""

    def __init__(self, body: list[Piece], media_type: str, headers: dict[str, str],
                 release: Callable[[int], None]) -> None:
        self._open = [p[0] for p in body if not isinstance(p, bytes)]  # first: __del__ closes them
        self._release = release
        self.pieces = body
        super().__init__(b"", 200, headers, media_type)
        self.headers["content-length"] = str(sum(piece_length(p) for p in body))

    def close(self) -> None:
        fds, self._open = self._open, []
        for fd in fds:
            os.close(fd)
        if fds:
            self._release(len(fds))

    def __del__(self) -> None:
        self.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": SENDFILE, "pieces": self.pieces, "more_body": False})
        finally:
            self.close()


def multipart_response(parts: list[tuple[str, bytes]], part_type: str,
                       headers: dict[str, str] | None = None) -> ChunksResponse:
    """``multipart/related; type=part_type`` of (Content-Type, bytes) parts (PS3.18
    §8.6.1.2), sent without joining the parts."""
    boundary = new_boundary()
    chunks: list[bytes] = []
    for i, (ctype, data) in enumerate(parts):
        chunks.append((b"\r\n" if i else b"") + part_header(boundary, ctype))
        chunks.append(data)
    chunks.append(closing(boundary))
    return ChunksResponse(chunks, media_type=content_type(boundary, part_type), headers=headers)


def multipart_stream(part_ctype: str, items: Iterator[bytes | None], part_type: str) -> StreamingResponse:
    """``multipart/related; type=part_type`` of parts produced in a worker thread
    as the client reads: ``items`` yields ``None`` where a part starts, then that
    part's bytes in pieces (e.g. frames read from disk or decoded one at a time).
    Each piece is sent in SEND_PIECE slices, so one answer holds about one piece."""
    boundary = new_boundary()

    async def body() -> AsyncIterator[bytes]:
        first = True
        async for item in iterate_in_threadpool(items):
            if item is None:
                yield (b"" if first else b"\r\n") + part_header(boundary, part_ctype)
                first = False
                continue
            for piece in pieces(item):
                yield piece
        yield closing(boundary)

    return StreamingResponse(body(), media_type=content_type(boundary, part_type))


def parse_byte_range(header: str, size: int) -> tuple[int, int] | None:
    """One ``bytes=first-last`` / ``first-`` / ``-suffix`` range of a ``size``-byte
    value as inclusive (start, end) (RFC 9110 §14.1.2); None when the header is not a
    single valid byte range: another unit, several ranges, or an invalid range-spec
    such as ``bytes=5-3`` (§14.1.1): the whole value is then sent, as §14.2 allows.

    Raises
    ------
    ValueError
        The range is unsatisfiable (§14.1.1: a first-pos at or past the end, or a
        suffix of length 0; HTTP 416).
    """
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or last.isdigit()) or (first and not first.isdigit()) \
            or (last and not last.isdigit()) or not (first + last).isascii():
        return None
    if not first:  # suffix: the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise ValueError(f"range {header!r} selects nothing of {size} bytes")
        return max(0, size - n), size - 1
    start = int(first)
    if last and int(last) < start:
        return None  # invalid (§14.1.1), not unsatisfiable: ignored
    if start >= size:
        raise ValueError(f"range {header!r} is outside the {size} bytes of the value")
    return start, min(int(last), size - 1) if last else size - 1


def requested_range(headers, size: int) -> tuple[int, int] | None:
    """The byte range a request asks of a ``size``-byte representation (RFC 9110
    §14.2): :func:`parse_byte_range` of its Range header; None without one, and when
    it carries If-Range (§13.1.5: these answers have no validator, so no If-Range
    condition can hold and the whole representation is sent).

    Raises
    ------
    ValueError
        The range is unsatisfiable (HTTP 416 with ``Content-Range: bytes */size``).
    """
    header = headers.get("range")
    if not header or headers.get("if-range") is not None:
        return None
    return parse_byte_range(header, size)

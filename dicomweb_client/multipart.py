"""Streaming ``multipart/related`` decoding (RFC 2046, RFC 2387).

DICOMweb moves instances, frames, bulk data and rendered images as
``multipart/related`` bodies (PS3.18 Section 8.7.1.2, 8.7.3). A study can be
gigabytes, so nothing here holds more than one part -- or, with the
streaming form, more than one network chunk -- in memory.

Decoding (this module; encoding is in :mod:`dicomweb_client.stow`)
    :class:`MultipartDecoder` is a push parser: :meth:`~MultipartDecoder.feed`
    it byte chunks of any size (1 byte to many MB) and it returns events.
    :func:`iter_parts` / :func:`aiter_parts` turn an (async) iterator of chunks
    into ``Part`` objects (headers + whole body);
    :func:`iter_part_streams` / :func:`aiter_part_streams` yield parts whose
    bodies are themselves streamed, for parts too large to hold.

    Why not python-multipart's ``MultipartParser``: it is a
    ``multipart/form-data`` parser. It rejects a preamble (and a leading CRLF
    before the first boundary, which some servers send), it does not accept
    transport padding after a boundary, it caps the number of part headers at 8
    and boundaries at 70 characters, and it silently accepts a body cut before
    the closing delimiter. A truncated WADO-RS answer must be an error, not a
    shorter instance. The decoder below is a small state machine over
    ``bytes.find`` (C speed, >1 GB/s here) that handles all of these.

References
----------
PS3.18 Section 8.7.1.2 (multipart/related), 8.7.3 (bulk data media types),
10.5.2 (Store Instances request); RFC 2046 Section 5.1.1; RFC 2387.
"""
from __future__ import annotations

from typing import (
    Any,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Iterator,
    Mapping,
)

from .errors import ResponseError
from .media_type import format_media_type, parse_media_type

__all__ = [
    "MultipartError",
    "Part",
    "MultipartDecoder",
    "StreamingPart",
    "AsyncStreamingPart",
    "parse_media_type",
    "format_media_type",
    "iter_parts",
    "aiter_parts",
    "iter_part_streams",
    "aiter_part_streams",
    "encode_multipart",
    "make_boundary",
    "stow_body",
    "StowBody",
]


class MultipartError(ResponseError):
    """A multipart body (or its Content-Type) is malformed or truncated."""


# --------------------------------------------------------------------------
# Parts
# --------------------------------------------------------------------------
class _PartHeaders:
    """Header accessors shared by :class:`Part` and the streaming parts
    (each has a ``headers`` dict, names lower-cased)."""

    __slots__ = ()
    headers: dict[str, str]

    @property
    def content_type(self) -> str:
        """The raw ``Content-Type`` header ("" when absent)."""
        return self.headers.get("content-type", "")

    @property
    def media_type(self) -> str:
        """The media type without parameters, lower-case (e.g. ``"application/dicom"``)."""
        return parse_media_type(self.content_type)[0]

    @property
    def parameters(self) -> dict[str, str]:
        """The Content-Type parameters (names lower-case, values unquoted)."""
        return parse_media_type(self.content_type)[1]

    @property
    def transfer_syntax_uid(self) -> str | None:
        """The ``transfer-syntax`` parameter of the part's Content-Type, if any."""
        return self.parameters.get("transfer-syntax")

    @property
    def content_location(self) -> str | None:
        """The ``Content-Location`` header, if any (PS3.18 8.7.1)."""
        return self.headers.get("content-location")

    @property
    def content_id(self) -> str | None:
        """The ``Content-ID`` header, if any."""
        return self.headers.get("content-id")



class Part(_PartHeaders):
    """One body part of a multipart message.

    Attributes
    ----------
    headers : dict of str to str
        Part headers, names lower-cased (a repeated header is joined with ``", "``).
    content : bytes
        The part body.
    """

    __slots__ = ("headers", "content")

    def __init__(self, headers: Mapping[str, str], content: bytes = b"") -> None:
        self.headers = dict(headers)
        self.content = content

    def __len__(self) -> int:
        return len(self.content)

    def __repr__(self) -> str:
        return f"Part({self.content_type!r}, {len(self.content)} bytes)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Part):
            return NotImplemented
        return self.headers == other.headers and self.content == other.content


def _parse_header_block(block: bytes) -> dict[str, str]:
    """Parse part headers (CRLF or LF separated, folded lines joined)."""
    headers: dict[str, str] = {}
    lines = block.replace(b"\r\n", b"\n").split(b"\n")
    logical: list[str] = []
    for raw in lines:
        line = raw.decode("latin-1")
        if not line:
            continue
        if line[0] in " \t" and logical:
            logical[-1] += " " + line.strip()
        else:
            logical.append(line)
    for line in logical:
        name, sep, value = line.partition(":")
        if not sep:
            raise MultipartError(f"malformed part header line: {line[:100]!r}")
        name = name.strip().lower()
        value = value.strip()
        if name in headers:
            headers[name] += ", " + value
        else:
            headers[name] = value
    return headers


# --------------------------------------------------------------------------
# The push decoder
# --------------------------------------------------------------------------
#: Event kinds returned by MultipartDecoder.feed
HEADERS = 0  # payload: dict of part headers (a new part starts)
DATA = 1  # payload: memoryview/bytes slice of the current part's body
END = 2  # payload: None (the current part is complete)

_PREAMBLE, _HEADERS, _BODY, _DONE = range(4)
_LWSP = b" \t"


class MultipartDecoder:
    """Incremental ``multipart/related`` decoder with bounded memory.

    Feed chunks with :meth:`feed`; each call returns a list of
    ``(kind, payload)`` events: ``(HEADERS, dict)`` when a part starts,
    ``(DATA, bytes-like)`` for pieces of its body, ``(END, None)`` when it is
    complete. Call :meth:`close` at the end of input: it raises if the body
    was cut before the closing delimiter.

    Memory held between calls is at most the boundary length plus a few bytes
    (or one header block, capped by ``max_header_bytes``), whatever the part
    sizes. DATA payloads are zero-copy ``memoryview`` slices of the fed chunks;
    convert with ``bytes()`` if they must outlive the chunk's owner (chunks are
    immutable ``bytes`` in practice, so they stay valid).

    Tolerated: a preamble (any bytes before the first boundary, including a
    leading CRLF), an epilogue (anything after the closing delimiter),
    transport padding (spaces/tabs) after a boundary, LF-only part header
    blocks, folded header lines, and boundary-like byte runs inside a part
    that are not followed by CRLF or ``--`` (they are data).

    Parameters
    ----------
    boundary : str or bytes
        The ``boundary`` parameter of the message's Content-Type (unquoted).
    max_header_bytes : int
        Largest accepted header block of one part.
    strict : bool
        If true (default), :meth:`close` raises :class:`MultipartError` when
        the closing delimiter is missing. If false, a body cut mid-part ends
        that part.

    Raises
    ------
    MultipartError
        Empty boundary, oversized or malformed part headers, truncated body.
    """

    __slots__ = (
        "_dash",
        "_delim",
        "_tail",
        "_state",
        "_max_header_bytes",
        "_strict",
        "_parts",
        "_at_start",
    )

    def __init__(self, boundary: str | bytes, *, max_header_bytes: int = 65536, strict: bool = True) -> None:
        if isinstance(boundary, str):
            boundary = boundary.encode("latin-1")
        if not boundary:
            raise MultipartError("empty multipart boundary")
        self._dash = b"--" + boundary
        self._delim = b"\r\n--" + boundary
        self._tail = b""
        self._state = _PREAMBLE
        self._max_header_bytes = max_header_bytes
        self._strict = strict
        self._parts = 0
        self._at_start = True  # no preamble byte discarded yet

    @property
    def done(self) -> bool:
        """True once the closing delimiter has been seen."""
        return self._state == _DONE

    @property
    def parts(self) -> int:
        """Number of parts started so far."""
        return self._parts

    # The delimiter line after a boundary: '--' (close), or LWSP* CRLF.
    def _after_boundary(self, buf: bytes, pos: int) -> tuple[str, int]:
        """Classify what follows a boundary at ``pos``.

        Returns ``("close", end)``, ``("open", end)`` (end = start of the
        next part's headers), ``("wait", 0)`` (need more bytes) or
        ``("no", 0)`` (not a delimiter: boundary-like data).
        """
        n = len(buf)
        if n < pos + 2:
            if n > pos and buf[pos] not in b"-\r \t\n":
                return "no", 0
            return "wait", 0
        two = buf[pos : pos + 2]
        if two == b"--":
            return "close", pos + 2
        j = pos
        while j < n and buf[j] in _LWSP:
            j += 1
            if j - pos > 1024:
                raise MultipartError("too much transport padding after a multipart boundary")
        if j >= n:
            return "wait", 0
        if buf[j] == 0x0D:  # \r
            if j + 1 >= n:
                return "wait", 0
            if buf[j + 1] == 0x0A:
                return "open", j + 2
            return "no", 0
        if buf[j] == 0x0A:  # bare LF, tolerated
            return "open", j + 1
        return "no", 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, Any]]:
        """Decode one more chunk.

        Parameters
        ----------
        data : bytes-like
            The next bytes of the body (any length, may be empty).

        Returns
        -------
        list of (int, object)
            Events ``(HEADERS, dict)``, ``(DATA, memoryview)``, ``(END, None)``.
        """
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._tail:
            buf = self._tail + data
        else:
            buf = data
        self._tail = b""
        events: list[tuple[int, Any]] = []
        pos = 0  # start of unconsumed bytes in buf
        n = len(buf)
        dash, delim = self._dash, self._delim
        dlen = len(delim)
        while True:
            state = self._state
            if state == _BODY:
                i = buf.find(delim, pos)
                while i >= 0:
                    kind, end = self._after_boundary(buf, i + dlen)
                    if kind == "no":
                        i = buf.find(delim, i + 1)
                        continue
                    break
                if i < 0:
                    # keep the bytes that could start a delimiter
                    safe = n - (dlen - 1)
                    if safe > pos:
                        events.append((DATA, memoryview(buf)[pos:safe]))
                        pos = safe
                    break
                if i > pos:
                    events.append((DATA, memoryview(buf)[pos:i]))
                    pos = i
                if kind == "wait":
                    break
                events.append((END, None))
                pos = end
                if kind == "close":
                    self._state = _DONE
                else:
                    self._state = _HEADERS
                continue
            if state == _HEADERS:
                if buf.startswith(b"\r\n", pos):
                    headers: dict[str, str] = {}
                    pos += 2
                elif buf.startswith(b"\n", pos):
                    headers = {}
                    pos += 1
                else:
                    i = buf.find(b"\r\n\r\n", pos)
                    j = buf.find(b"\n\n", pos)
                    if i < 0 and j < 0:
                        if n - pos > self._max_header_bytes:
                            raise MultipartError(
                                f"multipart part headers exceed {self._max_header_bytes} bytes"
                            )
                        break
                    if i >= 0 and (j < 0 or i < j):
                        block, pos = buf[pos:i], i + 4
                    else:
                        block, pos = buf[pos:j], j + 2
                    if len(block) > self._max_header_bytes:
                        raise MultipartError(f"multipart part headers exceed {self._max_header_bytes} bytes")
                    headers = _parse_header_block(block)
                self._parts += 1
                events.append((HEADERS, headers))
                self._state = _BODY
                continue
            if state == _PREAMBLE:
                # The first boundary may open the body (no CRLF before it) or
                # follow a preamble line.
                if pos == 0 and self._at_start and buf.startswith(dash):
                    i = 0
                    blen = len(dash)
                else:
                    i = buf.find(delim, pos)
                    blen = dlen
                while i >= 0:
                    kind, end = self._after_boundary(buf, i + blen)
                    if kind != "no":
                        break
                    i = buf.find(delim, i + 1)
                    blen = dlen
                if i < 0:
                    # discard the preamble, keep a possible partial delimiter
                    keep = max(pos, n - (dlen - 1))
                    if keep > 0:
                        self._at_start = False
                    pos = keep
                    break
                if i > 0:
                    self._at_start = False
                pos = i
                if kind == "wait":
                    break
                pos = end
                self._state = _DONE if kind == "close" else _HEADERS
                continue
            # _DONE: the epilogue is ignored
            pos = n
            break
        if pos < n and self._state != _DONE:
            self._tail = buf[pos:]
        return events

    def close(self) -> list[tuple[int, Any]]:
        """Signal the end of input.

        Returns
        -------
        list of (int, object)
            Remaining events (only in non-strict mode for a truncated body).

        Raises
        ------
        MultipartError
            In strict mode, when the closing delimiter was not seen.
        """
        if self._state == _DONE:
            return []
        if self._strict:
            if self._state == _PREAMBLE:
                raise MultipartError("no multipart boundary found in the body")
            raise MultipartError(
                f"multipart body truncated: no closing delimiter after {self._parts} part(s)"
            )
        events: list[tuple[int, Any]] = []
        if self._state == _BODY:
            if self._tail:
                events.append((DATA, memoryview(self._tail)))
            events.append((END, None))
        self._tail = b""
        self._state = _DONE
        return events


# --------------------------------------------------------------------------
# Pull-style wrappers
# --------------------------------------------------------------------------
def _boundary_of(content_type_or_boundary: str | bytes) -> str | bytes:
    """Accept either a boundary or a whole Content-Type value."""
    if isinstance(content_type_or_boundary, str) and ";" in content_type_or_boundary and "/" in content_type_or_boundary:
        media, params = parse_media_type(content_type_or_boundary)
        if not media.startswith("multipart/"):
            raise MultipartError(f"not a multipart media type: {media!r}")
        b = params.get("boundary")
        if not b:
            raise MultipartError(f"no boundary parameter in Content-Type {content_type_or_boundary!r}")
        return b
    return content_type_or_boundary


def _join(pieces: list) -> bytes:
    if len(pieces) == 1:
        return bytes(pieces[0])
    return b"".join(pieces)


def iter_parts(
    chunks: Iterable[bytes], boundary: str | bytes, *, strict: bool = True, max_header_bytes: int = 65536
) -> Iterator[Part]:
    """Decode a multipart body from an iterator of chunks, one part at a time.

    Parameters
    ----------
    chunks : iterable of bytes
        The body, in chunks of any size (e.g. ``httpx.Response.iter_bytes()``).
    boundary : str or bytes
        The boundary, or the whole Content-Type value of the message.
    strict : bool
        Raise on a missing closing delimiter (default) instead of ending the last part.
    max_header_bytes : int
        Largest accepted header block of one part.

    Yields
    ------
    Part
        Headers and complete body of each part, in order. Memory: one part.

    Raises
    ------
    MultipartError
        Malformed or truncated body.
    """
    assembler = _Assembler(MultipartDecoder(_boundary_of(boundary), strict=strict, max_header_bytes=max_header_bytes))
    for chunk in chunks:
        yield from assembler.feed(chunk)
        if assembler.done:
            break
    yield from assembler.close()


async def aiter_parts(
    chunks: AsyncIterable[bytes], boundary: str | bytes, *, strict: bool = True, max_header_bytes: int = 65536
) -> AsyncIterator[Part]:
    """Async twin of :func:`iter_parts` (``chunks`` is an async iterable)."""
    assembler = _Assembler(MultipartDecoder(_boundary_of(boundary), strict=strict, max_header_bytes=max_header_bytes))
    async for chunk in chunks:
        for part in assembler.feed(chunk):
            yield part
        if assembler.done:
            break
    for part in assembler.close():
        yield part


class _Assembler:
    """Turns decoder events into whole parts; shared by iter_parts and aiter_parts."""

    def __init__(self, decoder: "MultipartDecoder") -> None:
        self.decoder = decoder
        self.headers: dict[str, str] = {}
        self.pieces: list = []

    @property
    def done(self) -> bool:
        return self.decoder.done

    def _take(self, events) -> list[Part]:
        out = []
        for kind, payload in events:
            if kind == DATA:
                self.pieces.append(payload)
            elif kind == HEADERS:
                self.headers, self.pieces = payload, []
            elif kind == END:
                out.append(Part(self.headers, _join(self.pieces) if self.pieces else b""))
                self.pieces = []
        return out

    def feed(self, chunk: bytes) -> list[Part]:
        return self._take(self.decoder.feed(chunk))

    def close(self) -> list[Part]:
        return self._take(self.decoder.close())


class _EventSource:
    """Buffered decoder events behind the streaming-part iterators."""

    __slots__ = ("_pending", "_idx")

    def __init__(self) -> None:
        self._pending: list[tuple[int, Any]] = []
        self._idx = 0

    def push(self, events: list[tuple[int, Any]]) -> None:
        self._pending = events
        self._idx = 0

    def pop(self) -> tuple[int, Any] | None:
        if self._idx < len(self._pending):
            ev = self._pending[self._idx]
            self._idx += 1
            return ev
        return None


class StreamingPart(_PartHeaders):
    """A part whose body is streamed: iterate over it to get ``bytes`` chunks.

    The body must be consumed (or skipped: the next part does it for you)
    before the next part is available. :meth:`read` returns the whole body.

    Attributes
    ----------
    headers : dict of str to str
        Part headers, names lower-cased.
    """

    def __init__(self, headers: dict[str, str], gen: Iterator[bytes]) -> None:
        self.headers = headers
        self._gen = gen
        self._consumed = False

    def __iter__(self) -> Iterator[bytes]:
        if self._consumed:
            return
        self._consumed = True
        yield from self._gen

    def read(self) -> bytes:
        """Read the whole (remaining) body."""
        return b"".join(self)

    def _drain(self) -> None:
        self._consumed = True
        for _ in self._gen:
            pass


class AsyncStreamingPart(_PartHeaders):
    """Async twin of :class:`StreamingPart` (``async for chunk in part``, ``await part.read()``)."""

    def __init__(self, headers: dict[str, str], agen: AsyncIterator[bytes]) -> None:
        self.headers = headers
        self._agen = agen
        self._consumed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._consumed:
            return
        self._consumed = True
        async for chunk in self._agen:
            yield chunk

    async def read(self) -> bytes:
        """Read the whole (remaining) body."""
        return b"".join([c async for c in self])

    async def _drain(self) -> None:
        self._consumed = True
        async for _ in self._agen:
            pass


def iter_part_streams(
    chunks: Iterable[bytes], boundary: str | bytes, *, strict: bool = True
) -> Iterator[StreamingPart]:
    """Decode a multipart body yielding parts whose bodies are streamed.

    Memory is bounded by the chunk size, even for a multi-gigabyte part.

    Parameters
    ----------
    chunks : iterable of bytes
        The body.
    boundary : str or bytes
        The boundary, or the whole Content-Type value.
    strict : bool
        Raise on a missing closing delimiter.

    Yields
    ------
    StreamingPart
        Iterate over each to receive its body in ``bytes`` chunks.
    """
    dec = MultipartDecoder(_boundary_of(boundary), strict=strict)
    src = _EventSource()
    it = iter(chunks)
    finished = False

    def next_event() -> tuple[int, Any] | None:
        nonlocal finished
        while True:
            ev = src.pop()
            if ev is not None:
                return ev
            if finished:
                return None
            try:
                chunk = next(it)
            except StopIteration:
                finished = True
                src.push(dec.close())
                continue
            src.push(dec.feed(chunk))

    def body() -> Iterator[bytes]:
        while True:
            ev = next_event()
            if ev is None:
                return
            kind, payload = ev
            if kind == DATA:
                yield bytes(payload)
            elif kind == END:
                return
            else:  # pragma: no cover - decoder never emits HEADERS inside a body
                raise MultipartError("unexpected part headers inside a part body")

    while True:
        ev = next_event()
        if ev is None:
            return
        kind, payload = ev
        if kind != HEADERS:  # pragma: no cover
            raise MultipartError("multipart data outside of a part")
        part = StreamingPart(payload, body())
        yield part
        part._drain()


async def aiter_part_streams(
    chunks: AsyncIterable[bytes], boundary: str | bytes, *, strict: bool = True
) -> AsyncIterator[AsyncStreamingPart]:
    """Async twin of :func:`iter_part_streams`."""
    dec = MultipartDecoder(_boundary_of(boundary), strict=strict)
    src = _EventSource()
    it = chunks.__aiter__()
    finished = False

    async def next_event() -> tuple[int, Any] | None:
        nonlocal finished
        while True:
            ev = src.pop()
            if ev is not None:
                return ev
            if finished:
                return None
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                finished = True
                src.push(dec.close())
                continue
            src.push(dec.feed(chunk))

    async def body() -> AsyncIterator[bytes]:
        while True:
            ev = await next_event()
            if ev is None:
                return
            kind, payload = ev
            if kind == DATA:
                yield bytes(payload)
            elif kind == END:
                return
            else:  # pragma: no cover
                raise MultipartError("unexpected part headers inside a part body")

    while True:
        ev = await next_event()
        if ev is None:
            return
        kind, payload = ev
        if kind != HEADERS:  # pragma: no cover
            raise MultipartError("multipart data outside of a part")
        part = AsyncStreamingPart(payload, body())
        yield part
        await part._drain()


# The encoder moved to dicomweb_client.stow; these names stay importable from here.
from .stow import StowBody, encode_multipart, make_boundary, stow_body  # noqa: E402,F401

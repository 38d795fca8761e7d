"""multipart/related (RFC 2387) for DICOMweb: a streaming reader that spools each
part of a STOW-RS body to its own file, and helpers that frame response parts.

The reader drives python-multipart's low-level ``MultipartParser`` (a streaming
byte parser, ~1 GB/s here). That parser does not accept a preamble before the first
boundary (RFC 2046 §5.1.1 allows one), so :class:`PartSpooler` skips it first; this
is the only hand-written framing code.

References
----------
PS3.18 §8.6.1.2 (multipart/related payloads), RFC 2046 §5.1.1 (boundary, preamble,
epilogue), RFC 2387.
"""

from __future__ import annotations

import itertools
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser

CRLF = b"\r\n"
#: a part up to this size is kept in memory while the body arrives and written to its
#: spool file by the worker thread that stores it (no file system call on the event
#: loop: creating the spool file there took ~0.9 ms of a STOW-RS, issue 11) ...
MEMORY_PART_BYTES = 1024 * 1024
#: ... as long as the request's parts kept in memory stay under this (then: files)
MEMORY_REQUEST_BYTES = 2 * 1024 * 1024


_spool_names = itertools.count()


def new_spool_file(spool_dir: Path, prefix: str = "part-") -> tuple[int, Path]:
    """A new file in ``spool_dir`` (``O_EXCL``, mode 0600 as ``mkstemp`` makes it), open for
    writing: its descriptor and path. Named by the process id and a counter, not by
    ``tempfile.mkstemp``'s random name: that name's generation and path handling was ~4 %
    of the DIMSE listener's GIL time per stored instance (py-spy, issue 33). A name left by
    an earlier process with the same id is skipped (``O_EXCL``: the next number)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    pid = os.getpid()
    for _ in range(1000):
        path = spool_dir / f"{prefix}{pid:x}-{next(_spool_names):x}.tmp"
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=spool_dir)
    return fd, Path(name)


class MultipartError(ValueError):
    """Malformed multipart framing (HTTP 400)."""


class TooLarge(ValueError):
    """Body or part count above the configured cap (HTTP 413)."""


@dataclass(slots=True)
class SpooledPart:
    """One part of a multipart body, spooled to ``path`` (a file the caller owns), or
    a small part held in ``data`` until :meth:`spool` writes it to a file."""

    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    path: Path | None = None
    size: int = 0
    complete: bool = False
    error: OSError | None = None  # the spool file could not be written (disk full, read-only)
    data: bytes | None = None  # a small complete part, not yet in a file
    synced: bool = False  # the file's data is durable (fdatasync'ed by :meth:`spool`)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def spool(self, spool_dir: Path, *, sync: bool = False) -> None:
        """Write an in-memory part to a new file in ``spool_dir`` (blocking: call it
        off the event loop). Sets ``path``, or ``error`` when the file cannot be written.

        With ``sync`` the data is made durable with ``fdatasync`` on the descriptor
        that wrote it (``synced`` is then set): the store's write path then need not
        open the file again to sync it, and the sync starts as early as it can."""
        if self.data is None:
            return
        data, self.data = self.data, None
        try:
            fd, path = new_spool_file(spool_dir)
        except OSError as e:
            self.error = e
            return
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                view = memoryview(data)
                while view:  # a raw write may be short
                    view = view[f.write(view):]
                if sync:
                    os.fdatasync(f.fileno())  # a new file: its size and blocks are synced too
        except OSError as e:
            self.error = e
            path.unlink(missing_ok=True)
            return
        self.path = path
        self.synced = sync


class PartSpooler:
    """Feed a multipart body chunk by chunk; each part goes to a new file in
    ``spool_dir`` (same filesystem as the archive, so a stored part is renamed, not
    copied). Memory stays bounded by the chunk size.

    Raises
    ------
    MultipartError
        Framing errors (no boundary found, bad delimiters).
    TooLarge
        More than ``max_bytes`` bytes or ``max_parts`` parts.
    """

    def __init__(self, boundary: str, spool_dir: Path, *, max_bytes: int, max_parts: int) -> None:
        if not boundary or len(boundary) > 70:
            raise MultipartError("the multipart boundary must be 1 to 70 characters (RFC 2046)")
        self._boundary = boundary.encode("latin-1")
        self._delim = b"--" + self._boundary
        self._spool_dir = spool_dir
        self._max_bytes = max_bytes
        self._max_parts = max_parts
        self._received = 0
        self._in_preamble = True
        self._head = b""
        self.parts: list[SpooledPart] = []
        self._file = None
        self._memory: list[bytes] | None = None  # the current part's bytes while it stays in memory
        self._in_memory = 0  # bytes of this request's parts held in memory
        self._hname = b""
        self._hvalue = b""
        self._ended = False
        self._parser = MultipartParser(
            self._boundary,
            {
                "on_part_begin": self._on_part_begin,
                "on_header_field": self._on_header_field,
                "on_header_value": self._on_header_value,
                "on_header_end": self._on_header_end,
                "on_part_data": self._on_part_data,
                "on_part_end": self._on_part_end,
                "on_end": self._on_end,
            },
        )

    # python-multipart callbacks
    def _on_part_begin(self) -> None:
        if len(self.parts) >= self._max_parts:
            raise TooLarge(f"more than {self._max_parts} parts in one request")
        self.parts.append(SpooledPart())
        self._memory = []

    def _open_file(self, part: SpooledPart) -> None:
        """Move the current part from memory to a new spool file (it grew too large)."""
        held, self._memory = self._memory or [], None
        self._in_memory -= sum(len(b) for b in held)
        try:
            fd, part.path = new_spool_file(self._spool_dir)
        except OSError as e:
            part.error = e  # the rest of this part is read and dropped; the part fails
            return
        self._file = os.fdopen(fd, "wb", buffering=0)
        for chunk in held:
            self._write(part, chunk)

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._hname += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._hvalue += data[start:end]

    def _on_header_end(self) -> None:
        name = self._hname.decode("latin-1").strip().lower()
        self.parts[-1].headers[name] = self._hvalue.decode("latin-1").strip()
        self._hname = self._hvalue = b""

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self.parts[-1]
        part.size += end - start
        if self._memory is not None:
            self._memory.append(data[start:end])
            self._in_memory += end - start
            if part.size > MEMORY_PART_BYTES or self._in_memory > MEMORY_REQUEST_BYTES:
                self._open_file(part)
            return
        self._write(part, memoryview(data)[start:end])

    def _write(self, part: SpooledPart, view) -> None:
        if self._file is None:
            return
        try:
            while view:  # a raw write may be short (e.g. the disk filling up): write the rest
                n = self._file.write(view)
                view = view[n:]
        except OSError as e:  # ENOSPC, EROFS, EIO: fail this part, keep reading the body
            part.error = e
            self._drop_file(part)

    def _drop_file(self, part: SpooledPart) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if part.path is not None:
            try:
                part.path.unlink()
            except OSError:
                pass
            part.path = None

    def _on_part_end(self) -> None:
        part = self.parts[-1]
        if self._memory is not None:
            part.data, self._memory = b"".join(self._memory), None
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                part.error = e
                self._drop_file(part)
            self._file = None
        part.complete = True

    def _on_end(self) -> None:
        self._ended = True

    def feed(self, chunk: bytes) -> None:
        """Consume the next chunk of the body."""
        self._received += len(chunk)
        if self._received > self._max_bytes:
            raise TooLarge(f"request body larger than {self._max_bytes} bytes")
        if self._in_preamble:
            # RFC 2046: anything before the first "--boundary" line is a preamble.
            self._head += chunk
            if self._head.startswith(self._delim):
                idx = 0
            else:
                idx = self._head.find(CRLF + self._delim)
                if idx < 0:
                    if len(self._head) > 65536:
                        raise MultipartError("no multipart boundary found in the first 64 KiB of the body")
                    return
                idx += 2
            chunk, self._head, self._in_preamble = self._head[idx:], b"", False
        if self._ended:
            return  # epilogue
        try:
            self._parser.write(chunk)
        except MultipartParseError as e:
            raise MultipartError(f"malformed multipart body: {e}") from None

    def close(self) -> None:
        """End of body. Parts not closed by a delimiter stay ``complete=False``."""
        self._memory = None
        self._parser = None  # (its callbacks are this object's methods: no cycle left, see discard)
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._in_preamble:
            raise MultipartError("no multipart boundary found in the body")

    def discard(self) -> None:
        """Remove every spooled file that the caller did not take."""
        # The parser's callbacks are bound methods of this object: a reference cycle that
        # kept each request's spooler, its parts' bytes with it, until the cyclic garbage
        # collector ran; freed at once, the next body reuses the same (mapped) memory
        # instead of fresh pages (issue 33: 33 page faults, ~0.1 ms, per 132 KB part)
        self._parser = None
        if self._file is not None:
            self._file.close()
            self._file = None
        for p in self.parts:
            p.data = None
            if p.path is not None:
                try:
                    p.path.unlink()
                except FileNotFoundError:
                    pass


def new_boundary() -> str:
    return "dicomweb-" + secrets.token_hex(16)


def part_header(boundary: str, content_type: str, extra: dict[str, str] | None = None) -> bytes:
    """Delimiter and headers that open one part (CRLF framing, RFC 2046 §5.1.1)."""
    lines = [f"--{boundary}", f"Content-Type: {content_type}"]
    if extra:
        lines += [f"{k}: {v}" for k, v in extra.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def closing(boundary: str) -> bytes:
    """The close delimiter, preceded by the CRLF that ends the last part."""
    return f"\r\n--{boundary}--\r\n".encode("latin-1")


def content_type(boundary: str, part_type: str, transfer_syntax: str | None = None) -> str:
    """``multipart/related; type="..."; boundary=...`` for a response."""
    ct = f'multipart/related; type="{part_type}"; boundary={boundary}'
    if transfer_syntax:
        ct += f"; transfer-syntax={transfer_syntax}"
    return ct

"""Stored files sent to the socket by the kernel (``sendfile(2)``): the server side.

A whole-study retrieve is mostly bytes that already sit in files. Sent through
ASGI, every byte is copied by the kernel from the process (a ``bytes`` object or a
mapped file) into the socket with the event loop's GIL held: 46 % of the GIL time
of a study retrieve under load (issue 11, ``loadtests/results/profiles``), and the
reason static nginx served the same bytes faster. ``sendfile`` hands page-cache
pages to the socket without that copy.

uvicorn (0.55) implements no file-sending ASGI extension, so this module adds one
to our protocol subclass (:class:`~.limits.GuardedHttpToolsProtocol`):

- scope ``extensions`` gets ``{SENDFILE: {}}`` on plain TCP (and Unix) connections;
  TLS connections and other servers (the test client) do not, and the application
  then sends the bytes itself.
- the message ``{"type": SENDFILE, "pieces": [...], "more_body": bool}`` sends its
  pieces in order: ``bytes`` (multipart framing) or ``(fd, offset, count)`` of an
  open file. It is our own message, not ASGI's ``http.response.zerocopysend`` (one
  file per message): a study is one message here, so one worker-thread hop per
  socket-buffer-full rather than one per file. The caller keeps the files open
  until the send returns.

How it sends: the response head is written by uvicorn; the transport's own buffer
is waited out (so bytes stay in order); then a worker thread writes the pieces on a
duplicate of the socket's descriptor until done or the socket buffer is full
(EAGAIN), and the event loop waits for the socket to be writable before the next
hop. No thread waits on a slow reader, and the disk reads behind ``sendfile`` of
files not in the page cache happen in that thread, never on the event loop. The
duplicate keeps the socket (not a recycled descriptor number) under the thread if
the connection is closed meanwhile. A file shorter than it was when opened (stored
files never change; a hand edit) ends the connection: the Content-Length promised
cannot be kept."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from .threads import run_blocking

log = logging.getLogger("dicomweb_server.api")

#: scope extension and message type (see the module docstring)
SENDFILE = "dicomweb_server.sendfile"

Piece = bytes | tuple[int, int, int]  # framing bytes, or (file descriptor, offset, count)


def can_sendfile(transport: asyncio.BaseTransport) -> bool:
    """Plain TCP/Unix stream socket under the transport (not TLS: the kernel would
    send the file unencrypted)."""
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return False
    sock = transport.get_extra_info("socket")
    return sock is not None and sock.type == socket.SOCK_STREAM


def piece_length(piece: Piece) -> int:
    return len(piece) if isinstance(piece, bytes | bytearray | memoryview) else piece[2]


class ShortFile(OSError):
    """A file ended before the count promised for it."""


def write_pieces(fd: int, pieces: list[Piece], i: int, off: int) -> tuple[int, int]:
    """Write ``pieces[i:]`` (the first from byte ``off``) to the non-blocking socket
    ``fd`` until all are written or the socket buffer is full; in a worker thread.
    Returns where it stopped: ``(len(pieces), 0)`` when done.

    Framing bytes followed by a file go with MSG_MORE, so the kernel puts them in
    one segment with the file's first bytes (TCP_NODELAY is on); the last piece
    goes without, so nothing is held back."""
    sock = socket.socket(fileno=fd)
    try:
        sock.setblocking(False)  # already so (the transport's); makes send() not wait
        while i < len(pieces):
            piece = pieces[i]
            try:
                if isinstance(piece, bytes | bytearray | memoryview):
                    more = socket.MSG_MORE if i + 1 < len(pieces) and not isinstance(pieces[i + 1], bytes) else 0
                    n = sock.send(memoryview(piece)[off:], more)
                    size = len(piece)
                else:
                    file_fd, start, size = piece
                    n = os.sendfile(fd, file_fd, start + off, size - off)
                    if n == 0:
                        raise ShortFile(0, f"a stored file ended {size - off} bytes before its recorded size")
            except BlockingIOError:
                return i, off
            off += n
            if off >= size:
                i, off = i + 1, 0
        return i, off
    finally:
        sock.detach()  # the descriptor is the caller's


class SendfileSender:
    """The SENDFILE message on one connection of a uvicorn httptools protocol.

    Uses uvicorn's RequestResponseCycle state (response_started/complete,
    expected_content_length, keep_alive, on_response) the way its own ``send`` does
    for ``http.response.body``: pinned by tests/server/test_sendfile.py, which runs
    real uvicorn."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.waiter: asyncio.Future | None = None

    def connection_lost(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def wrap(self, cycle: Any, app: Any) -> Any:
        """``app`` with its ``send`` taking SENDFILE messages for ``cycle``."""
        async def wrapped_app(scope, receive, send):
            async def send_or_sendfile(message):
                if message["type"] == SENDFILE:
                    await self.send(cycle, message)
                else:
                    await send(message)
            await app(scope, receive, send_or_sendfile)
        return wrapped_app

    def _gone(self, cycle: Any) -> bool:
        return cycle.disconnected or self.protocol.transport.is_closing()

    async def send(self, cycle: Any, message: dict) -> None:
        if cycle.flow.write_paused and not self._gone(cycle):
            await cycle.flow.drain()
        if self._gone(cycle):
            return
        if not cycle.response_started or cycle.response_complete:
            raise RuntimeError(f"{SENDFILE} before the response start or after its end")
        if cycle.chunked_encoding:
            raise RuntimeError(f"{SENDFILE} needs a Content-Length")
        pieces: list[Piece] = []
        total = 0
        for piece in message["pieces"]:
            n = piece_length(piece)
            if n:
                pieces.append(piece)
                total += n
        if total > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if cycle.scope["method"] == "HEAD":
            cycle.expected_content_length = 0
        elif pieces:
            await self._drain_transport(cycle)
            if self._gone(cycle):
                return
            if not await self._write(cycle, pieces):
                return
            cycle.expected_content_length -= total
        if not message.get("more_body", False):
            if cycle.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                self.protocol.transport.close()
            cycle.on_response()

    async def _drain_transport(self, cycle: Any) -> None:
        """Until the transport's buffer (the response head, usually already in the
        socket) is empty: its bytes go before ours. Lowering the high-water mark to 0
        makes the transport pause the protocol until it is empty, and resume it
        then (uvicorn's flow control), so this waits without polling."""
        transport = self.protocol.transport
        while transport.get_write_buffer_size() and not self._gone(cycle):
            low, high = transport.get_write_buffer_limits()
            transport.set_write_buffer_limits(high=0, low=0)
            try:
                await cycle.flow.drain()
            finally:
                if not transport.is_closing():
                    transport.set_write_buffer_limits(high=high, low=low)

    async def _write(self, cycle: Any, pieces: list[Piece]) -> bool:
        transport = self.protocol.transport
        loop = asyncio.get_running_loop()
        fd = os.dup(transport.get_extra_info("socket").fileno())
        try:
            i = off = 0
            while True:
                try:
                    i, off = await run_blocking(write_pieces, fd, pieces, i, off)
                except OSError as e:  # the client went away (EPIPE, ECONNRESET), or a short file
                    (log.warning if isinstance(e, ShortFile) else log.debug)(
                        "ending the answer to %s: %s", self.protocol.client, e)
                    transport.close()
                    return False
                if i == len(pieces):
                    return True
                if self._gone(cycle):
                    return False
                self.waiter = loop.create_future()
                loop.add_writer(fd, lambda w=self.waiter: w.done() or w.set_result(None))
                try:
                    await self.waiter
                finally:
                    loop.remove_writer(fd)
                    self.waiter = None
                if self._gone(cycle):
                    return False
        finally:
            os.close(fd)

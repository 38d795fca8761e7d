"""Limits on the request head, before any application code runs.

uvicorn 0.54 (httptools) has no header-read timeout (a connection trickling its
headers is kept forever: slowloris) and no size limit (a 200 MB header or URL is
read and kept whole before the app can answer 431). :class:`GuardedHttpToolsProtocol`
adds both at the connection level: the request line and headers must arrive within
``header_timeout`` seconds (else ``408`` and close) and within ``max_header_bytes``
(else ``414`` when the request line alone is over it, ``431`` otherwise; RFC 9110
§15.5.9, §15.5.15, RFC 6585 §5), counted as the bytes arrive and before httptools
parses them, so at most one socket read beyond the limit is ever held. :func:`uvicorn_options` is how the CLI
and the tests run uvicorn with it.

:class:`HeaderLimit` is the same size rule for other ASGI servers (e.g. the test
client): a plain ASGI middleware (no per-request Python objects)."""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from . import balance
from .errors import error_response, warning_header
from .sendfile import SENDFILE, SendfileSender, can_sendfile

log = logging.getLogger("dicomweb_server.api")
LINGER = 2.0  # seconds a refused connection's input is still read and discarded
#: The longest request line accepted whatever ``max_header_bytes`` allows: httptools.parse_url
#: refuses a URL over 65,535 bytes (16-bit offsets), which uvicorn answers with a plain-text 400.
MAX_REQUEST_LINE = 65535


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_header_bytes: int) -> None:
        self.app = app
        self.max = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(k) + len(v) + 4 for k, v in scope["headers"]) + len(scope.get("raw_path") or b"") \
                + len(scope.get("query_string") or b"")
            if size > self.max:
                response = error_response(431, f"request line and headers exceed {self.max} bytes")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a byte bound on each
    request head (request line + header fields). The deadline starts with the
    connection, and for later requests of a keep-alive connection with their first
    byte (the idle time between requests is uvicorn's ``timeout_keep_alive``).

    It also offers the application the SENDFILE extension (stored files sent by the
    kernel: :mod:`.sendfile`) on connections without TLS, and with several workers passes
    a connection it just accepted to a less loaded sibling worker (:mod:`.balance`)."""

    def __init__(self, *args: Any, header_timeout: float, max_header_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = header_timeout
        self._max_head = max_header_bytes
        self._in_head = False
        self._head_bytes = 0
        self._line_done = False
        self._head_tail = b""  # the last 3 bytes of the head so far: an end (CRLFCRLF) split across reads
        self._awaiting_head = True  # the next byte starts a request head (connection start, after a request)
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._sendfile: SendfileSender | None = None
        self._handed_off = False

    def _start_head(self) -> None:
        if self._in_head:
            return
        self._in_head, self._head_bytes, self._line_done = True, 0, False
        self._head_timer = self.loop.call_later(self._header_timeout, self._head_timed_out)

    def _end_head(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if balance.connection_made(self, transport):  # a sibling worker serves it (api/balance.py)
            self._handed_off = True
            return
        super().connection_made(transport)
        if can_sendfile(transport):
            self._sendfile = SendfileSender(self)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handed_off:
            return  # never this worker's
        self._end_head()
        super().connection_lost(exc)
        if self._sendfile is not None:
            self._sendfile.connection_lost()
        balance.connection_lost()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if self._sendfile is not None and SENDFILE in cycle.scope.get("extensions", ()):
            app = self._sendfile.wrap(cycle, app)
        super()._start_asgi_task(cycle, app)

    def on_message_begin(self) -> None:
        self._awaiting_head = False
        super().on_message_begin()
        self._start_head()

    def on_message_complete(self) -> None:
        self._awaiting_head = True
        super().on_message_complete()

    def on_headers_complete(self) -> None:
        self._end_head()
        if self._sendfile is not None:
            self.scope["extensions"] = {**self.scope.get("extensions", {}), SENDFILE: {}}
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # after a refusal: discarded (see _refuse)
        if (self._in_head or self._awaiting_head) and self._refused_before_parsing(data):
            return
        began_here = not self._in_head
        if self._in_head:
            self._head_bytes += len(data)
            self._line_done = self._line_done or b"\n" in data
        # fed first: the read that completes a head may carry body bytes too
        super().data_received(data)
        if began_here and self._in_head:
            # The next request of a keep-alive connection began inside this read
            # (on_message_begin): count the read from it. Without pipelining the read
            # starts with its request line; with pipelining it may also hold the end of
            # the request before, which over-counts by at most that read.
            self._head_bytes = len(data)
            self._line_done = b"\n" in data
            self._head_tail = b""
        if self._in_head:
            self._head_tail = (self._head_tail + data)[-3:]
        if self._in_head and self._head_bytes > self._max_head and not self.transport.is_closing():
            if self._line_done:
                self._refuse(431, f"request headers exceed {self._max_head} bytes")
            else:
                self._refuse(414, f"request line exceeds {self._max_head} bytes")

    def _refused_before_parsing(self, data: bytes) -> bool:
        """Refuse (414/431) a head that this read takes beyond the bound *before*
        httptools sees it. Counting only after feeding let a head that arrives whole in
        one read through, and for a URL of 64 KiB or more httptools.parse_url (16-bit
        offsets) then fails: uvicorn answered a plain-text 400 ``Invalid HTTP request
        received.`` instead of the 414 (docs/security.md). Only the bytes up to the end
        of the head (CRLF CRLF) count: the body bytes a read may carry after it do not.
        414 when the request line alone exceeds the bound, or the longest URL httptools
        reads (:data:`MAX_REQUEST_LINE`, whatever ``max_header_bytes`` says; RFC 9110
        §15.5.15), else 431 (RFC 6585 §5)."""
        if not self._in_head and self.cycle is not None and not self.cycle.response_complete:
            return False  # a pipelined request behind an answer being sent: counted after feeding
        counted, line_done, tail = (
            (self._head_bytes, self._line_done, self._head_tail) if self._in_head else (0, False, b""))
        end = (tail + data).find(b"\r\n\r\n")
        part = data if end < 0 else data[: max(end + 4 - len(tail), 0)]
        if not line_done:
            newline = part.find(b"\n")
            line_bound = min(self._max_head, MAX_REQUEST_LINE)
            if counted + (len(part) if newline < 0 else newline) > line_bound:
                self._refuse(414, f"request line exceeds {line_bound} bytes")
                return True
        if counted + len(part) > self._max_head:
            self._refuse(431, f"request headers exceed {self._max_head} bytes")
            return True
        return False

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined head behind an answer still being sent: its deadline runs from then
            self._head_timer = self.loop.call_later(self._header_timeout, self._head_timed_out)
        elif self._head_bytes:
            self._refuse(408, f"request headers not received within {self._header_timeout:g} s")
        else:
            self.transport.close()  # an idle connection: closed without an answer

    def _refuse(self, status: int, message: str) -> None:
        """Answer and close; the parser has not finished a head, so no app runs."""
        log.info("%s: %s from %s", status, message, self.client)
        body = orjson.dumps({"detail": message})
        head = [STATUS_LINE[status]]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"warning: " + warning_header(message).encode() + b"\r\n", b"connection: close\r\n\r\n"]
        self._end_head()
        self.transport.write(b"".join(head) + body)
        # Lingering close (RFC 9112 §9.6): closing with unread input makes the kernel
        # send a reset that can destroy the answer at the client. Half-close, discard
        # what still arrives for LINGER seconds, then close.
        if self.transport.can_write_eof():
            self._lingering = True
            self.transport.write_eof()
            self.loop.call_later(LINGER, self.transport.close)
        else:
            self.transport.close()


def uvicorn_options(settings) -> dict[str, Any]:
    """uvicorn.Config/uvicorn.run keywords of the request-head guard (``settings``:
    :class:`dicomweb_server.settings.Settings`). A partial of a module-level class
    pickles, so worker processes get it too."""
    return {"http": functools.partial(GuardedHttpToolsProtocol, header_timeout=settings.header_timeout,
                                      max_header_bytes=settings.max_header_bytes)}


def raise_open_files_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit (inherited by
    worker processes): the default soft limit of 1,024 lets a few hundred idle or
    slow clients lock everyone else out. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:  # e.g. above fs.nr_open
            log.warning("cannot raise the open files limit from %s to %s: %s", soft, target, e)
    return soft

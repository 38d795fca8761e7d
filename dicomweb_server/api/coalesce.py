"""The writes of one event-loop turn to a connection, sent with one system call.

uvicorn writes an answer's head when the application sends ``http.response.start``
and each body piece when it is sent, and uvloop's transport hands each write to the
socket at once: a WADO-RS instance answer (head, part header, file, closing
boundary) was four ``write(2)`` calls and four TCP segments (TCP_NODELAY is on), each
going through the kernel's TCP path and waking the client. In a py-spy GIL profile of
WADO-RS instance under wrk the head's write alone was ~40% of the worker's time once
the file was read on the event loop (issue 33, docs/notes/readcpu.md).

:class:`CoalescingTransport` sits between uvicorn's protocol (and so every answer)
and the transport: what is written during one turn of the event loop is kept and
handed to the transport's ``writelines`` (one ``writev(2)``) by a callback scheduled
with ``call_soon``, i.e. as soon as the code writing gives the loop back (an
``await`` that waits) and before the loop reads or writes anything else for it.
Nothing is held longer than that turn, and bytes keep their order:

- more than :data:`HOLD_BYTES` kept are handed over at once, so the transport's flow
  control (its high-water mark pauses the protocol, and uvicorn's ``send`` waits for
  the drain) bounds what an answer holds, as before;
- every other use of the transport (``close``, ``write_eof``, ``abort``, its buffer
  size and limits, ``set_protocol``...) first hands over what is kept; reading-side
  calls (``pause_reading``, ``resume_reading``), ``is_closing`` and
  ``get_extra_info`` do not need to;
- on a transport already closing, writes go straight to it, as without this class.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: bytes kept before they are handed to the transport without waiting for the turn's end
HOLD_BYTES = 256 * 1024


class CoalescingTransport:
    """A transport that writes what one event-loop turn wrote in one ``writelines``."""

    __slots__ = ("_transport", "_loop", "_kept", "_size", "_scheduled")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._kept: list[bytes] = []
        self._size = 0
        self._scheduled = False

    @property
    def transport(self) -> asyncio.Transport:
        """The transport underneath."""
        return self._transport

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._transport.is_closing():
            self._transport.write(data)
            return
        self._kept.append(data)
        self._size += len(data)
        if self._size > HOLD_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._turn_ended)

    def writelines(self, data) -> None:
        for piece in data:
            self.write(piece)

    def _turn_ended(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand what is kept to the transport (dropped if it is closing: the connection is gone)."""
        if not self._kept:
            return
        kept, self._kept, self._size = self._kept, [], 0
        if self._transport.is_closing():
            return
        if len(kept) == 1:
            self._transport.write(kept[0])
        else:
            self._transport.writelines(kept)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        self.flush()
        return self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:  # write_eof, abort, set_write_buffer_limits, set_protocol...
        self.flush()
        return getattr(self._transport, name)

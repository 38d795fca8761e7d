"""The MLLP listener of HL7 v2 orders (``hl7_port``): ORM^O01 NW / CA messages become new
and cancelled worklist entries (hl7v2.py), each answered with an ACK once durably done.

MLLP (HL7 v2.5 Appendix C, Minimal Lower Layer Protocol): each message framed as
``<VT> message <FS><CR>``; python-hl7's asyncio streams (``hl7.mllp``) read and write the
frames. The listener is an asyncio loop in a thread of the DIMSE listener process (bound
with SO_REUSEPORT: ``serve``'s listener processes share the port as they share the DIMSE
one). The index writes run in the loop's executor, never on the loop.

- A message longer than ``hl7_max_message`` bytes, or a frame that does not begin with
  <VT>, or a message without an MSH segment, cannot be acknowledged (the ACK echoes its
  Message Control ID): logged, and the connection closed; nothing is written.
- A connection that sends nothing for :data:`IDLE_SECONDS` is closed (an order system
  reconnects; an idle socket is not held for ever).
- Otherwise the ACK's MSA-1 is ``AA`` (accepted: the new entries stored in one durable
  commit, then each cancel in its own: a message mixing NW and CA that fails between them
  is answered ``AE`` with its new entries stored: the sender's resend stores them again,
  identically), ``AE`` (application error: a required field missing, a cancel of an
  entry the worklist does not hold, the index unable to write) or ``AR`` (rejected: not an
  ORM^O01, or an order control other than NW and CA), with the reason in MSA-3.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import hl7
from hl7.mllp import InvalidBlockError, start_hl7_server

from ..store.base import Index
from .hl7v2 import ACCEPT, ERROR, OrderError, ack, orders

log = logging.getLogger("dicomweb_server.hl7")


def apply(index: Index, msg: hl7.Message) -> tuple[str, str]:
    """Do what an ORM^O01 asks: (acknowledgment code, text)."""
    try:
        found = orders(msg)
    except OrderError as e:
        return e.code, str(e)
    new = [o.entry for o in found if o.entry is not None]
    cancelled = [o.sps_id for o in found if o.control == "CA"]
    missing = [sps for sps in cancelled if index.worklist_entry(sps) is None]
    if missing:
        return ERROR, f"no worklist entry {missing[0]!r} to cancel"
    try:
        if new:
            index.put_worklist(new)  # type: ignore[arg-type]
        for sps in cancelled:
            index.delete_worklist(sps)
    except Exception as e:  # noqa: BLE001 - the sender is told, and sends it again
        log.exception("HL7 order not stored")
        return ERROR, f"not stored: {e}"
    return ACCEPT, ""


def decode(block: bytes) -> str:
    """UTF-8, else ISO 8859-1 (HL7's default character set is ASCII: both read it)."""
    try:
        return block.decode("utf-8")
    except UnicodeDecodeError:
        return block.decode("latin-1")


#: seconds a connection may stay silent between messages
IDLE_SECONDS = 300.0


class OrderListener:
    """The MLLP port of one DIMSE listener process: :meth:`start`, :meth:`stop`."""

    def __init__(self, index: Index, application: str, max_message: int) -> None:
        self.index = index
        self.application = application  # MSH-3 of the ACKs: the archive's AE title
        self.max_message = max_message
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server = None

    def start(self, host: str, port: int) -> int:
        """Listen (port 0: an ephemeral one); returns the bound port once it accepts."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                self._server = loop.run_until_complete(start_hl7_server(
                    self._serve, host, port, limit=self.max_message, reuse_port=True))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as e:  # noqa: BLE001 - given to start()
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="hl7-mllp", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self.port  # type: ignore[return-value]

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None or self._thread is None:
            return

        async def close() -> None:
            server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)

    async def _serve(self, reader, writer) -> None:
        peer = writer.get_extra_info("peername")
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    block = await asyncio.wait_for(reader.readblock(), IDLE_SECONDS)
                except asyncio.IncompleteReadError:
                    return  # the sender closed
                except TimeoutError:
                    log.info("HL7 connection from %s idle for %.0f s: closed", peer, IDLE_SECONDS)
                    return
                except ValueError:
                    log.warning("HL7 message from %s longer than %d bytes: connection closed", peer,
                                self.max_message)
                    return
                except InvalidBlockError:
                    log.warning("HL7 from %s: a frame not beginning with <VT> (MLLP): connection closed", peer)
                    return
                try:
                    msg = hl7.parse(decode(block))
                    msg.segment("MSH")
                except Exception as e:  # noqa: BLE001 - cannot be acknowledged without its MSH
                    log.warning("HL7 from %s cannot be parsed (%s): connection closed", peer, e)
                    return
                code, text = await asyncio.get_running_loop().run_in_executor(None, apply, self.index, msg)
                log.log(logging.INFO if code == ACCEPT else logging.WARNING, "HL7 %s from %s: %s %s",
                        msg["MSH.F10"], peer, code, text)
                writer.writemessage(ack(msg, code, text, self.application))
                await writer.drain()
        finally:
            writer.close()

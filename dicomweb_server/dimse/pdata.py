"""P-DATA-TF PDUs received without pynetdicom's per-PDU objects and copies (PS3.8 §9.3.5, Annex E).

Why by hand: perf on a listener receiving 512 KB CTs from one DCMTK ``storescu`` (2026-12-04)
put 53 % of its CPU in the interpreter and 11 % in libc (``memmove``, ``malloc``). pynetdicom
reads a PDU by extending a ``bytearray`` with its header and body (copy 1), ``_decode_pdu``
turns that into ``bytes`` (2), ``P_DATA_TF.decode`` slices each PDV out of it (3) and the DIMSE
layer writes ``data[1:]`` to the spool file (4): four copies of every data set in Python, plus a
PDU object, its items, a primitive, two event triggers and a trip through the state machine
per PDU.

For a P-DATA-TF PDU received in Sta6 (association established) the state machine's only
action is DT-2: give the PDVs to the DIMSE service user and stay in Sta6 (PS3.8 §9.2, Table
9-10). Here such a PDU is read into one buffer and its PDVs go to the DIMSE provider as views
of that buffer (what DT-2 does with pynetdicom's copies): a data set's fragments reach the
spool file with no copy in Python. The DIMSE layer, its checks and its errors are pynetdicom's,
behind :func:`receive_primitive`.

pynetdicom's own path is kept, with its events and errors, when: the state is not Sta6;
another PDU or event is still queued for the state machine (order); a handler is bound to
``EVT_DATA_RECV``, ``EVT_PDU_RECV`` or ``EVT_FSM_TRANSITION`` (they are given pynetdicom's
objects); or the PDV items do not parse exactly (pynetdicom then fails the PDU the way it
does today). Any other PDU type goes the same way, from the bytes read here.

:func:`receive_primitive` then hands the PDVs to pynetdicom one at a time, after checking the
rules of message assembly that pynetdicom does not (PS3.7 §6.3.1, PS3.8 §9.3.5 and Annex E):
found by attacking the listener with crafted PDUs, each broken rule used to lose or leak
something. A PDU that breaks one aborts its association (event 19, A-ABORT) and drops the
data set being received. A C-STORE-RQ's last command fragment goes first to
:func:`.cstore_rx.begin`: a C-STORE the archive's own path takes is received, stored and
answered on this thread (:mod:`.cstore_rx`); anything else goes on to pynetdicom.
"""

from __future__ import annotations

import logging
import os
import struct

from pynetdicom import dimse as _dimse
from pynetdicom import dul as _dul
from pynetdicom import evt
from pynetdicom.pdu import A_ABORT_RQ
from pynetdicom.pdu_primitives import P_DATA

from .cstore_rx import Receiver, begin, finish

log = logging.getLogger("dicomweb_server.dimse")

DUL = _dul.DULServiceProvider
_ORIGINAL = DUL._read_pdu_data
_HEADER = struct.Struct(">BBL")
_ITEM = struct.Struct(">LB")  # PDV item: Item-length, Presentation-context-ID (PS3.8 §9.3.5.1)
_OBJECT_EVENTS = (evt.EVT_DATA_RECV, evt.EVT_PDU_RECV, evt.EVT_FSM_TRANSITION)
_RECEIVE_PRIMITIVE = _dimse.DIMSEServiceProvider.receive_primitive

#: a command set longer than this is not one (C-STORE-RQ's are ~200 bytes)
COMMAND_MAX = 64 * 1024
#: data sets kept in memory (C-FIND/C-GET/C-MOVE identifiers; a C-STORE's goes to a file)
MEMORY_DATA_SET_MAX = 16 << 20


class PDURefused(OSError):
    """A PDU this listener does not read to its end: longer than the Maximum Length it
    announced (PS3.8 §D.1.1; ``reason`` 6, invalid PDU parameter value), or too slow to
    arrive (``reason`` 0). The peer gets an A-ABORT before the connection is closed."""

    def __init__(self, message: str, reason: int) -> None:
        super().__init__(message)
        self.reason = reason  # A-ABORT Reason/Diag. (PS3.8 Table 9-26)


def pdv_items(body) -> list | None:
    """The PDV items of a P-DATA-TF PDU's body (after its 6-byte header) as (presentation
    context ID, view of the value: message control header + fragment), or None when they do
    not tile the body exactly: each item's length counts its context ID and at least the
    message control header (PS3.8 §9.3.5.1, Annex E.2)."""
    view = memoryview(body)
    items = []
    offset, end = 0, len(body)
    while offset < end:
        if end - offset < 6:
            return None
        length, context_id = _ITEM.unpack_from(body, offset)
        if length < 2 or offset + 4 + length > end:
            return None
        items.append((context_id, view[offset + 5:offset + 4 + length]))
        offset += 4 + length
    return items or None


def _fast_lane(dul) -> bool:
    if dul.state_machine.current_state != "Sta6" or not dul._recv_pdu.empty() or not dul.event_queue.empty():
        return False
    assoc = dul.assoc
    return not any(assoc.get_handlers(e) for e in _OBJECT_EVENTS)


def _refuse(dul, exc: PDURefused) -> None:
    """An A-ABORT to the peer (source: service provider; PS3.8 §9.3.8), then the connection
    ends as if closed (event 17): the rest of a PDU not read is not waited for or read, as
    it would be in Sta13 after event 19 (for up to the ARTIM timeout)."""
    log.warning("PDU refused: %s; association aborted", exc)
    abort = A_ABORT_RQ()
    abort.source = 0x02
    abort.reason_diagnostic = exc.reason
    try:
        dul.socket.send(abort.encode())
    except OSError:
        pass
    dul.event_queue.put("Evt17")


def _read(dul, n: int):
    """``n`` bytes from the association's socket (fewer if the peer closed), or None once the
    event for what went wrong is queued: a refused PDU (A-ABORT, then closed) or a connection
    that failed (event 17)."""
    try:
        return dul.socket.recv(n)
    except PDURefused as exc:
        _refuse(dul, exc)
    except (OSError, TimeoutError) as exc:
        log.error("Connection closed before the entire PDU was received: %s", exc)
        dul.event_queue.put("Evt17")
    return None


def read_pdu_data(self) -> None:
    """``DULServiceProvider._read_pdu_data``: the same events for the same input (Evt17 when
    the connection ends mid PDU, Evt19 for an unknown PDU type or one that does not decode),
    with a P-DATA-TF in Sta6 handed to the DIMSE provider as views of one buffer."""
    header = _read(self, 6)
    if header is None:
        return
    if len(header) != 6:
        self.event_queue.put("Evt17")
        return
    pdu_type, _, pdu_length = _HEADER.unpack(header)
    if pdu_type not in (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07):
        log.error("Unknown PDU type received '0x%02X'", pdu_type)
        self.event_queue.put("Evt19")
        return
    body = _read(self, pdu_length)  # .scp._bounded_recv: one buffer, refused beyond the PDU limit
    if body is None:
        return
    if len(body) != pdu_length:
        log.error("The received PDU is shorter than expected (%d of %d bytes received)",
                  6 + len(body), 6 + pdu_length)
        self.event_queue.put("Evt17")
        return
    if pdu_type == 0x04 and _fast_lane(self):
        items = pdv_items(body)
        if items is not None:
            primitive = P_DATA()
            primitive._presentation_data_value_list = items  # its setter wants lists of bytes
            try:  # DT-2 (pynetdicom fsm.DT_2), Sta6 -> Sta6
                self.assoc.dimse.receive_primitive(primitive)
            except Exception as exc:  # as StateMachine.do_action: the DUL ends
                log.error("State Machine received an exception attempting to perform the action "
                          "'DT-2' while in state 'Sta6': %s", exc)
                self.kill_dul()
            return
    try:  # pynetdicom's decode (its events and errors) for everything else
        pdu, event = self._decode_pdu(header + body)
        self.event_queue.put(event)
    except Exception as exc:
        log.error("Unable to decode the received PDU data: %s", exc)
        self.event_queue.put("Evt19")
        return
    self._recv_pdu.put(pdu)


def _broken_rule(provider, context_id: int, value) -> str | None:
    """Why the PDV ``(context_id, value)`` cannot be the next fragment of the message being
    received (``provider.message``), or None. pynetdicom accepted, and lost or leaked by:
    a data set fragment before any command (kept in memory without bound); a new command
    in the middle of a C-STORE's data set (its spool file left behind for good: a peer could
    fill the disk); a data set on another presentation context than its command (stored
    as if sent in the command's transfer syntax)."""
    if context_id not in provider.assoc._accepted_cx:
        return f"a PDV on presentation context {context_id}, which the association did not accept"
    msg = provider.message
    context = getattr(msg, "_pdv_context", None)
    if context is not None and context_id != context:  # PS3.8 Annex E: one message, one context
        return f"a fragment on presentation context {context_id} of a message sent on context {context}"
    command = value[0] & 1  # message control header bit 0 (PS3.8 E.2)
    if msg is None or msg.context_id is None:  # its command set is being received
        if not command:
            return "a data set fragment before its message's command set (PS3.7 §6.3.1)"
        if msg is not None and msg.encoded_command_set.tell() + len(value) > COMMAND_MAX:
            return f"a command set of more than {COMMAND_MAX} bytes"
        return None
    if command:
        return "a command set fragment in the middle of a message's data set (PS3.7 §6.3.1)"
    # (a C-STORE on the archive's path bounds its own memory: cstore_rx.Receiver)
    if (type(msg) is not Receiver and msg._data_set_file is None
            and msg.data_set.tell() + len(value) > MEMORY_DATA_SET_MAX):
        return f"a data set of more than {MEMORY_DATA_SET_MAX >> 20} MiB in a message other than C-STORE"
    return None


def receive_primitive(self, primitive) -> None:
    """``DIMSEServiceProvider.receive_primitive``, one PDV at a time, each checked by
    :func:`_broken_rule`. One at a time because pynetdicom's ``decode_msg`` stops at the
    first message completed in a P-DATA and drops the PDVs after it (a P-DATA-TF may carry
    fragments of consecutive messages: PS3.8 §9.3.5): a C-STORE whose last data fragment
    shared a PDU with the next command was stored, never answered, and its association
    aborted. A PDU without a PDV (PS3.8 §9.3.5 requires one or more), a broken rule or a
    command set that does not parse aborts the association (event 19) and removes the data
    set being spooled (pynetdicom decodes the command set outside its reactor's error
    handling: an exception there killed the association's reactor thread)."""
    try:
        pdvs = primitive.presentation_data_value_list
        if not pdvs:
            raise ValueError("a P-DATA-TF without a presentation data value item (PS3.8 §9.3.5)")
        for context_id, value in pdvs:
            why = _broken_rule(self, context_id, value)
            if why:
                raise ValueError(why)
            msg = self.message
            if type(msg) is Receiver:  # a C-STORE's data set, on the archive's path (cstore_rx.py)
                msg.write(value[1:])
                if value[0] & 2:
                    finish(self, msg)
                continue
            if value[0] & 3 == 3 and (msg is None or msg.context_id is None):
                rx = begin(self, context_id, value)  # a C-STORE-RQ the archive's path takes, or None
                if rx is not None:
                    self.message = rx
                    continue
            spool = getattr(msg, "_data_set_file", None)
            if spool is not None and not value[0] & 3:  # a C-STORE data fragment, not the last
                # what decode_msg does for it, without its flush per fragment: 1-byte PDVs cost
                # pynetdicom a write system call each (~0.5 s of CPU per MiB sent that way)
                spool.write(value[1:])
                continue
            if len(pdvs) == 1:
                one = primitive
            else:
                one = P_DATA()
                one._presentation_data_value_list = [(context_id, value)]
            _RECEIVE_PRIMITIVE(self, one)
            if self.message is not None:  # a message still being received: its context
                self.message._pdv_context = context_id
    except Exception as e:
        log.warning("DIMSE message refused (%s): association aborted", e)
        drop_partial(self.assoc)
        self.message = None
        self.dul.event_queue.put("Evt19")


def drop_partial(assoc) -> None:
    """Remove the spool file of a C-STORE data set the association did not finish
    (aborted, closed, or refused mid data set): nothing is left in the spool."""
    msg = getattr(getattr(assoc, "dimse", None), "message", None)
    f = getattr(msg, "_data_set_file", None)
    if f is None:
        return
    try:
        f.close()  # (a full disk can fail the close's flush: the name is removed all the same)
    except OSError:
        pass
    try:
        os.unlink(f.name)
    except OSError:
        pass


def install() -> None:
    DUL._read_pdu_data = read_pdu_data  # type: ignore[method-assign]
    _dimse.DIMSEServiceProvider.receive_primitive = receive_primitive  # type: ignore[method-assign]


def uninstall() -> None:
    DUL._read_pdu_data = _ORIGINAL  # type: ignore[method-assign]
    _dimse.DIMSEServiceProvider.receive_primitive = _RECEIVE_PRIMITIVE  # type: ignore[method-assign]

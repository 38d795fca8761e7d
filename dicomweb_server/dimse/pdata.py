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
spool file with no copy in Python. The DIMSE layer, its checks and its errors are pynetdicom's
(and :func:`.scp._receive_primitive_or_abort`'s).

pynetdicom's own path is kept, with its events and errors, when: the state is not Sta6;
another PDU or event is still queued for the state machine (order); a handler is bound to
``EVT_DATA_RECV``, ``EVT_PDU_RECV`` or ``EVT_FSM_TRANSITION`` (they are given pynetdicom's
objects); or the PDV items do not parse exactly (pynetdicom then fails the PDU the way it
does today). Any other PDU type goes the same way, from the bytes read here.
"""

from __future__ import annotations

import logging
import struct

from pynetdicom import dul as _dul
from pynetdicom import evt

log = logging.getLogger("dicomweb_server.dimse")

DUL = _dul.DULServiceProvider
_ORIGINAL = DUL._read_pdu_data
_HEADER = struct.Struct(">BBL")
_ITEM = struct.Struct(">LB")  # PDV item: Item-length, Presentation-context-ID (PS3.8 §9.3.5.1)
_OBJECT_EVENTS = (evt.EVT_DATA_RECV, evt.EVT_PDU_RECV, evt.EVT_FSM_TRANSITION)


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


def read_pdu_data(self) -> None:
    """``DULServiceProvider._read_pdu_data``: the same events for the same input (Evt17 when
    the connection ends mid PDU, Evt19 for an unknown PDU type or one that does not decode),
    with a P-DATA-TF in Sta6 handed to the DIMSE provider as views of one buffer."""
    sock = self.socket
    try:
        header = sock.recv(6)
    except (OSError, TimeoutError) as exc:
        log.error("Connection closed before the entire PDU was received: %s", exc)
        self.event_queue.put("Evt17")
        return
    if len(header) != 6:
        self.event_queue.put("Evt17")
        return
    pdu_type, _, pdu_length = _HEADER.unpack(header)
    if pdu_type not in (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07):
        log.error("Unknown PDU type received '0x%02X'", pdu_type)
        self.event_queue.put("Evt19")
        return
    try:
        body = sock.recv(pdu_length)  # .scp._bounded_recv: one buffer, refused beyond the PDU limit
    except (OSError, TimeoutError) as exc:
        log.error("Connection closed before the entire PDU was received: %s", exc)
        self.event_queue.put("Evt17")
        return
    if len(body) != pdu_length:
        log.error("The received PDU is shorter than expected (%d of %d bytes received)",
                  6 + len(body), 6 + pdu_length)
        self.event_queue.put("Evt17")
        return
    if pdu_type == 0x04 and _fast_lane(self):
        items = pdv_items(body)
        if items is not None:
            from pynetdicom.pdu_primitives import P_DATA

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


def install() -> None:
    DUL._read_pdu_data = read_pdu_data  # type: ignore[method-assign]


def uninstall() -> None:
    DUL._read_pdu_data = _ORIGINAL  # type: ignore[method-assign]

"""The C-STORE-RSP command set, encoded by hand (PS3.7 §9.3.1.2, Table 9.3-2; §6.3.1:
command sets are Implicit VR Little Endian, elements in tag order, with their group length).

Why by hand: py-spy (``--gil --idle``, the listener process, one DCMTK ``storescu``
association of 300 512 KB CTs, 2026-12-02) put 19.4 % of the listener's GIL samples in
sending the C-STORE-RSP (``StorageServiceClass.SCP`` -> ``DIMSEServiceProvider.send_msg``):
pynetdicom turns the primitive into a pydicom ``Dataset`` (``primitive_to_message``), encodes
it with ``write_dataset`` twice (once to learn the group length), then cuts it into P-DATA
fragments; the pieces are six fixed elements. pynetdicom's own path is kept for anything
else (other messages, an Offending Element, an ``EVT_DIMSE_SENT`` handler bound, a peer's
maximum PDU too small for one fragment). A test checks the bytes are pynetdicom's.

One message at a time on an association (PS3.7 §6.3.1, PS3.8 §9.3.5 and Annex E: a
message's command fragments, then its data set fragments, then the next message's). pynetdicom
queues a message for the DUL thread fragment by fragment, and the archive sends from several
threads: the DUL thread answers a C-STORE itself (:mod:`.cstore_rx`), the association thread
answers other requests and sends C-GET/C-MOVE sub-operations, the storage commitment reporter
sends its N-EVENT-REPORT (PS3.4 J.3.3) from a thread of its own. A C-STORE-RSP written
between the report's command and its data set broke the rules (tests/dimse/test_send_order.py).
:class:`SendGate`: a thread other than the DUL thread queues a whole message under the
association's send lock; the DUL thread never waits for it (it is the one draining the queue
such a sender may wait on: ``reactor._send_pdu_paced``): while another thread is inside a
message, the DUL thread's own message is held and queued by that thread right after its own.
"""

from __future__ import annotations

import struct
import threading

from pynetdicom import dimse, evt
from pynetdicom.dimse_primitives import C_STORE
from pynetdicom.pdu_primitives import P_DATA

_send_msg = dimse.DIMSEServiceProvider.send_msg


def _element(tag: int, value: bytes, pad: bytes) -> bytes:
    if len(value) % 2:
        value += pad
    return struct.pack("<HHI", tag >> 16, tag & 0xFFFF, len(value)) + value


def encode_c_store_rsp(rsp: C_STORE) -> bytes | None:
    """The command set of a C-STORE-RSP (Implicit VR LE), or None when it carries an element
    this encoder does not write (then pynetdicom encodes it)."""
    if rsp.OffendingElement is not None:
        return None
    return encode(rsp.AffectedSOPClassUID, rsp.MessageIDBeingRespondedTo, rsp.Status, rsp.ErrorComment,
                  rsp.AffectedSOPInstanceUID)


def encode(sop_class_uid, message_id_being_responded_to: int, status: int, error_comment: str | None,
           sop_instance_uid) -> bytes:
    """The command set of a C-STORE-RSP from its fields (PS3.7 Table 9.3-2): Affected SOP Class
    UID and Affected SOP Instance UID when given, Error Comment when not None."""
    us = struct.Struct("<H").pack
    parts = []
    if sop_class_uid:
        parts.append(_element(0x00000002, str(sop_class_uid).encode(), b"\x00"))
    parts += (_element(0x00000100, us(0x8001), b""),  # Command Field: C-STORE-RSP
              _element(0x00000120, us(message_id_being_responded_to), b""),
              _element(0x00000800, us(0x0101), b""),  # Command Data Set Type: no data set
              _element(0x00000900, us(status), b""))
    if error_comment is not None:
        parts.append(_element(0x00000902, str(error_comment).encode("ascii", "replace"), b" "))
    if sop_instance_uid:
        parts.append(_element(0x00001000, str(sop_instance_uid).encode(), b"\x00"))
    body = b"".join(parts)
    return _element(0x00000000, struct.pack("<I", len(body)), b"") + body


class SendGate:
    """Who is sending a message on one association (module docstring).

    ``lock`` is held by a thread other than the DUL thread for the whole of its message (and
    by the association thread around its A-RELEASE-RP: :mod:`.reactor`); reentrant, for an
    ``EVT_DIMSE_SENT`` handler that sends on the same association. ``busy`` (under
    ``mutex``) says such a message is being queued; ``held`` are the DUL thread's PDUs that wait
    for its end. ``mutex`` is held briefly, never while waiting for another thread; the DUL
    thread holds it while it writes a C-STORE-RSP to the socket (:mod:`.cstore_rx`), so a
    sender may wait for that write (for a peer that reads slowly), never the reverse."""

    __slots__ = ("lock", "mutex", "busy", "held")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.mutex = threading.Lock()
        self.busy = False
        self.held: list = []


def gate(dul) -> SendGate:
    """The association's :class:`SendGate` (made on first use; ``dict.setdefault`` is atomic)."""
    g = dul.__dict__.get("_send_gate")
    return g if g is not None else dul.__dict__.setdefault("_send_gate", SendGate())


def _fragments(self, primitive, context_id: int) -> list:
    """The P-DATA primitives of the message: a C-STORE-RSP encoded here, anything else as
    pynetdicom's ``DIMSEServiceProvider.send_msg`` encodes it (its EVT_DIMSE_SENT included)."""
    if isinstance(primitive, C_STORE) and primitive.MessageIDBeingRespondedTo is not None \
            and not self.assoc.get_handlers(evt.EVT_DIMSE_SENT):
        command = encode_c_store_rsp(primitive)
        max_pdu = self.maximum_pdu_size
        if command is not None and (not max_pdu or len(command) + 6 <= max_pdu):
            pdata = P_DATA()  # one PDV, the last (and only) command fragment: bits xxxxxx11 (PS3.8 E.2)
            pdata.presentation_data_value_list.append((context_id, b"\x03" + command))
            return [pdata]
    if primitive.MessageIDBeingRespondedTo is None:  # pynetdicom's send_msg from here on
        msg = dimse._RQ_TO_MESSAGE[primitive.__class__]()
    else:
        msg = dimse._RSP_TO_MESSAGE[primitive.__class__]()
    msg.primitive_to_message(primitive)
    msg.context_id = context_id
    evt.trigger(self.assoc, evt.EVT_DIMSE_SENT, {"message": msg})
    return msg.encode_msg(context_id, self.maximum_pdu_size)  # a generator: encoded as sent


def send_msg(self, primitive, context_id: int) -> None:
    """``DIMSEServiceProvider.send_msg``: the C-STORE-RSP encoded by :func:`encode_c_store_rsp`,
    and every message queued whole, never between another message's fragments."""
    dul = self.dul
    g = gate(dul)
    if threading.get_ident() == dul.ident:  # the DUL thread: never waits for another sender
        pdus = list(_fragments(self, primitive, context_id))
        with g.mutex:
            if g.busy:
                g.held.extend(pdus)
                return
            for pdu in pdus:  # not paced on the DUL thread: no wait
                dul.send_pdu(pdu)
        return
    with g.lock:
        with g.mutex:
            nested, g.busy = g.busy, True  # nested: an EVT_DIMSE_SENT handler of this thread's message
        queued = 0
        try:
            for pdu in _fragments(self, primitive, context_id):
                dul.send_pdu(pdu)
                queued += 1
        except BaseException:
            if queued:  # part of a message is out (e.g. a sub-operation's file failed to read):
                with g.mutex:  # nothing may follow it on this association (PS3.8 Annex E)
                    g.held = []
                self.assoc.abort()
            raise
        finally:
            if not nested:  # (a nested message leaves the flush to the outer one)
                _flush_held(dul, g)


def _flush_held(dul, g: SendGate) -> None:
    """What the DUL thread held while another thread queued its message, in its order; then
    the gate is open again."""
    while True:
        with g.mutex:
            held, g.held = g.held, []
            if not held:
                g.busy = False
                return
        for pdu in held:
            dul.send_pdu(pdu)


def install() -> None:
    dimse.DIMSEServiceProvider.send_msg = send_msg  # type: ignore[method-assign]


def uninstall() -> None:
    dimse.DIMSEServiceProvider.send_msg = _send_msg  # type: ignore[method-assign]

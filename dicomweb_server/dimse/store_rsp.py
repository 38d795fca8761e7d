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
"""

from __future__ import annotations

import struct

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


def send_msg(self, primitive, context_id: int) -> None:
    """``DIMSEServiceProvider.send_msg`` with the C-STORE-RSP encoded by :func:`encode_c_store_rsp`."""
    if isinstance(primitive, C_STORE) and primitive.MessageIDBeingRespondedTo is not None \
            and not self.assoc.get_handlers(evt.EVT_DIMSE_SENT):
        command = encode_c_store_rsp(primitive)
        max_pdu = self.maximum_pdu_size
        if command is not None and (not max_pdu or len(command) + 6 <= max_pdu):
            pdata = P_DATA()  # one PDV, the last (and only) command fragment: bits xxxxxx11 (PS3.8 E.2)
            pdata.presentation_data_value_list.append((context_id, b"\x03" + command))
            self.dul.send_pdu(pdata)
            return
    _send_msg(self, primitive, context_id)


def install() -> None:
    dimse.DIMSEServiceProvider.send_msg = send_msg  # type: ignore[method-assign]


def uninstall() -> None:
    dimse.DIMSEServiceProvider.send_msg = _send_msg  # type: ignore[method-assign]

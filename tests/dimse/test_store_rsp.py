"""The hand-encoded C-STORE-RSP (dicomweb_server/dimse/store_rsp.py) is byte for byte what
pynetdicom encodes (PS3.7 §9.3.1.2; Implicit VR Little Endian, §6.3.1)."""

from __future__ import annotations

import pytest
from pynetdicom.dimse_messages import C_STORE_RSP
from pynetdicom.dimse_primitives import C_STORE
from pynetdicom.dsutils import encode

from dicomweb_server.dimse.store_rsp import encode_c_store_rsp


def _rsp(status: int, comment: str | None, sop_uid: str) -> C_STORE:
    rsp = C_STORE()
    rsp.MessageIDBeingRespondedTo = 7
    rsp.AffectedSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"  # even length
    rsp.AffectedSOPInstanceUID = sop_uid
    rsp.Status = status
    rsp.ErrorComment = comment
    return rsp


@pytest.mark.parametrize(("status", "comment", "sop_uid"), [
    (0x0000, None, "1.2.3.4"),  # odd-length UID: NUL pad
    (0x0000, None, "1.2.3.45"),
    (0xA900, "SOP Instance UID missing", "1.2.3"),  # even comment
    (0xC000, "cannot understand: x", "1.2.826.0.1.3680043.8.498.1"),  # odd comment: space pad
    (0xA700, "", "1.2.3.4"),
])
def test_bytes_are_pynetdicoms(status, comment, sop_uid):
    rsp = _rsp(status, comment, sop_uid)
    msg = C_STORE_RSP()
    msg.primitive_to_message(rsp)
    expected = encode(msg.command_set, True, True)
    assert encode_c_store_rsp(rsp) == expected
    assert expected[:4] == b"\x00\x00\x00\x00"  # starts with Command Group Length


def test_offending_element_is_left_to_pynetdicom():
    rsp = _rsp(0xA900, None, "1.2.3")
    rsp.OffendingElement = [0x00080018]
    assert encode_c_store_rsp(rsp) is None

"""The C-STORE receive path written for the archive (issue 33): a C-STORE-RQ received, stored
and answered on the association's receiving (DUL) thread.

Why: py-spy (``--gil``, 16 associations of DCMTK ``storescu``, 2026-12-06) put about half of
the listener's GIL time per C-STORE outside the archive: pynetdicom decodes each command set
into a pydicom ``Dataset`` (PS3.7 §6.3.1: Implicit VR Little Endian) and converts it into a
primitive, writes the data set through a ``NamedTemporaryFile`` wrapper, queues the primitive
for the association thread (a wake-up: a lock released with the GIL held), which dispatches it
through ``Association._serve_request`` and ``StorageServiceClass.SCP`` to the handler, then
queues the C-STORE-RSP for the DUL thread (a second wake-up) whose state machine (Sta6, Evt9,
DT-1: PS3.8 §9.2) sends it.

Here, for a C-STORE-RQ (PS3.7 §9.3.1.1) whose command set is exactly one this module reads
(:func:`parse_c_store_rq`), :mod:`.pdata` hands the data set's fragments to a
:class:`Receiver` (the spool file, its file meta with the calling AE title written once, the
head kept in memory for the SOP Class/Instance UID check), and on the last fragment
:func:`finish` runs, on the same thread, what pynetdicom's association thread ran: the access
check (:mod:`.access`), the archive's store (the one write path: the response waits for the
file's fsync and the durable index commit), then the C-STORE-RSP (PS3.7 §9.3.1.2, encoded by
:mod:`.store_rsp`) written to the socket as DT-1 would write it: one P-DATA-TF PDU with one
PDV, the last command fragment (PS3.8 §9.3.5, Annex E.2).

pynetdicom keeps association negotiation, release, abort and every other service: anything
this path does not take is given to pynetdicom unchanged, with its events and errors, before
any of it was consumed. It does not take: a command set that is not a C-STORE-RQ, or that
carries an element, a length, a value or an order this parser does not expect (pynetdicom
decodes it, and answers, ignores or aborts as it always did: a malformed command set still
aborts the association, PS3.8 §9.3.1, event 19); a C-STORE-RQ without a data set (Command Data
Set Type 0x0101); a SOP class that is not a storage SOP class of the presentation context
(SOP Class Common Extended Negotiation included); an association whose ``EVT_C_STORE``
handler is not the archive's, or with a handler bound to an event this path would not
trigger (``EVT_DIMSE_RECV``, ``EVT_DIMSE_SENT``, ``EVT_PDU_SENT``, ``EVT_DATA_SENT``,
``EVT_FSM_TRANSITION``); a requestor; an association releasing.

While the thread stores, the association thread must not count the peer's wait as idle:
``dul._storing`` holds its network timeout off (:mod:`.reactor`), as pynetdicom's association
thread does not look at the timer while it serves.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from pathlib import Path

from pydicom.dataset import Dataset
from pynetdicom import _config, evt
from pynetdicom.dimse_primitives import C_STORE
from pynetdicom.service_class import StorageServiceClass
from pynetdicom.sop_class import uid_to_service_class

from . import store_rsp
from .access import context_mismatch
from .file_meta import _encoded_file_meta

log = logging.getLogger("dicomweb_server.dimse")

_ELEMENT = struct.Struct("<HHI")  # Implicit VR LE element header: group, element, length (PS3.5 §7.1.3)
_US = struct.Struct("<H")
_PDU = struct.Struct(">BBIIBB")  # P-DATA-TF header, one PDV item header, message control header

#: the command elements of a C-STORE-RQ (PS3.7 Table 9.3-1) and the primitive's names for them
_UI = {0x0002: "AffectedSOPClassUID", 0x1000: "AffectedSOPInstanceUID"}
_US_ELEMENTS = {0x0100: "CommandField", 0x0110: "MessageID", 0x0700: "Priority", 0x0800: "CommandDataSetType",
                0x1031: "MoveOriginatorMessageID"}
_AE = {0x1030: "MoveOriginatorApplicationEntityTitle"}
#: events pynetdicom triggers on its path that this one does not
_EVENTS = (evt.EVT_DIMSE_RECV, evt.EVT_DIMSE_SENT, evt.EVT_PDU_SENT, evt.EVT_DATA_SENT, evt.EVT_FSM_TRANSITION)
#: bytes of a received file kept in memory for the SOP Class/Instance UID check (scp._HEAD)
HEAD = 64 * 1024

_names = itertools.count()


def parse_c_store_rq(command) -> dict | None:
    """The elements of a C-STORE-RQ command set (Implicit VR LE, group 0000, PS3.7 §6.3.1,
    Table 9.3-1) by keyword, values as pydicom decodes them (UI without trailing NUL or space,
    AE without its spaces, US as int), or None when it is anything else: another command, an
    element not in the table, elements out of order or repeated, a length that is not the
    VR's, a multi-valued or empty value, bytes that are not ASCII, a truncated element."""
    data = bytes(command)
    out: dict = {}
    at, end, last = 0, len(data), -1
    while at < end:
        if end - at < 8:
            return None
        group, element, length = _ELEMENT.unpack_from(data, at)
        at += 8
        if group != 0 or element <= last or at + length > end:
            return None
        last = element
        value = data[at:at + length]
        at += length
        if element == 0x0000:
            if length != 4:
                return None
        elif element in _US_ELEMENTS:
            if length != 2:
                return None
            out[_US_ELEMENTS[element]] = _US.unpack(value)[0]
        elif element in _UI or element in _AE:
            if not value.isascii() or b"\\" in value:
                return None
            text = value.decode("ascii")
            text = text.rstrip("\0 ") if element in _UI else text.strip()
            if not text:
                return None
            out[_UI.get(element) or _AE[element]] = text
        else:
            return None
    if out.get("CommandField") != 0x0001 or out.get("CommandDataSetType", 0x0101) == 0x0101:
        return None
    if not all(k in out for k in ("MessageID", "Priority", "AffectedSOPClassUID", "AffectedSOPInstanceUID")):
        return None
    return out


def _request(fields: dict, context_id: int) -> C_STORE | None:
    """The C-STORE primitive pynetdicom would make of these elements (its setters validate
    them as they do there), or None when one is refused (pynetdicom then refuses it)."""
    req = C_STORE()
    try:
        for keyword, value in fields.items():
            if keyword not in ("CommandField", "CommandDataSetType"):
                setattr(req, keyword, value)
    except (ValueError, TypeError):
        return None
    req._context_id = context_id
    return req


def _eligible(assoc, req: C_STORE, context_id: int) -> bool:
    """Whether pynetdicom would give ``req`` to the archive's ``EVT_C_STORE`` handler with
    nothing observable on the way (module docstring)."""
    server = getattr(assoc.ae, "dicomweb_cstore", None)
    if server is None or not assoc.is_acceptor or assoc._sent_release or _config.UNRESTRICTED_STORAGE_SERVICE:
        return False
    handler = assoc.get_handlers(evt.EVT_C_STORE)
    if not handler or handler[0] != server._on_store:
        return False
    if any(assoc.get_handlers(e) for e in _EVENTS):
        return False
    sop_class = str(req.AffectedSOPClassUID)
    if sop_class in (getattr(assoc.acceptor, "accepted_common_extended", None) or {}):
        return False
    try:
        if uid_to_service_class(sop_class) is not StorageServiceClass:
            return False
    except Exception:  # noqa: BLE001 - pynetdicom's own path then says what it says
        return False
    return context_id in assoc._accepted_cx and context_mismatch(assoc, req, context_id) is None


class Receiver:
    """The data set of one C-STORE-RQ being received: stands where pynetdicom's DIMSEMessage
    stands (``DIMSEServiceProvider.message``) for :mod:`.pdata`'s checks and
    ``drop_partial``: ``context_id``, ``_pdv_context``, ``_data_set_file``."""

    __slots__ = ("request", "context_id", "_pdv_context", "_data_set_file", "path", "head", "transfer_syntax")

    def __init__(self, request: C_STORE, context_id: int, transfer_syntax: str, spool: Path, meta: bytes) -> None:
        self.request = request
        self.context_id = self._pdv_context = context_id
        self.transfer_syntax = transfer_syntax
        # PS3.10 §7.1: the preamble, "DICM", the file meta; a name of this process's spool
        # folder (scp._spool), created here (O_EXCL) with mkstemp's mode (the stored file's)
        self.path = spool / f"dimse-{os.getpid()}-{next(_names):x}.dcm"
        self._data_set_file = open(self.path, "xb", opener=lambda p, flags: os.open(p, flags, 0o600))
        head = b"\x00" * 128 + b"DICM" + meta
        self._data_set_file.write(head)
        self.head = bytearray(head)

    def write(self, fragment) -> None:
        """A data set fragment (the PDV value after its message control header)."""
        self._data_set_file.write(fragment)
        if len(self.head) < HEAD:
            self.head += fragment[:HEAD - len(self.head)]


def begin(provider, context_id: int, value) -> Receiver | None:
    """At a C-STORE-RQ's last command fragment ``value`` (message control header included): a
    :class:`Receiver` for its data set, or None (nothing consumed: pynetdicom takes it)."""
    msg = provider.message
    command = value[1:] if msg is None else msg.encoded_command_set.getvalue() + bytes(value[1:])
    fields = parse_c_store_rq(command)
    if fields is None:
        return None
    req = _request(fields, context_id)
    assoc = provider.assoc
    if req is None or not _eligible(assoc, req, context_id):
        return None
    ts = assoc._accepted_cx[context_id].transfer_syntax[0]
    ae = str(assoc.requestor.ae_title).strip().encode("ascii", "replace")[:16].ljust(16)
    meta = _encoded_file_meta(sop_class_uid=req.AffectedSOPClassUID, sop_instance_uid=req.AffectedSOPInstanceUID,
                              transfer_syntax=ts, source_ae=ae)
    return Receiver(req, context_id, ts, assoc.ae.dicomweb_cstore.spool_dir, meta)


def _status(result) -> tuple[int, str | None] | None:
    """(Status, Error Comment) of what the archive's handler returned, as pynetdicom's
    ``ServiceClass.validate_status`` sets them; None for anything else (pynetdicom's path)."""
    if isinstance(result, int):
        return result, None
    if isinstance(result, Dataset) and "Status" in result and set(result.keys()) <= {0x00000900, 0x00000902}:
        comment = result.get("ErrorComment")
        return int(result.Status), None if comment is None else str(comment)
    return None


def finish(provider, rx: Receiver) -> None:
    """The last data set fragment is in: store and answer (module docstring; PS3.4 B.2.3)."""
    provider.message = None
    rx._data_set_file.close()
    assoc, dul, req, cx = provider.assoc, provider.dul, rx.request, rx.context_id
    req._dataset_path = rx.path
    req._dataset_file = rx._data_set_file
    policy = getattr(assoc.ae, "dicomweb_access", None)
    if policy is not None and not policy.check_request(assoc, req, cx):
        return  # answered 0x0124 (access.py), the data set removed
    provider.cancel_req = {}
    dul._storing = True
    try:
        result = assoc.ae.dicomweb_cstore.store_one(assoc, req, rx.path, rx.transfer_syntax, bytes(rx.head))
    finally:
        dul._storing = False
        try:
            os.unlink(rx.path)  # as StorageServiceClass.SCP: the spool name (a stored file is linked)
        except OSError:
            pass
    if not assoc.is_established:  # aborted meanwhile: no response (StorageServiceClass.SCP)
        return
    pdu = response_pdu(req, cx, result, provider.maximum_pdu_size)
    if pdu is None or not dul.to_provider_queue.empty() or dul.state_machine.current_state != "Sta6":
        rsp = C_STORE()
        rsp.MessageID = rsp.MessageIDBeingRespondedTo = req.MessageID
        rsp.AffectedSOPInstanceUID = req.AffectedSOPInstanceUID
        rsp.AffectedSOPClassUID = req.AffectedSOPClassUID
        rsp = StorageServiceClass(assoc).validate_status(result, rsp)
        provider.send_msg(rsp, cx)  # queued behind what is queued, sent by the state machine (DT-1)
        return
    # DT-1 (PS3.8 §9.2, Sta6 + Evt9 -> Sta6), from the thread that runs the state machine
    dul.socket.send(pdu)


def response_pdu(req: C_STORE, context_id: int, result, max_pdu: int | None) -> bytes | None:
    """The P-DATA-TF PDU of the C-STORE-RSP to ``req`` (PS3.7 §9.3.1.2: Affected SOP Class and
    Instance UID echoed, Message ID Being Responded To, Status, Error Comment) for the
    archive handler's ``result``: one PDV, the last command fragment (PS3.8 §9.3.5, E.2), the
    bytes pynetdicom's StorageServiceClass.SCP, send_msg and DT-1 write. None when
    pynetdicom's own path must encode it (another result, a Maximum Length too small)."""
    status = _status(result)
    if status is None:
        return None
    command = store_rsp.encode(req.AffectedSOPClassUID, req.MessageID, status[0], status[1],
                               req.AffectedSOPInstanceUID)
    if max_pdu and len(command) + 6 > max_pdu:
        return None
    return _PDU.pack(0x04, 0, len(command) + 6, len(command) + 2, context_id, 0x03) + command

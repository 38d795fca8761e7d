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

import io
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

from ..store.blobs import is_out_of_resources
from . import status as S
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
    ``drop_partial``: ``context_id``, ``_pdv_context``, ``_data_set_file``.

    A small data set (up to ``memory`` bytes after the file meta; the STOW-RS in-memory part
    threshold, :data:`..dicom.multipart.MEMORY_PART_BYTES`) is kept in memory, the PS3.10
    file's bytes in ``data``, and handed to the archive as STOW-RS hands its small parts:
    written once to its spool file and ``fdatasync``ed on the descriptor that wrote it, with no
    spool file created up front (issue 33). The fragment that takes it past ``memory`` opens
    the spool file and the bytes so far go there: an association holds at most ``memory``
    bytes of a data set (one C-STORE at a time on an association, PS3.7 §9.3.1), a larger one
    is never held whole.

    A write that fails (disk full, read-only storage, I/O error) keeps the error in
    ``error``, removes the spool file and drops the rest of the data set: :func:`finish`
    answers 0xA700 Refused: Out of Resources (PS3.4 B.2.3) or 0x0110 and the association
    goes on."""

    __slots__ = ("request", "context_id", "_pdv_context", "_data_set_file", "path", "head", "transfer_syntax",
                 "data", "memory", "error", "_spool")

    def __init__(self, request: C_STORE, context_id: int, transfer_syntax: str, spool: Path, meta: bytes,
                 memory: int = 0) -> None:
        self.request = request
        self.context_id = self._pdv_context = context_id
        self.transfer_syntax = transfer_syntax
        self._spool = spool
        self.error: OSError | None = None
        self.path: Path | None = None
        self._data_set_file = None
        # PS3.10 §7.1: the preamble, "DICM", the file meta
        head = b"\x00" * 128 + b"DICM" + meta
        self.memory = len(head) + memory
        # a BytesIO, not a bytearray: its getvalue() at the end hands its buffer over as
        # bytes without copying it (CPython's bytesio.c), where bytes(bytearray) copied the
        # whole data set once more (5.7 % of the listener's GIL samples, issue 33)
        self.data: io.BytesIO | None = io.BytesIO()
        self.data.write(head)
        self.head = bytearray()  # the spool file's first HEAD bytes, for the SOP UID check
        if memory <= 0:
            self._to_file()

    def _to_file(self) -> None:
        """The spool file (a name of this process's spool folder, scp._spool, created here,
        O_EXCL, with mkstemp's mode: the stored file's), the bytes so far written to it."""
        data, self.data = self.data.getvalue(), None
        self.head = bytearray(data[:HEAD])
        self.path = self._spool / f"dimse-{os.getpid()}-{next(_names):x}.dcm"
        try:
            self._data_set_file = open(self.path, "xb", opener=lambda p, flags: os.open(p, flags, 0o600))
            self._data_set_file.write(data)
        except OSError as e:
            self._failed(e)

    def _failed(self, e: OSError) -> None:
        self.error = e
        self.data = None
        f, self._data_set_file = self._data_set_file, None
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def write(self, fragment) -> None:
        """A data set fragment (the PDV value after its message control header)."""
        if self.data is not None:
            if self.data.tell() + len(fragment) <= self.memory:
                self.data.write(fragment)
                return
            self._to_file()
        if self._data_set_file is None:  # failed: the rest is dropped
            return
        try:
            self._data_set_file.write(fragment)
        except OSError as e:
            self._failed(e)
            return
        if len(self.head) < HEAD:
            self.head += fragment[:HEAD - len(self.head)]

    def take(self) -> bytes:
        """The PS3.10 file of a data set received in memory (preamble, file meta, data set),
        handed over without a copy: the buffer ``data`` filled becomes these bytes (issue 33)."""
        data, self.data = self.data.getvalue(), None
        return data

    def close(self) -> None:
        """The last fragment is in: the spool file closed (its write errors in ``error``)."""
        if self._data_set_file is not None:
            try:
                self._data_set_file.close()
            except OSError as e:
                self._failed(e)


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
    server = assoc.ae.dicomweb_cstore
    return Receiver(req, context_id, ts, server.spool_dir, meta, server.memory_data_set)


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
    """The last data set fragment is in: store and answer (module docstring; PS3.4 B.2.3).

    Whatever fails on the way (the spool file's close, the access check or its audit record,
    the access rules, the store) the peer gets an answer and the spool file is removed: an
    unexpected exception answers 0xC211, as pynetdicom's StorageServiceClass.SCP answers an
    exception of the handler, and the association goes on."""
    provider.message = None
    assoc, dul, req, cx = provider.assoc, provider.dul, rx.request, rx.context_id
    dul._storing = True  # the peer waits for this answer: not idle time (reactor.py)
    try:
        result = _store(provider, rx, assoc, req, cx)
    except Exception:
        log.exception("C-STORE from %s failed", str(assoc.requestor.ae_title).strip())
        result = S.dataset(S.STORE_HANDLER_EXCEPTION, "the archive could not process the C-STORE")
    finally:
        dul._idle_timer.restart()  # before _storing falls: the association thread must not see the
        dul._storing = False       # wait for the store as idle time (as after _serve_request)
        if rx.path is not None:
            try:
                os.unlink(rx.path)  # as StorageServiceClass.SCP: the spool name (a stored file is linked)
            except OSError:
                pass
    if result is None or ended(assoc):  # answered 0x0124, or aborted meanwhile: no response
        return
    pdu = response_pdu(req, cx, result, provider.maximum_pdu_size)
    if pdu is not None:
        g = store_rsp.gate(dul)
        with g.mutex:  # not while another thread queues a message (store_rsp.SendGate: never inside it)
            if not g.busy and not dul.to_provider_queue.queue and dul.state_machine.current_state == "Sta6":
                # DT-1 (PS3.8 §9.2, Sta6 + Evt9 -> Sta6), from the thread that runs the state machine
                dul.socket.send(pdu)
                return
    rsp = C_STORE()
    rsp.MessageID = rsp.MessageIDBeingRespondedTo = req.MessageID
    rsp.AffectedSOPInstanceUID = req.AffectedSOPInstanceUID
    rsp.AffectedSOPClassUID = req.AffectedSOPClassUID
    rsp = StorageServiceClass(assoc).validate_status(result, rsp)
    provider.send_msg(rsp, cx)  # queued behind what is queued, sent by the state machine (DT-1)


def ended(assoc) -> bool:
    """Whether the association was aborted or is being torn down, so that no C-STORE-RSP may be
    sent on it. Not ``not assoc.is_established``: pynetdicom's acceptor sets ``is_established``
    only after it sent the A-ASSOCIATE-AC and ran the ``EVT_ACCEPTED`` handlers (acse.py,
    ``_negotiate_as_acceptor``), while this thread already receives the peer's first P-DATA
    (Sta6, PS3.8 §9.2): a C-STORE answered before that flag rose (a refusal such as 0xA900
    takes microseconds; the audit handler a file write) lost its C-STORE-RSP, and the SCU
    waited out its DIMSE timeout (CI, tests/dimse/test_corpus.py, 2026-12-07)."""
    return bool(assoc.is_aborted or assoc.is_released or getattr(assoc, "_kill", False))


def _store(provider, rx: Receiver, assoc, req: C_STORE, cx: int):
    """The archive's answer to the received C-STORE (its status dataset), or None when the
    access check refused and answered it (0x0124, dimse/access.py)."""
    rx.close()
    req._dataset_path = rx.path
    req._dataset_file = rx._data_set_file
    policy = getattr(assoc.ae, "dicomweb_access", None)
    if policy is not None and not policy.check_request(assoc, req, cx):
        return None
    provider.cancel_req = {}
    if rx.error is not None:  # the spool file could not be written: nothing of it is left
        return write_failed(rx.error, assoc.requestor.ae_title)
    if rx.data is not None:  # a small data set: to the archive in memory, written once there
        data = rx.take()
        return assoc.ae.dicomweb_cstore.store_one(assoc, req, None, rx.transfer_syntax, data, data)
    return assoc.ae.dicomweb_cstore.store_one(assoc, req, rx.path, rx.transfer_syntax, bytes(rx.head))


def write_failed(e: OSError, source_ae) -> Dataset:
    """The C-STORE-RSP status of a data set the listener could not write to its spool file:
    0xA700 Refused: Out of Resources for a full disk, a quota or read-only storage (PS3.4
    B.2.3), 0x0110 Processing Failure for another I/O error (PS3.7 Annex C), with an Error
    Comment; the association goes on (before issue 33's second change it was aborted)."""
    status = S.STORE_OUT_OF_RESOURCES if is_out_of_resources(e) else S.PROCESSING_FAILURE
    log.warning("C-STORE from %s failed: cannot write the received data set: %s", str(source_ae).strip(), e)
    return S.dataset(status, f"cannot write the received data set: {e.strerror or e}")


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

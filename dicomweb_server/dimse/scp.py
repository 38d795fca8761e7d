"""The DIMSE listener: association policy and the handlers bound per event
(pynetdicom). Verification (C-ECHO), Storage (C-STORE), Query/Retrieve (C-FIND,
C-GET, C-MOVE; Patient Root and Study Root), Storage Commitment Push Model (N-ACTION,
N-EVENT-REPORT: :mod:`.commitment`), Modality Worklist (C-FIND: :mod:`.worklist`) and
Modality Performed Procedure Step (N-CREATE, N-SET: :mod:`.mpps`) SCP.

One write path: a C-STORE is streamed into a file in the archive's spool folder, then
handed to :meth:`Archive.store`, the same validation, durable placement and group commit as
STOW-RS; the C-STORE-RSP says Success only after it returns. A C-STORE-RQ the archive's own
receive path takes (:mod:`.cstore_rx`: the common case) is received, stored and answered on
the association's DUL thread; any other goes through pynetdicom (``STORE_RECV_CHUNKED_DATASET``,
the association thread and :meth:`DimseServer._on_store`).

References
----------
PS3.7 §9 (DIMSE-C), PS3.4 Annex A (Verification), Annex B (Storage; B.2.3 statuses),
Annex C (Query/Retrieve; C.4 statuses and sub-operation counts), PS3.10 §7.1 (file
meta: Media Storage SOP Class/Instance UID, Transfer Syntax, Source AE Title).
"""

from __future__ import annotations

import copy
import functools
import gc
import logging
import os
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

import orjson
from pydicom import dcmread
from pydicom import uid as U
from pynetdicom import (
    AE,
    AllStoragePresentationContexts,
    _config,
    dimse_messages,
    evt,
    transport,
)
from pynetdicom.association import Association
from pynetdicom.presentation import PresentationContext
from pynetdicom.sop_class import (
    ModalityPerformedProcedureStep,
    ModalityWorklistInformationFind,
    PatientRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelFind,
    StorageCommitmentPushModel,
    Verification,
)

from ..access.rules import Access, AccessRules
from ..archive import Archive, source_of_dimse
from ..dicom.charset import configured
from ..dicom.lean import Decline
from ..dicom.lean import _explicit_header as explicit_header
from ..dicom.multipart import MEMORY_PART_BYTES, SpooledPart
from ..settings import Settings
from ..routing import open_outbox
from ..routing.rules import Arrival
from . import access, mpps, negotiation, pdata, pins, reactor, slots, store_rsp, tls, worklist
from .commitment import Reporter
from .file_meta import _AE_SLOT_BYTES, _EncodedFileMeta, _encoded_file_meta  # noqa: F401  (pull.py, tests)
from .file_meta import _file_meta_with_ae_slot  # noqa: F401  (tests)
from .pdata import PDURefused
from . import status as S
from .find import IdentifierError, decoded_identifier, find
from .peers import Peer, load_peers
from .retrieve_scp import GET_MODELS, MOVE_MODELS, SEND_PDU_MAX, ListenerAE, RetrieveSCP, _send_c_store_from_file
from .shutdown import CLOSE_WAIT, end_associations, exit_after

log = logging.getLogger("dicomweb_server.dimse")
audit_log = logging.getLogger("dicomweb_server.audit")

#: The transfer syntaxes the archive's decoders know (issue 10; PS3.5 §10 and Annex A).
TRANSFER_SYNTAXES = [
    U.ExplicitVRLittleEndian, U.ImplicitVRLittleEndian, U.ExplicitVRBigEndian, U.DeflatedExplicitVRLittleEndian,
    U.JPEGBaseline8Bit, U.JPEGExtended12Bit, U.JPEGLossless, U.JPEGLosslessSV1,
    U.JPEGLSLossless, U.JPEGLSNearLossless, U.JPEG2000Lossless, U.JPEG2000,
    U.HTJ2KLossless, U.HTJ2KLosslessRPCL, U.HTJ2K, U.RLELossless,
]
_FIND_MODELS = {PatientRootQueryRetrieveInformationModelFind: "patient", StudyRootQueryRetrieveInformationModelFind: "study"}

# --- the received file: in the spool folder, with Source AE Title in its file meta --------
# (file_meta.py: the file meta encoded by hand, with its Source AE Title slot)


def _write_file_meta(fp, file_meta, *args, **kwargs):
    """``write_file_meta_info`` as pynetdicom's chunked receive calls it, for an encoded one."""
    if isinstance(file_meta, _EncodedFileMeta):
        fp.write(file_meta)
        return
    _write_file_meta_info(fp, file_meta, *args, **kwargs)


def _copy_contexts(obj, memo=None):
    """pynetdicom deep-copies the listener's presentation contexts for every association
    (``RequestHandler._create_association``: 170 storage SOP classes x 16 transfer
    syntaxes here, ~25 ms of CPU, most of a one-image association). Negotiation
    (``presentation.negotiate_as_acceptor``) only reads them and builds new
    PresentationContext objects for its results, and the listener never changes them
    after start: every association gets a new list of the same objects."""
    if isinstance(obj, list) and all(isinstance(c, PresentationContext) for c in obj):
        return list(obj)
    return copy.deepcopy(obj, memo)


# Largest PDU read: the Maximum Length this listener announces (PS3.8 D.1.1: the peer's
# P-DATA-TF PDUs must not exceed it), and at least 1 MiB for an A-ASSOCIATE-RQ, which the
# announced maximum does not bound (128 presentation contexts with many transfer syntaxes,
# user identity). pynetdicom reads whatever length a PDU header declares (up to 4 GiB) into
# memory, before any calling AE check: one connection could hold gigabytes.
_PDU_FLOOR = 1 << 20
_pdu_limit = _PDU_FLOOR
#: bytes/s below which a PDU still arriving after the network timeout is refused
PDU_MIN_RATE = 10 * 1024


def _bounded_recv(self, nr_bytes: int) -> bytearray:
    """``AssociationSocket.recv``: exactly ``nr_bytes`` (fewer if the peer closed), into one
    buffer sized once. pynetdicom reads 4096 bytes per ``recv`` and appends each to a
    growing bytearray: 128 system calls and reallocations for one 512 KB P-DATA PDU.

    Bounded in length (``_pdu_limit``: refused at the header) and in time: with the
    socket's timeout (the network timeout), no read waits longer than it and the whole read
    must end within it plus ``nr_bytes`` at ``PDU_MIN_RATE``. A peer trickling a PDU a byte
    every 20 s used to hold its association, and the DUL thread (so the network timeout's
    A-ABORT was never sent), for as long as it liked. Before the A-ASSOCIATE-RQ is in, the
    ACSE timeout bounds the read as well (:func:`.slots.request_time_left`: part of an
    A-ASSOCIATE-RQ held its connection for the network timeout). Either refusal is
    :class:`.pdata.PDURefused`: an A-ABORT, and the connection closed."""
    if nr_bytes > _pdu_limit:
        raise PDURefused(f"a PDU of {nr_bytes} bytes, longer than the {_pdu_limit} bytes accepted", 6)
    buf = bytearray(nr_bytes)
    view = memoryview(buf)
    got = 0
    sock = self.socket
    timeout = sock.gettimeout()  # type: ignore[union-attr]
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout + nr_bytes / PDU_MIN_RATE
    rq_left = slots.request_time_left(self)
    if rq_left is not None and deadline is not None:
        deadline = min(deadline, start + rq_left)
    try:
        while got < nr_bytes:
            if (got or rq_left is not None) and deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PDURefused(f"{got} of a PDU's {nr_bytes} bytes received in {deadline - start:.0f} s", 0)
                if left < timeout:
                    sock.settimeout(left)  # type: ignore[union-attr]
            n = sock.recv_into(view[got:])  # type: ignore[union-attr]
            if not n:  # closed: what was read so far, as pynetdicom returns it
                del view
                del buf[got:]
                return buf
            got += n
    except TimeoutError as e:
        raise PDURefused(f"{got} of a PDU's {nr_bytes} bytes received, then nothing within the "
                         f"{'ACSE' if rq_left is not None else 'network'} timeout", 0) from e
    finally:
        if deadline is not None and sock.gettimeout() != timeout:  # type: ignore[union-attr]
            sock.settimeout(timeout)  # type: ignore[union-attr]
    return buf


def _encode_msg_capped(self, context_id: int, max_pdu_length: int):
    return _encode_msg(self, context_id, min(max_pdu_length or SEND_PDU_MAX, SEND_PDU_MAX))


_write_file_meta_info = dimse_messages.write_file_meta_info  # type: ignore[attr-defined]
_encode_msg = dimse_messages.DIMSEMessage.encode_msg

_UNPATCHED = (transport.deepcopy,  # type: ignore[attr-defined]
              _config.STORE_RECV_CHUNKED_DATASET, dimse_messages.NamedTemporaryFile,  # type: ignore[attr-defined]
              dimse_messages.create_file_meta, transport.AssociationSocket.recv,  # type: ignore[attr-defined]
              transport.AssociationServer.verify_request, _config.STORE_SEND_CHUNKED_DATASET,
              Association.send_c_store, dimse_messages.DIMSEMessage.encode_msg,
              dimse_messages.write_file_meta_info, _config.LOG_HANDLER_LEVEL)


def _unpatch() -> None:
    """Undo :func:`_receive_into` (the listener stopped: other pynetdicom users in this
    process, e.g. a test's own Storage SCP, get pynetdicom's own behaviour back)."""
    (transport.deepcopy, _config.STORE_RECV_CHUNKED_DATASET,
     dimse_messages.NamedTemporaryFile, dimse_messages.create_file_meta, transport.AssociationSocket.recv,
     transport.AssociationServer.verify_request, _config.STORE_SEND_CHUNKED_DATASET,
     Association.send_c_store, dimse_messages.DIMSEMessage.encode_msg,
     dimse_messages.write_file_meta_info, _config.LOG_HANDLER_LEVEL) = _UNPATCHED
    reactor.uninstall()
    slots.uninstall()
    store_rsp.uninstall()
    pdata.uninstall()
    access.uninstall()
    negotiation.uninstall()


#: listeners started in this process: a stop that outlasts the start of the next listener
#: (its associations get up to ``shutdown_timeout`` s) must not undo the new one's patches
_generation = 0


def _receive_into(spool: Path, max_pdu: int) -> None:
    """Patch pynetdicom (process-wide: one listener per process) as described above:
    chunked receive into ``spool`` with a Source AE Title slot, P-DATA received as views of
    one buffer and checked against the rules of message assembly (:mod:`.pdata`: a broken
    rule or an unparsable command set aborts the association), a cheap copy of the
    presentation contexts, PDUs no longer than ``max_pdu`` (at least 1 MiB; 0: unlimited,
    as announced) and no slower than ``PDU_MIN_RATE`` past the network timeout; C-GET/C-MOVE
    sub-operations sent from the stored file (:mod:`.retrieve_scp`) in PDUs of at most ``SEND_PDU_MAX``;
    blocking reactors instead of pynetdicom's polling ones (:mod:`.reactor`); the
    C-STORE-RSP encoded by hand (:mod:`.store_rsp`), without pynetdicom's debug handlers;
    each presentation context accepted with the requestor's first proposed transfer syntax
    the listener supports (:mod:`.negotiation`)."""
    global _pdu_limit, _generation
    _generation += 1
    _pdu_limit = max(max_pdu, _PDU_FLOOR) if max_pdu else 1 << 32  # of the PDU's variable field
    transport.AssociationSocket.recv = _bounded_recv  # type: ignore[method-assign]
    # at most twice dimse_max_associations connections on the node, twice the per-peer limit per address (slots.py)
    transport.AssociationServer.verify_request = slots.verify_request  # type: ignore[method-assign]
    reactor.install()
    slots.install()
    transport.deepcopy = _copy_contexts  # type: ignore[attr-defined]
    _config.STORE_RECV_CHUNKED_DATASET = True
    dimse_messages.NamedTemporaryFile = functools.partial(  # type: ignore[attr-defined]
        tempfile.NamedTemporaryFile, dir=spool, prefix="dimse-")
    dimse_messages.create_file_meta = _encoded_file_meta  # type: ignore[attr-defined]
    dimse_messages.write_file_meta_info = _write_file_meta  # type: ignore[attr-defined]
    _config.STORE_SEND_CHUNKED_DATASET = True  # send_c_store(path): the data set read per fragment
    Association.send_c_store = _send_c_store_from_file  # type: ignore[method-assign]
    dimse_messages.DIMSEMessage.encode_msg = _encode_msg_capped  # type: ignore[method-assign]
    # pynetdicom's standard notification handlers (EVT_DIMSE_RECV/SENT, EVT_PDU_RECV/SENT)
    # format debug lines for every message and PDU, logged or not: 4-5 % of the listener's
    # GIL samples per C-STORE (py-spy, store_rsp.py). Debug logging of pynetdicom is off here.
    _config.LOG_HANDLER_LEVEL = "none"
    # pynetdicom decodes a C-FIND/C-GET/C-MOVE identifier a first time only to log it at INFO,
    # inflating a Deflated one without a bound (a 97 KB identifier: 48 s and 270 MB); the
    # archive's handlers read it with bounds (dicom/reading.py read_identifier, PS3.5 §A.5)
    _config.LOG_REQUEST_IDENTIFIERS = False
    store_rsp.install()  # the C-STORE-RSP encoded by hand (store_rsp.py: 19 % of GIL samples)
    pdata.install()  # P-DATA-TF as views of one buffer, PDV by PDV, message assembly checked (pdata.py)
    access.install()  # every DIMSE request checked against the listener's AccessPolicy (access.py)
    negotiation.install()  # each context accepted with the requestor's first supported syntax (negotiation.py)


#: bytes read from the head of a received file: its file meta and first elements
_HEAD = 64 * 1024


def _fill_source_ae_and_check(request, path: Path, ae_title: str, transfer_syntax: str | None = None,
                              head: bytes | None = None) -> str | None:
    """Write the calling AE title into the file meta's Source AE Title slot (in place), and
    say why the C-STORE-RQ's Affected SOP Class/Instance UID (0000,0002)/(0000,1000) are not
    the data set's SOP Class/Instance UID (0008,0016)/(0008,0018), or None (PS3.7 9.1.1.1,
    PS3.4 B.2.3: 0xA900; DCMTK's storescp answers the same). Without this a success status
    confirmed an instance that was not the one stored. A data set that does not decode is
    left to the archive, which names the fault.

    One open and one read of the file's head for both. The file meta is the listener's own
    (PS3.10 §7.1, with its group length), so the data set's first elements are read from
    just after it in the accepted ``transfer_syntax`` up to (0008,0018): ~0.09 ms, where
    ``dcmread`` of the head, file meta included, took ~0.55 ms of the ~5 ms of listener CPU
    per image. Deflated data sets, or a head that does not hold both elements, are read
    by ``dcmread``. With ``head`` (the file's first ``_HEAD`` bytes, its Source AE Title
    written on receipt: :mod:`.cstore_rx`) the file is not opened."""
    from io import BytesIO

    from pydicom.filereader import read_dataset

    if head is None:
        with open(path, "r+b") as f:
            head = f.read(_HEAD)
            at = head.find(_AE_SLOT_BYTES)
            if at >= 0:
                f.seek(at + len(_AE_SLOT_BYTES) - 16)
                f.write(ae_title.strip().encode("ascii", "replace")[:16].ljust(16))
    ds = None
    ts = U.UID(transfer_syntax) if transfer_syntax else None
    if ts is not None and not ts.is_deflated and head[128:136] == b"DICM\x02\x00\x00\x00":
        if ts.is_little_endian:
            ds = _sop_uids(head, 144 + int.from_bytes(head[140:144], "little"), ts.is_implicit_VR)
    if ds is None and ts is not None and not ts.is_deflated and head[128:136] == b"DICM\x02\x00\x00\x00":
        try:
            fp = BytesIO(head)
            fp.seek(144 + int.from_bytes(head[140:144], "little"))  # after (0002,0000) UL and the group
            ds = read_dataset(fp, is_implicit_VR=ts.is_implicit_VR, is_little_endian=ts.is_little_endian,
                              stop_when=lambda tag, vr, length: tag > 0x00080018)
            if not all(k in ds for k in ("SOPClassUID", "SOPInstanceUID")):
                ds = None
        except Exception:
            ds = None
    if ds is None:
        tags = [0x00080016, 0x00080018]
        try:
            ds = dcmread(BytesIO(head), stop_before_pixels=True, specific_tags=tags)
            if len(head) == _HEAD and not all(k in ds for k in ("SOPClassUID", "SOPInstanceUID")):
                raise EOFError  # the head was cut before them: the file itself
        except Exception:
            try:
                ds = dcmread(path, stop_before_pixels=True, specific_tags=tags)
            except Exception:
                return None
    for keyword, command in (("SOPInstanceUID", "AffectedSOPInstanceUID"),
                             ("SOPClassUID", "AffectedSOPClassUID")):
        have, said = str(ds.get(keyword, "")).strip("\x00 "), str(getattr(request, command, "")).strip("\x00 ")
        if have and have != said:
            return f"{command} {said[:64]!r} of the command is not the data set's {keyword} {have[:64]!r}"
    return None


def _sop_uids(head: bytes, pos: int, implicit: bool) -> dict[str, str] | None:
    """SOP Class and Instance UID (0008,0016), (0008,0018) of the Little Endian data set at
    ``pos`` in ``head`` (PS3.5 §7.1.2, §7.1.3), walked element by element up to them, decoded
    as pydicom's ``read_dataset`` decodes a UI (PS3.5 §6.2: Latin-1, trailing NUL and spaces
    dropped): the same values without building a Dataset (~15 % of the listener's GIL time
    per C-STORE, py-spy 2026-12-06). None (pydicom reads them) for anything else: an undefined
    length before them, a VR other than UI or one :mod:`..dicom.lean` does not read, a
    multi-valued UID, an element cut by the head, either one missing."""
    found: dict[str, str] = {}
    n = len(head)
    try:
        while pos + 8 <= n:
            group, element = struct.unpack_from("<HH", head, pos)
            tag = group << 16 | element
            if tag > 0x00080018:
                break
            if implicit:
                (length,) = struct.unpack_from("<I", head, pos + 4)
                pos += 8
                if length == 0xFFFFFFFF or pos + length > n:
                    return None
            else:
                vr, length, pos = explicit_header(head, pos, n)
                if tag in (0x00080016, 0x00080018) and vr != b"UI":
                    return None
            if tag in (0x00080016, 0x00080018):
                value = head[pos:pos + length]
                if b"\\" in value:
                    return None
                found["SOPClassUID" if tag == 0x00080016 else "SOPInstanceUID"] = \
                    value.decode("latin-1").rstrip("\0 ")
            pos += length
    except Decline:
        return None
    return found if len(found) == 2 else None


_status = S.dataset


def store_received(archive: Archive, request, path: Path | None, source_ae: str, transfer_syntax: str | None,
                   access: Access, head: bytes | None = None, data: bytes | None = None) -> int | object:
    """Store one received C-STORE data set, a PS3.10 file in the spool folder (the file meta
    written on receipt, with the Source AE Title slot), through :meth:`Archive.store`: the
    C-STORE-RSP status (PS3.4 B.2.3). The listener's C-STORE SCP and the C-STORE
    sub-operations of a C-GET this archive requested (dimse/pull.py) both store here: one
    write path. ``source_ae``: the AE that sent it (PS3.10 §7.1 Source AE Title); ``head``: the
    file's head, its Source AE Title already written (:func:`_fill_source_ae_and_check`).
    ``data``: instead of ``path``, the whole PS3.10 file of a small data set received in
    memory (:mod:`.cstore_rx`), stored as a STOW-RS part in memory is (written once, its data
    ``fdatasync``ed on the descriptor that wrote it); a write that fails there answers 0xA700
    (disk full, read-only storage: PS3.4 B.2.3) or 0x0110."""
    try:
        mismatch = _fill_source_ae_and_check(request, path, source_ae, transfer_syntax, head)
        if mismatch:
            if path is not None:
                path.unlink(missing_ok=True)
            log.warning("C-STORE from %s refused: %s", source_ae, mismatch)
            return _status(S.STORE_DATASET_MISMATCH, mismatch)
        if data is not None:
            part = SpooledPart(data=data, size=len(data), complete=True)
        else:
            part = SpooledPart(path=path, size=path.stat().st_size, complete=True)
        # the calling AE title: the instance's source, and labels on arrival by
        # SourceApplicationEntityTitle (access/labels_in.py)
        outcome = archive.store([part], access=access, source=source_of_dimse(source_ae),
                                arrival=Arrival(calling_ae=str(source_ae).strip()))
    except Exception as e:  # never a dead association thread: a failure status instead
        log.exception("C-STORE failed")
        try:
            if path is not None:
                path.unlink()
        except OSError:
            pass
        return _status(S.PROCESSING_FAILURE, f"processing failure: {e}")
    if outcome.stored:
        return S.SUCCESS
    failed = outcome.failed[0]
    log.warning("C-STORE from %s failed: %s", source_ae, failed.message)
    return _status(S.store_status(failed.reason), failed.message)


class DimseServer(RetrieveSCP):
    """The listener of one archive; :meth:`start` returns once it accepts associations."""

    def __init__(self, archive: Archive, settings: Settings | None = None, slots_fd: int | None = None) -> None:
        self.archive = archive
        self.settings = settings or archive.settings
        self.slots_fd = slots_fd  # the node's slot table (serve's listeners); None: this listener's own
        self.peers: dict[str, Peer] = load_peers(self.settings.dimse_peers_file)
        self.access = access.AccessPolicy(self.settings, self.peers)  # who may do what (access.py)
        # which studies each calling AE title may see (access/rules.py: "ae:" entries)
        self.rules = AccessRules.load(self.settings.access_rules, self.settings.access_rules_file)
        self.ae = self._make_ae()
        self.ae.dicomweb_access = self.access  # type: ignore[attr-defined]
        self.ae.dicomweb_cstore = self  # C-STORE received and answered on the DUL thread (cstore_rx.py)
        self.spool_dir: Path | None = None
        #: a C-STORE data set up to this many bytes is received in memory and written once by
        #: the archive (cstore_rx.Receiver), as a STOW-RS part up to it is (dicom/multipart.py)
        self.memory_data_set = MEMORY_PART_BYTES
        self._server = None
        self._tls_server = None
        self.tls_port: int | None = None  # the TLS port bound by start (PS3.15 Annex B)
        self._outbox = None  # the storage commitment reports' (commitment.py), opened by start()
        self.commitment: Reporter | None = None
        self.orders = None  # the HL7 v2 orders' MLLP port (orders/mllp.py) with hl7_port

    # --- association policy (kept out of the handlers) ----------------------------------

    def _make_ae(self) -> AE:
        s = self.settings
        ae = ListenerAE(ae_title=s.ae_title)  # a refused C-MOVE: no association (retrieve_scp.py)
        # the limits are the node's (slots.py): pynetdicom's own (acceptor threads of this
        # process, connections without an A-ASSOCIATE-RQ included) never reached
        ae.maximum_associations = 4 * s.dimse_max_associations + 1
        ae.acse_timeout = s.dimse_acse_timeout
        ae.dimse_timeout = s.dimse_timeout
        ae.network_timeout = s.dimse_network_timeout
        ae.maximum_pdu_size = s.dimse_max_pdu
        ae.require_called_aet = s.dimse_check_called_ae
        ae.require_calling_aet = list(s.dimse_allowed_aes)
        ae.add_supported_context(Verification)
        for cx in AllStoragePresentationContexts:
            # scp_role: a C-GET requestor is the Storage SCP on this association (PS3.7 D.3.3.4)
            ae.add_supported_context(cx.abstract_syntax, TRANSFER_SYNTAXES, scu_role=True, scp_role=True)
        for model in (*_FIND_MODELS, *GET_MODELS, *MOVE_MODELS, ModalityWorklistInformationFind):
            ae.add_supported_context(model)
        # the requester is the SCU; the N-EVENT-REPORT goes back on this association (PS3.4 J.3)
        ae.add_supported_context(StorageCommitmentPushModel)
        ae.add_supported_context(ModalityPerformedProcedureStep)  # N-CREATE, N-SET (PS3.4 F.7: mpps.py)
        return ae

    def _open_commitment(self) -> Reporter:
        """The storage commitment reporter, on routing's outbox (or one opened for it)."""
        routing = self.archive.routing
        if routing is not None:
            outbox = routing.outbox
        else:
            outbox = self._outbox = open_outbox(self.settings, self.archive.committer.writer)
        reporter = Reporter(self.archive.index, outbox, self.peers, self.settings.ae_title, self.settings)
        reporter.start()
        return reporter

    def start(self, host: str | None = None, port: int | None = None, tls_port: int | None = None) -> int:
        """Start listening (threads: one per association); returns the bound port (the TLS
        port when ``dimse_port`` is 0 and ``dimse_tls_port`` is not: TLS only). With
        ``dimse_tls_port`` (or ``tls_port``; 0 here: an ephemeral port) a second port serves
        DICOM over TLS (PS3.15 Annex B, :mod:`.tls`) with the same AE, handlers and
        association slots; its bound port is :attr:`tls_port`."""
        tls_port = self.settings.dimse_tls_port or None if tls_port is None else tls_port
        ssl_context = None
        if tls_port is not None:  # a bad certificate or key: refused before anything listens
            s = self.settings
            ssl_context = tls.server_context(s.dimse_tls_cert_file, s.dimse_tls_key_file, s.dimse_tls_ca_file,
                                             s.dimse_tls_require_client_cert)
        pins.check_installed()  # an error in the log, not a crash: pynetdicom outside the tested range
        self.spool_dir = self._spool()
        _receive_into(self.spool_dir, self.settings.dimse_max_pdu)
        if self.commitment is None:
            self.commitment = self._open_commitment()
        quiet_pynetdicom(self.settings.log_level)
        self.ae.dimse_slots = slots.Slots(self.settings.dimse_max_associations,  # type: ignore[attr-defined]
                                          slots.per_peer_limit(self.settings), self.slots_fd)
        handlers = [
            # first: A-ASSOCIATE-RJ (permanent) for a peer not allowed, before it can take a slot
            (evt.EVT_REQUESTED, self.access.on_requested),
            *slots.HANDLERS,  # then a slot, or A-ASSOCIATE-RJ (transient) local-limit-exceeded
            (evt.EVT_C_ECHO, lambda e: S.SUCCESS),
            (evt.EVT_C_STORE, self._on_store),
            (evt.EVT_C_FIND, self._on_find),
            (evt.EVT_C_GET, self._on_get),
            (evt.EVT_C_MOVE, self._on_move),
            (evt.EVT_N_ACTION, self.commitment.on_n_action),
            (evt.EVT_N_CREATE, functools.partial(mpps.on_n_create, self.archive.index)),
            (evt.EVT_N_SET, functools.partial(mpps.on_n_set, self.archive.index)),
            (evt.EVT_ABORTED, self._on_abort),
            (evt.EVT_CONN_CLOSE, self._on_close),
            (evt.EVT_ACCEPTED, self._audit),
            (evt.EVT_REJECTED, self._audit),
            (evt.EVT_RELEASED, self._audit),
        ]
        host = host or self.settings.host
        port = self.settings.dimse_port or None if port is None else port  # None: TLS only
        try:
            if port is not None or ssl_context is None:
                self._server = self._listen((host, port or 0), handlers)
            if ssl_context is not None:
                self._tls_server = self._listen((host, tls_port), handlers, ssl_context)
                self.tls_port = self._tls_server.server_address[1]
        except BaseException:
            if self._server is not None:
                self._server.shutdown()
                self._server = None
            self.ae.dimse_slots.close()  # type: ignore[attr-defined]
            self._stop_commitment()
            raise
        if self.settings.hl7_port and self.orders is None:
            self._start_orders(host)
        # Everything alive now (pydicom's dictionaries, pynetdicom's 2,800 supported
        # presentation contexts, the archive) lives as long as the listener: out of the
        # collector's sight. Each association allocates enough to trigger collections,
        # and each full one walked that heap: ~1 ms per one-image association.
        gc.freeze()
        return (self._server or self._tls_server).server_address[1]

    def _listen(self, address, handlers, ssl_context=None):
        """One listening port of this AE (the plain one, or the TLS one with ``ssl_context``)."""
        # socketserver listens with a backlog of 5: 16 modalities connecting at once overflowed
        # it, and each refused SYN was retried by the client's kernel 1 s later (p99 > 1 s)
        transport.ThreadedAssociationServer.request_queue_size = max(128, 2 * self.settings.dimse_max_associations)
        if self.settings.dimse_processes != 1:  # `serve` may start several listeners on this port
            transport.ThreadedAssociationServer.server_bind = _server_bind_reuseport  # type: ignore[method-assign]
        try:
            server = self.ae.start_server(address, block=False, evt_handlers=handlers, ssl_context=ssl_context)
        finally:
            del transport.ThreadedAssociationServer.request_queue_size  # socketserver's 5 again
            if "server_bind" in vars(transport.ThreadedAssociationServer):
                del transport.ThreadedAssociationServer.server_bind
        accept = server.socket.accept
        network_timeout, acse_timeout = self.ae.network_timeout, self.ae.acse_timeout

        def get_request_nodelay():  # request/response traffic: no Nagle delay (a delayed ACK costs 40 ms)
            sock, addr = accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # no read or write waits longer than the network timeout (as pynetdicom's requestor
            # sockets): an accepted socket came blocking without one, and a peer that stopped
            # mid PDU, or stopped reading, held its association and threads for ever
            sock.settimeout(network_timeout)
            if ssl_context is not None:  # the handshake in the connection's thread (finish_request)
                sock = ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            return sock, addr

        server.get_request = get_request_nodelay  # type: ignore[method-assign]
        if ssl_context is not None:
            finish_request = server.finish_request

            def finish_after_handshake(request, client_address):
                """PS3.15 B.9: no association without a completed TLS handshake (within the
                ACSE timeout); a plain DICOM client, a client without a certificate where
                one is required, or a silent one: logged, its connection closed."""
                why = tls.handshake(request, acse_timeout)
                if why == tls.CLOSED_SILENTLY:  # a port probe: nothing to act on (docs/dimse.md, Logging)
                    log.debug("DICOM TLS connection from %s:%s %s", *client_address[:2], why)
                    server.shutdown_request(request)
                    return
                if why is not None:
                    log.warning("DICOM TLS handshake with %s:%s failed: %s", *client_address[:2], why)
                    server.shutdown_request(request)
                    return
                finish_request(request, client_address)

            server.finish_request = finish_after_handshake  # type: ignore[method-assign]
        return server

    def _start_orders(self, host: str) -> None:
        """The MLLP port of HL7 v2 orders (orders/mllp.py); one that cannot listen is logged,
        DIMSE goes on."""
        from ..orders.mllp import OrderListener  # (python-hl7: imported when the port is on)

        listener = OrderListener(self.archive.index, self.settings.ae_title, self.settings.hl7_max_message)
        try:
            listener.start(host, self.settings.hl7_port)
        except OSError as e:
            log.error("HL7 MLLP port %s:%d cannot listen: %s; HL7 orders are off", host, self.settings.hl7_port, e)
            return
        self.orders = listener

    def _stop_commitment(self) -> None:
        reporter, self.commitment = self.commitment, None
        if reporter is not None:
            reporter.stop()
        outbox, self._outbox = self._outbox, None
        if outbox is not None:
            outbox.close()

    def _spool(self) -> Path:
        """``dimse/`` inside this process's spool folder (``BlobStore.spool``: locked while the
        process lives, so a starting HTTP worker's sweep never touches a data set still being
        received). What is left here at start is a crash's leftover of this process."""
        spool = self.archive.blobs.spool / "dimse"
        spool.mkdir(exist_ok=True)
        for p in spool.iterdir():
            p.unlink(missing_ok=True)
        return spool

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let the associations go on for at most ``grace`` seconds (default
        ``shutdown_timeout``), abort the rest (:func:`.shutdown.end_associations`)."""
        servers = [s for s in (self._server, self._tls_server) if s is not None]
        self._server = self._tls_server = None
        if not servers:
            return
        generation = _generation
        for one in servers:
            one.block_on_close = False  # server_close must not wait for connection threads
            one.shutdown()  # the accept loop ends, the listening socket is closed
        deadline = time.monotonic() + (self.settings.shutdown_timeout if grace is None else grace)
        for one in servers:
            end_associations(one, deadline - time.monotonic())
        self.ae.dimse_slots.close()  # type: ignore[attr-defined]
        self._stop_commitment()
        orders, self.orders = self.orders, None
        if orders is not None:
            orders.stop()
        if generation == _generation:  # no other listener started in this process meanwhile
            _unpatch()
            gc.unfreeze()

    # --- audit ----------------------------------------------------------------------------

    def _audit(self, event) -> None:
        assoc = event.assoc
        record = {
            "event": event.event.name.removeprefix("EVT_").lower(),
            "protocol": "DIMSE",
            "calling_ae": _calling_ae(assoc),
            "called_ae": assoc.acceptor.ae_title,
            "peer": f"{assoc.requestor.address}:{assoc.requestor.port}",
        }
        # one line per association at INFO, when it ends (released, aborted) or is rejected
        log.log(logging.DEBUG if record["event"] == "accepted" else logging.INFO, "association %s: %s -> %s from %s",
                record["event"], record["calling_ae"], record["called_ae"], record["peer"])
        if self.settings.audit_log is not None:  # the JSON lines go to that file only (api/auth.py)
            audit_log.info(orjson.dumps(record).decode())

    def _on_abort(self, event) -> None:
        pdata.drop_partial(event.assoc)
        self._audit(event)

    def _on_close(self, event) -> None:
        pdata.drop_partial(event.assoc)

    def _access(self, event) -> Access:
        """What the association's calling AE title may see and store into (access/rules.py)."""
        return self.rules.access(access.identity_of(event.assoc), dimse=True)

    # --- C-STORE (PS3.4 B.2) --------------------------------------------------------------

    def _on_store(self, event):
        if getattr(event.request, "_dataset_path", None) is None:
            # Command Data Set Type 0x0101: a C-STORE-RQ without the data set it must carry (PS3.7 §9.3.1.1)
            return _status(S.STORE_CANNOT_UNDERSTAND, "C-STORE-RQ without a data set")
        return store_received(self.archive, event.request, Path(event.dataset_path), event.assoc.requestor.ae_title,
                              event.context.transfer_syntax, self._access(event))

    def store_one(self, assoc, request, path: Path | None, transfer_syntax: str, head: bytes,
                  data: bytes | None = None):
        """:meth:`_on_store` for :mod:`.cstore_rx` (no event object; the file meta's Source AE
        Title written on receipt, ``head`` its first bytes; ``data`` the whole file of a small
        data set received in memory, ``path`` then None)."""
        access_ = self.rules.access(access.identity_of(assoc), dimse=True)
        return store_received(self.archive, request, path, assoc.requestor.ae_title, transfer_syntax, access_, head,
                              data)

    # --- C-FIND (PS3.4 C.4.1) -------------------------------------------------------------

    def _identifier(self, event):
        """(identifier, "") or (None, why): :func:`.find.decoded_identifier`."""
        return decoded_identifier(event)

    def _on_find(self, event):
        if event.request.AffectedSOPClassUID == ModalityWorklistInformationFind:
            yield from self._on_worklist_find(event)
            return
        model = _FIND_MODELS.get(event.request.AffectedSOPClassUID)
        identifier, why = self._identifier(event)
        if model is None or identifier is None:
            yield _status(S.QR_UNABLE_TO_PROCESS, why or "identifier cannot be decoded"), None
            return
        try:
            for ds in find(self.archive.index, identifier, model, self.settings.max_results,
                           self._access(event).filter, configured(self.settings.dimse_character_set)):
                if event.is_cancelled:
                    yield S.CANCEL, None
                    return
                yield S.PENDING, ds
        except IdentifierError as e:
            yield _status(S.QR_IDENTIFIER_MISMATCH, str(e), e.offending), None
        except Exception as e:
            log.exception("C-FIND failed")
            yield _status(S.QR_UNABLE_TO_PROCESS, str(e)), None

    def _on_worklist_find(self, event):
        yield from worklist.on_find(self.archive.index, event, *self._identifier(event),
                                    default_charset=configured(self.settings.dimse_character_set))


def _calling_ae(assoc) -> str:
    """The requestor's calling AE title. pynetdicom sets ``requestor.ae_title`` from the
    A-ASSOCIATE-RQ only after the EVT_REQUESTED handlers (ACSE negotiation): an association a
    handler rejects there (slots.py: per-peer limit) has it blank, so it is read from the
    request primitive (PS3.8 §9.3.2: Calling AE Title)."""
    title = str(assoc.requestor.ae_title or "").strip()
    primitive = assoc.requestor.primitive
    if not title and primitive is not None:
        raw = primitive.calling_ae_title
        title = (raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw or "")).strip()
    return title


def _server_bind_reuseport(self) -> None:
    """pynetdicom's ``AssociationServer.server_bind`` with SO_REUSEPORT first: the listener
    processes ``serve`` starts (``dimse_processes``) bind the same port and the kernel spreads
    incoming connections over them, so DIMSE work uses more than one core (one process is
    bound to one core by the GIL: ~200 images/s of 512 KB here). pynetdicom's own bind
    ignores socketserver's ``allow_reuse_port``."""
    self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    transport.AssociationServer.server_bind(self)


def quiet_pynetdicom(log_level: str) -> None:
    """pynetdicom logs several INFO lines per association ("Accepting Association", the
    negotiated contexts...): at WARNING unless the archive's own level is DEBUG, so that
    an association is one line at INFO (its end, :meth:`DimseServer._audit`)."""
    logging.getLogger("pynetdicom").setLevel(logging.DEBUG if log_level.lower() == "debug" else logging.WARNING)


def listen_error(settings: Settings, e: OSError) -> str:
    """What a user reads when the DIMSE port cannot be bound: the port, the reason and the
    way out (HTTP keeps serving without DIMSE)."""
    ports = " and ".join(str(p) for p in (settings.dimse_port, settings.dimse_tls_port) if p)
    return (f"DIMSE listener cannot listen on {settings.host}:{ports}: {e}; "
            "DIMSE is off, HTTP goes on (another program on that port? start with "
            "--dimse-port PORT, or --dimse-port 0 to turn DIMSE off)")


def run_forever(settings: Settings, stop: threading.Event, slots_fd: int | None = None) -> int:
    """The listener as a process (started by ``dicomweb-server serve``): opens the
    archive, listens until ``stop`` is set, then ends within ``shutdown_timeout`` +
    2 x ``CLOSE_WAIT`` seconds (a watchdog exits the process if the orderly end hangs).
    ``slots_fd``: the node's association slot table (:mod:`.slots`), shared by serve's listeners."""
    archive = Archive.open(settings)
    server = DimseServer(archive, settings, slots_fd)
    try:
        port = server.start()
    except OSError as e:
        log.error("%s", listen_error(settings, e))
        archive.close()
        return 1
    # information, not a warning: `serve` prints the address once the port accepts (startup.py)
    log.debug("DIMSE listener process %d: %s at %s:%d", os.getpid(), settings.ae_title, settings.host, port)
    try:
        stop.wait()
    finally:
        # bounded, whatever the peers or a stuck thread do (shutdown.py)
        exit_after(settings.shutdown_timeout + 2 * CLOSE_WAIT)
        server.stop()
        archive.close()
    return 0

"""Storage Commitment Push Model SOP Class as SCP (PS3.4 Annex J).

A requester (a modality, usually right after its C-STOREs) asks the archive to commit
to keep instances: N-ACTION, Action Type ID 1 "Request Storage Commitment", with a
Transaction UID and a Referenced SOP Sequence (Referenced SOP Class/Instance UID per
instance; J.3.2.1). The archive answers the N-ACTION-RSP (Success: the request is
accepted and will be answered, not yet the commitment itself), then reports the
outcome with an N-EVENT-REPORT (J.3.3.1): Event Type ID 1 "Storage Commitment Request
Successful" when every instance is committed, 2 "Storage Commitment Request Complete -
Failures Exist" otherwise, with the Failed SOP Sequence and a Failure Reason per
failed instance: 0x0112 No such object instance (not stored here), 0x0119 Class /
Instance conflict (stored with another SOP Class UID).

The instances a request names are also kept in the index (:meth:`store.base.Index.declare`,
store/arrivals.py) before the N-ACTION-RSP: what the requester declared it sent, which the
operator's study page compares with what arrived (docs/notes/sources.md).

"Committed" is what a C-STORE Success already promised: the instance is durable (its
file placed and synced) and indexed. Each referenced instance is looked up in the
index (:meth:`store.base.Index.locate`) when the report is made, with its SOP Class.

The report is a job of the durable outbox (routing/outbox.py, destination
:data:`DESTINATION`, the request in ``_payload``), written before the N-ACTION-RSP:
acknowledged means owed, whatever happens next (a crash, a restart). It is written leased
to the :class:`Reporter` of the listener process that received the N-ACTION (the only one
that holds its association): the Reporters of the other listener processes sharing the
outbox do not claim it until that process has tried it (its attempt settles or releases the
lease) or has died (its lease is freed by :meth:`.Outbox.reap`, which every Reporter runs
each :data:`REAP` seconds, or expires). The Reporter delivers it:

- on the association that carried the request while that is still established
  :data:`REPORT_DELAY` after the N-ACTION-RSP (this process holds it; J.3.3: the SCP may
  send it there);
- otherwise on a new association to the requester, from the peers file (dimse/peers.py:
  its ``host`` and ``port``), on which the archive is the association requestor in the
  SCP role of the SOP Class (SCP/SCU Role Selection, PS3.7 D.3.3.4: SCU-role 0,
  SCP-role 1), as Orthanc and dcm4chee do; over DICOM TLS when the peer says ``tls = true``
  (PS3.15 Annex B, :mod:`.tls`);
- a report the requester does not take (unreachable, refused, no Success status) is
  tried again later: ``dimse_commitment_retry`` seconds, doubled each attempt (at most
  60 times that), until ``dimse_commitment_max_attempts``; then it is a dead letter of
  the outbox (``GET /admin/queue``, ``POST /admin/queue/retry``).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid

import orjson
from pydicom.dataset import Dataset
from pynetdicom import AE, build_role, evt
from pynetdicom.sop_class import StorageCommitmentPushModel, StorageCommitmentPushModelInstance

from ..routing.outbox import HELD, Outbox, Row, Settlement
from ..store.base import Index
from . import status as S
from . import tls
from .peers import Peer

log = logging.getLogger("dicomweb_server.dimse")

#: the outbox destination of every storage commitment report (routes file names cannot
#: begin with ``dimse:``: routing/rules.py)
DESTINATION = "dimse:storage-commitment"
KIND = "storage-commitment"
REQUEST_STORAGE_COMMITMENT = 1  # Action Type ID (PS3.4 J.3.2)
EVENT_SUCCESSFUL = 1  # Event Type IDs (PS3.4 J.3.3)
EVENT_FAILURES_EXIST = 2
NO_SUCH_OBJECT_INSTANCE = 0x0112  # Failure Reason (PS3.4 J.3.3.1.2; PS3.7 Annex C)
CLASS_INSTANCE_CONFLICT = 0x0119
# N-ACTION-RSP statuses (PS3.7 10.1.4.1.10, Annex C)
NO_SUCH_ACTION = 0x0123
MISSING_ATTRIBUTE = 0x0120
INVALID_ARGUMENT_VALUE = 0x0115
PROCESSING_FAILURE = 0x0110
#: seconds between the N-ACTION-RSP and the report: a requester that releases its association
#: right after the response (many do, and take the report on a new association) has done so by
#: then; a report sent while its A-RELEASE-RQ crossed it stalled both sides until a timeout
#: (the requester's release waits for the A-RELEASE-RP, the archive for the N-EVENT-REPORT-RSP)
REPORT_DELAY = 1.0
#: reports claimed at once
BATCH = 8
POLL = 1.0
#: seconds between two frees of the leases held by dead listener processes of this host
REAP = 30.0


class RequestError(ValueError):
    """An N-ACTION the archive cannot accept: its status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_request(action_type: int | None, info: Dataset | None) -> tuple[str, list[tuple[str, str]]]:
    """The Transaction UID and the (SOP Class, SOP Instance) UIDs of an N-ACTION (PS3.4
    J.3.2.1.1, Table J.3-1), or :class:`RequestError`."""
    if action_type != REQUEST_STORAGE_COMMITMENT:
        raise RequestError(NO_SUCH_ACTION, f"Action Type ID {action_type} (only 1: Request Storage Commitment)")
    if info is None:
        raise RequestError(MISSING_ATTRIBUTE, "no Action Information")
    tuid = str(info.get("TransactionUID", "") or "").strip()
    if not tuid:
        raise RequestError(MISSING_ATTRIBUTE, "no Transaction UID (0008,1195)")
    refs = []
    for item in info.get("ReferencedSOPSequence", None) or []:
        cls = str(item.get("ReferencedSOPClassUID", "") or "").strip()
        sop = str(item.get("ReferencedSOPInstanceUID", "") or "").strip()
        if not cls or not sop:
            raise RequestError(MISSING_ATTRIBUTE, "a Referenced SOP Sequence item without Referenced SOP Class "
                                                  "or Instance UID")
        refs.append((cls, sop))
    if not refs:
        raise RequestError(MISSING_ATTRIBUTE, "no Referenced SOP Sequence (0008,1199) items")
    return tuid, refs


def report(index: Index, tuid: str, refs: list[tuple[str, str]], retrieve_ae: str | None = None
           ) -> tuple[int, Dataset]:
    """The Event Type ID and Event Information of the N-EVENT-REPORT for these instances,
    as the index holds them now (PS3.4 J.3.3.1.1, Table J.3-2)."""
    ok, failed = [], []
    for cls, sop in refs:
        loc = index.locate(sop)
        item = Dataset()
        item.ReferencedSOPClassUID = cls
        item.ReferencedSOPInstanceUID = sop
        if loc is None:
            item.FailureReason = NO_SUCH_OBJECT_INSTANCE
            failed.append(item)
        elif loc.sop_class_uid != cls:
            item.FailureReason = CLASS_INSTANCE_CONFLICT
            failed.append(item)
        else:
            if retrieve_ae:
                item.RetrieveAETitle = retrieve_ae
            ok.append(item)
    ds = Dataset()
    ds.TransactionUID = tuid
    if retrieve_ae:
        ds.RetrieveAETitle = retrieve_ae
    if ok:
        ds.ReferencedSOPSequence = ok
    if failed:
        ds.FailedSOPSequence = failed
    return (EVENT_FAILURES_EXIST if failed else EVENT_SUCCESSFUL), ds


class Reporter:
    """Receives the N-ACTIONs of one listener and delivers their reports (module docstring)."""

    def __init__(self, index: Index, outbox: Outbox, peers: dict[str, Peer], ae_title: str, settings) -> None:
        self.index = index
        self.outbox = outbox
        self.peers = peers
        self.ae_title = ae_title
        self.retry = settings.dimse_commitment_retry
        self.max_attempts = settings.dimse_commitment_max_attempts
        self.timeout = settings.dimse_timeout
        self.network_timeout = settings.dimse_network_timeout
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:commitment"
        self.lease = 4 * self.timeout + 30  # a batch's lease: a few associations' timeouts
        self._held_due: list[tuple[float, str]] = []  # (due, Transaction UID) of the reports born leased here
        self._associations: dict[str, object] = {}  # Transaction UID -> the request's association
        self._answered: dict[str, threading.Event] = {}  # Transaction UID -> set once its N-ACTION-RSP is sent
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held_owner(self) -> str:
        """The lease owner of the reports this process received (:meth:`on_n_action`)."""
        return f"{self.owner}{HELD}"

    # --- the N-ACTION (the association's thread) -----------------------------------------

    def on_n_action(self, event):
        """``EVT_N_ACTION``: the request owed durably, then Success (or a failure status)."""
        req = event.request
        info = None
        if req.ActionInformation is not None:
            try:
                from .find import parsed_identifier  # bounded, unlike event.action_information (find.py)

                info = parsed_identifier(req.ActionInformation, event.context.transfer_syntax)
            except Exception as e:  # noqa: BLE001 - does not decode, or past the bounds (PS3.7 C.4.2)
                log.warning("storage commitment request from %s refused: %s", event.assoc.requestor.ae_title, e)
                return S.dataset(S.PROCESSING_FAILURE, f"Action Information cannot be decoded: {e}"), None
        try:
            tuid, refs = parse_request(req.ActionTypeID, info)
        except RequestError as e:
            log.warning("storage commitment request from %s refused: %s", event.assoc.requestor.ae_title, e)
            return S.dataset(e.status, str(e)), None
        requester = str(event.assoc.requestor.ae_title).strip()
        payload = orjson.dumps({"transaction_uid": tuid, "requester": requester, "references": refs}).decode()
        # The report may go on this association once the N-ACTION-RSP is on its way: sent
        # before it, the requester (waiting for that response) would take the report for it.
        # pynetdicom marks the association paused while the handler runs, so a send from the
        # reporter thread is not held back: the reporter waits for the response's EVT_DIMSE_SENT
        # (bound on this association only: the listener's hand-encoded C-STORE-RSP stays on
        # for the others, store_rsp.py).
        answered = threading.Event()
        assoc = event.assoc

        def on_sent(sent) -> None:
            if type(sent.message).__name__ == "N_ACTION_RSP":
                assoc.unbind(evt.EVT_DIMSE_SENT, on_sent)
                answered.set()

        with self._lock:
            # requests whose report another listener process sent: their closed associations go
            for old in [t for t, a in self._associations.items() if not getattr(a, "is_established", False)]:
                self._associations.pop(old, None)
                self._answered.pop(old, None)
            self._associations[tuid] = assoc
            self._answered[tuid] = answered
        try:
            # what the requester declared it sent (the operator's page: arrived N of declared M)
            self.index.declare(tuid, requester, refs, time.time())
            # leased to this process, which alone holds the association: no other listener
            # process claims it before this one has tried it there
            self.outbox.insert_job(DESTINATION, KIND, tuid, payload, REPORT_DELAY, owner=self.held_owner,
                                   lease=REPORT_DELAY + self.lease)
        except Exception as e:  # noqa: BLE001 - not owed: not acknowledged
            with self._lock:
                self._associations.pop(tuid, None)
                self._answered.pop(tuid, None)
            log.exception("storage commitment request cannot be queued")
            return S.dataset(PROCESSING_FAILURE, f"cannot be queued: {e}"), None
        with self._lock:
            self._held_due.append((time.time() + REPORT_DELAY, tuid))
        assoc.bind(evt.EVT_DIMSE_SENT, on_sent)
        self._wake.set()
        return 0x0000, None

    # --- delivery (this object's thread) -------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="storage-commitment", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
        try:
            self.outbox.release(self.owner)
        except Exception as e:  # noqa: BLE001 - the leases expire anyway
            log.warning("could not release the storage commitment leases: %s", e)

    def _reap(self) -> None:
        try:  # reports leased by a listener of this host that died (SIGKILL): claimable now, not in minutes
            if freed := self.outbox.reap(socket.gethostname()):
                log.warning("%d storage commitment report(s) leased by a process that died are claimable again", freed)
        except Exception as e:  # noqa: BLE001 - the leases expire anyway
            log.warning("could not free the leases of dead processes: %s", e)

    def _held(self) -> tuple[list[Row], float | None]:
        """The due reports this process received (born leased to it: :meth:`on_n_action`),
        and when the next one becomes due (this process's clock)."""
        now = time.time()
        with self._lock:
            due = [tuid for t, tuid in self._held_due if t <= now][:BATCH]
            self._held_due = [(t, tuid) for t, tuid in self._held_due if tuid not in due]
            later = min((t for t, _ in self._held_due), default=None)
        try:  # those not returned were settled or released already, or claimed by another once their lease expired
            return self.outbox.claim_held(DESTINATION, self.held_owner, due, self.lease), later
        except Exception:
            with self._lock:  # the database is busy: again next time
                self._held_due.extend((now, tuid) for tuid in due)
            raise

    def _run(self) -> None:
        reaped = time.monotonic()
        self._reap()
        batches = 0
        while not self._stop.is_set():
            self._wake.clear()
            wait = POLL
            try:
                if time.monotonic() - reaped >= REAP:
                    reaped = time.monotonic()
                    self._reap()
                # first the reports whose association this process holds: none claims them but it
                rows, next_held = self._held()
                if rows:
                    self._deliver(rows, self.held_owner)
                if next_held is not None:
                    wait = min(wait, max(0.0, next_held - time.time()))
                owner = f"{self.owner}:{batches}"
                batches += 1
                rows, next_due = self.outbox.claim(DESTINATION, BATCH, owner, self.lease, 4)
                if rows:
                    self._deliver(rows, owner)
                    continue
                if next_due is not None:
                    wait = min(wait, max(0.0, next_due - time.time()))
            except Exception as e:  # noqa: BLE001 - never dies; the database may be busy
                log.error("storage commitment reports: %s", e)
            self._wake.wait(wait)

    def _deliver(self, rows: list[Row], owner: str) -> None:
        s = Settlement([], [], [], [])
        now = time.time()
        for row in rows:
            error = self.send(row)
            if error is None:
                s.delivered.append(row.id)
            elif row.attempts + 1 < self.max_attempts:
                delay = min(60 * self.retry, self.retry * 2 ** row.attempts) * random.uniform(0.9, 1.1)
                s.retry.append((row.id, now + delay, error))
                log.info("storage commitment report %s not delivered (%s): again in %.0f s", row.sop_uid, error, delay)
            else:
                s.failed.append((row.id, f"gave up after {row.attempts + 1} attempt(s): {error}"))
                log.warning("storage commitment report %s failed for good: %s", row.sop_uid, error)
        self.outbox.settle(s, owner)

    def send(self, row: Row) -> str | None:
        """Send the report of one outbox row: None when the requester took it, else why not."""
        try:
            job = orjson.loads(row.payload or "")
            tuid, requester = job["transaction_uid"], job["requester"]
            refs = [tuple(r) for r in job["references"]]
        except (ValueError, KeyError, TypeError) as e:
            return f"not a storage commitment job: {e}"
        event_type, info = report(self.index, tuid, refs, self.ae_title)
        with self._lock:
            assoc = self._associations.pop(tuid, None)
            answered = self._answered.pop(tuid, None)
        if answered is not None and not answered.wait(self.timeout):
            assoc = None  # the N-ACTION-RSP never went: not on that association
        if assoc is not None and getattr(assoc, "is_established", False) \
                and not assoc.acse.is_release_requested():
            error = _send_report(assoc, event_type, info)
            if error is None:
                log.info("storage commitment %s: event type %d sent to %s on its association", tuid, event_type,
                         requester)
                return None
            log.info("storage commitment %s: not taken on the request's association (%s): a new one", tuid, error)
        peer = self.peers.get(requester)
        if peer is None or peer.port is None:
            return f"requester {requester!r} is not in the peers file with a port"
        ae = AE(ae_title=self.ae_title)
        ae.acse_timeout = ae.dimse_timeout = self.timeout
        ae.network_timeout = self.network_timeout
        ae.add_requested_context(StorageCommitmentPushModel)
        try:
            # the archive requests the association in the SCP role of the SOP class (PS3.4 J.3.3),
            # over DICOM TLS to a peer with tls = true (PS3.15 Annex B)
            assoc = ae.associate(peer.host, peer.port, ae_title=peer.ae_title,
                                 ext_neg=[build_role(StorageCommitmentPushModel, scp_role=True)],
                                 tls_args=tls.tls_args(peer.tls, peer.host))
        except Exception as e:  # noqa: BLE001 - e.g. the host does not resolve
            return f"cannot associate with {requester} at {peer.host}:{peer.port}: {e}"
        if not assoc.is_established:
            return f"{requester} at {peer.host}:{peer.port} did not accept the association"
        try:
            error = _send_report(assoc, event_type, info)
        finally:
            if assoc.is_established:
                assoc.release()
        if error is None:
            log.info("storage commitment %s: event type %d sent to %s on a new association", tuid, event_type,
                     requester)
        return error


def _send_report(assoc, event_type: int, info: Dataset) -> str | None:
    try:
        rsp = assoc.send_n_event_report(info, event_type, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
    except Exception as e:  # noqa: BLE001 - no context, the association went...
        return f"{type(e).__name__}: {e}"
    status = rsp[0] if isinstance(rsp, tuple) else rsp
    code = getattr(status, "Status", None)
    if code is None:
        return "no N-EVENT-REPORT-RSP (timeout, abort or invalid)"
    if code != 0x0000:
        return f"N-EVENT-REPORT-RSP status 0x{code:04X}"
    return None


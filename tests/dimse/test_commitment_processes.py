"""Storage commitment with several DIMSE listener processes sharing one outbox: the
report goes on the N-ACTION's association while it is open (PS3.4 J.3.3, docs/modality.md),
whichever process's Reporter polls the outbox first. Each listener process has its own
:class:`commitment.Reporter`; here two of them share one SQLite outbox in one test process,
driven with a fake association (only the process that received the N-ACTION holds it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid

from dicomweb_server.dimse import commitment
from dicomweb_server.routing.outbox import SQLiteOutbox

CT = "1.2.840.10008.5.1.4.1.1.2"


class _Index:
    """What the Reporter asks the index: declare (kept) and locate (every SOP here is a CT)."""

    def __init__(self) -> None:
        self.declared: list[str] = []

    def declare(self, tuid, requester, refs, when) -> None:
        self.declared.append(tuid)

    def locate(self, sop):
        return SimpleNamespace(sop_class_uid=CT)


class _Assoc:
    """The request's association as the receiving listener process sees it (pynetdicom's API)."""

    def __init__(self) -> None:
        self.requestor = SimpleNamespace(ae_title="MODALITY")
        self.acse = SimpleNamespace(is_release_requested=lambda: False)
        self.is_established = True
        self.handlers: list = []
        self.reports: list[tuple[int, Dataset]] = []
        self.sent = threading.Event()

    def bind(self, event, handler) -> None:
        self.handlers.append(handler)

    def unbind(self, event, handler) -> None:
        self.handlers.remove(handler)

    def response_sent(self) -> None:
        """EVT_DIMSE_SENT of the N-ACTION-RSP."""
        N_ACTION_RSP = type("N_ACTION_RSP", (), {})
        for h in list(self.handlers):
            h(SimpleNamespace(message=N_ACTION_RSP()))

    def send_n_event_report(self, info, event_type, sop_class, sop_instance):
        self.reports.append((event_type, info))
        self.sent.set()
        rsp = Dataset()
        rsp.Status = 0x0000
        return rsp, None


def _request(tuid: str, sop: str) -> Dataset:
    """The N-ACTION's Action Information (PS3.4 J.3.2): one CT instance referenced."""
    info = Dataset()
    info.TransactionUID = tuid
    item = Dataset()
    item.ReferencedSOPClassUID = CT
    item.ReferencedSOPInstanceUID = sop
    info.ReferencedSOPSequence = [item]
    return info


def _n_action(reporter: commitment.Reporter, assoc: _Assoc, tuid: str, sop: str) -> int:
    from io import BytesIO

    from pydicom.uid import ImplicitVRLittleEndian
    from pynetdicom.dsutils import encode

    # the Action Information as pynetdicom's primitive holds it, encoded (commitment.py reads it with bounds)
    info = BytesIO(encode(_request(tuid, sop), True, True))
    event = SimpleNamespace(request=SimpleNamespace(ActionTypeID=1, ActionInformation=info),
                            context=SimpleNamespace(transfer_syntax=ImplicitVRLittleEndian), assoc=assoc)
    status, _ = reporter.on_n_action(event)
    assoc.response_sent()
    return status


@pytest.fixture
def box(tmp_path):
    b = SQLiteOutbox(tmp_path / "outbox.sqlite")
    yield b
    b.close()


def _reporter(box) -> commitment.Reporter:
    # no peers: a report can only go on the request's association (the integrator's modality)
    settings = SimpleNamespace(dimse_commitment_retry=0.2, dimse_commitment_max_attempts=20, dimse_timeout=5.0,
                               dimse_network_timeout=5.0)
    return commitment.Reporter(_Index(), box, {}, "DICOMWEB", settings)


def _row(box, tuid: str) -> dict:
    [row] = [r for r in box.rows(commitment.DESTINATION) if r["SOPInstanceUID"] == tuid]
    return row


def test_other_process_does_not_take_the_report_of_an_open_association(box, monkeypatch):
    """Process B polls the outbox while the report of an N-ACTION that process A received
    is due: B leaves it (it has no association for it), A sends it on the request's
    association, once, with no attempt on a new association (there is no peer to open one to)."""
    monkeypatch.setattr(commitment, "REPORT_DELAY", 0.2)
    a, b = _reporter(box), _reporter(box)
    assoc, tuid, sop = _Assoc(), str(generate_uid()), str(generate_uid())
    assert _n_action(a, assoc, tuid, sop) == 0x0000
    b.start()  # the other listener process, polling first
    try:
        time.sleep(commitment.REPORT_DELAY + 2 * commitment.POLL)
        row = _row(box, tuid)
        assert (row["state"], row["attempts"], row["last_error"]) == ("pending", 0, None)
        assert assoc.reports == []
        a.start()
        assert assoc.sent.wait(10), "no report on the request's association"
        deadline = time.monotonic() + 10
        while _row(box, tuid)["state"] != "delivered":
            assert time.monotonic() < deadline, _row(box, tuid)
            time.sleep(0.02)
    finally:
        a.stop()
        b.stop()
    [(event_type, info)] = assoc.reports
    assert event_type == commitment.EVENT_SUCCESSFUL
    assert info.TransactionUID == tuid
    assert [(i.ReferencedSOPClassUID, i.ReferencedSOPInstanceUID) for i in info.ReferencedSOPSequence] == [(CT, sop)]
    row = _row(box, tuid)
    assert (row["state"], row["attempts"], row["last_error"]) == ("delivered", 1, None)


def test_report_of_a_dead_process_is_claimed_by_another(box, monkeypatch):
    """The process that received the N-ACTION dies before its report is due (SIGKILL): its
    lease is freed (Outbox.reap, by every Reporter) and another process's Reporter tries the
    report on a new association (here: the requester has no peers entry, so the attempt is
    recorded with that reason and retried, not held forever)."""
    monkeypatch.setattr(commitment, "REPORT_DELAY", 0.1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    a = _reporter(box)
    a.owner = f"{socket.gethostname()}:{dead.pid}:deadbeef:commitment"  # the listener process that died
    assoc, tuid = _Assoc(), str(generate_uid())
    assert _n_action(a, assoc, tuid, str(generate_uid())) == 0x0000
    assert box.rows(commitment.DESTINATION)[0]["state"] == "pending"
    try:
        os.kill(dead.pid, 0)
        pytest.skip("the pid was reused")
    except ProcessLookupError:
        pass
    b = _reporter(box)
    b.start()
    try:
        deadline = time.monotonic() + 10
        while _row(box, tuid)["attempts"] == 0:
            assert time.monotonic() < deadline, _row(box, tuid)
            time.sleep(0.02)
    finally:
        b.stop()
    assert _row(box, tuid)["last_error"] == "requester 'MODALITY' is not in the peers file with a port"
    assert assoc.reports == []


def test_stopped_process_releases_the_reports_it_holds(box, monkeypatch):
    """A listener process that stops (its associations go with it) leaves its reports to the
    others at once."""
    monkeypatch.setattr(commitment, "REPORT_DELAY", 0.1)
    a = _reporter(box)
    tuid = str(generate_uid())
    assert _n_action(a, _Assoc(), tuid, str(generate_uid())) == 0x0000
    a.stop()  # never started: only its leases go
    time.sleep(0.2)
    rows, _ = box.claim(commitment.DESTINATION, 8, "other:1", 60, 4)
    assert [r.sop_uid for r in rows] == [tuid]


def test_served_with_two_listener_processes_every_report_on_its_association(tmp_path):
    """``serve --dimse-processes 2``, a requester not in the peers file (none configured):
    eight N-ACTIONs on eight associations held open, the kernel spreading them over both
    listener processes; each gets its report on its own association (it used to go to the
    other process's Reporter now and then, which could only try a new association)."""
    from concurrent.futures import ThreadPoolExecutor

    from pynetdicom import AE, build_context, evt
    from pynetdicom.sop_class import StorageCommitmentPushModel, StorageCommitmentPushModelInstance

    from tests.helpers import free_port

    port, dport = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--port", str(port), "--dimse-port", str(dport), "--workers", "1", "--dimse-processes", "2"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def request(sop: str):
        reports = []
        arrived = threading.Event()

        def on_report(event):
            reports.append((event.event_type, event.event_information))
            arrived.set()
            return 0x0000, None

        ae = AE(ae_title="MODALITY")
        assoc = ae.associate("127.0.0.1", dport, ae_title="DICOMWEB",
                             contexts=[build_context(StorageCommitmentPushModel)], evt_handlers=[(evt.EVT_N_EVENT_REPORT, on_report)])
        assert assoc.is_established
        tuid = str(generate_uid())
        info = _request(tuid, sop)
        try:
            status, _ = assoc.send_n_action(info, 1, StorageCommitmentPushModel, StorageCommitmentPushModelInstance)
            assert status.Status == 0x0000
            arrived.wait(8)  # the association held open: 1 s after the N-ACTION-RSP it is still there
        finally:
            assoc.release()
        return tuid, reports

    try:
        ae = AE(ae_title="MODALITY")
        ae.add_requested_context(StorageCommitmentPushModel)
        deadline = time.monotonic() + 30
        while True:
            assoc = ae.associate("127.0.0.1", dport, ae_title="DICOMWEB")
            if assoc.is_established:
                assoc.release()
                break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1)  # both listener processes up
        sops = [str(generate_uid()) for _ in range(8)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(request, sops))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    for sop, (tuid, reports) in zip(sops, results):
        # not stored here: Failures Exist, No such object instance (PS3.4 J.3.3.1)
        assert [(t, i.TransactionUID) for t, i in reports] == [(commitment.EVENT_FAILURES_EXIST, tuid)], sop
        [failed] = reports[0][1].FailedSOPSequence
        assert (failed.ReferencedSOPInstanceUID, failed.FailureReason) == (sop, commitment.NO_SUCH_OBJECT_INSTANCE)


def test_held_reports_do_not_count_against_the_claim_concurrency(box, monkeypatch):
    """Reports waiting for the listener process holding their association (one per process,
    up to 8 processes) do not stop the retries of other reports from being claimed: the
    destination's concurrency (4 live leases) counts sends, not waits."""
    monkeypatch.setattr(commitment, "REPORT_DELAY", 30.0)
    for _ in range(5):  # five listener processes, each holding a report not due yet
        assert _n_action(_reporter(box), _Assoc(), str(generate_uid()), str(generate_uid())) == 0x0000
    retry = str(generate_uid())
    box.insert_job(commitment.DESTINATION, commitment.KIND, retry, "{}", 0.0)
    rows, _ = box.claim(commitment.DESTINATION, 8, "other:1", 60, 4)
    assert [r.sop_uid for r in rows] == [retry]

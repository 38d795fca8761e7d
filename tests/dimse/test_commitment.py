"""Storage Commitment Push Model SCP (PS3.4 Annex J): pynetdicom as the requester. The
N-ACTION is answered Success, then the N-EVENT-REPORT says which instances are committed
(Event Type 1) or not (2, Failed SOP Sequence with 0x0112 / 0x0119): on the request's
association while it is open, else on a new association to the requester (peers file),
retried through the outbox while the requester is down."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom import AE, build_context, evt
from pynetdicom.sop_class import StorageCommitmentPushModel, StorageCommitmentPushModelInstance

from dicomweb_server.dimse import commitment
from dicomweb_server.dimse import status as S
from tests.helpers import LiveServer, free_port, make_dataset

from .conftest import Dimse

CT = "1.2.840.10008.5.1.4.1.1.2"
MR = "1.2.840.10008.5.1.4.1.1.4"


class Requester:
    """The modality's Storage Commitment SCU, listening (as SCP role) for reports on new associations."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reports: list[tuple[str, int, Dataset]] = []  # (where, event type, event information)
        self.arrived = threading.Event()
        self.server = None

    def on_report(self, where: str):
        def handler(event):
            self.reports.append((where, event.event_type, event.event_information))
            self.arrived.set()
            return 0x0000, None
        return handler

    def listen(self) -> None:
        ae = AE(ae_title="MODALITY")
        # the archive requests the association in the SCP role (SCP/SCU Role Selection)
        ae.add_supported_context(StorageCommitmentPushModel, scu_role=False, scp_role=True)
        self.server = ae.start_server(("127.0.0.1", self.port), block=False,
                                      evt_handlers=[(evt.EVT_N_EVENT_REPORT, self.on_report("new"))])

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None


@pytest.fixture
def requester():
    r = Requester(free_port())
    yield r
    r.close()


@pytest.fixture
def commit_dimse(tmp_path, requester, index_kind):
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[MODALITY]\nhost = "127.0.0.1"\nport = {requester.port}\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", index_kind.partition("+")[0], dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=peers, dimse_commitment_retry=0.2).start()
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield Dimse(srv, port, client)
    srv.stop()


def _stored(dimse) -> list[Dataset]:
    study = str(generate_uid())
    series = str(generate_uid())
    dss = [make_dataset(study=study, series=series, InstanceNumber=i) for i in (1, 2)]
    assert dimse.store(dss, ae_title="MODALITY") == [S.SUCCESS] * 2
    return dss


def _request(tuid: str, refs: list[tuple[str, str]]) -> Dataset:
    ds = Dataset()
    ds.TransactionUID = tuid
    ds.ReferencedSOPSequence = []
    for cls, sop in refs:
        item = Dataset()
        item.ReferencedSOPClassUID = cls
        item.ReferencedSOPInstanceUID = sop
        ds.ReferencedSOPSequence.append(item)
    return ds


def _n_action(dimse, requester: Requester, ds: Dataset, wait: bool):
    """Send the N-ACTION (the report handler bound to this association); wait for the report
    on it when ``wait``, else release at once. The N-ACTION-RSP status."""
    assoc = dimse.associate([build_context(StorageCommitmentPushModel)], ae_title="MODALITY",
                            evt_handlers=[(evt.EVT_N_EVENT_REPORT, requester.on_report("same"))])
    started = time.monotonic()
    try:
        status, _ = assoc.send_n_action(ds, commitment.REQUEST_STORAGE_COMMITMENT, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
        if wait:
            assert requester.arrived.wait(20), "no N-EVENT-REPORT"
        return status.Status
    finally:
        assoc.release()
        # released at once after the report (pynetdicom serves it in a thread of its own:
        # reactor.served_off_thread; the release used to wait out the 30 s timeout)
        assert time.monotonic() - started < 10


def _wait_state(dimse, tuid: str, state: str) -> None:
    from dicomweb_server.routing import open_outbox

    box = open_outbox(dimse.server.settings)
    try:
        deadline = time.monotonic() + 20
        while not any(r["SOPInstanceUID"] == tuid and r["state"] == state for r in box.rows(commitment.DESTINATION)):
            assert time.monotonic() < deadline, box.rows(commitment.DESTINATION)
            time.sleep(0.02)
    finally:
        box.close()


def _refs(seq) -> list[tuple[str, str]]:
    return [(str(i.ReferencedSOPClassUID), str(i.ReferencedSOPInstanceUID)) for i in seq]


def test_all_committed_reported_on_the_same_association(commit_dimse, requester):
    dss = _stored(commit_dimse)
    refs = [(str(d.SOPClassUID), str(d.SOPInstanceUID)) for d in dss]
    tuid = str(generate_uid())
    assert _n_action(commit_dimse, requester, _request(tuid, refs), wait=True) == 0x0000
    [(where, event_type, info)] = requester.reports
    assert (where, event_type) == ("same", 1)
    assert info.TransactionUID == tuid
    assert _refs(info.ReferencedSOPSequence) == refs
    assert [str(i.RetrieveAETitle) for i in info.ReferencedSOPSequence] == ["DICOMWEB", "DICOMWEB"]
    assert "FailedSOPSequence" not in info


def test_missing_and_mismatched_instances_fail(commit_dimse, requester):
    dss = _stored(commit_dimse)
    missing = str(generate_uid())
    refs = [(CT, str(dss[0].SOPInstanceUID)), (CT, missing), (MR, str(dss[1].SOPInstanceUID))]
    tuid = str(generate_uid())
    assert _n_action(commit_dimse, requester, _request(tuid, refs), wait=True) == 0x0000
    [(where, event_type, info)] = requester.reports
    assert (where, event_type) == ("same", 2)
    assert info.TransactionUID == tuid
    assert _refs(info.ReferencedSOPSequence) == [refs[0]]
    assert _refs(info.FailedSOPSequence) == [refs[1], refs[2]]
    assert [i.FailureReason for i in info.FailedSOPSequence] == [0x0112, 0x0119]


def test_report_on_a_new_association_after_release(commit_dimse, requester, monkeypatch):
    """The requester releases its association before the report is made: the report comes
    on a new association, the archive requesting it in the SCP role."""
    requester.listen()
    gate = _after_release(monkeypatch)
    dss = _stored(commit_dimse)
    refs = [(str(d.SOPClassUID), str(d.SOPInstanceUID)) for d in dss]
    tuid = str(generate_uid())
    assert _n_action(commit_dimse, requester, _request(tuid, refs), wait=False) == 0x0000
    gate.set()  # released: now the report may be sent
    assert requester.arrived.wait(20), "no N-EVENT-REPORT"
    [(where, event_type, info)] = requester.reports
    assert (where, event_type) == ("new", 1)
    assert info.TransactionUID == tuid and _refs(info.ReferencedSOPSequence) == refs


def _after_release(monkeypatch) -> threading.Event:
    """Reports wait until the returned event is set (the test sets it once its requester
    released the N-ACTION's association: the report cannot go there)."""
    gate = threading.Event()
    send = commitment.Reporter.send
    monkeypatch.setattr(commitment.Reporter, "send", lambda self, row: (gate.wait(20), send(self, row))[1])
    return gate


def test_report_retried_while_the_requester_is_down(commit_dimse, requester, monkeypatch):
    """Nobody listens at the requester's port: the report is owed in the outbox and tried
    again (its attempts and last error recorded) until the requester comes up."""
    gate = _after_release(monkeypatch)
    dss = _stored(commit_dimse)
    refs = [(str(d.SOPClassUID), str(d.SOPInstanceUID)) for d in dss]
    tuid = str(generate_uid())
    assert _n_action(commit_dimse, requester, _request(tuid, refs), wait=False) == 0x0000
    gate.set()
    outbox = commit_dimse.server.archive.routing  # no routes: the listener opened its own outbox
    assert outbox is None
    from dicomweb_server.routing import open_outbox

    box = open_outbox(commit_dimse.server.settings)
    try:
        deadline = time.monotonic() + 20
        while True:
            rows = box.rows(commitment.DESTINATION)
            if rows and rows[0]["attempts"] >= 2:
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        assert rows[0]["SOPInstanceUID"] == tuid and rows[0]["state"] == "pending"
        assert "cannot associate" in rows[0]["last_error"] or "did not accept" in rows[0]["last_error"]
        assert not requester.reports
        requester.listen()
        assert requester.arrived.wait(30), "no N-EVENT-REPORT once the requester is up"
        [(where, event_type, info)] = requester.reports
        assert (where, event_type, info.TransactionUID) == ("new", 1, tuid)
        deadline = time.monotonic() + 10
        while box.rows(commitment.DESTINATION)[0]["state"] != "delivered":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        box.close()


def test_bad_requests_are_refused(commit_dimse, requester):
    """Action Type ID other than 1: 0x0123; no Transaction UID or no references: 0x0120;
    nothing is owed for them."""
    refs = [(CT, str(generate_uid()))]
    assoc = commit_dimse.associate([build_context(StorageCommitmentPushModel)], ae_title="MODALITY")
    try:
        status, _ = assoc.send_n_action(_request(str(generate_uid()), refs), 2, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
        assert status.Status == 0x0123
        no_uid = _request(str(generate_uid()), refs)
        del no_uid.TransactionUID
        status, _ = assoc.send_n_action(no_uid, 1, StorageCommitmentPushModel, StorageCommitmentPushModelInstance)
        assert status.Status == 0x0120
        status, _ = assoc.send_n_action(_request(str(generate_uid()), []), 1, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
        assert status.Status == 0x0120
    finally:
        assoc.release()


def test_report_owed_across_a_sigkill(tmp_path):
    """Success answered to the N-ACTION means owed: the listener process is SIGKILLed while
    the requester is down, started again, and the report reaches the requester once it is up
    (the outbox row survived, the dead process's lease freed at start)."""
    import os
    import signal

    from .test_crash import _listener

    data, port, requester = tmp_path / "data", free_port(), Requester(free_port())
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[MODALITY]\nhost = "127.0.0.1"\nport = {requester.port}\n')
    env = {"DICOMWEB_DIMSE_PEERS_FILE": str(peers), "DICOMWEB_DIMSE_COMMITMENT_RETRY": "0.2"}
    os.environ.update(env)
    try:
        proc = _listener(data, port)
        try:
            ds = make_dataset()
            store = AE(ae_title="MODALITY")
            store.add_requested_context(CT)
            store.add_requested_context(StorageCommitmentPushModel)
            assoc = store.associate("127.0.0.1", port)
            assert assoc.is_established
            assert assoc.send_c_store(ds).Status == 0
            tuid = str(generate_uid())
            status, _ = assoc.send_n_action(_request(tuid, [(CT, str(ds.SOPInstanceUID))]), 1,
                                            StorageCommitmentPushModel, StorageCommitmentPushModelInstance)
            assert status.Status == 0
            started = time.monotonic()
            assoc.release()  # at once, as many modalities do: the report must not cross the release
            assert time.monotonic() - started < 5  # (it did: 30 s, both sides waiting, commitment.REPORT_DELAY)
            time.sleep(1.5)  # a few attempts at the requester, which is down
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            assert not requester.reports
            requester.listen()
            proc = _listener(data, port)
            assert requester.arrived.wait(30), "no report after the restart"
            [(where, event_type, info)] = requester.reports
            assert (where, event_type, info.TransactionUID) == ("new", 1, tuid)
            assert _refs(info.ReferencedSOPSequence) == [(CT, str(ds.SOPInstanceUID))]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            requester.close()
    finally:
        for k in env:
            os.environ.pop(k, None)


def test_a_deflated_request_is_inflated_with_a_bound(commit_dimse, requester):
    """An N-ACTION whose Action Information, in Deflated Explicit VR Little Endian (PS3.5
    §A.5), inflates past 1 MiB (dicom/reading.py MAX_IDENTIFIER_BYTES; a private OB of 4 MiB
    of zeros, 4 KB on the wire): 0x0110 Processing failure (PS3.7 C.4.2) saying why.
    pynetdicom inflated it whole, without a bound, and the commitment was owed (0x0000)."""
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    ds = _request(str(generate_uid()), [(CT, str(generate_uid()))])
    ds.add_new(0x00090010, "LO", "BOMB")
    ds.add_new(0x00091001, "OB", bytes(4 * 1024 * 1024))
    assoc = commit_dimse.associate([build_context(StorageCommitmentPushModel, DeflatedExplicitVRLittleEndian)],
                                   ae_title="MODALITY")
    try:
        status, _ = assoc.send_n_action(ds, 1, StorageCommitmentPushModel, StorageCommitmentPushModelInstance)
        assert (status.Status, status.ErrorComment) == (
            0x0110, "Action Information cannot be decoded: the Deflated data set infl")
    finally:
        assoc.release()

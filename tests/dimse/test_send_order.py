"""Messages sent on one association are never interleaved (PS3.7 §6.3.1, PS3.8 §9.3.5 and
Annex E): a message's command fragments, then its data set fragments, then the next message.

The archive writes on one association from two threads: the DUL thread answers each C-STORE
itself (dimse/cstore_rx.py), and the storage commitment reporter sends its N-EVENT-REPORT
(PS3.4 J.3.3) from a thread of its own, fragment by fragment. A modality that sends its
N-ACTION and goes on storing on the same association used to get a C-STORE-RSP between the
report's command and its data set, or between two data set fragments: a protocol violation
that a strict SCU answers with an A-ABORT (pynetdicom lost the association). Here the
modality's side records every byte it receives and checks the order of the fragments."""

from __future__ import annotations

import struct
import threading
import time

import httpx
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom import AE, evt
from pynetdicom import transport as _transport
from pynetdicom.sop_class import CTImageStorage, StorageCommitmentPushModel, StorageCommitmentPushModelInstance

from dicomweb_server.dimse import commitment
from tests.helpers import LiveServer, free_port, make_dataset

from .conftest import AET


def _messages(stream: bytes) -> list[tuple[int, int]]:
    """The DIMSE messages in the P-DATA-TF PDUs of ``stream`` as (Command Field, data set
    length), checking the assembly rules: a message's command fragments (the last one marked),
    then, unless its Command Data Set Type is 0x0101, its data set fragments (the last one
    marked), all on one presentation context, before any fragment of another message."""
    messages, pos, seen = [], 0, []
    command, data, cx, want_data, field = b"", b"", None, False, None
    while pos + 6 <= len(stream):
        pdu_type, _, length = struct.unpack_from(">BBL", stream, pos)
        body = stream[pos + 6:pos + 6 + length]
        pos += 6 + length
        if pdu_type != 0x04:
            continue
        i = 0
        while i < len(body):
            (item_length, context_id), header = struct.unpack_from(">LB", body, i), body[i + 5]
            value = body[i + 6:i + 4 + item_length]
            i += 4 + item_length
            seen.append((context_id, header, len(value)))
            assert cx is None or context_id == cx, f"a fragment of another message's context: {seen[-8:]}"
            cx = context_id
            if header & 1:  # a command fragment
                assert not want_data, f"a command fragment inside the data set of 0x{field:04X}"
                command += value
                if header & 2:
                    elements, j = {}, 0
                    while j < len(command):
                        group, element, vlen = struct.unpack_from("<HHL", command, j)
                        elements[(group << 16) | element] = command[j + 8:j + 8 + vlen]
                        j += 8 + vlen
                    field = struct.unpack("<H", elements[0x00000100])[0]
                    if struct.unpack("<H", elements[0x00000800])[0] == 0x0101:
                        messages.append((field, 0))
                        command, cx = b"", None
                    else:
                        want_data = True
            else:
                assert want_data, "a data set fragment without its command"
                data += value
                if header & 2:
                    messages.append((field, len(data)))
                    command, data, cx, want_data = b"", b"", None, False
    return messages


@pytest.fixture
def archive(tmp_path):
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True,
                     dimse_commitment_retry=0.2).start()
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield srv, port, client
    srv.stop()


def test_c_store_rsp_never_inside_a_commitment_report(archive, monkeypatch):
    _, port, _ = archive
    received: list[bytes] = []
    recv = _transport.AssociationSocket.recv

    def recording_recv(self, nr_bytes):
        chunk = recv(self, nr_bytes)
        if self.assoc.is_requestor:  # the modality's side (the archive runs in this process too)
            received.append(bytes(chunk))
        return chunk

    monkeypatch.setattr(_transport.AssociationSocket, "recv", recording_recv)
    reports: list[Dataset] = []
    arrived = threading.Event()

    def on_report(event):
        reports.append(event.event_information)
        arrived.set()
        return 0x0000, None

    ae = AE(ae_title="MODALITY")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(StorageCommitmentPushModel)
    ae.add_requested_context(CTImageStorage)
    # max_pdu: the report, ~60 KB, goes out in about 16 P-DATA-TF PDUs
    assoc = ae.associate("127.0.0.1", port, ae_title=AET, max_pdu=4096,
                         evt_handlers=[(evt.EVT_N_EVENT_REPORT, on_report)])
    assert assoc.is_established
    study, series = str(generate_uid()), str(generate_uid())
    request = Dataset()
    request.TransactionUID = tuid = str(generate_uid())
    request.ReferencedSOPSequence = []
    for _ in range(500):  # not stored: each a Failed SOP Sequence item (0x0112)
        item = Dataset()
        item.ReferencedSOPClassUID = CTImageStorage
        item.ReferencedSOPInstanceUID = str(generate_uid())
        request.ReferencedSOPSequence.append(item)
    statuses = []
    try:
        status, _ = assoc.send_n_action(request, commitment.REQUEST_STORAGE_COMMITMENT, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
        assert status.Status == 0x0000
        deadline = time.monotonic() + 30
        n = 0
        while (not arrived.is_set() or n < 20) and time.monotonic() < deadline and assoc.is_established:
            n += 1  # C-STOREs on the same association while the report is being sent
            ds = make_dataset(study=study, series=series, InstanceNumber=n, rows=8, columns=8)
            rsp = assoc.send_c_store(ds)
            statuses.append(getattr(rsp, "Status", None))
    finally:
        if assoc.is_established:
            assoc.release()
    messages = _messages(b"".join(received))  # asserts the assembly rules
    assert arrived.is_set(), "no N-EVENT-REPORT"
    assert statuses == [0x0000] * len(statuses) and len(statuses) >= 20
    [report] = reports
    assert report.TransactionUID == tuid and len(report.FailedSOPSequence) == 500
    assert [f for f, _ in messages].count(0x0100) == 1  # the N-EVENT-REPORT-RQ, whole
    assert [f for f, _ in messages].count(0x8001) == len(statuses)


class _FakeDul:
    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.sent: list = []
        self.first_put = threading.Event()
        self.go_on = threading.Event()

    def send_pdu(self, pdu) -> None:
        self.sent.append(pdu)
        if len(self.sent) == 1:  # the other thread is inside its message now
            self.first_put.set()
            assert self.go_on.wait(10)


class _FakeProvider:
    maximum_pdu_size = 16384

    def __init__(self, dul) -> None:
        self.dul = dul
        self.aborted = 0
        self.assoc = self

    def get_handlers(self, event):
        return []

    def abort(self) -> None:
        self.aborted += 1


def _rsp(message_id: int):
    from pynetdicom.dimse_primitives import C_STORE

    rsp = C_STORE()
    rsp.MessageIDBeingRespondedTo = message_id
    rsp.AffectedSOPClassUID = CTImageStorage
    rsp.AffectedSOPInstanceUID = "1.2.3"
    rsp.Status = 0x0000
    return rsp


def test_the_dul_threads_message_waits_for_the_end_of_another_threads(monkeypatch):
    """Store_rsp.SendGate: the DUL thread's C-STORE-RSP, sent while the reporter is between two
    fragments of its message, is held and queued right after that message; the DUL thread
    does not wait."""
    from dicomweb_server.dimse import store_rsp

    dul = _FakeDul(ident=-1)
    provider = _FakeProvider(dul)
    monkeypatch.setattr(store_rsp, "_fragments",
                        lambda self, p, cx: iter([("report", 1), ("report", 2), ("report", 3)]) if p == "report"
                        else iter([("rsp", p.MessageIDBeingRespondedTo)]))
    reporter = threading.Thread(target=store_rsp.send_msg, args=(provider, "report", 1))
    reporter.start()
    assert dul.first_put.wait(10)
    dul.ident = threading.get_ident()  # this thread plays the DUL thread
    store_rsp.send_msg(provider, _rsp(7), 3)  # returns at once: held
    assert dul.sent == [("report", 1)]
    dul.go_on.set()
    reporter.join(10)
    assert dul.sent == [("report", 1), ("report", 2), ("report", 3), ("rsp", 7)]
    assert not store_rsp.gate(dul).busy and provider.aborted == 0


def test_a_message_that_fails_half_sent_aborts_the_association(monkeypatch):
    """A message whose fragments fail after the first was queued (a sub-operation's file
    unreadable) cannot be completed: the association is aborted, and nothing held is sent
    after the partial message (PS3.8 Annex E)."""
    from dicomweb_server.dimse import store_rsp

    dul = _FakeDul(ident=-1)
    dul.go_on.set()
    provider = _FakeProvider(dul)

    def fragments(self, p, cx):
        yield ("sub-operation", 1)
        store_rsp.gate(dul).held.append(("rsp", 9))  # the DUL thread answered meanwhile
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store_rsp, "_fragments", fragments)
    with pytest.raises(OSError):
        store_rsp.send_msg(provider, "sub-operation", 1)
    assert dul.sent == [("sub-operation", 1)]
    assert provider.aborted == 1 and not store_rsp.gate(dul).busy

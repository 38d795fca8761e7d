"""A C-MOVE the archive refuses, or that matches nothing, is answered without a connection to
its destination (PS3.4 C.4.2.3.1: the C-STORE sub-operations are what goes to the move
destination; a refused request has none). Before, pynetdicom's Move SCP associated with the
destination before it asked the handler for the refusal: a TCP connection and an
A-ASSOCIATE-RQ to a peer for a request the archive refused. The final status is what it was
(0xA900 naming the key, 0xC000 for an identifier that cannot be decoded; Success with no
sub-operation when nothing matches), and a C-MOVE that matches still delivers."""

from __future__ import annotations

import io
import struct
import threading
import time

import pytest
from pydicom.dataset import Dataset
from pydicom.uid import ExplicitVRLittleEndian
from pynetdicom import AE, StoragePresentationContexts, build_context, evt
from pynetdicom.dimse_primitives import C_MOVE
from pynetdicom.sop_class import (
    PatientRootQueryRetrieveInformationModelMove,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from dicomweb_server.dimse import status as S
from tests.helpers import free_port, make_dataset

from .conftest import AET, archive_moving_to

STUDY = "1.2.826.0.1.3680043.8.498.47"
SERIES = STUDY + ".1"
STUDY_UID, SERIES_UID = 0x0020000D, 0x0020000E


class Destination:
    """The move destination MOVEDEST: a Storage SCP that counts the connections it accepts
    (EVT_CONN_OPEN) and keeps the SOP Instance UIDs it receives."""

    def __init__(self) -> None:
        self.connections = 0
        self.received: list[str] = []
        self._lock = threading.Lock()
        ae = AE(ae_title="MOVEDEST")
        ae.supported_contexts = StoragePresentationContexts
        ae.add_supported_context(Verification)
        self.port = free_port()
        self.server = ae.start_server(("127.0.0.1", self.port), block=False, evt_handlers=[
            (evt.EVT_CONN_OPEN, self._on_open), (evt.EVT_C_STORE, self._on_store)])

    def _on_open(self, event) -> None:
        with self._lock:
            self.connections += 1

    def _on_store(self, event):
        self.received.append(str(event.request.AffectedSOPInstanceUID))
        return 0x0000


@pytest.fixture(scope="module")
def dest():
    d = Destination()
    yield d
    d.server.shutdown()


@pytest.fixture(scope="module")
def archive(tmp_path_factory, dest):
    with archive_moving_to(tmp_path_factory.mktemp("move-refused"), dest.port) as d:
        dss = [make_dataset(study=STUDY, series=SERIES, PatientID="MR47", InstanceNumber=i) for i in (1, 2)]
        assert d.store(dss) == [S.SUCCESS] * 2
        d.stored = dss
        yield d


def _keys(**keys) -> Dataset:
    ds = Dataset()
    for k, v in keys.items():
        setattr(ds, k, v)
    return ds


def _move(archive, identifier: Dataset, model=StudyRootQueryRetrieveInformationModelMove) -> list[Dataset]:
    assoc = archive.associate([build_context(model)])
    try:
        return [s for s, _ in assoc.send_c_move(identifier, "MOVEDEST", model)]
    finally:
        assoc.release()


def _settled(dest: Destination) -> int:
    """The destination's connection count once its accept loop had time to see any."""
    time.sleep(0.3)
    return dest.connections


REFUSED = [  # (model, identifier keys, status, Error Comment, Offending Element)
    (StudyRootQueryRetrieveInformationModelMove, {"QueryRetrieveLevel": "FRAME"}, S.QR_IDENTIFIER_MISMATCH,
     "QueryRetrieveLevel 'FRAME' is not one of STUDY, SERIES, IMAGE", 0x00080052),
    (StudyRootQueryRetrieveInformationModelMove, {"QueryRetrieveLevel": "STUDY", "StudyInstanceUID": "*"},
     S.QR_IDENTIFIER_MISMATCH, "StudyInstanceUID: no wildcard matching at STUDY level", STUDY_UID),
    (StudyRootQueryRetrieveInformationModelMove, {"QueryRetrieveLevel": "SERIES", "StudyInstanceUID": STUDY},
     S.QR_IDENTIFIER_MISMATCH, "SeriesInstanceUID missing (required at SERIES level)", SERIES_UID),
    (PatientRootQueryRetrieveInformationModelMove, {"QueryRetrieveLevel": "PATIENT", "PatientID": "MR*"},
     S.QR_IDENTIFIER_MISMATCH, "PatientID: no wildcard matching at PATIENT level", 0x00100020),
]


@pytest.mark.parametrize("model,keys,status,comment,offending", REFUSED)
def test_a_refused_move_does_not_connect_to_the_destination(archive, dest, model, keys, status, comment, offending):
    """An identifier that does not match the SOP class (PS3.4 C.4.2.1.5, Table C.4-2:
    0xA900, Error Comment and Offending Element naming the key): one final response, no
    pending one, no sub-operation completed, and the destination saw no connection."""
    before, got = dest.connections, len(dest.received)
    responses = _move(archive, _keys(**keys), model)
    assert len(responses) == 1, responses
    final = responses[0]
    assert (final.Status, final.ErrorComment, final.OffendingElement) == (status, comment, offending)
    # the counts as before the fix: pynetdicom counts the one sub-operation announced as failed
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations,
            final.NumberOfWarningSuboperations) == (0, 1, 0)
    assert _settled(dest) == before
    assert dest.received[got:] == []


def _el(g: int, e: int, vr: bytes, value: bytes, length: int | None = None) -> bytes:
    return struct.pack("<HH", g, e) + vr + struct.pack("<H", len(value) if length is None else length) + value


def test_a_move_whose_identifier_cannot_be_decoded_does_not_connect(archive, dest):
    """An identifier whose Study Instance UID declares 64 bytes and has fewer (PS3.5 §7.1):
    0xC000 Unable to process (find.decoded_identifier), and no connection to the destination."""
    before = dest.connections
    ae = AE(ae_title="RAWSCU")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelMove, ExplicitVRLittleEndian)
    assoc = ae.associate("127.0.0.1", archive.port, ae_title=AET)
    assert assoc.is_established
    uid = STUDY.encode()
    raw = _el(0x0008, 0x0052, b"CS", b"STUDY ") + _el(0x0020, 0x000D, b"UI", uid, 64)
    req = C_MOVE()
    req.MessageID, req.AffectedSOPClassUID, req.Priority = 3, StudyRootQueryRetrieveInformationModelMove, 2
    req.MoveDestination, req.Identifier = "MOVEDEST", io.BytesIO(raw)
    assoc._reactor_checkpoint.clear()  # as send_c_move: the reactor leaves the responses to us
    while not assoc._is_paused:
        time.sleep(0.001)
    assoc.dimse.send_msg(req, assoc.accepted_contexts[0].context_id)
    statuses = []
    try:
        while True:
            _, rsp = assoc.dimse.get_msg(block=True)
            assert rsp is not None, "no C-MOVE-RSP"
            statuses.append((rsp.Status, rsp.ErrorComment))
            if rsp.Status != S.PENDING:
                break
    finally:
        assoc._reactor_checkpoint.set()
        assoc.release()
    assert statuses == [(S.QR_UNABLE_TO_PROCESS, f"identifier truncated: (0020,000D) declares 64 bytes, has {len(uid)}")]
    assert _settled(dest) == before


@pytest.mark.parametrize("keys", [
    {"QueryRetrieveLevel": "STUDY", "StudyInstanceUID": "1.2.826.0.1.3680043.8.498.4799"},
    {"QueryRetrieveLevel": "IMAGE", "StudyInstanceUID": STUDY, "SeriesInstanceUID": SERIES,
     "SOPInstanceUID": "1.2.826.0.1.3680043.8.498.4799.1"},
])
def test_a_move_matching_nothing_is_success_without_a_connection(archive, dest, keys):
    """Nothing matches: Success with no sub-operation (PS3.4 C.4.2.3.1), and no connection."""
    before = dest.connections
    responses = _move(archive, _keys(**keys))
    assert len(responses) == 1, responses
    final = responses[0]
    assert final.Status == S.SUCCESS
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations,
            final.NumberOfWarningSuboperations) == (0, 0, 0)
    assert _settled(dest) == before


def test_a_move_that_matches_delivers_over_one_connection(archive, dest):
    """The normal path is unchanged: one association to the destination, the instance named
    arrives (its SOP Instance UID), Success with one sub-operation completed."""
    before, got = dest.connections, len(dest.received)
    one = archive.stored[1]
    responses = _move(archive, _keys(QueryRetrieveLevel="IMAGE", StudyInstanceUID=STUDY, SeriesInstanceUID=SERIES,
                                     SOPInstanceUID=one.SOPInstanceUID))
    final = responses[-1]
    assert (final.Status, final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (S.SUCCESS, 1, 0)
    assert dest.received[got:] == [one.SOPInstanceUID]
    assert _settled(dest) == before + 1

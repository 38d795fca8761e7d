"""A C-MOVE whose destination stalls (PS3.4 C.4.2.3: the sub-operations are C-STOREs on an
association of their own, PS3.7 9.1.4): the stalled sub-operation fails after the listener's
DIMSE timeout, the requester gets its final C-MOVE-RSP with the counts and the Failed SOP
Instance UID List (0008,0058), and its association goes on. Before, the listener's network
timeout, counted from the C-MOVE-RQ, aborted the requester's association right after the
final response."""

from __future__ import annotations

import threading
import time

import pytest
from pynetdicom import AE, StoragePresentationContexts, build_context, evt
from pynetdicom.sop_class import StudyRootQueryRetrieveInformationModelMove, Verification

from dicomweb_server.dimse import status as S
from tests.helpers import LiveServer, free_port, make_dataset

from .conftest import Dimse
from .test_query_retrieve import _ident

STUDY = "1.2.826.0.1.3680043.8.498.77"
TIMEOUT = 2.0  # the listener's DIMSE and network timeouts


@pytest.fixture
def stalling_destination():
    """A Storage SCP (AE STALLDEST) that accepts the association, receives the first C-STORE-RQ
    and never answers it (its handler waits until the test ends)."""
    received: list[str] = []
    release = threading.Event()

    def on_store(event):
        received.append(str(event.request.AffectedSOPInstanceUID))
        release.wait(120)
        return 0x0000

    ae = AE(ae_title="STALLDEST")
    ae.supported_contexts = StoragePresentationContexts
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = None
    port = free_port()
    server = ae.start_server(("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    yield port, received
    release.set()
    server.shutdown()


def test_a_stalled_sub_operation_fails_and_the_requester_gets_its_final_response(tmp_path, stalling_destination):
    dest_port, received = stalling_destination
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[STALLDEST]\nhost = "127.0.0.1"\nport = {dest_port}\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=peers,
                     dimse_timeout=TIMEOUT, dimse_network_timeout=TIMEOUT).start()
    try:
        dimse = Dimse(srv, port, None)  # type: ignore[arg-type]
        dss = [make_dataset(study=STUDY, series=STUDY + ".1", InstanceNumber=i) for i in (1, 2, 3)]
        assert dimse.store(dss) == [S.SUCCESS] * 3
        assoc = dimse.associate([build_context(StudyRootQueryRetrieveInformationModelMove), build_context(Verification)])
        started = time.monotonic()
        responses = list(assoc.send_c_move(_ident("STUDY", StudyInstanceUID=STUDY), "STALLDEST",
                                           StudyRootQueryRetrieveInformationModelMove))
        took = time.monotonic() - started
        final, identifier = responses[-1]
        # the first sub-operation stalled: failed after the DIMSE timeout; the destination
        # association was given up with it, so the other two failed at once (PS3.4 C.4.2.1.5)
        assert len(received) == 1 and received[0] in {d.SOPInstanceUID for d in dss}
        assert TIMEOUT <= took < TIMEOUT + 5
        assert final.Status == S.QR_OUT_OF_RESOURCES_SUBOPS  # 0xA702: no sub-operation completed
        assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations,
                final.NumberOfWarningSuboperations) == (0, 3, 0)
        assert sorted(identifier.FailedSOPInstanceUIDList) == sorted(d.SOPInstanceUID for d in dss)
        # the requester's association goes on: it was never idle, it waited for this answer
        assert assoc.is_established
        assert assoc.send_c_echo().Status == S.SUCCESS
        assoc.release()
        assert assoc.is_released
    finally:
        srv.stop()

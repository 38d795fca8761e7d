"""A C-MOVE whose destination stalls (PS3.4 C.4.2.3: the sub-operations are C-STOREs on an
association of their own, PS3.7 9.1.4): the stalled sub-operation fails within the listener's
timeouts, the requester gets its final C-MOVE-RSP with the counts and the Failed SOP Instance
UID List (0008,0058), and its association goes on. Before, a destination that never answered
made the listener's network timeout, counted from the C-MOVE-RQ, abort the requester's
association right after the final response; one that stopped reading held the C-MOVE 60 s
with timeouts of 2 s."""

from __future__ import annotations

import socket
import struct
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


def _listener(tmp_path, dest_port: int) -> tuple[LiveServer, Dimse]:
    """The archive with its listener's DIMSE and network timeouts at TIMEOUT, STALLDEST its peer."""
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[STALLDEST]\nhost = "127.0.0.1"\nport = {dest_port}\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=peers,
                     dimse_timeout=TIMEOUT, dimse_network_timeout=TIMEOUT).start()
    return srv, Dimse(srv, port, None)  # type: ignore[arg-type]


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


def test_a_stalled_sub_operation_fails_and_the_requester_gets_its_final_response(tmp_path,
                                                                                  stalling_destination):
    dest_port, received = stalling_destination
    srv, dimse = _listener(tmp_path, dest_port)
    try:
        dss = [make_dataset(study=STUDY, series=STUDY + ".1", InstanceNumber=i) for i in (1, 2, 3)]
        assert dimse.store(dss) == [S.SUCCESS] * 3
        assoc = dimse.associate([build_context(StudyRootQueryRetrieveInformationModelMove),
                                 build_context(Verification)])
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


@pytest.fixture
def unread_destination():
    """A destination that accepts the association (a real Storage SCP behind a proxy) and then
    stops reading: the proxy forwards PDUs until the first P-DATA-TF, then reads no more, with
    a receive buffer of 64 KiB, so the listener's send blocks once the socket buffers are full."""
    stop = threading.Event()
    ae = AE(ae_title="STALLDEST")
    ae.supported_contexts = StoragePresentationContexts
    scp_port = free_port()
    scp = ae.start_server(("127.0.0.1", scp_port), block=False, evt_handlers=[(evt.EVT_C_STORE, lambda e: 0)])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # inherited by accepted sockets
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    sockets: list[socket.socket] = [listener]

    def exactly(s: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def serve():
        while not stop.is_set():
            try:
                up, _ = listener.accept()
            except OSError:
                return
            down = socket.create_connection(("127.0.0.1", scp_port))
            sockets.extend((up, down))

            def back(up=up, down=down):
                try:
                    while data := down.recv(65536):
                        up.sendall(data)
                except OSError:
                    pass

            def forth(up=up, down=down):
                try:
                    while True:
                        header = exactly(up, 6)
                        if header[0] == 0x04:  # P-DATA-TF: stop reading
                            stop.wait(120)
                            return
                        down.sendall(header + exactly(up, struct.unpack(">I", header[2:])[0]))
                except (OSError, EOFError):
                    pass

            threading.Thread(target=back, daemon=True).start()
            threading.Thread(target=forth, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    stop.set()
    for s in sockets:
        s.close()
    scp.shutdown()


def test_a_destination_that_stops_reading_fails_its_sub_operation(tmp_path, unread_destination):
    srv, dimse = _listener(tmp_path, unread_destination)
    try:
        # 8 MiB of pixel data: more than the socket buffers between the listener and the proxy
        big = make_dataset(study=STUDY, series=STUDY + ".1", sop_class="1.2.840.10008.5.1.4.1.1.12.1",
                           modality="XA", rows=512, columns=512, frames=16)
        assert dimse.store([big]) == [S.SUCCESS]
        assoc = dimse.associate([build_context(StudyRootQueryRetrieveInformationModelMove),
                                 build_context(Verification)])
        assoc.dimse_timeout = 120  # the requester waits: the listener's timeouts are under test
        started = time.monotonic()
        responses = list(assoc.send_c_move(_ident("STUDY", StudyInstanceUID=STUDY), "STALLDEST",
                                           StudyRootQueryRetrieveInformationModelMove))
        took = time.monotonic() - started
        final, identifier = responses[-1]
        assert took < 2 * TIMEOUT + 5  # the socket's send timed out (network timeout): 60 s before
        assert final.Status == S.QR_OUT_OF_RESOURCES_SUBOPS
        assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (0, 1)
        assert identifier.FailedSOPInstanceUIDList == big.SOPInstanceUID
        assert assoc.send_c_echo().Status == S.SUCCESS
        assoc.release()
    finally:
        srv.stop()

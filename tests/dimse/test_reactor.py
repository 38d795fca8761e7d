"""The listener's reactors block on the socket and on events, never poll with sleeps
(issue 10: "no polling sleeps on the receive path"; dicomweb_server/dimse/reactor.py)."""

from __future__ import annotations

import threading
import time

from pynetdicom import AE, build_context
from pynetdicom.sop_class import CTImageStorage
from pydicom import uid as U

from dicomweb_server.archive import Archive
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.scp import DimseServer
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset


def test_association_threads_never_sleep(tmp_path, monkeypatch):
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory"))
    server = DimseServer(archive)
    port = server.start(host="127.0.0.1", port=0)
    sleeps: list[str] = []
    real_sleep = time.sleep
    main = threading.main_thread()

    def counting_sleep(seconds):
        if threading.current_thread() is not main:  # the association and DUL threads
            sleeps.append(threading.current_thread().name)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", counting_sleep)
    try:
        ae = AE(ae_title="TESTSCU")
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
        ae.add_requested_context(CTImageStorage, U.ExplicitVRLittleEndian)
        ds = make_dataset(rows=16, columns=16, PatientID="NOSLEEP")
        for _ in range(2):
            assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
            assert assoc.is_established
            real_sleep(0.05)  # idle: a polling reactor would sleep here
            assert assoc.send_c_store(ds).Status == S.SUCCESS
            assoc.release()
            assert assoc.is_released
    finally:
        monkeypatch.setattr(time, "sleep", real_sleep)
        server.stop()
        archive.close()
    assert sleeps == []


def test_both_ends_of_an_association_have_nagle_off(tmp_path):
    """TCP_NODELAY on the socket the listener accepts and on the one a pynetdicom SCU opens
    in a process that installed the reactors (the load01 generator, C-MOVE sub-operations):
    with Nagle on, a PDU's small last segment waited for the peer's 40 ms delayed ACK."""
    import socket

    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory"))
    server = DimseServer(archive)
    port = server.start(host="127.0.0.1", port=0)
    try:
        ae = AE(ae_title="TESTSCU")
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
        ae.add_requested_context(CTImageStorage, U.ExplicitVRLittleEndian)
        assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
        assert assoc.is_established
        scu_sock = assoc.dul.socket.socket
        assert scu_sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        accepted = [a.dul.socket.socket for a in server._server.active_associations]
        assert accepted and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0 for s in accepted)
        assoc.release()
    finally:
        server.stop()
        archive.close()


class _Chunks:
    """A socket stand-in that has everything already received (counts the calls)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.calls = memoryview(data), 0

    def recv(self, n):
        self.calls += 1
        out, self.data = bytes(self.data[:n]), self.data[n:]
        return out

    def recv_into(self, buf, n=0):
        self.calls += 1
        n = min(len(buf), len(self.data)) if not n else min(n, len(buf), len(self.data))
        buf[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def test_a_pdu_is_read_into_one_buffer_not_4096_bytes_per_call(tmp_path):
    """pynetdicom read a P-DATA PDU 4096 bytes per recv (128 calls and reallocations for a
    512 KB image); the listener reads what the socket has into one buffer."""
    from types import SimpleNamespace

    from dicomweb_server.dimse import scp

    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory"))
    server = DimseServer(archive)
    server.start(host="127.0.0.1", port=0)
    try:
        payload = bytes(range(256)) * 2048  # 512 KiB
        fake = _Chunks(payload)
        got = scp._bounded_recv(SimpleNamespace(socket=fake), len(payload))
        assert bytes(got) == payload and fake.calls == 1
        short = _Chunks(payload[:1000])  # the peer closed early: what was read, as pynetdicom
        assert bytes(scp._bounded_recv(SimpleNamespace(socket=short), 4096)) == payload[:1000]
    finally:
        server.stop()
        archive.close()


def test_the_listeners_long_lived_objects_are_frozen(tmp_path):
    """gc.freeze() once the listener is built: full collections no longer walk pydicom's and
    pynetdicom's tables at every few associations (~1 ms per one-image association)."""
    import gc

    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory"))
    server = DimseServer(archive)
    gc.unfreeze()
    server.start(host="127.0.0.1", port=0)
    try:
        assert gc.get_freeze_count() > 10_000
    finally:
        server.stop()
        archive.close()
        gc.unfreeze()

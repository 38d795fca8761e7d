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

    earlier = set(threading.enumerate())  # (other tests' daemon threads, e.g. serve's announcer)

    def counting_sleep(seconds):
        me = threading.current_thread()
        if me is not main and me not in earlier:  # the association and DUL threads
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

    def gettimeout(self):
        return 60.0


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


def test_a_paused_reactor_never_takes_the_services_response():
    """pynetdicom's pause handshake (a ``send_*`` service clears ``_reactor_checkpoint`` and
    waits for ``_is_paused``, then takes its response off the DIMSE queue itself) had a
    window: the reactor set ``_is_paused = False`` only after the checkpoint wait returned,
    so a service could see the stale True, send, and have its C-STORE-RSP taken and dropped
    by the reactor: the SCU waited out its DIMSE timeout. 20,000 pause cycles against the
    real reactor loop with a fake association; tiny switch interval to provoke the window."""
    import collections
    import sys
    from types import SimpleNamespace

    from dicomweb_server.dimse import reactor

    lock = threading.Lock()
    queue: collections.deque = collections.deque()
    stolen: list = []

    def get_msg(block=False):
        with lock:
            return queue.popleft() if queue else (None, None)

    a = SimpleNamespace(_kill=False, _reactor_checkpoint=threading.Event(), _is_paused=False,
                        _wake=threading.Event(), is_established=True, dimse=SimpleNamespace(get_msg=get_msg),
                        _serve_request=lambda msg, cid: stolen.append(msg),
                        acse=SimpleNamespace(is_release_requested=lambda: False, is_aborted=lambda: False),
                        dul=SimpleNamespace(is_alive=lambda: True, idle_timer_expired=lambda: False,
                                            _idle_timer=SimpleNamespace(timeout=None)))
    a._reactor_checkpoint.set()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=reactor._assoc_run_reactor, args=(a,))
    t.start()
    try:
        for i in range(20_000):
            a._reactor_checkpoint.clear()  # what Association.send_c_store does
            while not a._is_paused:
                time.sleep(0)
            with lock:
                queue.append((1, ("C-STORE-RSP", i)))  # the peer answered at once
            a._wake.set()  # the DUL's put wakes the reactor
            get_msg()  # the service takes its response
            a._reactor_checkpoint.set()
            if i % 7 == 0:
                a._wake.set()  # other traffic
    finally:
        sys.setswitchinterval(interval)
        a._kill = True
        a._reactor_checkpoint.set()
        a._wake.set()
        t.join(10)
    assert stolen == []


def test_the_listen_backlog_holds_a_burst_of_connections(tmp_path):
    """socketserver's listen backlog is 5: a burst of 16+ associations overflowed it and the
    clients' kernels retried the dropped SYNs a second later. Every connection of a burst of
    64 (nothing accepted meanwhile: the accept thread is held) is queued at once."""
    import socket

    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory", dimse_max_associations=64))
    server = DimseServer(archive)
    port = server.start(host="127.0.0.1", port=0)
    hold = threading.Lock()
    get_request = server._server.get_request

    def held_get_request():
        with hold:
            return get_request()

    server._server.get_request = held_get_request
    socks = []
    try:
        with hold:
            for _ in range(64):
                s = socket.socket()
                s.settimeout(0.5)
                s.connect(("127.0.0.1", port))  # a full backlog would time out (SYN dropped)
                socks.append(s)
            assert server._server.socket.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    finally:
        for s in socks:
            s.close()
        server.stop()
        archive.close()

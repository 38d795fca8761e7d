"""Blocking (event-driven) reactors for pynetdicom's associations: no polling sleeps.

pynetdicom 3.0 runs two threads per association, and both poll: the DUL thread
(``DULServiceProvider.run_reactor``) checks its queues and the socket and then
``time.sleep(0.001)``; the association thread (``Association._run_reactor``) sleeps
1 ms before each look at the decoded DIMSE messages; ``Association.kill`` waits for
the DUL thread in 10 ms sleeps. py-spy put ~39 % of the listener's samples in
those sleeps, and every request/response hop paid up to a millisecond twice (issue
10: "no polling sleeps on the receive path").
pynetdicom has no hook for this, so the three methods are replaced here, process-wide
while the listener runs (:func:`install`; :func:`uninstall` on stop), keeping
pynetdicom's state machine, queues, ACSE and DIMSE code unchanged:

- the DUL thread blocks in ``select`` on the association socket and a per-association
  wake-up pipe, with a timeout only for the ARTIM timer (PS3.8 §9.1.5); a ``put`` from
  another thread on its event or provider queue, or ``kill_dul``, writes a byte to
  the pipe;
- the association thread blocks on a ``threading.Event`` set by a ``put`` on the
  DUL's to-user queue or the DIMSE message queue, and when the DUL thread ends, with
  a timeout only for the network idle timer;
- ``kill`` asks the DUL thread to end once it is idle (Sta1) and joins it;
- a thread sending P-DATA (``send_pdu``) waits while 4 PDUs are queued for the DUL
  thread: pynetdicom's queue is unbounded, so a data set sent from a file (C-GET,
  C-MOVE: read PDU by PDU) was read into the queue faster than the socket took it,
  half a 32 MB instance at a time;
- the sockets pynetdicom opens as a requestor (an SCU: C-MOVE sub-operations, routing's
  C-STORE destinations, the LOAD-01 generator) get TCP_NODELAY: pynetdicom writes a
  P-DATA PDU and then waits for the answer, and with Nagle on, a small last segment
  waits for the peer's delayed ACK (40 ms on Linux; DCMTK >= 3.6.2 leaves Nagle on too).
  Accepted sockets get it in :meth:`.scp.DimseServer.start`.

The checks each loop makes are pynetdicom's own, in the same order. Used by the
listener (:mod:`.scp`) and by any pynetdicom SCU in a process that calls :func:`install`
(``loadtests/load01.py`` does, so that the generator does not measure its own sleeps).
"""

from __future__ import annotations

import logging
import os
import queue
import select
import socket
import ssl
import threading

from pynetdicom import association as _association
from pynetdicom import dul as _dul
from pynetdicom import transport as _transport
from pynetdicom.fsm import InvalidEventError
from pynetdicom.pdu import A_ABORT_RQ
from pynetdicom.pdu_primitives import P_DATA

from . import store_rsp

log = logging.getLogger("dicomweb_server.dimse")

Association = _association.Association
DUL = _dul.DULServiceProvider
Socket = _transport.AssociationSocket
_ORIGINAL = (Association.__init__, Association._run_reactor, Association.kill, DUL.run_reactor, DUL.kill_dul,
             Socket._create_socket, DUL.send_pdu)

#: P-DATA PDUs a sending thread may have queued for the DUL thread
SEND_QUEUE = 4


def _notify_on_put(q: queue.Queue, notify) -> None:
    """Make ``q.put`` call ``notify()`` after the item is queued (this instance only)."""
    put = q.put

    def put_and_notify(item, block=True, timeout=None):
        put(item, block, timeout)
        notify()

    q.put = put_and_notify  # type: ignore[method-assign]


def _wake_dul(dul) -> None:
    """Wake the DUL thread's ``select`` (no-op on its own thread: it looks at its queues
    before it waits again)."""
    w = getattr(dul, "_wake_w", None)
    if w is None or threading.get_ident() == dul.ident:
        return
    try:
        os.write(w, b"\0")
    except OSError:  # pipe full (already woken) or closed (DUL thread ended)
        pass


def _assoc_init(self, *args, **kwargs) -> None:
    _ORIGINAL[0](self, *args, **kwargs)
    self._wake = threading.Event()
    dul = self.dul
    dul._wake_w = None
    dul._stop_when_idle = False
    _notify_on_put(dul.event_queue, lambda: _wake_dul(dul))
    _notify_on_put(dul.to_provider_queue, lambda: _wake_dul(dul))
    _notify_on_put(dul.to_user_queue, self._wake.set)
    _notify_on_put(self.dimse.msg_queue, self._wake.set)


def _kill_dul(self) -> None:
    self._kill_thread = True
    _wake_dul(self)


def _dul_wait(self, rfd: int) -> None:
    """Block until the socket has data, another thread wakes us, or the ARTIM timer expires."""
    sock = getattr(self.socket, "socket", None)
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return  # decrypted bytes already buffered: select would not see them
    fds = [rfd]
    if sock is not None and self.socket._is_connected and sock.fileno() >= 0:
        fds.append(sock)
    timeout = None
    if self.artim_timer._start_time is not None and self.artim_timer._end_time is None:
        timeout = max(0.0, self.artim_timer.remaining)
    try:
        ready, _, _ = select.select(fds, [], [], timeout)
    except (OSError, ValueError):  # socket closed under us: the next loop sees it
        return
    if rfd in ready:
        try:
            os.read(rfd, 4096)
        except BlockingIOError:
            pass


def _dul_run_reactor(self) -> None:
    """``DULServiceProvider.run_reactor`` without the 1 ms polling sleep."""
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    self._wake_w = wfd
    self._ended = False
    self._idle_timer.start()
    try:
        while True:
            if not self.assoc._dul_ready.is_set():
                self.assoc._dul_ready.set()
            if self._kill_thread or (self._stop_when_idle and self.state_machine.current_state == "Sta1"):
                break
            if self.artim_timer.expired:
                self.event_queue.put("Evt18")
            try:
                if self._process_recv_primitive():  # encode (sent by state machine)
                    pass
                elif self._is_transport_event():  # receive and decode PDU
                    self._idle_timer.restart()
            except Exception as exc:  # as pynetdicom: A-ABORT, hard stop of both reactors
                log.error("Exception in DUL reactor, aborting association")
                log.exception(exc)
                abort_pdu = A_ABORT_RQ()
                abort_pdu.source = 0x02
                abort_pdu.reason_diagnostic = 0x00
                self.socket.send(abort_pdu.encode())
                self.assoc.is_aborted = True
                self.assoc.is_established = False
                self.assoc._kill = True
                self._kill_thread = True
                return
            try:
                event = self.event_queue.get(block=False)
            except queue.Empty:  # nothing to do: wait (a readable socket returns at once)
                if self.to_provider_queue.queue:  # queued by this thread (cstore_rx.py): no wake-up came
                    continue
                _dul_wait(self, rfd)
                continue
            try:
                self.state_machine.do_action(event)
            except InvalidEventError as exc:
                # A service primitive that arrives after the association ended under it (an
                # A-ASSOCIATE or A-RELEASE response from the association thread once the peer's
                # PDUs moved the machine to Sta13): PS3.8 Table 9-10 has no action for it. The
                # DUL ends, as it did in pynetdicom, where the exception ended the thread with a
                # traceback; the association thread then sees it gone and ends the association.
                log.warning("association ended under its own response (%s)", exc)
                break
    finally:
        self._wake_w = None
        os.close(wfd)
        os.close(rfd)
        q = self.to_provider_queue
        with q.not_full:  # a sender waiting for room (_send_pdu_paced) stops waiting
            self._ended = True
            q.not_full.notify_all()
        # A thread waiting on the to-user queue (pynetdicom's acceptor waits there for
        # its A-ASSOCIATE-RQ, for acse_timeout) learns that nothing more will come: None is
        # what that wait returns on a timeout, and it then kills the association and
        # closes its socket. A DUL that ended without putting a primitive there (garbage
        # or a refused PDU before the A-ASSOCIATE-RQ: PS3.8 Sta2 -> AA-1, no indication)
        # held that thread, and its place among the listener's associations, for
        # acse_timeout (30 s). Queued primitives stay ahead of it.
        self.to_user_queue.put(None)
        wake = getattr(self.assoc, "_wake", None)
        if wake is not None:
            wake.set()  # the association thread sees the DUL has ended


def _assoc_run_reactor(self) -> None:
    """``Association._run_reactor`` blocking on ``self._wake`` instead of sleeping 1 ms."""
    wake = getattr(self, "_wake", None)
    if wake is None:  # created before install(): pynetdicom's own loop
        return _ORIGINAL[1](self)
    while not self._kill:
        # A service (``release``, ``send_*``; the requestor's own thread) pauses the reactor:
        # it clears the checkpoint, waits until _is_paused, then sends and takes the answer
        # off the message queue itself. pynetdicom's loop set _is_paused = False only after
        # the checkpoint wait returned: a service that cleared the checkpoint in between saw
        # the stale True, and the reactor then took that service's response (the C-STORE-RSP)
        # and dropped it; the SCU waited out its DIMSE timeout (the LOAD-01 "hangs", more
        # frequent the faster the server answers). Announce running first, then look.
        self._is_paused = False
        if not self._reactor_checkpoint.is_set():
            self._is_paused = True
            self._reactor_checkpoint.wait()
            continue
        wake.clear()  # set by any put after this point: the wait below returns at once

        context_id, msg = self.dimse.get_msg(block=False)
        if msg:
            self._serve_request(msg, context_id)
            # The peer waited for this answer, it was not idle: the network timeout counts from
            # the end of the service. A C-MOVE whose destination stalled for dimse_timeout (the
            # same 60 s) used to end with the final response, then an A-ABORT of the requester's
            # association, whose last PDU (the C-MOVE-RQ) had come a network timeout before.
            self.dul._idle_timer.restart()
            continue  # more may be queued

        if self.is_established and self.acse.is_release_requested():
            with store_rsp.gate(self.dul).lock:  # never between the fragments of a message (PS3.8 Annex E)
                self.acse.send_release(is_response=True)
            log.debug("Association Released")
            self.is_released = True
            self.is_established = False
            _association.evt.trigger(self, _association.evt.EVT_RELEASED, {})
            self.kill()
            return

        if self.acse.is_aborted():
            log.debug("Association Aborted%s", " (A-P-ABORT)" if self.acse.is_aborted("a-p-abort") else "")
            self.dul.receive_pdu(wait=False)  # EVT_ACSE_RECV fires for subscribers
            self.is_aborted = True
            self.is_established = False
            _association.evt.trigger(self, _association.evt.EVT_ABORTED, {})
            self.kill()
            return

        if not self.dul.is_alive():
            self.kill()
            return

        storing = getattr(self.dul, "_storing", False)  # a C-STORE served by the DUL thread (cstore_rx.py)
        if self.dul.idle_timer_expired() and not storing:
            log.error("Network timeout reached")
            if self.network_timeout_response == "A-RELEASE":
                self._is_paused = True
                self._reactor_checkpoint.wait()
                self.release()
                self._is_paused = False
            else:
                self.abort()
            self.kill()
            return

        timer = self.dul._idle_timer
        timeout = None if timer.timeout is None else timer.timeout if storing else max(0.0, timer.remaining)
        self._is_paused = True  # nothing is taken off a queue until the checkpoint above
        wake.wait(timeout)


def _assoc_kill(self) -> None:
    """``Association.kill``: the DUL thread ends once idle (Sta1), joined, not polled."""
    if not hasattr(self, "_wake"):  # created before install()
        return _ORIGINAL[2](self)
    self._reactor_checkpoint.set()
    self._kill = True
    self.is_established = False
    self._is_paused = True
    self._wake.set()
    dul = self.dul
    if dul.is_alive() and dul.ident != threading.get_ident():
        dul._stop_when_idle = True
        _wake_dul(dul)
        dul.join()


def _send_pdu_paced(self, primitive) -> None:
    """``DULServiceProvider.send_pdu``, waiting while ``SEND_QUEUE`` P-DATA are queued
    (woken by the DUL thread's ``get``, which notifies ``not_full``, or by its end)."""
    if isinstance(primitive, P_DATA) and threading.get_ident() != self.ident:
        q = self.to_provider_queue
        with q.not_full:
            while q._qsize() >= SEND_QUEUE and not getattr(self, "_ended", True) and not self._kill_thread:
                q.not_full.wait()
    _ORIGINAL[6](self, primitive)


def _create_socket_nodelay(self, address):
    """``AssociationSocket._create_socket`` (the requestor's socket) with Nagle off."""
    sock = _ORIGINAL[5](self, address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def served_off_thread(assoc) -> None:
    """After ``Association._serve_request`` returns (called by :mod:`.access`'s dispatch hook).

    pynetdicom serves an N-EVENT-REPORT request in a thread of its own (``dimse.py``
    ``receive_primitive``: "would block the DUL otherwise"), and ``_serve_request`` ends with
    ``_is_paused = False``, while the association's reactor may be blocked in its wait
    having said paused: a ``release()`` (or any ``send_*``) from the application then spun
    on ``_is_paused`` until the network timeout (a storage commitment SCU releasing right
    after its report, tests/dimse/test_commitment.py). pynetdicom's polling loop set the
    flag again within 1 ms; here the reactor is woken, and its next loop does."""
    if threading.current_thread() is not assoc:
        wake = getattr(assoc, "_wake", None)
        if wake is not None:
            wake.set()


def install() -> None:
    """Replace pynetdicom's polling reactors and give requestor sockets TCP_NODELAY
    (process-wide; associations created after this)."""
    Association.__init__ = _assoc_init  # type: ignore[method-assign]
    Association._run_reactor = _assoc_run_reactor  # type: ignore[method-assign]
    Association.kill = _assoc_kill  # type: ignore[method-assign]
    DUL.run_reactor = _dul_run_reactor  # type: ignore[method-assign]
    DUL.kill_dul = _kill_dul  # type: ignore[method-assign]
    Socket._create_socket = _create_socket_nodelay  # type: ignore[method-assign]
    DUL.send_pdu = _send_pdu_paced  # type: ignore[method-assign]


def uninstall() -> None:
    """pynetdicom's own reactors again (associations created after this)."""
    (Association.__init__, Association._run_reactor, Association.kill, DUL.run_reactor, DUL.kill_dul,
     Socket._create_socket, DUL.send_pdu) = _ORIGINAL

"""Association slots of one node, shared by its listener processes (issues 25 and 33).

``dimse_max_associations`` is the node's limit, however the kernel spreads connections over
the listener processes ``serve`` starts (SO_REUSEPORT hashes each connection to one of
them: with a limit per process, 13 of 64 LOAD-01 associations were rejected while the
other process had room). No peer takes every slot: one peer (by address, and separately by
calling AE title) holds at most ``dimse_max_associations_per_peer`` associations, and one
address at most twice that many TCP connections; the node at most twice
``dimse_max_associations`` connections (the rest are closed at accept). Before, one peer
that opened 300 associations held all the slots, or 128 idle sockets all the connections,
and a modality's C-ECHO was refused.

An association beyond a limit gets an A-ASSOCIATE-RJ, rejected-transient, source: service
provider (presentation related), reason: local-limit-exceeded (PS3.8 §9.3.4, Table 9-21:
result 2, source 3, reason 2), from an ``EVT_REQUESTED`` handler (pynetdicom's hook for a
user's own A-ASSOCIATE-RJ, run before its own checks). pynetdicom's own limit (active
acceptor threads, idle connections included, per process) is set out of reach.

The accounting (:mod:`..process_rows`): an anonymous shared file (``memfd``) that ``serve`` creates before it starts
the listeners, one row per listener process. Each process writes into its own row, under
an ``fcntl`` lock on the file, what it holds: every connection (peer address) and whether
it holds a slot (with the calling AE title), taken each time from its live threads (a
process's row is never more than a restatement of the truth: nothing to leak). It does so
at each decision (accept, A-ASSOCIATE-RQ), when an association is released, aborted or
rejected, and when an association's thread ends. A listener holds an ``fcntl`` lock on a
byte of its row while it lives: the kernel drops it when the process dies, SIGKILL
included, and the rows whose lock is free are not counted (the slots of a dead listener
come back at once). The same lock, taken by a process that dies, is dropped too, which a
semaphore or lock in shared memory would not be.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import threading

from pynetdicom import evt
from pynetdicom.association import Association

from .. import process_rows

log = logging.getLogger("dicomweb_server.dimse")

_HEADER = struct.Struct("<8sII")  # magic, rows, entries per row
_MAGIC = b"DCMSLOT1"
_COUNT = struct.Struct("<I")
#: one connection: 1 (connection) or 2 (association), peer address, calling AE title
_ENTRY = struct.Struct("<B47s16s")
CONNECTION, ASSOCIATION = 1, 2
#: result 2 (rejected-transient), source 3 (service provider, presentation related),
#: reason 2 (local-limit-exceeded): PS3.8 §9.3.4
LOCAL_LIMIT_EXCEEDED = (0x02, 0x03, 0x02)


def per_peer_limit(settings) -> int:
    """``dimse_max_associations_per_peer``, or a quarter of ``dimse_max_associations`` (at least 1)."""
    total = settings.dimse_max_associations
    return min(total, settings.dimse_max_associations_per_peer or max(1, total // 4))


def create_table(rows: int, limit: int) -> int:
    """A new shared table for ``rows`` listener processes of a node limited to ``limit``
    associations: an anonymous file (not inheritable: ``serve`` passes it to each listener);
    returns its descriptor."""
    per_row = 2 * limit  # connections one process may hold (the node's bound)
    return process_rows.new_table("dicomweb-dimse-slots", _HEADER.size + rows * (_COUNT.size + per_row * _ENTRY.size),
                                  _HEADER.pack(_MAGIC, rows, per_row))


class Slots:
    """This process's view of its node's table (``fd`` from :func:`create_table`; None: a
    table of its own, for a listener alone on its port)."""

    def __init__(self, limit: int, per_peer: int, fd: int | None = None) -> None:
        self.limit, self.per_peer = limit, per_peer
        self._own = fd is None
        self.fd = create_table(1, limit) if fd is None else fd
        self._map = mmap.mmap(self.fd, os.fstat(self.fd).st_size)
        magic, self.rows, self.per_row = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC:
            raise ValueError(f"descriptor {self.fd} is not a DIMSE slot table")
        self._lock = threading.Lock()  # fcntl locks do not exclude the threads of one process
        self.closed = False
        self.row = self._claim()

    # --- the shared file -----------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        """The table to itself (this thread among this process's, this process among the
        node's); yields False once :meth:`close` ran (a thread ending after its listener)."""
        with self._lock:
            if self.closed:
                yield False
                return
            with process_rows.mutex(self.fd):
                yield True

    def _offset(self, row: int) -> int:
        return _HEADER.size + row * (_COUNT.size + self.per_row * _ENTRY.size)

    def _claim(self) -> int:
        """The first row no live process holds: locked (held until this process ends), emptied."""
        with self._locked():
            for row in range(self.rows):
                if not process_rows.own(self.fd, row):
                    continue  # a live listener's
                _COUNT.pack_into(self._map, self._offset(row), 0)
                return row
        raise RuntimeError(f"all {self.rows} rows of the DIMSE slot table are held by live listeners")

    def _entries(self) -> list[tuple[int, str, str]]:
        """Every live process's connections (the caller holds the lock); a dead process's row is emptied."""
        out = []
        for row in range(self.rows):
            at = self._offset(row)
            (n,) = _COUNT.unpack_from(self._map, at)
            if not n:
                continue
            if row != self.row and not process_rows.owner_alive(self.fd, row):
                _COUNT.pack_into(self._map, at, 0)  # SIGKILLed: its slots come back
                continue
            for state, address, ae in _ENTRY.iter_unpack(self._map[at + 4:at + 4 + n * _ENTRY.size]):
                out.append((state, address.rstrip(b"\0").decode(), ae.rstrip(b"\0").decode()))
        return out

    def _publish(self, entries) -> None:
        """This process's row := ``entries`` (the caller holds the lock)."""
        entries = entries[:self.per_row]
        at = self._offset(self.row)
        for i, (state, address, ae) in enumerate(entries):
            _ENTRY.pack_into(self._map, at + 4 + i * _ENTRY.size, state, address.encode("ascii", "replace")[:47],
                             ae.encode("ascii", "replace")[:16])
        _COUNT.pack_into(self._map, at, len(entries))

    def close(self) -> None:
        """Give the row back (the process goes on; e.g. a test's next listener)."""
        with self._locked() as open_:
            if not open_:
                return
            self.closed = True
            _COUNT.pack_into(self._map, self._offset(self.row), 0)
            process_rows.disown(self.fd, self.row)
        self._map.close()
        if self._own:
            os.close(self.fd)

    # --- decisions --------------------------------------------------------------------------

    def admit_connection(self, server, address: str) -> str | None:
        """Why a new TCP connection from ``address`` is closed at accept, or None (admitted)."""
        with self._locked() as open_:
            if not open_:
                return None
            mine = _held(server)
            self._publish(mine + [(CONNECTION, address, "")])  # seen by the others at once
            entries = self._entries()
            if len(entries) > 2 * self.limit:
                why = f"{len(entries) - 1} connections open (twice the node's {self.limit} associations)"
            elif sum(1 for e in entries if e[1] == address) > 2 * self.per_peer:
                why = f"{2 * self.per_peer} connections open from {address} (twice the associations per peer)"
            else:
                return None
            self._publish(mine)
        return why

    def admit_association(self, assoc, ae_title: str) -> str | None:
        """Why the A-ASSOCIATE-RQ of ``assoc`` is rejected, or None: it holds a slot."""
        address = assoc.requestor.address
        with self._locked() as open_:
            if not open_:
                return None
            self._publish(_held(assoc._server))
            held = [e for e in self._entries() if e[0] == ASSOCIATION]
            if len(held) >= self.limit:
                return f"all {self.limit} associations of this node are in use"
            if sum(1 for e in held if e[1] == address) >= self.per_peer:
                return f"{address} holds {self.per_peer} associations (dimse_max_associations_per_peer)"
            if sum(1 for e in held if e[2] == ae_title) >= self.per_peer:
                return f"{ae_title!r} holds {self.per_peer} associations (dimse_max_associations_per_peer)"
            assoc._dimse_slot = ae_title
            self._publish(_held(assoc._server))
        return None

    def refresh(self, server, ending=None) -> None:
        """Rewrite this process's row from its threads (``ending``: a thread about to end)."""
        with self._locked() as open_:
            if open_:
                self._publish(_held(server, ending))


def _held(server, ending=None) -> list[tuple[int, str, str]]:
    """What this process's listener holds now: an entry per connection, from the live threads
    of ``server`` and of the other servers of its AE (the plain and the TLS port share the
    process's row: a row written from one port's threads alone dropped the other's), an
    association holding a slot until it is released, aborted or rejected."""
    out = []
    others = getattr(getattr(server, "ae", None), "_servers", None) or []
    for one in [server, *(s for s in list(others) if s is not server)]:  # a stopping one left ae._servers
        out += _held_by(one, ending)
    return out


def _held_by(server, ending=None) -> list[tuple[int, str, str]]:
    out = []
    sockets = set()
    for assoc in server.active_associations:
        if assoc is ending:
            continue
        sockets.add(id(getattr(assoc.dul.socket, "socket", None)))
        ae = getattr(assoc, "_dimse_slot", None)
        if ae is not None and not (assoc.is_released or assoc.is_aborted or assoc.is_rejected):
            out.append((ASSOCIATION, assoc.requestor.address, ae))
        else:
            out.append((CONNECTION, assoc.requestor.address, ""))
    # connections accepted whose association thread has not started yet (socketserver's
    # per-request thread: ThreadingMixIn.process_request_thread(request, client_address),
    # alive for a moment after it started the association's: not counted twice)
    for t in threading.enumerate():
        if t.name.endswith("(process_request_thread)") and getattr(getattr(t, "_target", None), "__self__",
                                                                    None) is server:
            request, client_address = t._args  # type: ignore[attr-defined]
            if id(request) not in sockets:
                out.append((CONNECTION, str(client_address[0]), ""))
    return out


def request_time_left(assoc_socket) -> float | None:
    """Seconds left for the A-ASSOCIATE-RQ of the accepted connection ``assoc_socket`` (a
    ``pynetdicom.transport.AssociationSocket``) while its DUL awaits it (Sta2, PS3.8 §9.2;
    the ARTIM timer started at accept, ``dimse_acse_timeout``); None otherwise."""
    assoc = getattr(assoc_socket, "assoc", None)
    dul = getattr(assoc, "dul", None)
    if dul is None or not assoc.is_acceptor:
        return None
    state, timer = dul.state_machine.current_state, dul.artim_timer
    if state == "Sta1":  # accepted, its event (Evt5: AE-5 starts ARTIM) not yet handled: bytes came first
        return timer.timeout
    if state != "Sta2" or timer._start_time is None or timer._end_time is not None:
        return None
    return max(0.0, timer.remaining)


def _slots_of(server) -> Slots | None:
    return getattr(getattr(server, "ae", None), "dimse_slots", None)


# --- pynetdicom hooks ----------------------------------------------------------------------


def verify_request(self, request, client_address) -> bool:
    """socketserver's accept hook (``AssociationServer.verify_request``): a connection over the
    node's or its address's bound is closed at once (pynetdicom gave every connection two
    threads from accept on, and checked its limit only at the A-ASSOCIATE-RQ)."""
    slots = _slots_of(self)
    if slots is None:
        return True
    why = slots.admit_connection(self, str(client_address[0]))
    if why:
        log.warning("DIMSE connection from %s closed at accept: %s", client_address[0], why)
    return why is None


def on_requested(event) -> None:
    """``EVT_REQUESTED``: an A-ASSOCIATE-RQ arrived; a slot for it, or A-ASSOCIATE-RJ
    local-limit-exceeded (what pynetdicom's acceptor does for its own limit)."""
    assoc = event.assoc
    slots = _slots_of(assoc._server)
    if slots is None or assoc.is_rejected or assoc.is_aborted:
        return
    ae_title = str(assoc.requestor.primitive.calling_ae_title).strip()
    why = slots.admit_association(assoc, ae_title)
    if why is None:
        return
    log.warning("association from %r at %s rejected (local-limit-exceeded): %s", ae_title,
                assoc.requestor.address, why)
    assoc.acse.send_reject(*LOCAL_LIMIT_EXCEEDED)
    evt.trigger(assoc, evt.EVT_REJECTED, {})
    assoc.kill()


def on_ended(event) -> None:
    """``EVT_RELEASED``, ``EVT_ABORTED``, ``EVT_REJECTED``: the slot is free for the others now."""
    slots = _slots_of(getattr(event.assoc, "_server", None))
    if slots is not None:
        slots.refresh(event.assoc._server)


#: the handlers :meth:`.scp.DimseServer.start` binds
HANDLERS = [(evt.EVT_REQUESTED, on_requested), (evt.EVT_RELEASED, on_ended), (evt.EVT_ABORTED, on_ended),
            (evt.EVT_REJECTED, on_ended)]


def _run(self) -> None:
    """``Association.run`` (the thread's body): when an acceptor's thread ends, its row is rewritten."""
    try:
        threading.Thread.run(self)  # the target: pynetdicom's run_reactor
    finally:
        slots = _slots_of(getattr(self, "_server", None))
        if slots is not None:
            slots.refresh(self._server, ending=self)


def install() -> None:
    """Process-wide while a listener runs (pynetdicom's Association has no ``run`` of its own)."""
    Association.run = _run  # type: ignore[method-assign]


def uninstall() -> None:
    if "run" in vars(Association):
        del Association.run

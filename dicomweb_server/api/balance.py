"""Keep-alive connections spread evenly over uvicorn's worker processes (issue 33).

Why: ``serve --workers N`` runs uvicorn's supervisor; its workers accept from one shared
listening socket, and a keep-alive connection stays for its whole life with the worker that
accepted it. The idle worker wakes first and takes a whole burst: with 8 keep-alive
connections over 2 workers the split was 3/5 or 2/6 in 7 of 20 tries (0/8 on a busy
machine), with 32 as bad as 4/28 (``benchmarks/worker_spread.py``). A viewer or a modality
holding a few persistent connections was then served by one core of two.

How: a worker that accepts a connection while it holds more open HTTP connections than the
least loaded live sibling (so that taking it would put it 2 ahead) passes the accepted
socket to that sibling over a Unix socket (``SCM_RIGHTS``), in ``connection_made``, before
any byte of it was read. The sibling adopts it with ``loop.connect_accepted_socket`` and a
protocol factory built as uvicorn's ``Server.startup`` builds it, so the connection is in
its ``server_state`` (graceful shutdown, limits) exactly as one it accepted itself. The
sender then closes its descriptor without ``shutdown()``: the socket lives on in the
message, then in the sibling (closing one of several descriptors of a socket sends
nothing). A connection is decided once: an adopted one is never passed on.

The accounting is the DIMSE slots' mechanism (:mod:`..process_rows`): an anonymous shared file (``memfd``) that
the supervisor creates before the workers start, one row per worker (pid, connections held,
connections sent to it and not yet adopted), changed under an ``fcntl`` lock on a byte of
the file, except the count of connections held, which only its worker writes (one aligned
int store, read whole by the others: no lock at each accept and close). A worker holds an ``fcntl`` lock on a byte of its row while it serves; the kernel
drops it when the worker dies (SIGKILL included), so a dead or restarted worker's row is
never chosen. Each row has its own ``socketpair``, made by the supervisor too: every worker
has both ends of every row, so a descriptor sent to a worker that died before adopting it
stays queued, and the next worker to check (each second, or one claiming that row) adopts
it: no connection is lost with a sibling. The sender sends while it holds the table's lock
and counts the connection as the sibling's at once (a burst accepted in one wake-up would
otherwise all go to the same sibling). Whatever fails (no table, no live sibling, a send
error) serves the connection where it was accepted. Not for TLS or Unix-domain connections
(``serve`` has neither on its HTTP port).

:func:`run` is ``uvicorn.run`` for several workers (uvicorn 0.55: ``main.run``,
``supervisors/multiprocess.py``; the version and the functions relied on are pinned:
``tests/server/test_uvicorn_pins.py``), with workers whose server is :class:`BalancedServer`.
``balance_connections`` (``DICOMWEB_BALANCE_CONNECTIONS``) switches it off.
"""

from __future__ import annotations

import array
import asyncio
import functools
import logging
import mmap
import os
import socket
import struct
from multiprocessing import reduction
from typing import Any

import uvicorn
from uvicorn.server import Server
from uvicorn.supervisors import multiprocess

from .. import process_rows

log = logging.getLogger("dicomweb_server.api")

_HEADER = struct.Struct("<8sI")  # magic, rows
_MAGIC = b"DCMBAL01"
_ROW = struct.Struct("<iii")  # pid, connections held, connections sent to it and not yet adopted
_FIRST = _HEADER.size // 4  # the first row's first int (the rows start 4-aligned)
_INT = array.array("i")


class Table:
    """The supervisor's shared table and one ``socketpair`` per row; pickled into each
    worker (multiprocessing's spawn passes the descriptors)."""

    def __init__(self, rows: int, fd: int | None = None, pairs: list | None = None) -> None:
        if fd is None:
            fd = process_rows.new_table("dicomweb-balance", _HEADER.size + rows * _ROW.size,
                                        _HEADER.pack(_MAGIC, rows))
            # datagrams: one connection per message; a socketpair's peer has no queue-length limit
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(rows)]
        self.fd, self.rows, self.pairs = fd, rows, pairs

    def __reduce__(self):
        return _rebuild, (reduction.DupFd(self.fd), self.rows, self.pairs)


def _rebuild(dup, rows: int, pairs: list) -> Table:
    return Table(rows, dup.detach(), pairs)


class Balancer:
    """One worker's row of :class:`Table` and its hand-offs."""

    def __init__(self, table: Table, server: BalancedServer) -> None:
        self.table, self.server = table, server
        self.fd = table.fd
        self._map = mmap.mmap(self.fd, _HEADER.size + table.rows * _ROW.size)
        # the rows as C ints: one field is stored with one aligned write, which a reader in
        # another process sees whole (struct.pack_into writes byte by byte)
        self._ints = memoryview(self._map).cast("i")
        self.loop = asyncio.get_running_loop()
        config = server.config
        self._factory = functools.partial(config.http_protocol_class, config=config,
                                          server_state=server.server_state, app_state=server.lifespan.state)
        self._adopting: set[asyncio.Task] = set()
        self.stopped = False
        self.row = self._claim()
        self._recv = table.pairs[self.row][0]
        self.loop.add_reader(self._recv.fileno(), self._on_readable)

    # --- the shared file ---------------------------------------------------------------------

    def _locked(self):
        return process_rows.mutex(self.fd)

    def _get(self, row: int) -> tuple[int, int, int]:
        i = _FIRST + 3 * row
        return self._ints[i], self._ints[i + 1], self._ints[i + 2]

    def _set(self, row: int, pid: int, held: int, incoming: int) -> None:
        """A whole row (the caller holds the table's lock, and no live owner writes it: a row
        being claimed, emptied, or this worker's own)."""
        i = _FIRST + 3 * row
        self._ints[i], self._ints[i + 1], self._ints[i + 2] = pid, held, max(0, incoming)

    def _add_incoming(self, row: int, n: int) -> None:
        """Connections sent to ``row`` and not yet adopted, changed by ``n`` (the caller holds
        the table's lock: senders and the row's owner both change this field)."""
        i = _FIRST + 3 * row + 2
        self._ints[i] = max(0, self._ints[i] + n)

    def _set_held(self, adding: int = 0) -> None:
        """This worker's count of connections, without the table's lock: only this worker
        writes it (a sender changes a row's incoming field only), and a reader sees the old
        or the new value. At every accept and close of a connection: taking the lock there
        cost clients that open a connection per request (issue 33)."""
        self._ints[_FIRST + 3 * self.row + 1] = len(self.server.server_state.connections) + adding

    def _alive(self, row: int) -> bool:
        return process_rows.owner_alive(self.fd, row)

    def _claim(self) -> int:
        """A row no live worker holds (one with connections queued first: they are adopted now)."""
        with self._locked():
            free = [r for r in range(self.table.rows) if not self._alive(r)]
            for row in sorted(free, key=lambda r: -self._get(r)[2]):
                if not process_rows.own(self.fd, row):
                    continue
                self._set(row, os.getpid(), 0, 0)
                self.row = row
                self._set(row, os.getpid(), 0, self._drain(self.table.pairs[row][0]))
                return row
        raise RuntimeError(f"all {self.table.rows} rows of the connection table are held by live workers")

    def _rescue(self) -> None:
        """Adopt what was sent to workers that died before adopting it; their rows emptied."""
        with self._locked():
            for row in range(self.table.rows):
                if row != self.row and self._get(row)[0] and not self._alive(row):
                    n = self._drain(self.table.pairs[row][0])
                    self._set(row, 0, 0, 0)
                    self._add_incoming(self.row, n)

    # --- sending -----------------------------------------------------------------------------

    def _lighter(self) -> list[tuple[int, int]]:
        """(load, row) of the siblings holding fewer connections than this worker, least
        loaded first (from the table as it is read: under the lock or not)."""
        mine = len(self.server.server_state.connections) + self._get(self.row)[2]
        return sorted((held + incoming, row) for row in range(self.table.rows) if row != self.row
                      for pid, held, incoming in [self._get(row)] if pid and held + incoming < mine)

    def hand_off(self, transport: asyncio.Transport) -> bool:
        """True: the connection of ``transport`` (just accepted, nothing read) went to a sibling."""
        sock = transport.get_extra_info("socket")
        if self.stopped or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6) \
                or transport.get_extra_info("sslcontext") is not None:
            return False
        if not self._lighter():
            self._set_held(1)  # no sibling less loaded: read without the lock, the common case
            return False
        sent, refused = False, None
        try:
            with self._locked():
                # the least loaded sibling that lives (its lock tested only for the candidates)
                target = next((row for _load, row in self._lighter() if self._alive(row)), None)
                if target is None:
                    self._set_held(1)
                    return False
                try:
                    # MSG_DONTWAIT: the descriptors are shared with every worker (O_NONBLOCK would be
                    # too); a full queue: served here
                    self.table.pairs[target][1].sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                                 array.array("i", [sock.fileno()]))],
                                                        socket.MSG_DONTWAIT)
                except OSError as e:
                    refused = e
                    self._set_held(1)
                else:
                    sent = True
                    self._add_incoming(target, 1)
        finally:
            if sent:  # the sibling has it, whatever failed after the send: never served by two workers
                # the message holds the socket: closing this descriptor ends nothing (no shutdown())
                transport.close()
        if refused is not None:  # logged outside the lock: a slow log must not hold every worker's accepts
            log.info("connection not handed to a sibling worker: %s", refused)
        return sent

    def _publish(self, adding: int = 0, adopted: int = 0) -> None:
        """This worker's row := its connections (+ ``adding`` about to be added), ``adopted``
        connections fewer on their way; the caller holds the lock."""
        self._set_held(adding)
        if adopted:
            self._add_incoming(self.row, -adopted)

    def publish(self, adding: int = 0, adopted: int = 0) -> None:
        if self.stopped:
            return
        if not adopted:  # the held count alone: this worker's field (_set_held)
            self._set_held(adding)
            return
        with self._locked():
            self._publish(adding, adopted)

    # --- receiving ---------------------------------------------------------------------------

    def _on_readable(self) -> None:
        with self._locked():
            self._drain(self._recv)

    def _drain(self, recv: socket.socket) -> int:
        """Adopt every connection queued on ``recv``; how many."""
        n = 0
        while True:
            try:
                # socket.recv_fds and send_fds of Python 3.11 drop their flags argument
                _msg, ancillary, _flags, _addr = recv.recvmsg(16, socket.CMSG_SPACE(4 * _INT.itemsize),
                                                              socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return n
            fds = array.array("i")
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            if _flags & socket.MSG_CTRUNC and not fds:  # the kernel closed it (e.g. no descriptor left)
                log.warning("a connection handed over by a sibling worker was lost on the way (MSG_CTRUNC)")
                self._add_incoming(self.row, -1)  # not coming: the balance stays right
            for fd in fds:
                n += 1
                self._adopt(fd)

    def _adopt(self, fd: int) -> None:
        sock = socket.socket(fileno=fd)

        def protocol():
            p = self._factory()
            p.balance_adopted = True
            return p

        task = self.loop.create_task(self.loop.connect_accepted_socket(protocol, sock))
        self._adopting.add(task)
        task.add_done_callback(self._adopted)

    def _adopted(self, task: asyncio.Task) -> None:
        self._adopting.discard(task)
        if task.cancelled() or task.exception() is not None:
            log.warning("a connection handed over by a sibling worker could not be adopted: %r",
                        None if task.cancelled() else task.exception())
            self.publish(0, 1)

    async def stop(self) -> None:
        """Shutdown: no more hand-offs to or from here; what is queued is adopted (then shut down
        with the others)."""
        if self.stopped:
            return
        self.loop.remove_reader(self._recv.fileno())
        with self._locked():
            self.stopped = True
            self._drain(self._recv)
            self._set(self.row, 0, 0, 0)
            process_rows.disown(self.fd, self.row)
        if self._adopting:
            await asyncio.wait(list(self._adopting))


_BALANCER: Balancer | None = None  # this worker's


def connection_made(protocol: Any, transport: asyncio.Transport) -> bool:
    """The protocol's ``connection_made`` hook: True when the connection went to a sibling
    (the protocol then does nothing more); else it is counted as this worker's."""
    balancer = _BALANCER
    if balancer is None:
        return False
    try:
        if getattr(protocol, "balance_adopted", False):
            balancer.publish(1, 1)
            return False
        return balancer.hand_off(transport)
    except Exception:  # noqa: BLE001 - never lose a connection to the balancing
        if transport.is_closing():  # sent, then something failed: the sibling serves it
            log.exception("connection handed to a sibling worker; counting it failed")
            return True
        log.exception("connection hand-off failed; served here")
        return False


def connection_lost() -> None:
    if _BALANCER is not None:
        try:
            _BALANCER.publish()
        except Exception:  # noqa: BLE001 - a count not published must not fail the protocol's close
            log.exception("connection count not published")


class BalancedServer(Server):
    """uvicorn's worker server with a :class:`Balancer` from start-up (the app started and
    the listener open) to shutdown."""

    def __init__(self, config: uvicorn.Config, table: Table) -> None:
        super().__init__(config)
        self.table = table

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        global _BALANCER
        await super().startup(sockets)
        if self.started and not self.should_exit:
            try:
                _BALANCER = Balancer(self.table, self)
            except (OSError, RuntimeError) as e:  # e.g. more workers than rows (SIGTTIN)
                log.warning("connections not balanced with this worker: %s", e)

    async def on_tick(self, counter: int) -> bool:
        if counter % 10 == 0 and _BALANCER is not None and not _BALANCER.stopped:
            try:
                _BALANCER._rescue()
            except Exception:  # noqa: BLE001 - the serving goes on (an exception here would end the worker)
                log.exception("adopting connections of a dead sibling worker failed")
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if _BALANCER is not None:
            await _BALANCER.stop()
        await super().shutdown(sockets)


class BalancedProcess(multiprocess.Process):
    """uvicorn's worker process, serving with :class:`BalancedServer`."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], table: Table) -> None:
        self.table = table
        super().__init__(config, sockets)

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = BalancedServer(self.config, self.table)
        return self._server


def run(config: uvicorn.Config) -> None:
    """``uvicorn.run(...)`` of ``config`` (``workers`` > 1, the app an import string) whose workers
    balance their connections. uvicorn's supervisor makes its workers as
    ``multiprocess.Process``: that name is this module's for the run (the supervisor's
    process only; the workers get :class:`BalancedProcess` pickled by reference)."""
    table = Table(rows=2 * config.workers + 2)  # rolling restarts (SIGHUP) and SIGTTIN start more
    previous = multiprocess.Process
    multiprocess.Process = functools.partial(BalancedProcess, table=table)  # type: ignore[misc]
    try:
        sock = config.bind_socket()
        multiprocess.Multiprocess(config, sockets=[sock]).run()
    except KeyboardInterrupt:
        pass
    finally:
        multiprocess.Process = previous  # type: ignore[misc]
        if config.uds and os.path.exists(config.uds):
            os.remove(config.uds)

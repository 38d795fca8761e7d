"""Native decoders run in separate worker processes that may die.

The compiled decoders behind pydicom's plugins (GDCM, OpenJPEG, CharLS,
libjpeg-turbo) run on stored, client-supplied bytes; a fault in one of them
(``abort()``, a segfault, an endless loop) would take the whole server process
with it. :func:`call` runs one decode in a small pool of worker processes instead:

* each worker is a fresh interpreter (``python -m dicomweb_server.dicom.decode_worker``)
  talking over a socket pair with ``multiprocessing.connection`` framing: no copy of
  the web server's threads or locks (as ``fork`` would make) and no re-import of the
  caller's ``__main__`` (as multiprocessing's ``spawn``/``forkserver`` do);
* the pool (:data:`PROCESSES` workers) starts in the background at first use; a
  caller takes an idle worker or waits for one;
* a worker that dies during a call is replaced and the call raises
  :class:`WorkerDied`; one that exceeds the timeout is killed and replaced
  (:class:`WorkerTimeout`). Other calls are not affected: each call has a worker
  of its own.

Only encapsulated (compressed) frames go through here (the codestream in, the
decoded array out through a pipe); uncompressed pixel data never leaves the web
process. multiprocessing has no pool that survives a dead worker without failing
every pending task (``concurrent.futures`` marks the whole pool broken), hence
this small hand-written one.

This isolates faults, it is not a sandbox: a worker runs as the same user, and the
parent unpickles what its own worker code sends back.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["PROCESSES", "TIMEOUT", "WorkerDied", "WorkerTimeout", "call", "configure"]

#: decode worker processes per web worker process (configure(): Settings.decode_processes)
PROCESSES = 2
#: seconds one decode may take (configure(): Settings.decode_timeout)
TIMEOUT = 60.0
#: address space of a worker process (RLIMIT_AS): a decoder asked for more fails in its
#: worker (MemoryError, or an abort that ends the worker) instead of the machine swapping
ADDRESS_SPACE = 4 << 30
#: seconds allowed for a worker process to start, on top of TIMEOUT, when waiting for one
STARTUP = 30.0


class WorkerDied(RuntimeError):
    """The worker process ended (signal or exit) while decoding."""


class WorkerTimeout(RuntimeError):
    """The decode took longer than the timeout; its worker was killed."""


def _send(conn: Connection, obj: Any) -> None:
    """Pickle protocol 5 with out-of-band buffers: a numpy array's bytes go to the
    socket without the extra copy ``Connection.send`` makes."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(len(buffers).to_bytes(4, "little") + payload)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def _recv(conn: Connection) -> Any:
    head = conn.recv_bytes()
    count = int.from_bytes(head[:4], "little")
    buffers = [conn.recv_bytes() for _ in range(count)]
    return pickle.loads(memoryview(head)[4:], buffers=buffers)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the worker process
    while True:
        try:
            fn, args = _recv(conn)
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001 - sent back to the caller
            reply = ("err", exc)
        try:
            _send(conn, reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an exception that does not pickle
            _send(conn, ("err", RuntimeError(f"{type(reply[1]).__name__}: {exc}")))


class _Worker:
    def __init__(self) -> None:
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with child:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(child.fileno()), str(os.getpid())],
                pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL, close_fds=True,
            )
        self.conn = Connection(parent.detach())

    def call(self, fn: Callable[..., Any], args: tuple, timeout: float) -> tuple[str, Any]:
        try:
            _send(self.conn, (fn, args))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise WorkerDied(self._ended()) from None
        if not self.conn.poll(timeout):
            raise WorkerTimeout(f"the decoder did not finish within {timeout:g} s")
        try:
            return _recv(self.conn)
        except (EOFError, ConnectionResetError, OSError):
            raise WorkerDied(self._ended()) from None

    def _ended(self) -> str:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        return f"the decoder process ended with {'signal ' + str(-code) if code and code < 0 else f'exit code {code}'}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()


_lock = threading.Lock()
_idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
_started = 0


def configure(processes: int | None = None, timeout: float | None = None) -> None:
    """Set the pool size and the per-decode timeout (before or between decodes)."""
    global PROCESSES, TIMEOUT
    if processes is not None:
        PROCESSES = max(1, int(processes))
    if timeout is not None:
        TIMEOUT = float(timeout)


def _acquire() -> _Worker:
    """An idle worker; on first use the whole pool is started at once (in the
    background, a fresh interpreter each), and the caller takes the first ready."""
    try:
        return _idle.get_nowait()
    except queue.Empty:
        pass
    with _lock:
        missing = PROCESSES - _started
    for _ in range(missing):
        threading.Thread(target=_replace, name="dicomweb-decoder-start", daemon=True).start()
    wait = TIMEOUT + STARTUP
    try:
        return _idle.get(timeout=wait)
    except queue.Empty:
        raise WorkerTimeout(f"no decoder process was free within {wait:g} s") from None


def _retire(worker: _Worker) -> None:
    """Close a dead/hung worker and start its replacement in the background (a
    fresh interpreter takes about half a second: the next caller need not wait)."""
    global _started
    worker.close()
    with _lock:
        _started -= 1
    threading.Thread(target=_replace, name="dicomweb-decoder-restart", daemon=True).start()


def _replace() -> None:
    """Start one worker into the idle queue unless the pool is full."""
    global _started
    with _lock:
        if _started >= PROCESSES:
            return
        _started += 1
    try:
        worker = _Worker()
    except Exception:  # noqa: BLE001 - the next call starts one itself
        with _lock:
            _started -= 1
        return
    _idle.put(worker)


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a decode worker process; its exceptions are re-raised here.

    `fn` must be a module-level function and `args`/the result picklable.
    Raises WorkerDied or WorkerTimeout when the worker crashed or hung (it is
    replaced; the next call gets a fresh one).
    """
    worker = _acquire()
    try:
        status, value = worker.call(fn, args, TIMEOUT)
    except BaseException:  # died, hung, or interrupted with a reply pending: replace it
        _retire(worker)
        raise
    _idle.put(worker)
    if status == "err":
        raise value
    return value


if __name__ == "__main__":  # pragma: no cover - the worker process
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower hard limit already
        pass
    from dicomweb_server.lifeline import exit_with_parent

    # its web worker gone (SIGKILL included), a worker in the middle of a decode (a hung
    # decoder) ends too; an idle one ends at the socket's end-of-file anyway
    exit_with_parent(int(sys.argv[2]))
    import dicomweb_server.dicom.pixels  # noqa: F401 - decoders loaded before the first call

    _serve(Connection(int(sys.argv[1])))

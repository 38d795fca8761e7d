"""A child process ends with its parent, however the parent ends (SIGKILL included).

Seen: ``serve`` SIGKILLed; its DIMSE listeners ended, but its uvicorn workers kept serving
(they stored a STOW-RS 15 s later) and held the HTTP port, so a new ``serve`` failed with
"address already in use". Two mechanisms, each covering a gap of the other:

- :func:`set_parent_death_signal`: Linux ``prctl(PR_SET_PDEATHSIG)`` (prctl(2)): the kernel
  sends the child a signal when its parent ends. It is armed in the child, after the fork
  (or after a spawned interpreter started), so a parent that died before it was armed has
  sent nothing; and the "parent" is the *thread* that forked the child: it fires when that
  thread ends, even if the process goes on. Hence it is armed only for children forked by
  the parent's main thread (``serve`` starts its DIMSE listeners there; uvicorn's
  supervisor starts, restarts and adds its workers in its main thread: Multiprocess.run
  and its signal handling), never for the decode workers, which threads start;
- :func:`watch_parent`: a daemon thread in the child that waits for the end of a pipe
  whose write end only the parent holds (multiprocessing's parent sentinel for uvicorn's
  workers; ``--parent-fd`` for the DIMSE listeners: dimse/shutdown.py), and checks every
  second that ``getppid()`` is still the parent it was started by (a parent gone before
  the child started is seen at once).

The child's answer to its parent's end is its own orderly stop (SIGTERM: requests in
flight finish within ``shutdown_timeout``), bounded by a hard exit after that plus
:data:`KILL_AFTER`: the listening sockets are closed first, so the ports are free for a
new ``serve`` at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("dicomweb_server")

#: prctl(2) option: signal sent to this process when its parent (thread) ends
PR_SET_PDEATHSIG = 1
#: seconds between two ``getppid()`` checks of :func:`watch_parent`
CHECK_EVERY = 1.0
#: seconds past the shutdown timeout a worker whose supervisor is gone gets before it exits
#: without finishing its orderly stop (os._exit)
KILL_AFTER = 15.0


_PRCTL = None  # libc's prctl, once looked up (False: not available)


def _prctl():
    """libc's ``prctl`` (None off Linux), looked up once: a ``preexec_fn`` must not load a
    library in the child of a process with threads (the loader's lock may be held)."""
    global _PRCTL
    if _PRCTL is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # the C library this interpreter uses
        except (OSError, AttributeError):
            _PRCTL = False
    return _PRCTL or None


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it ends
    (Linux only; False elsewhere or when refused)."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def parent_death_signal_preexec() -> Callable[[], None] | None:
    """A ``subprocess.Popen`` ``preexec_fn`` arming :func:`set_parent_death_signal` in the
    child, or None when the caller is not the main thread (the signal would come when
    this thread ends, not when the process does: see the module docstring)."""
    if threading.current_thread() is not threading.main_thread() or _prctl() is None:
        return None
    return set_parent_death_signal


def watch_parent(parent_pid: int, on_gone: Callable[[], None], sentinel=None,
                 every: float = CHECK_EVERY) -> threading.Thread:
    """Call ``on_gone()`` once (in a daemon thread) when the parent ``parent_pid`` is gone:
    ``getppid()`` differs (the child was re-parented), or ``sentinel`` (an object with
    ``join(timeout)`` and ``is_alive()``, such as ``multiprocessing.parent_process()``)
    says so."""

    def gone() -> bool:
        return os.getppid() != parent_pid or (sentinel is not None and not sentinel.is_alive())

    def watch() -> None:
        while not gone():
            if sentinel is not None:
                sentinel.join(every)  # returns at once when the parent ends
            else:
                time.sleep(every)
        on_gone()

    t = threading.Thread(target=watch, name="parent-watch", daemon=True)
    t.start()
    return t


def end_worker_with_supervisor(grace: float) -> bool:
    """In a uvicorn worker (a multiprocessing ``spawn`` child of ``serve``): stop when the
    supervisor ends, however it ends. Returns False (and does nothing) in a process that
    is not such a child (``serve --workers 1`` runs the app in itself).

    The stop is uvicorn's own (SIGTERM: no new connections, the listening socket closed,
    requests in flight finish within ``grace`` seconds), and the process exits anyway
    :data:`KILL_AFTER` seconds after that."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return False
    set_parent_death_signal(signal.SIGTERM)
    me = os.getpid()

    def stop() -> None:
        log.warning("worker %d: its supervisor (process %d) is gone; stopping", me, parent.pid)
        os.kill(me, signal.SIGTERM)  # the same orderly stop as the supervisor's own SIGTERM
        time.sleep(grace + KILL_AFTER)
        log.error("worker %d did not stop within %.0f s of its supervisor's end: exiting now",
                  me, grace + KILL_AFTER)
        logging.shutdown()
        os._exit(1)

    watch_parent(parent.pid, stop, parent)
    return True


def exit_with_parent(parent_pid: int) -> threading.Thread:
    """End this process at once (``os._exit``) when ``parent_pid`` is no longer its
    parent: for helper processes that hold nothing to finish (the decode workers)."""
    return watch_parent(parent_pid, lambda: os._exit(1))

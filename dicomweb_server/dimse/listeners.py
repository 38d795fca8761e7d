"""The DIMSE listener processes of ``dicomweb-server serve`` (cli.py): how many, starting them
(``python -m dicomweb_server.dimse``, sharing the port with SO_REUSEPORT and one table of
association slots: slots.py), keeping them running (:class:`Listeners`: one that dies is
replaced), and stopping them (SIGTERM, then SIGKILL past a bound)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable


def dimse_processes(settings) -> int:
    """How many DIMSE listener processes ``serve`` starts (``dimse_processes``; 0: two per core,
    at least 2, at most 8). More processes than cores: a listener process is one GIL, and
    its associations spend most of their time waiting for the syncs, so one process's
    Python runs while another's waits; 4 rather than 2 processes on 2 cores took LOAD-01's
    64-association step from 302-339 to 384-401 images/s and left 1-16 equal or better
    (docs/dimse.md, "How it uses the cores")."""
    return settings.dimse_processes or max(2, min(8, 2 * (os.cpu_count() or 1)))


def start_dimse(settings) -> Listeners | None:
    """The DIMSE listener processes (``python -m dicomweb_server.dimse``, sharing the port with
    SO_REUSEPORT: the kernel spreads the associations), supervised (:class:`Listeners`), or
    None when DIMSE is off or runs inside the worker. They end with this process, however it
    ends: each watches a pipe whose write end only this process holds (end-of-file: serve is
    gone; dimse/shutdown.py), and PR_SET_PDEATHSIG sends the first ones SIGTERM as well. They
    share one table of association slots (dimse/slots.py: ``dimse_max_associations`` is the
    node's, not one process's), which this process keeps open for the listeners it starts in
    place of dead ones (a dead listener's row is free: its lock went with it)."""
    if not settings.dimse_on() or settings.dimse_in_worker:
        return None
    from .slots import create_table

    n = dimse_processes(settings)  # their address is printed when the port accepts (startup.py)
    slots_fd = create_table(n, settings.dimse_max_associations)

    def spawn():
        r, w = os.pipe()  # not inheritable (PEP 446): only the listener gets r, only we keep w
        try:
            proc = spawn_listener(r, slots_fd=slots_fd)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        proc.parent_pipe = w  # closed by stop_dimse, or by the kernel when this process dies
        return proc

    return Listeners(spawn, n, on_stopped=lambda: os.close(slots_fd))  # closed once all have ended


def spawn_listener(parent_fd: int, env=None, slots_fd: int | None = None):
    """One listener process, stopping when the pipe ``parent_fd`` reaches end-of-file, or
    on the SIGTERM of PR_SET_PDEATHSIG when this process ends (lifeline.py; armed when
    this is the main thread: the signal comes when the forking *thread* ends);
    ``slots_fd``: the node's association slot table (dimse/slots.py)."""
    import subprocess

    from ..lifeline import parent_death_signal_preexec

    argv = [sys.executable, "-m", "dicomweb_server.dimse", "--parent-fd", str(parent_fd)]
    fds: tuple[int, ...] = (parent_fd,)
    if slots_fd is not None:
        argv += ["--slots-fd", str(slots_fd)]
        fds += (slots_fd,)
    return subprocess.Popen(argv, pass_fds=fds, preexec_fn=parent_death_signal_preexec(), env=env)


#: seconds past ``shutdown_timeout`` a listener gets to end after SIGTERM before SIGKILL
#: (its own watchdog ends it after 2 x CLOSE_WAIT: dimse/shutdown.py)
DIMSE_KILL_AFTER = 15
#: a listener that ran at least this many seconds is replaced at once when it dies; one that
#: ended sooner (it cannot start?) after BACKOFF_FIRST, doubling up to BACKOFF_MAX seconds
STABLE_AFTER = 10.0
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0


def _say(line: str) -> None:
    print(f"dicomweb-server: {line}", file=sys.stderr, flush=True)


def how_it_ended(returncode: int) -> str:
    """``killed by SIGKILL``, ``exit status 1``..."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def asked_to_stop(returncode: int) -> bool:
    """Whether a listener ended because it was asked to: its orderly stop (exit status 0, only
    on SIGTERM or SIGINT while serve lives: dimse/__main__.py), or one of those signals
    before its handler was set. Both reach every process of serve at once when the whole
    group or service is stopped (Ctrl-C in a terminal, ``systemctl stop``): serve is stopping
    then, though it only stops its listeners once uvicorn has finished."""
    return returncode in (0, -signal.SIGTERM, -signal.SIGINT)


class Listeners:
    """``count`` listener processes made by ``spawn()`` (a ``subprocess.Popen`` with its
    ``parent_pipe``), each watched by a thread of its own blocked in ``Popen.wait`` (which
    reaps it: no zombie). One that ends while serve is not stopping is replaced by a new
    one, at once if it ran :data:`STABLE_AFTER` seconds, else after a pause growing from
    :data:`BACKOFF_FIRST` to :data:`BACKOFF_MAX` seconds (a listener that cannot start is
    not started again in a tight loop); each step is a line on stderr. Not replaced: a
    listener :func:`asked_to_stop`.

    The first listeners are started here, in the caller's (main) thread: PR_SET_PDEATHSIG is
    armed for them. A replacement is started by the watching thread, so it has no
    PR_SET_PDEATHSIG (lifeline.py: the signal would come when that thread ends); its parent
    pipe ends it when serve ends, however serve ends. :meth:`stop` and the replacements take
    one lock: no listener is started once stopping has begun, and every one started is
    stopped."""

    def __init__(self, spawn: Callable, count: int, on_stopped: Callable[[], None] | None = None) -> None:
        self._spawn_one, self._on_stopped = spawn, on_stopped
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.procs: list = []  # the listener of each place, the latest one
        self._threads: list[threading.Thread] = []
        try:
            for place in range(count):
                self.procs.append(self._spawn())
                t = threading.Thread(target=self._watch, args=(place, self.procs[place]),
                                     name=f"dimse-listener-{place}", daemon=True)
                t.start()
                self._threads.append(t)
        except BaseException:
            self.stop(0)
            raise

    def _spawn(self):
        proc = self._spawn_one()
        proc.started = time.monotonic()
        return proc

    def _watch(self, place: int, proc) -> None:
        delay = 0.0
        while True:
            proc.wait()  # blocks until it ends; reaps it
            if self._stopping.is_set():
                return
            lived = time.monotonic() - proc.started
            how = how_it_ended(proc.returncode)
            if asked_to_stop(proc.returncode):
                _say(f"DIMSE listener {proc.pid} stopped ({how}: asked to by a signal); not replaced (Ctrl-C "
                     f"and systemctl stop signal every process of serve)")
                return
            delay = 0.0 if lived >= STABLE_AFTER else min(BACKOFF_MAX, max(BACKOFF_FIRST, 2 * delay))
            if delay:
                _say(f"DIMSE listener {proc.pid} ended ({how}) {lived:.1f} s after it started; another starts "
                     f"in {delay:g} s (one that keeps ending at once is started again at most every "
                     f"{BACKOFF_MAX:g} s)")
            new = self._replace(place, delay)
            if new is None:
                return
            _say(f"DIMSE listener {proc.pid} ended ({how}); listener {new.pid} started in its place")
            proc = new

    def _replace(self, place: int, delay: float):
        """The new listener of ``place``, started after ``delay`` seconds; None: serve is stopping."""
        while not self._stopping.wait(delay):
            with self._lock:
                if self._stopping.is_set():
                    return None
                old = self.procs[place]
                if old.parent_pipe >= 0:  # its write end: the dead listener no longer reads it
                    os.close(old.parent_pipe)
                    old.parent_pipe = -1  # (stop() closes only the current ones' pipes)
                try:
                    self.procs[place] = self._spawn()
                    return self.procs[place]
                except Exception as e:  # noqa: BLE001 - fork refused (memory, process limit), exec failed: try again later
                    delay = min(BACKOFF_MAX, max(BACKOFF_FIRST, 2 * delay))
                    _say(f"DIMSE listener could not start ({e}); next attempt in {delay:g} s")
        return None

    def stop(self, grace: float = 30) -> None:
        """SIGTERM each listener, wait at most ``grace`` + :data:`DIMSE_KILL_AFTER` seconds in
        all, then SIGKILL those still running; no listener is started from here on."""
        with self._lock:  # a replacement being started is in self.procs once this is ours
            self._stopping.set()
            procs = list(self.procs)
        for proc in procs:
            proc.terminate()  # nothing if it has ended (reaped)
            if proc.parent_pipe >= 0:
                with contextlib.suppress(OSError):
                    os.close(proc.parent_pipe)
                proc.parent_pipe = -1
        deadline = time.monotonic() + grace + DIMSE_KILL_AFTER
        for t in self._threads:  # each ends once its listener has ended (reaped by it)
            t.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.returncode is None:  # its thread still waits
                _say(f"DIMSE listener {proc.pid} did not stop: killed")
                proc.kill()
                proc.wait()
        for t in self._threads:
            t.join()
        if self._on_stopped is not None:
            self._on_stopped()
            self._on_stopped = None


def stop_dimse(listeners: Listeners | None, grace: float = 30) -> None:
    """Stop ``serve``'s listeners (:meth:`Listeners.stop`); None: there are none."""
    if listeners is not None:
        listeners.stop(grace)

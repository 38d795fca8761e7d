"""The DIMSE listener processes of ``dicomweb-server serve`` (cli.py): how many, starting them
(``python -m dicomweb_server.dimse``, sharing the port with SO_REUSEPORT and one table of
association slots: slots.py), and stopping them (SIGTERM, then SIGKILL past a bound)."""

from __future__ import annotations

import contextlib
import os
import sys


def dimse_processes(settings) -> int:
    """How many DIMSE listener processes ``serve`` starts (``dimse_processes``; 0: two per core,
    at least 2, at most 8). More processes than cores: a listener process is one GIL, and
    its associations spend most of their time waiting for the syncs, so one process's
    Python runs while another's waits; 4 rather than 2 processes on 2 cores took LOAD-01's
    64-association step from 302-339 to 384-401 images/s and left 1-16 equal or better
    (docs/dimse.md, "How it uses the cores")."""
    return settings.dimse_processes or max(2, min(8, 2 * (os.cpu_count() or 1)))


def start_dimse(settings):
    """The DIMSE listener processes (``python -m dicomweb_server.dimse``, sharing the port with
    SO_REUSEPORT: the kernel spreads the associations), or [] when DIMSE is off or runs inside
    the worker. They end with this process, however it ends: each watches a pipe whose write
    end only this process holds (end-of-file: serve is gone; dimse/shutdown.py), and
    PR_SET_PDEATHSIG sends them SIGTERM as well. They share one table of association slots
    (dimse/slots.py: ``dimse_max_associations`` is the node's, not one process's)."""
    if not settings.dimse_on() or settings.dimse_in_worker:
        return []
    from .slots import create_table

    n = dimse_processes(settings)  # their address is printed when the port accepts (startup.py)
    slots_fd = create_table(n, settings.dimse_max_associations)
    procs = []
    try:
        for _ in range(n):
            r, w = os.pipe()  # not inheritable (PEP 446): only the listener gets r, only we keep w
            try:
                proc = spawn_listener(r, slots_fd=slots_fd)
            except BaseException:
                os.close(w)
                raise
            finally:
                os.close(r)
            proc.parent_pipe = w  # closed by stop_dimse, or by the kernel when this process dies
            procs.append(proc)
    finally:
        os.close(slots_fd)  # the listeners hold it
    return procs


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


def stop_dimse(procs, grace: float = 30) -> None:
    """SIGTERM each listener, wait at most ``grace`` + :data:`DIMSE_KILL_AFTER` seconds in
    all, then SIGKILL those still running."""
    import subprocess
    import time

    for proc in procs:
        proc.terminate()
        with contextlib.suppress(OSError):
            os.close(proc.parent_pipe)
    deadline = time.monotonic() + grace + DIMSE_KILL_AFTER
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"dicomweb-server: DIMSE listener {proc.pid} did not stop: killed", file=sys.stderr, flush=True)
            proc.kill()
            proc.wait()

"""Crash injection for the crash-safety tests: ``DICOMWEB_FAULT=step[:n]`` in the
environment of a server process makes it SIGKILL itself the n-th time (default 1)
it reaches ``step`` of the STOW-RS write path. Unset (the normal case), a check
costs one comparison.

Steps, in order: ``spooled`` (body received, nothing parsed), ``fsynced`` (file
fsynced, not yet linked into place), ``linked`` (linked, directory not yet
fsynced), ``placed`` (all files of the request in place, index not committed),
``indexed`` (index committed, answer not yet sent); and in the forwarder
(routing/), ``forwarded`` (a batch sent to a destination, its rows not yet settled).
In the lifecycle: ``update-written`` (a new version's file placed), ``update-switch``
(every file placed, index not switched), ``update-switched`` (switched, not answered)
(lifecycle/update.py); ``note-indexed`` (a rejection note indexed, what it names not
yet hidden, in the same open transaction: lifecycle/reject.py). In the ``deidentify``
job (deid/job.py), ``deid-exported`` (an instance in its target, the checkpoint not yet
saved: the command line's ``export --deidentify`` as well as the server's jobs).
"""

from __future__ import annotations

import os
import signal
import threading

_SPEC = os.environ.get("DICOMWEB_FAULT", "")
_STEP, _, _N = _SPEC.partition(":")
_count = 0
_lock = threading.Lock()


def point(step: str) -> None:
    """Die here if this is the configured step and occurrence."""
    global _count
    if not _STEP or step != _STEP:
        return
    with _lock:
        _count += 1
        if _count >= int(_N or 1):
            os.kill(os.getpid(), signal.SIGKILL)

"""A table shared by the processes of one node, one row per process, each row owned by a
live process: the mechanism under the DIMSE association slots (dimse/slots.py) and the
HTTP connection balancing (api/balance.py).

The table is an anonymous file (``memfd_create``, close-on-exec; the parent passes its
descriptor to each process it starts) that every process maps. ``fcntl`` byte-range locks
on it say who may write and who lives: byte :data:`MUTEX` is the table's mutex, byte
``1 + row`` is held by the row's owner as long as it lives. The kernel drops a process's
locks when it ends, SIGKILL included, so a dead owner's row is found free without any
heartbeat. (Locks of one process do not conflict with each other: threads of a process
need a lock of their own around :func:`mutex`, and :func:`owner_alive` must not be asked
about the caller's own row, which it would release.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

#: the lock offset of the table's mutex; a row's owner holds ``1 + row``
MUTEX = 0


def new_table(name: str, size: int, header: bytes) -> int:
    """A new table of ``size`` bytes starting with ``header``: its descriptor."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    os.pwrite(fd, header, 0)
    return fd


@contextlib.contextmanager
def mutex(fd: int) -> Iterator[None]:
    """The table to this process (blocking)."""
    fcntl.lockf(fd, fcntl.LOCK_EX, 1, MUTEX)
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, MUTEX)


def own(fd: int, row: int) -> bool:
    """Take ``row`` for this process until it ends or :func:`disown`; False when a live
    process owns it."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1 + row)
    except OSError:
        return False
    return True


def disown(fd: int, row: int) -> None:
    """Give ``row`` back (this process goes on without it)."""
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, 1 + row)


def owner_alive(fd: int, row: int) -> bool:
    """Whether another process that lives owns ``row`` (never ask about your own)."""
    if own(fd, row):
        disown(fd, row)
        return False
    return True

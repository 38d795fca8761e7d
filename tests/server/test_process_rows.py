"""dicomweb_server/process_rows.py: the shared table of the DIMSE slots and the HTTP
connection balancing. A row's owner is alive as long as its process lives, SIGKILL
included, with no heartbeat."""

from __future__ import annotations

import os
import signal
import struct

from dicomweb_server import process_rows


def _child_owning(fd: int, row: int) -> tuple[int, int]:
    """A forked process that owns ``row`` and waits (its pid, the pipe it waits on)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: own the row, say so, wait to be killed
        try:
            os.write(ready_w, b"1" if process_rows.own(fd, row) else b"0")
            signal.pause()
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid, row


def test_a_row_is_owned_while_its_process_lives_and_free_once_it_is_killed():
    fd = process_rows.new_table("test-rows", 64, struct.pack("<8sI", b"TESTROWS", 2))
    try:
        assert os.pread(fd, 12, 0) == struct.pack("<8sI", b"TESTROWS", 2) and os.fstat(fd).st_size == 64
        assert not process_rows.owner_alive(fd, 1)  # nobody's
        pid, row = _child_owning(fd, 1)
        assert process_rows.owner_alive(fd, row)
        assert not process_rows.own(fd, row)  # a live process's: not taken
        with process_rows.mutex(fd):  # the mutex is another byte than any row's
            assert process_rows.owner_alive(fd, row)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert not process_rows.owner_alive(fd, row)  # the kernel dropped the dead owner's lock
        assert process_rows.own(fd, row)  # and another process may take it
        process_rows.disown(fd, row)
    finally:
        os.close(fd)

"""A stored file read by the event loop itself when that cannot wait for a disk (issue 33).

A WADO-RS instance answer (PS3.18 §10.4.1.1.1) of a file as stored was read by a worker
thread and handed back to the event loop: ~71 system calls per answer, 48 of them ``futex``
(the hand-off, then the GIL passed back and forth), and 4-6 voluntary context switches. When
the whole file is in the page cache, :func:`cached_file` reads it on the loop instead
(``open``, ``fstat``, ``preadv2(..., RWF_NOWAIT)``, ``close``: ~13 system calls):
``RWF_NOWAIT`` (Linux >= 4.14) makes the kernel refuse rather than wait for a disk.

Only where the open itself cannot wait either: the blob folder must be on a local
block-device file system (the blob store's ``loop_reads``, decided once from
``/proc/self/mountinfo``: ``store.blobs.local_block_file_system``). On NFS, CIFS, CephFS or a FUSE
mount (an object store mounted as a folder) an ``open`` revalidates over the network, and an
unresponsive server would freeze the event loop, health checks included; tmpfs refuses
``RWF_NOWAIT``. A file system that refuses it anyway (EOPNOTSUPP) is remembered by its
device and not asked again.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .retrieve import LARGE_FILE, Gone, _open_error
from .store.base import InstanceLocation
from .store.objects import StoredObject

#: ``preadv2(2)``'s flag "fail with EAGAIN rather than wait for the disk", or None
NOWAIT = getattr(os, "RWF_NOWAIT", None)
_refused: set[int] = set()  # devices whose file system answered EOPNOTSUPP


def cached_file(path: Path | StoredObject, loc: InstanceLocation) -> memoryview | None:
    """The whole stored file of ``loc`` (at most ``retrieve.LARGE_FILE`` bytes) when it is all
    in the page cache, read without waiting for a disk. None when any of it would need a disk
    read, when the system cannot tell (no ``RWF_NOWAIT``, a file system that refuses it), for
    an object store or a larger file: then it is read in a worker thread
    (``retrieve.instance_payload``). The caller checks the blob store's ``loop_reads`` first.

    Raises
    ------
    Gone
        As ``retrieve.open_stored``: the file is missing, unreadable or not the size recorded.
    """
    if NOWAIT is None or not isinstance(path, Path) or loc.size > LARGE_FILE:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _open_error(e, loc) from None
    try:
        st = os.fstat(fd)
        if st.st_size != loc.size:
            raise Gone(f"instance {loc.sop_uid} was replaced while being read")
        if st.st_dev in _refused:
            return None
        buf = bytearray(loc.size)
        try:
            n = os.preadv(fd, [buf], 0, NOWAIT)
        except OSError as e:  # EAGAIN: not all in memory
            if e.errno == errno.EOPNOTSUPP:  # this file system cannot tell: not asked again
                _refused.add(st.st_dev)
            return None
        return memoryview(buf) if n == loc.size else None
    finally:
        os.close(fd)

"""Instance files on disk, written so that a crash at any moment leaves either the
complete file or nothing at its final name.

Write path (``place``): the received part was spooled to ``tmp/`` on the same
filesystem; it is fsynced, hard-linked to its final name (``link`` fails if the
name exists, so two writers of one SOP Instance UID never overwrite each other),
the final directory is fsynced, and the spool name is removed. Folders are made
(and their parents fsynced) and emptied folders removed under a folder lock that
placements share, so a file is only ever linked into a folder whose entry is durable
and that no DELETE is removing. Paths are built
from validated UIDs only (``dicom.uids.validate_uid``); :meth:`BlobStore.resolve`
refuses anything that would leave the blob root.

Spool: every process spools into its own folder ``tmp/{pid}-{token}/`` and holds an
``flock`` on ``tmp/{pid}-{token}.lock`` while it lives (the kernel drops the lock
when the process dies, however it dies). Start-up sweeps only the folders whose
lock it can take, so a worker that starts, restarts or stops never touches the
parts another worker is receiving (case P6).
"""

from __future__ import annotations

import errno
import fcntl
import filecmp
import os
import secrets
import shutil
import threading
import zlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from enum import Enum
from pathlib import Path

from .. import faults
from .objects import BlobStorage, Listed


class Placed(str, Enum):
    NEW = "new"  # the file is now at its final name
    EXISTS = "exists"  # a file is already at that name (see BlobStore.same)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a new or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: file systems on a local block device (local_block_file_system; overlay: over a local one)
LOCAL_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "reiserfs", "bcachefs",
                                "zfs", "nilfs2", "overlay"})


def _unescape(field: str) -> str:
    """A mount point as ``/proc/self/mountinfo`` writes it (space, tab, newline and backslash
    as octal escapes)."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def file_system_type(path: Path, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the file system holding ``path`` (resolved: a symbolic link to an NFS mount
    is NFS), from the longest mount point that contains it; None when the table cannot be read."""
    real = os.path.realpath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best, best_type = "", None
    for line in lines:
        fields = line.split(" ")
        try:  # id parent major:minor root mount-point options [optional...] - type source super-options
            mount_point, fs_type = _unescape(fields[4]), fields[fields.index("-") + 1]
        except (IndexError, ValueError):
            continue
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):  # a later mount over the same point wins
            best, best_type = mount_point, fs_type
    return best_type


def local_block_file_system(path: Path) -> bool:
    """Whether ``path`` is on a local block-device file system whose reads ``preadv2``'s
    ``RWF_NOWAIT`` reports on (Linux >= 4.14): files there may be read by the event loop
    (dicomweb_server/loop_read.py). Not on NFS, CIFS, CephFS or FUSE, where even an ``open``
    may wait for a network, nor on tmpfs, which refuses the flag."""
    return hasattr(os, "RWF_NOWAIT") and file_system_type(path) in LOCAL_FILE_SYSTEMS


class BlobStore(BlobStorage):
    """Files under ``root/blobs``; spool files under ``root/tmp/{pid}-{token}/``.

    The spool, the reserve and the ``flock`` stripes are local to the node whatever
    keeps the stored instances (store/s3.py reuses them); the methods after
    ``resolve`` are the stored-files side of :class:`store.objects.BlobStorage`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.spool_root = root / "tmp"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.spool_root.mkdir(parents=True, exist_ok=True)
        self._blobs_abs = self.blobs.resolve()
        self._blobs_abs_str = str(self._blobs_abs)
        self.loop_reads = local_block_file_system(self._blobs_abs)
        self.locks = root / "locks"
        self.locks.mkdir(parents=True, exist_ok=True)
        self._spool: Path | None = None
        self._spool_fd = -1
        self._spool_pid = 0
        self._spool_mutex = threading.Lock()
        self._stripe_mutex = [threading.Lock() for _ in range(256)]
        self._stripe_fds: dict[int, int] = {}
        self._stripe_pid = os.getpid()
        self._folder_fd = threading.local()  # this thread's descriptor of locks/folders.lock
        self._folder_fds: list[int] = []

    # --- reserve ----------------------------------------------------------------------

    RESERVE_BYTES = 1024 * 1024

    @property
    def reserve(self) -> Path:
        """A ballast file in the data folder. On a full disk a DELETE still needs a few
        index pages (the WAL grows before it shrinks): the reserve is given up for that
        DELETE (:meth:`release_reserve`) and laid again once space is free."""
        return self.root / "reserve.bin"

    def ensure_reserve(self) -> None:
        """Lay the reserve if it is missing and there is room (never fails: without
        room, there is none to keep)."""
        if self.reserve.exists():
            return
        tmp = self.root / "reserve.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(bytes(self.RESERVE_BYTES))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.reserve)
        except OSError:
            tmp.unlink(missing_ok=True)

    def release_reserve(self) -> bool:
        """Give the reserve's space back to the file system; False if there was none."""
        try:
            self.reserve.unlink()
        except FileNotFoundError:
            return False
        return True

    # --- spool ------------------------------------------------------------------------

    @property
    def spool(self) -> Path:
        """This process's spool folder, claimed (folder made, lock taken) on first use
        and again in a forked child, which must not share its parent's folder."""
        if self._spool is None or self._spool_pid != os.getpid():
            with self._spool_mutex:
                if self._spool is None or self._spool_pid != os.getpid():
                    self._spool, self._spool_fd = self._claim_spool()
                    self._spool_pid = os.getpid()
        return self._spool

    def _claim_spool(self) -> tuple[Path, int]:
        while True:
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            lock = self.spool_root / f"{name}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # a sweeper may have taken the fresh lock and removed its file before
                # our flock: keep it only if the name still holds the file we locked
                if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                    folder = self.spool_root / name
                    folder.mkdir()
                    return folder, fd
            except (BlockingIOError, FileNotFoundError):
                pass
            os.close(fd)

    def clean_spool(self) -> int:
        """Remove what crashed or stopped processes left in ``tmp/`` (never
        acknowledged): the folders whose lock can be taken, folders without a lock
        file and loose files (the layout before per-process folders). Folders of
        live processes are skipped. Returns the number of files removed."""
        n = 0
        own = self._spool.name if self._spool is not None and self._spool_pid == os.getpid() else None
        for p in list(self.spool_root.iterdir()):
            if p.suffix == ".lock":
                if p.stem != own:
                    n += self._sweep(p)
            elif p.is_dir() and not p.is_symlink():
                if p.name != own and not p.with_name(p.name + ".lock").exists():
                    n += _rmtree(p)
            else:
                try:
                    p.unlink()
                    n += 1
                except OSError:
                    pass
        return n

    def _sweep(self, lock: Path) -> int:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return 0  # a live process owns it
        try:
            n = _rmtree(lock.with_suffix(""))
            lock.unlink(missing_ok=True)
            return n
        finally:
            os.close(fd)

    def close_locks(self) -> None:
        """Close this process's stripe lock descriptors (at shutdown)."""
        if self._stripe_pid == os.getpid():
            for fd in self._stripe_fds.values():
                os.close(fd)
        self._stripe_fds = {}
        with self._spool_mutex:
            for fd in self._folder_fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._folder_fds = []
        self._folder_fd = threading.local()

    def release_spool(self) -> None:
        """Remove this process's spool folder and drop its lock (at shutdown, after
        the requests in flight have finished)."""
        with self._spool_mutex:
            if self._spool is None or self._spool_pid != os.getpid():
                return
            _rmtree(self._spool)
            self._spool.with_name(self._spool.name + ".lock").unlink(missing_ok=True)
            os.close(self._spool_fd)
            self._spool, self._spool_fd = None, -1

    # --- stored files -----------------------------------------------------------------

    @contextmanager
    def locked(self, sop_uids: Iterable[str]) -> Iterator[None]:
        """Hold the write locks of these SOP Instance UIDs (256 striped ``flock``
        files, taken in order, so there is no deadlock). Held from placing a file to
        committing its index row, they serialise writers of one instance across
        threads and worker processes: a file found at its final name without an
        index row is then a crash orphan, never another writer's work in progress."""
        stripes = sorted({zlib.crc32(u.encode()) % 256 for u in sop_uids})
        held = []
        try:
            for n in stripes:
                # a thread lock per stripe, then the flock on this process's descriptor
                # of the stripe file (kept open: opening it per request cost two system
                # calls; one descriptor is shared by this process's threads, so the
                # thread lock is what keeps them apart, the flock keeps processes apart)
                mutex = self._stripe_mutex[n]
                mutex.acquire()
                try:
                    fd = self._stripe_fd(n)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    mutex.release()
                    raise
                held.append((mutex, fd))
            yield
        finally:
            for mutex, fd in reversed(held):
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    mutex.release()

    def _stripe_fd(self, n: int) -> int:
        """This process's descriptor of stripe file ``n`` (called holding its mutex;
        a forked child opens its own: a shared open file would share the flock)."""
        if self._stripe_pid != os.getpid():
            with self._spool_mutex:
                if self._stripe_pid != os.getpid():
                    self._stripe_fds = {}
                    self._stripe_pid = os.getpid()
        fd = self._stripe_fds.get(n)
        if fd is None:
            fd = os.open(self.locks / f"{n:02x}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._stripe_fds[n] = fd
        return fd

    def resolve(self, relpath: str) -> Path:
        """Absolute path of a stored file.

        Raises
        ------
        ValueError
            ``relpath`` is absolute or climbs out of the blob root (``..``). A
            lexical check: the archive itself never creates symbolic links.
        """
        return self._blobs_abs / self._inside(relpath)

    def resolve_str(self, relpath: str) -> str:
        """:meth:`resolve` as a ``str`` (no ``Path`` object: a whole-study answer
        resolves every file of the study per request)."""
        return os.path.join(self._blobs_abs_str, self._inside(relpath))

    @staticmethod
    def _inside(relpath: str) -> str:
        norm = os.path.normpath(relpath)
        if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or "\0" in norm:
            raise ValueError(f"path {relpath!r} is outside the archive")
        return norm

    def _mkdirs(self, directory: Path) -> None:
        """Create ``directory`` and missing parents (holding the folder lock
        exclusively); each new folder's entry is made durable (its parent fsynced)
        before the lock is released, so no other writer can place and acknowledge a
        file in a folder whose own entry is not yet durable."""
        missing = []
        d = directory
        while not d.exists():
            missing.append(d)
            d = d.parent
        for m in reversed(missing):
            try:
                m.mkdir()
            except FileExistsError:
                pass
            fsync_dir(m.parent)

    def place(self, spooled: Path, relpath: str, *, sync_dir: bool = True, synced: bool = False) -> Placed:
        """Durably move a spooled file to ``relpath`` (see module docstring). With
        ``sync_dir=False`` the caller fsyncs the final directory itself (the group
        commit does, once per directory, before the index commit). ``synced``: the
        spooled file's data is durable already (:meth:`SpooledPart.spool` with
        ``sync``), it is not opened again.

        Raises
        ------
        OSError
            ENOSPC/EROFS/EDQUOT and other I/O errors (STOW failure 0xA700); the
            final name is then untouched.
        """
        final = self.resolve(relpath)
        if not synced:
            fd = os.open(spooled, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        faults.point("fsynced")
        with self._folders(fcntl.LOCK_SH):  # a folder found here is durable and stays (see _folders)
            linked = final.parent.is_dir() and self._link(spooled, final)
        if linked is False:
            with self._folders(fcntl.LOCK_EX):
                self._mkdirs(final.parent)
                linked = self._link(spooled, final)
        if linked is None:
            return Placed.EXISTS
        faults.point("linked")
        if sync_dir:
            fsync_dir(final.parent)
        os.unlink(spooled)
        return Placed.NEW

    @staticmethod
    def _link(spooled: Path, final: Path) -> bool | None:
        """Link ``spooled`` to ``final``: True, or None when a file is there already."""
        try:
            os.link(spooled, final)
        except FileExistsError:
            return None
        return True

    @contextmanager
    def _folders(self, how: int) -> Iterator[None]:
        """The folder lock (``locks/folders.lock``), shared by placements, exclusive while
        folders are made (mkdir and the fsync of its parent) or removed. A placement that
        finds its folder under the shared lock knows the folder's entry is durable (its
        maker held the lock until its parent was fsynced) and that no DELETE removes the
        emptied folder before the file is linked into it. Each thread has its own
        descriptor: ``flock`` locks belong to an open file, which threads would share."""
        fd = getattr(self._folder_fd, "fd", None)
        if fd is None or self._folder_fd.pid != os.getpid():
            fd = os.open(self.locks / "folders.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._folder_fd.fd, self._folder_fd.pid = fd, os.getpid()
            with self._spool_mutex:
                self._folder_fds.append(fd)
        fcntl.flock(fd, how)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def replace(self, spooled: Path, relpath: str) -> None:
        """Durably replace an unindexed file left at ``relpath`` (an orphan)."""
        final = self.resolve(relpath)
        os.replace(spooled, final)
        fsync_dir(final.parent)

    def same(self, spooled: Path, relpath: str) -> bool:
        """Whether the spooled file is byte-identical to the stored one."""
        return filecmp.cmp(spooled, self.resolve(relpath), shallow=False)

    def remove(self, relpath: str) -> None:
        """Delete a stored file and its emptied series/study folders."""
        final = self.resolve(relpath)
        with self._folders(fcntl.LOCK_EX):
            try:
                final.unlink()
            except FileNotFoundError:
                return
            d = final.parent
            for _ in range(2):
                try:
                    d.rmdir()
                except OSError:
                    break
                d = d.parent
        try:  # outside the lock: placements need not wait for the removal to be durable
            fsync_dir(d)
        except FileNotFoundError:  # emptied and removed by another DELETE meanwhile, which syncs its parent
            pass

    def walk(self):
        """Relative paths of every stored ``.dcm`` file."""
        for dirpath, _dirs, files in os.walk(self.blobs):
            for f in files:
                if f.endswith(".dcm"):
                    yield os.path.relpath(os.path.join(dirpath, f), self.blobs)

    def listing(self) -> Iterator[Listed]:
        for rel in self.walk():
            try:
                st = self.resolve(rel).stat()
            except FileNotFoundError:  # removed meanwhile
                continue
            yield Listed(rel, st.st_size, st.st_mtime)

    def exists(self, relpath: str) -> bool:
        return self.resolve(relpath).exists()

    def source(self, relpath: str) -> Path:
        """The file itself (readers ``open`` it; see store/objects.py)."""
        return self.resolve(relpath)

    def directory(self, relpath: str) -> Path | None:
        return self.resolve(relpath).parent

    def local_copy(self, relpath: str) -> AbstractContextManager[Path]:
        return nullcontext(self.resolve(relpath))


def _rmtree(folder: Path) -> int:
    """Remove a spool folder; returns the number of files it held."""
    try:
        n = sum(len(files) for _d, _s, files in os.walk(folder))
    except OSError:
        n = 0
    shutil.rmtree(folder, ignore_errors=True)
    return n


def is_out_of_resources(err: OSError) -> bool:
    """Errors that mean 'no room or no write access' (STOW failure 0xA700)."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


__all__ = ["BlobStore", "Placed", "is_out_of_resources"]

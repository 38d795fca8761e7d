"""Where the stored instances (PS3.10 files) live: the small interface every blob
store gives the archive, whatever keeps the bytes.

Two implementations:

- :class:`store.blobs.BlobStore`: files under ``data/blobs/`` (one disk, or a folder
  several nodes mount);
- :class:`store.s3.S3BlobStore`: objects in an S3-compatible bucket
  (``--storage s3://bucket/prefix``).

Both spool received parts locally (``data/tmp/``, per process), and both name an
instance by the relative path the index row holds (``study/series/sop.dcm``, built
from validated UIDs). The write order is the archive's (archive.py): ``place``
under the instance's placement locks, then the index commit; ``remove`` only after
the index commit that dropped the row.

A reader gets a *source* (:meth:`BlobStorage.source`): a :class:`pathlib.Path` for
files, a :class:`StoredObject` otherwise; ``source.open("rb")`` gives a seekable
binary reader (retrieve.py reads frames and bulk data at the offsets the index holds).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from ..settings import Settings
    from .blobs import BlobStore, Placed


class StoredObject(Protocol):
    """A stored instance that is not a local file (see :class:`store.s3.S3Source`)."""

    def open(self, mode: str = "rb", *, size: int | None = None) -> BinaryIO:
        """A seekable reader of the object's bytes; FileNotFoundError when it is gone
        (from ``open``, or, when ``size`` is given, from the first read, which also
        raises it when the object is not ``size`` bytes long)."""

    def version(self) -> Hashable:
        """Changes whenever the object at this name is replaced; FileNotFoundError when gone."""


class StorageUnavailable(OSError):
    """The storage as a whole did not take a write: an object store's 5xx answers
    after the client's retries, a timeout, no connection. Not about one instance:
    the archive fails the rest of the request at once instead of waiting as long again
    for each of its instances (archive.py)."""


@dataclass(frozen=True, slots=True)
class Listed:
    """One stored instance found by :meth:`BlobStorage.listing`."""

    path: str  # relative path (the index row's)
    size: int
    modified: float  # seconds since the epoch (the store's clock)


class BlobStorage(ABC):
    """What the archive, the readers and ``check`` need from a blob store."""

    #: what ``check`` does with an unindexed instance: "reindex" (files: a crash between
    #: link and commit, the file is whole) or "remove" (objects older than the grace period)
    orphans = "reindex"
    #: whether ``resolve`` gives a local file for every stored instance (readers may then open
    #: descriptors themselves, e.g. a whole study's files before its answer starts)
    local_files = True
    #: whether a stored file in the page cache may be read by the event loop (loop_read.py;
    #: BlobStore: a local block-device file system)
    loop_reads = False

    @abstractmethod
    def place(self, spooled: Path, relpath: str, *, sync_dir: bool = True, synced: bool = False) -> "Placed":
        """Store the spooled part at ``relpath`` durably, never over an existing one
        (``Placed.EXISTS``: something is already there). ``synced``: the spool file's data
        was already made durable by its writer."""

    @abstractmethod
    def replace(self, spooled: Path, relpath: str) -> None:
        """Durably replace what is at ``relpath`` (an orphan no index row names; the
        caller holds the placement locks)."""

    @abstractmethod
    def same(self, spooled: Path, relpath: str) -> bool:
        """Whether the spooled part is byte-identical to what is stored at ``relpath``."""

    @abstractmethod
    def remove(self, relpath: str) -> None:
        """Delete what is stored at ``relpath`` (nothing when it is gone)."""

    @abstractmethod
    def walk(self) -> Iterator[str]:
        """Relative paths of every stored ``.dcm`` instance."""

    @abstractmethod
    def listing(self) -> Iterator[Listed]:
        """Every stored ``.dcm`` instance with its size and modification time."""

    @abstractmethod
    def exists(self, relpath: str) -> bool:
        """Whether something is stored at ``relpath``."""

    @abstractmethod
    def source(self, relpath: str) -> "Path | StoredObject":
        """What readers open (module docstring)."""

    @abstractmethod
    def directory(self, relpath: str) -> Path | None:
        """The local folder whose fsync makes a placed ``relpath`` durable (the group
        commit fsyncs it before the index commit); None when ``place`` was durable already."""

    @abstractmethod
    def local_copy(self, relpath: str) -> AbstractContextManager[Path]:
        """A local file holding the stored bytes while the context lasts (to parse it)."""


def open_blobs(settings: "Settings") -> "BlobStore":
    """The blob store ``settings.storage`` names: the data folder's ``blobs/`` (default)
    or an S3 bucket (``s3://bucket/prefix``)."""
    from .blobs import BlobStore

    if settings.storage is None:
        return BlobStore(Path(settings.data_dir))
    from .s3 import S3BlobStore

    return S3BlobStore(Path(settings.data_dir), settings.storage, endpoint_url=settings.s3_endpoint_url)


__all__ = ["BlobStorage", "Listed", "StoredObject", "open_blobs"]

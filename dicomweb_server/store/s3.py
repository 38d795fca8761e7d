"""Instances as objects in an S3-compatible bucket (``--storage s3://bucket/prefix``;
AWS S3, MinIO, Ceph RGW), with boto3.

The object of an instance is ``{prefix}{study}/{series}/{sop}.dcm``: the relative
path its index row holds, built from validated UIDs (:meth:`S3BlobStore.key` refuses
anything else). The received part is spooled and validated locally first, as for
files (the spool, the reserve and the per-node ``flock`` stripes are the file store's:
:class:`store.blobs.BlobStore`); then:

1. ``place``: one ``PutObject`` with ``Content-MD5`` (the server checks the bytes it
   received against it) and ``If-None-Match: *`` (the server refuses to overwrite an
   existing object: 412, ``Placed.EXISTS``). The object is durable when S3 answers
   200: nothing is acknowledged before that;
2. the archive commits the index row (archive.py) and only then answers success.

A crash between 1 and 2 leaves an object no index row names: an orphan, never
acknowledged, which ``dicomweb-server check --repair`` removes once it is older than
the grace period (check.py). DELETE removes the objects after the index commit.

What the object store must guarantee (docs/scale-out.md): a 200 to ``PutObject``
means durably stored; strong read-after-write consistency for GET, HEAD and LIST
(AWS S3 since December 2020, MinIO, Ceph RGW); ranged GET (RFC 9110 §14) and
``If-Match`` on GET. ``If-None-Match: *`` on PUT (AWS since August 2024, MinIO, recent
Ceph) is probed at start-up (:meth:`S3BlobStore.probe_conditional_put`); where it is
ignored, each PUT is preceded by a HEAD. Either way the index's placement lock
(``Index.locked``: PostgreSQL advisory locks across nodes) is what serialises the
writers of one SOP Instance UID: a conditional PUT is the second line of defence.

Reads: :class:`S3Reader` is a seekable reader whose reads are ranged GETs of one
object version: the first GET checks the size the index row holds and notes the
ETag, every later one asks for that ETag (``If-Match``); no HEAD on the read path.
Small reads (pydicom
parsing a header) are served from a 64 KB read-ahead; a read of a frame or a bulk
data value is one GET of exactly its bytes; a whole instance streams from one GET in
bounded pieces (:meth:`S3Reader.iter_range`). Nothing reads a whole object into
memory that a file read would not.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import logging
import os
import secrets
import tempfile
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from .. import faults
from .blobs import BlobStore, Placed
from .objects import Listed, StorageUnavailable

log = logging.getLogger("dicomweb_server.store.s3")

#: read-ahead of small reads (pydicom reads a header a few bytes at a time)
READAHEAD = 64 * 1024
#: pieces in which a streamed range is handed on (retrieve.CHUNK)
PIECE = 256 * 1024
#: the largest object one PutObject may write (AWS; a STOW-RS body is capped at 4 GiB by default)
MAX_PUT = 5 * 1024**3


def parse_storage_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix ending in ``/`` or empty) of ``s3://bucket[/prefix]``.

    Raises
    ------
    ValueError
        Not an ``s3://`` URL, no bucket, or a prefix with ``..``/empty segments.
    """
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"storage {url!r}: expected s3://bucket/prefix (or nothing, for the data folder)")
    prefix = parts.path.strip("/")
    if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
        raise ValueError(f"storage {url!r}: the prefix may not have empty, '.' or '..' segments")
    return parts.netloc, (prefix + "/") if prefix else ""


def _md5_b64(path: Path) -> tuple[str, int]:
    h = hashlib.md5(usedforsecurity=False)
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
            n += len(chunk)
    return base64.b64encode(h.digest()).decode("ascii"), n


def _status(err: Exception) -> int:
    return int(getattr(err, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(err: Exception) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code") or "")


_FULL = {"QuotaExceeded", "XMinioStorageFull", "StorageFull", "EntityTooLarge", "XMinioAdminBucketQuotaExceeded"}


def _os_error(err: Exception, what: str) -> OSError:
    """A boto3/botocore error as the OSError the archive handles (STOW failure 0xA700
    for 'no room or no write access', else 0x0110)."""
    from botocore.exceptions import ConnectionError as NoConnection, HTTPClientError

    code = _code(err)
    message = f"{what}: {code or type(err).__name__}: {err}"
    if code in _FULL:
        number = errno.ENOSPC
    elif code in ("AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        number = errno.EACCES
    elif _status(err) >= 500 or isinstance(err, (NoConnection, HTTPClientError)):
        return StorageUnavailable(errno.EIO, message)  # (after botocore's retries)
    else:
        number = errno.EIO
    return OSError(number, message)


def _gone(err: Exception) -> bool:
    """Not there (any more), or not the version asked for (416: a shorter object)."""
    return _status(err) in (404, 412, 416) or _code(err) in ("NoSuchKey", "404", "PreconditionFailed",
                                                               "InvalidRange")


class BucketUnreachable(RuntimeError):
    """The bucket of ``--storage`` cannot be reached (named, with the cause)."""


class S3BlobStore(BlobStore):
    """Objects in ``s3://bucket/prefix``; spool, reserve and locks in the local data folder."""

    orphans = "remove"
    local_files = False

    def __init__(self, root: Path, url: str, *, endpoint_url: str | None = None, client=None) -> None:
        super().__init__(root)  # the local side: data/tmp (spool), data/locks, the reserve
        self.loop_reads = False  # instances are objects, read by worker threads (loop_read.py)
        self.url = url
        self.bucket, self.prefix = parse_storage_url(url)
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url,
                config=Config(
                    max_pool_connections=64,  # one per worker thread that may read or write at once
                    retries={"mode": "standard", "max_attempts": 4},
                    # Content-MD5 is sent explicitly (every S3-compatible server checks it); botocore's
                    # default CRC trailers (aws-chunked bodies) are not understood by all of them
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    s3={"addressing_style": "path"} if endpoint_url else None,
                ))
        self.client = client
        self.conditional_put = True  # until probe_conditional_put says otherwise

    # --- names ------------------------------------------------------------------------

    def key(self, relpath: str) -> str:
        """The object key of a relative path.

        Raises
        ------
        ValueError
            ``relpath`` is absolute or climbs out of the prefix (``..``).
        """
        norm = os.path.normpath(relpath)
        if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or "\0" in norm or norm == ".":
            raise ValueError(f"path {relpath!r} is outside the archive")
        return self.prefix + norm

    def resolve(self, relpath: str) -> Path:
        raise TypeError(f"instances in {self.url} have no local path; use source() or local_copy()")

    # --- start-up ---------------------------------------------------------------------

    def check_bucket(self) -> None:
        """Raise BucketUnreachable, naming the bucket and the cause, when it cannot be reached."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as e:  # noqa: BLE001 - botocore raises several families
            raise BucketUnreachable(f"storage {self.url}: the bucket cannot be reached: {e}") from e

    def probe_conditional_put(self) -> bool:
        """Whether the server refuses ``PutObject`` with ``If-None-Match: *`` over an
        existing object (412). Tried on a key of its own, removed afterwards; where the
        header is ignored, ``place`` asks with a HEAD first (see the module docstring)."""
        key = f"{self.prefix}.probe/{os.getpid()}-{secrets.token_hex(8)}"
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=b"1", IfNoneMatch="*")
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=b"2", IfNoneMatch="*")
                honoured = False
            except Exception as e:  # noqa: BLE001
                if _status(e) not in (412, 409):
                    raise
                honoured = True
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=key)
            except Exception:  # noqa: BLE001 - the probe key is not an instance: check ignores it
                pass
        if not honoured:
            log.warning("%s ignores If-None-Match on PUT: every PUT is preceded by a HEAD "
                        "(the index's placement lock serialises writers of one instance)", self.url)
        self.conditional_put = honoured
        return honoured

    # --- writes (under the caller's placement locks) ----------------------------------

    def _put(self, spooled: Path, key: str, conditional: bool) -> bool:
        """PUT the spooled file; False when ``conditional`` and an object exists."""
        md5, size = _md5_b64(spooled)
        if size > MAX_PUT:
            raise OSError(errno.EFBIG, f"{size} bytes: larger than one S3 PUT may write ({MAX_PUT})")
        extra = {"IfNoneMatch": "*"} if conditional and self.conditional_put else {}
        faults.point("fsynced")  # crash tests: spooled and hashed, not yet PUT
        try:
            with open(spooled, "rb") as f:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=f, ContentLength=size, ContentMD5=md5,
                                       ContentType="application/dicom", **extra)
        except Exception as e:  # noqa: BLE001
            if conditional and (_status(e) == 412 or _code(e) == "PreconditionFailed"):
                return False
            raise _os_error(e, f"PUT {key}") from e
        return True

    def place(self, spooled: Path, relpath: str, *, sync_dir: bool = True, synced: bool = False) -> Placed:
        """Store the spooled part as a new object and remove the spool file, as the
        file store does (``sync_dir``, ``synced``: no meaning here, a 200 answer is
        durable and the spool file is never fsynced). ``Placed.EXISTS`` when an object
        is already there (the spool file is kept, for :meth:`same` and :meth:`replace`)."""
        key = self.key(relpath)
        if not self.conditional_put and self.exists(relpath):
            return Placed.EXISTS
        if not self._put(spooled, key, conditional=True):
            return Placed.EXISTS
        faults.point("linked")
        os.unlink(spooled)
        return Placed.NEW

    def replace(self, spooled: Path, relpath: str) -> None:
        self._put(spooled, self.key(relpath), conditional=False)

    def same(self, spooled: Path, relpath: str) -> bool:
        """Byte comparison with the stored object, streamed (size first, from a HEAD)."""
        key = self.key(relpath)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            if int(head["ContentLength"]) != os.path.getsize(spooled):
                return False
            body = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=head["ETag"])["Body"]
        except Exception as e:  # noqa: BLE001
            if _gone(e):
                return False
            raise _os_error(e, f"GET {key}") from e
        try:
            with open(spooled, "rb") as f:
                for piece in body.iter_chunks(PIECE):
                    if f.read(len(piece)) != piece:
                        return False
                return f.read(1) == b""
        finally:
            body.close()

    def remove(self, relpath: str) -> None:
        key = self.key(relpath)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as e:  # noqa: BLE001
            if not _gone(e):
                raise _os_error(e, f"DELETE {key}") from e

    # --- listing ----------------------------------------------------------------------

    def listing(self, under: str = "") -> Iterator[Listed]:
        """Every stored object (or those under the folder ``under``, e.g. ``study/``)."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                     Prefix=self.prefix + under)
        for page in pages:
            for obj in page.get("Contents", ()):
                key = obj["Key"]
                rel = key[len(self.prefix):]
                if not rel.endswith(".dcm") or rel.startswith(".probe/"):
                    continue
                yield Listed(rel, int(obj["Size"]), obj["LastModified"].timestamp())

    def walk(self) -> Iterator[str]:
        return (obj.path for obj in self.listing())

    def sizes(self, relpaths: list[str]) -> dict[str, int]:
        """The sizes of those of ``relpaths`` that are stored, by listing their folders: a
        series folder when they all are in one, else their study folders (one request
        per 1000 objects; missing_data.absent)."""
        by_study: dict[str, set[str]] = {}
        for rel in relpaths:
            study, _, rest = rel.partition("/")
            by_study.setdefault(study, set()).add(rest.partition("/")[0])
        wanted = set(relpaths)
        out: dict[str, int] = {}
        for study, series in by_study.items():
            under = f"{study}/{next(iter(series))}/" if len(series) == 1 else f"{study}/"
            for obj in self.listing(under):
                if obj.path in wanted:
                    out[obj.path] = obj.size
        return out

    def exists(self, relpath: str) -> bool:
        key = self.key(relpath)
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except Exception as e:  # noqa: BLE001
            if _gone(e):
                return False
            raise _os_error(e, f"HEAD {key}") from e
        return True

    # --- reads ------------------------------------------------------------------------

    def source(self, relpath: str) -> "S3Source":
        return S3Source(self, self.key(relpath))

    def directory(self, relpath: str) -> None:
        return None  # durable when PutObject answered

    @contextmanager
    def local_copy(self, relpath: str) -> Iterator[Path]:
        """The object downloaded (streamed) into this process's spool folder."""
        fd, tmp = tempfile.mkstemp(prefix="get-", suffix=".dcm", dir=self.spool)
        try:
            with os.fdopen(fd, "wb") as out, self.source(relpath).open() as reader:
                for piece in reader.iter_range(0, None):
                    out.write(piece)
            yield Path(tmp)
        finally:
            os.unlink(tmp)


class S3Source:
    """A stored object as readers see it (store/objects.py ``StoredObject``)."""

    __slots__ = ("store", "key")

    def __init__(self, store: S3BlobStore, key: str) -> None:
        self.store, self.key = store, key

    def _head(self) -> dict:
        try:
            return self.store.client.head_object(Bucket=self.store.bucket, Key=self.key)
        except Exception as e:  # noqa: BLE001
            if _gone(e):
                raise FileNotFoundError(errno.ENOENT, "no such object", self.key) from None
            raise _os_error(e, f"HEAD {self.key}") from e

    def open(self, mode: str = "rb", *, size: int | None = None) -> "S3Reader":
        """A reader of the object. With ``size`` (the index row's) no request is made
        now: the first read's GET checks it (a HEAD otherwise)."""
        if mode != "rb":
            raise ValueError("stored objects are read-only")
        if size is not None:
            return S3Reader(self.store, self.key, size, None)
        head = self._head()
        return S3Reader(self.store, self.key, int(head["ContentLength"]), head["ETag"])

    def version(self) -> Hashable:
        head = self._head()
        return head["ETag"], int(head["ContentLength"]), head["LastModified"].timestamp()

    def __fspath__(self) -> str:  # pragma: no cover - a loud error, not a wrong file
        raise TypeError(f"s3://{self.store.bucket}/{self.key} is not a local file")


class S3Reader(io.RawIOBase):
    """Seekable reads of one object version by ranged GETs (module docstring).

    ``etag`` None: the first GET finds the version (its ETag, and its size, which must
    be ``size``); every later GET asks for that version (``If-Match``). Raises
    FileNotFoundError from a read when the object is gone or is another version
    (404, 412, 416, or another size)."""

    def __init__(self, store: S3BlobStore, key: str, size: int, etag: str | None) -> None:
        super().__init__()
        self.store, self.key, self.size, self.etag = store, key, size, etag
        self.pos = 0
        self._buf = b""
        self._buf_at = 0
        self.gets = 0  # GET requests made (tests, benchmarks)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self.pos = base + offset
        return self.pos

    def _get(self, offset: int, length: int | None):
        """The body of a GET of ``length`` bytes from ``offset`` (to the end when None)."""
        end = "" if length is None else str(offset + length - 1)
        self.gets += 1
        extra = {"IfMatch": self.etag} if self.etag is not None else {}
        try:
            r = self.store.client.get_object(Bucket=self.store.bucket, Key=self.key, Range=f"bytes={offset}-{end}",
                                             **extra)
        except Exception as e:  # noqa: BLE001
            if _gone(e):
                raise FileNotFoundError(errno.ENOENT, "object deleted or replaced while being read",
                                        self.key) from None
            raise _os_error(e, f"GET {self.key}") from e
        if self.etag is None:  # the first GET: this is the version read from now on
            cr = r.get("ContentRange") or ""
            total = int(cr.rpartition("/")[2]) if "/" in cr else int(r["ContentLength"])
            if total != self.size:
                r["Body"].close()
                raise FileNotFoundError(errno.ENOENT, f"object of {total} bytes, not {self.size}: replaced",
                                        self.key)
            self.etag = r["ETag"]
        return r["Body"]

    def _fetch(self, offset: int, length: int) -> bytes:
        body = self._get(offset, length)
        try:
            data = body.read()
        finally:
            body.close()
        if len(data) != length:
            raise OSError(errno.EIO, f"GET {self.key}: {len(data)} bytes of {length} asked at {offset}")
        return data

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read of a closed object")
        left = self.size - self.pos
        n = left if n is None or n < 0 else min(n, left)
        if n <= 0:
            return b""
        at = self.pos - self._buf_at
        if 0 <= at and at + n <= len(self._buf):
            data = self._buf[at : at + n]
        elif n >= READAHEAD:
            data = self._fetch(self.pos, n)  # a frame or a value: exactly its bytes
        else:
            self._buf_at, self._buf = self.pos, self._fetch(self.pos, min(READAHEAD, left))
            data = self._buf[:n]
        self.pos += n
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def iter_range(self, offset: int, length: int | None, piece: int = PIECE) -> Iterator[bytes]:
        """``length`` bytes from ``offset`` (to the end when None) from one GET, in
        pieces of at most ``piece`` bytes as they arrive (bounded memory)."""
        total = self.size - offset if length is None else min(length, self.size - offset)
        if total <= 0:
            return
        got = 0
        body = self._get(offset, total)
        try:
            for chunk in body.iter_chunks(piece):
                got += len(chunk)
                yield chunk
        finally:
            body.close()
        self.pos = offset + got
        if got != total:
            raise OSError(errno.EIO, f"GET {self.key}: {got} bytes of {total} from {offset}")


__all__ = ["S3BlobStore", "S3Reader", "S3Source", "parse_storage_url"]

"""A bounded LRU cache of rendered pictures, keyed by instance, the version of its
stored file, frames, parameters and media type, so that a repeated rendered request
costs a look-up. One per worker process; the cap (bytes of cached pictures) is a
setting.

No worker is ever told about a DELETE or a new store in another worker, so the key
holds :func:`file_version`: an instance deleted and stored again under the same SOP
Instance UID is a new file (new inode, mtime, usually size), hence a new key, in
every process. Pictures of old versions are never asked for again and age out.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path

from .store.objects import StoredObject


def file_version(path: Path | StoredObject) -> Hashable:
    """(device, inode, size, mtime in ns) of a stored file: changes whenever the
    file at that name is replaced (stored files are never rewritten in place); an
    object's own version (ETag, size, time: store/s3.py).

    Raises
    ------
    FileNotFoundError
        The file was deleted.
    """
    if not isinstance(path, Path):
        return path.version()
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class RenderCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: bytes) -> None:
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._items[key] = value
            self._bytes += len(value)
            while self._bytes > self.max_bytes:
                _k, v = self._items.popitem(last=False)
                self._bytes -= len(v)

    @property
    def size(self) -> int:
        return self._bytes

"""A bounded LRU cache of rendered pictures, keyed by instance, frames,
parameters and media type, so that a repeated rendered request costs a look-up.
One per worker process; the cap (bytes of cached pictures) is a setting."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable


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

    def evict_instance(self, sop_uid: str) -> None:
        """Forget every picture of an instance (after DELETE)."""
        with self._lock:
            for k in [k for k in self._items if isinstance(k, tuple) and k and k[0] == sop_uid]:
                self._bytes -= len(self._items.pop(k))

    @property
    def size(self) -> int:
        return self._bytes

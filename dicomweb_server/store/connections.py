"""One SQLite connection per thread (sqlite3 connections are not shared between
threads that write), all closed together. WAL journal, ``synchronous=FULL``: a
commit survives power loss; writers wait up to 30 s for the database lock.

Used by the SQLite index (``store/sqlite.py``, with two more pragmas) and the routing outbox.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


class ThreadConnections:
    def __init__(self, path: Path, pragmas: tuple[str, ...] = ()) -> None:
        self.path = path
        self.pragmas = ("journal_mode=WAL", "synchronous=FULL", *pragmas)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        """This thread's connection (autocommit mode: transactions are explicit)."""
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            for pragma in self.pragmas:
                con.execute(f"PRAGMA {pragma}")
            self._local.con = con
            with self._lock:
                self._all.append(con)
        return con

    def close(self) -> None:
        with self._lock:
            for con in self._all:
                try:
                    con.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()

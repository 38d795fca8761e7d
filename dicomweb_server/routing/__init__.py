"""Routing: forward what the archive stores to other archives, durably.

- :mod:`.rules`: the routes file (destinations, rules with QIDO-RS matching keys).
- :mod:`.outbox`: the forwards owed, written in the index transaction of the instance.
- :mod:`.forwarder`: delivery in each worker (leases, batches, retries, dead letters).
- :mod:`.destinations`: STOW-RS and C-STORE senders.
- :mod:`.webhook`: webhooks, told of every change of the change log (store/changes.py)
  through the same outbox.

The archive is the one write path (:meth:`archive.Archive.store`, used by STOW-RS,
``import`` and the DIMSE front door): :class:`Routing` registers an index write hook,
so every newly indexed instance is matched against the rules inside the commit that
indexes it, whichever front door received it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path

from ..dicom.instance import InstanceRecord
from ..store.base import Index
from ..store.changes import Change
from .outbox import Entry, Outbox, SQLiteOutbox
from .rules import Routes, RoutesError, load_routes

__all__ = ["Routing", "Routes", "RoutesError", "load_routes", "outbox_path", "open_outbox", "Outbox", "Entry"]


def outbox_path(data_dir: Path, index: str) -> Path:
    """The SQLite file holding the outbox: the index itself, or ``outbox.sqlite``
    next to the files for the in-memory index (which must survive a restart).
    (The PostgreSQL index keeps it in its database: :func:`open_outbox`.)"""
    return Path(data_dir) / ("index.sqlite" if index == "sqlite" else "outbox.sqlite")


def open_outbox(settings, writer: Callable[[], AbstractContextManager] | None = None) -> Outbox:
    """The outbox that lives where the index's transactions are: the PostgreSQL
    database for ``index = "postgresql"`` (shared by every node), else a SQLite file
    (:func:`outbox_path`) whose writes take ``writer`` (the index writer lock)."""
    if settings.index == "postgresql":
        from .outbox_pg import PostgreSQLOutbox

        return PostgreSQLOutbox(settings.database_url)
    return SQLiteOutbox(outbox_path(Path(settings.data_dir), settings.index), writer)


class Routing:
    """Rules + outbox of one archive process; the forwarder wakes on :meth:`committed`."""

    def __init__(self, routes: Routes, outbox: Outbox) -> None:
        self.routes = routes
        self.outbox = outbox
        self._wake: Callable[[set[str]], None] | None = None
        self._owed: set[str] = set()
        self._lock = threading.Lock()
        self.index: Index | None = None  # where webhooks read the changes they carry
        self.webhooks = [name for name, d in routes.destinations.items() if d.webhook is not None]

    @classmethod
    def attach(cls, routes: Routes, index: Index, outbox: Outbox, rules: bool = True) -> "Routing":
        """Hook ``routes`` into ``index``: the rules (unless ``rules`` is False: the
        caller adds ``_on_add`` later) and the webhooks."""
        routing = cls(routes, outbox)
        routing.index = index
        if rules:
            index.add_write_hook(routing._on_add)
        if routing.webhooks:
            index.add_change_hook(routing._on_change)
        return routing

    def _on_change(self, con: object, changes: list[Change]) -> None:
        """Index change hook: owe every webhook a notification of each change, in the
        transaction that logs it (``con``: the index's, or the in-memory index's journal
        in ``outbox.sqlite``)."""
        self.outbox.insert_changes(self.webhooks, changes, con)
        created = [c.study_uid for c in changes if c.action == "create"]
        for name in self.webhooks:
            hook = self.routes.destinations[name].webhook
            if created and hook is not None and hook.stable_after is not None:
                self.outbox.defer_stable(name, created, hook.stable_after, con)
        with self._lock:
            self._owed.update(self.webhooks)

    def change(self, sequence: int) -> Change | None:
        """The change-log row with this Sequence (what a webhook sends)."""
        assert self.index is not None
        found = self.index.changes(after=sequence - 1, limit=1)
        return found[0] if found and found[0].sequence == sequence else None

    def study_size(self, study_uid: str) -> int:
        """Instances of the study stored now (a "study stable" event says how many)."""
        assert self.index is not None
        return len(self.index.instances(study_uid))

    def _on_add(self, con: object, records: list[InstanceRecord], added: list[bool]) -> None:
        """Index write hook: owe the forwards of the newly added records, in the
        index's transaction ``con`` (SQLite, PostgreSQL) or before the index
        changes (memory: ``con`` is None)."""
        entries = [Entry(dest, r.study_uid, r.series_uid, r.sop_uid, r.path, rule)
                   for r, new in zip(records, added) if new for dest, rule in self.routes.destinations_for(r)]
        if entries:
            self.outbox.insert(entries, con)
            with self._lock:
                self._owed.update(e.destination for e in entries)

    def committed(self) -> None:
        """Called by the archive after a commit: wake the forwarder of this process
        for the destinations just owed something (no polling for our own rows)."""
        with self._lock:
            owed, self._owed = self._owed, set()
        if owed and self._wake is not None:
            self._wake(owed)

    def committed_to(self, destinations: set[str]) -> None:
        """Wake the forwarder for rows changed outside a store (retry, export)."""
        if destinations and self._wake is not None:
            self._wake(destinations)

    def set_waker(self, wake: Callable[[set[str]], None] | None) -> None:
        self._wake = wake

    def export(self, destination: str, instances: Iterable) -> int:
        """Manual export: owe ``instances`` (:class:`store.base.InstanceLocation`) to
        ``destination``. Returns the number of rows added."""
        if destination not in self.routes.destinations:
            raise KeyError(destination)
        n = self.outbox.enqueue(Entry(destination, i.study_uid, i.series_uid, i.sop_uid, i.path, "export")
                                for i in instances)
        if n:
            self.committed_to({destination})
        return n

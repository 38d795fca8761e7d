"""Routing: forward what the archive stores to other archives, durably.

- :mod:`.rules`: the routes file (destinations, rules with QIDO-RS matching keys).
- :mod:`.outbox`: the forwards owed, written in the index transaction of the instance.
- :mod:`.forwarder`: delivery in each worker (leases, batches, retries, dead letters).
- :mod:`.destinations`: STOW-RS and C-STORE senders.
- :mod:`.webhook`: webhooks, told of every change of the change log (store/changes.py)
  through the same outbox.

Rows are owed when an instance first becomes indexed while routes are in force,
whatever indexes it: :class:`Routing` registers an index write hook, so the store path
(:meth:`archive.Archive.store`: STOW-RS, ``import``, the DIMSE front door), ``check
--repair`` and the in-memory index's start-up rebuild all write the forwards of every
instance they add in the commit that adds it. The rules are matched *before* that
commit (:meth:`Routing.plan`, outside the index writer lock); the hook only writes
the rows. New versions (an ``$update``, ``$merge``, ``$restore``: lifecycle/update.py)
go through a replace hook in the transaction that switches the index to them: the
rules with ``on = ["store", "update"]`` owe the new versions (matched before it, as
for a store), and every forward of the instance still owed is re-pointed at the new
file. Two more cases close the gaps a crash leaves:

- the in-memory index is rebuilt from the files at every start, so "first indexed"
  is kept in a ledger (table ``routed`` of ``outbox.sqlite``, written with the rows):
  a file that the ledger does not name was placed but never committed (a crash
  between the two) and owes its forwards when the rebuild indexes it. A new ledger
  (or one a process without the routes stored past) is first filled from the files
  without owing anything: those were stored while no routes were in force.
- a duplicate store (an acknowledged success, nothing indexed) owes each forward its
  rules name that has no row at all for the instance (:meth:`Routing.owe_missing`):
  the orphan indexed by a ``check --repair`` run without the routes, then sent again
  by its client, is forwarded. (A delivered row removed after ``keep_delivered`` is
  also "no row": that instance is sent again, at least once, never lost.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
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
    return SQLiteOutbox(outbox_path(Path(settings.data_dir), settings.index), writer,
                        ledger=settings.index == "memory")


class Routing:
    """Rules + outbox of one archive process; the forwarder wakes on :meth:`committed`.

    ``ledger``: keep the ledger of decided instances (the in-memory index: module
    docstring)."""

    def __init__(self, routes: Routes, outbox: Outbox, ledger: bool = False) -> None:
        self.routes = routes
        self.outbox = outbox
        self.ledger = ledger
        self._wake: Callable[[set[str]], None] | None = None
        self._owed: set[str] = set()
        self._planned: dict[str, list[tuple[str, str]]] = {}
        self._rebuilding: str | None = None  # "seed" or "rebuild" while the in-memory index is rebuilt
        self._lock = threading.Lock()
        self.index: Index | None = None  # where webhooks read the changes they carry
        self.webhooks = [name for name, d in routes.destinations.items() if d.webhook is not None]

    @classmethod
    def attach(cls, routes: Routes, index: Index, outbox: Outbox, ledger: bool = False) -> "Routing":
        """Hook ``routes`` into ``index``: the rules (a write hook) and the webhooks (a
        change hook). ``ledger``: the in-memory index's (class docstring)."""
        routing = cls(routes, outbox, ledger)
        routing.index = index
        index.add_write_hook(routing._on_add)
        index.add_replace_hook(routing._on_replace)
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

    # --- matching, before the index transaction ------------------------------------------

    def plan(self, records: list[InstanceRecord], event: str = "store") -> None:
        """Match ``records`` against the rules of ``event`` (``store``; ``update``: new
        versions, lifecycle/update.py) now, before the commit that indexes them: the
        write (or replace) hook, inside the index transaction (under the writer lock of
        every process), then only writes the rows. (Instances being stored or updated
        are locked by their SOP Instance UID until their commit: one plan per UID at a
        time.)"""
        matched = {r.sop_uid: self.routes.destinations_for(r, event) for r in records}
        with self._lock:
            self._planned.update(matched)

    def owe_nothing(self, records: list[InstanceRecord]) -> None:
        """The next commit that indexes ``records`` owes no forward for them: rejected
        instances shown again (lifecycle/reject.py restore) were forwarded, or not, when
        first stored; neither a store nor a new version. (:meth:`forget` afterwards.)"""
        with self._lock:
            self._planned.update({r.sop_uid: [] for r in records})

    def forget(self, records: list[InstanceRecord]) -> None:
        """Drop the plans the commit did not use (duplicates, refusals, failures)."""
        with self._lock:
            for r in records:
                self._planned.pop(r.sop_uid, None)

    def _destinations(self, record: InstanceRecord, event: str = "store") -> list[tuple[str, str]]:
        with self._lock:
            planned = self._planned.pop(record.sop_uid, None)
        # not planned: indexed by check --repair or the rebuild (no lock contention there)
        return planned if planned is not None else self.routes.destinations_for(record, event)

    def _entries(self, records: Iterable[InstanceRecord], event: str = "store") -> list[Entry]:
        return [Entry(dest, r.study_uid, r.series_uid, r.sop_uid, r.path, rule)
                for r in records for dest, rule in self._destinations(r, event)]

    # --- owing ---------------------------------------------------------------------------

    def _on_add(self, con: object, records: list[InstanceRecord], added: list[bool]) -> None:
        """Index write hook: owe the forwards of the newly added records, in the
        index's transaction ``con`` (SQLite, PostgreSQL) or before the index
        changes (memory: ``con`` is None)."""
        new = [r for r, a in zip(records, added) if a]
        decided = [r.sop_uid for r in new] if self.ledger else []
        if self._rebuilding == "seed":  # stored while no routes were in force: owe nothing
            new = []
        elif self._rebuilding == "rebuild":  # owe only what a crash left undecided
            undecided = self.outbox.undecided(decided)
            new = [r for r in new if r.sop_uid in undecided]
        entries = self._entries(new)
        if entries or decided:
            self.outbox.insert(entries, con, decided)
        if entries:
            with self._lock:
                self._owed.update(e.destination for e in entries)

    def _on_replace(self, con: object, records: list[InstanceRecord], action: str) -> None:
        """Index replace hook: new versions made current (an update, merge or restore),
        in the transaction ``con`` that switches the index to them: pending forwards
        re-pointed at the new files, and the rules with ``on = ["update"]`` owe the new
        versions (:meth:`Outbox.insert_versions`)."""
        entries = self._entries(records, "update") if self.routes.on_update else []
        self.outbox.insert_versions(entries, [(r.sop_uid, r.path) for r in records], con)
        if entries:
            with self._lock:
                self._owed.update(e.destination for e in entries)

    def owe_missing(self, records: list[InstanceRecord]) -> None:
        """A duplicate store of ``records`` (already indexed): owe the forwards their
        rules name that have no row for the instance (module docstring). Durable on
        return; raises when the outbox cannot be written."""
        entries = self._entries(records)
        if entries and self.outbox.insert_missing(entries):
            with self._lock:
                self._owed.update(e.destination for e in entries)

    @contextmanager
    def rebuilding(self) -> Iterator[None]:
        """The in-memory index's start-up rebuild runs inside: instances the ledger
        does not name owe their forwards; a ledger not armed is filled (owing
        nothing) and armed once the rebuild is done."""
        seed = not self.outbox.armed()
        self._rebuilding = "seed" if seed else "rebuild"
        try:
            yield
        finally:
            self._rebuilding = None
        if seed:
            self.outbox.arm(True)

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

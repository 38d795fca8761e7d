"""The archive: blob store + metadata index, and the STOW-RS store transaction
that ties them together.

Store order for each instance (nothing is acknowledged before step 3 returns):
1. the received part, spooled to ``data/tmp``, is parsed and validated
   (:func:`dicom.instance.describe_instance`);
2. under the instance's write lock (:meth:`store.blobs.BlobStore.locked`), the file
   is fsynced and hard-linked to its final name (:meth:`store.blobs.BlobStore.place`);
3. the group commit (:class:`store.commit.GroupCommitter`): the request fsyncs its
   directories (a fsync shared with the process's other requests for the same folder,
   outside the writer lock), then the index rows of every request waiting are
   committed in one durable transaction (SQLite ``synchronous=FULL``).
With ``--storage s3://...`` step 2 is a conditional PutObject (store/s3.py), durable
when the object store answers 200; step 3 has no directory to fsync.
A crash before 3 leaves a file no index row names: invisible to every search and
retrieve, re-indexed by ``dicomweb-server check --repair`` (the in-memory index
indexes it at start-up); an object no row names is removed by ``check --repair`` once
older than the grace period (check.py).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from . import faults, metrics
from .access import labels_in
from .access.rules import FULL, Access
from .dicom.instance import InstanceRecord, describe_instance, instance_url
from .dicom.multipart import MEMORY_PART_BYTES, SpooledPart
from .dicom.reading import same_data_set
from .dicom.status import FailureReason, InstanceError
from .policy import ingest
from .lifecycle import reject
from .lifecycle.update import UpdateError, replace_version
from .lifecycle.versions import current_file, kept_files, main_file, split_version
from .policy import retention
from .routing import Routes, Routing, load_routes, open_outbox, outbox_path
from .routing.rules import NOWHERE, Arrival
from .settings import Settings
from .store.base import Index, IndexUnavailable, Refused
from .store.blobs import BlobStore, Placed, is_out_of_resources
from .store.commit import Expected, GroupCommitter
from .store.objects import StorageUnavailable, open_blobs

log = logging.getLogger("dicomweb_server.archive")


#: the source of the instances the command line imports (importer.py)
IMPORT_SOURCE = "import"


def source_of_dimse(calling_ae: str | bytes) -> str:
    """The source of a C-STORE's instance: its association's calling AE title (PS3.8 §7.1.1.3)."""
    if isinstance(calling_ae, bytes):
        calling_ae = calling_ae.decode("ascii", "replace")
    return "dimse:" + calling_ae.strip()


def source_of_stow(user: str | None, address: str | None) -> str:
    """The source of a STOW-RS request's instances: the authenticated user (its key's name,
    JWT ``sub`` or Basic user name: identity.py), else the client's address."""
    return "stow:" + (user or address or "unknown")


@dataclass(slots=True)
class Stored:
    sop_class_uid: str
    sop_instance_uid: str
    study_uid: str
    series_uid: str
    duplicate: bool = False


@dataclass(slots=True)
class Failed:
    reason: FailureReason
    message: str
    sop_class_uid: str | None = None
    sop_instance_uid: str | None = None
    source: Path | None = None  # the spooled part that failed (names the file for `import --report`)


def _small_file(part: SpooledPart) -> bytes | None:
    """The bytes of a spooled file no larger than an in-memory STOW-RS part (a DIMSE
    C-STORE data set arrives as a file), so that it is described from memory like one:
    without a pydicom Dataset in the common case (dicom/lean.py; issue 10). None for
    larger files, or when it cannot be read (then described from the file, which
    reports the error)."""
    if part.path is None or not 0 < part.size <= MEMORY_PART_BYTES:
        return None
    try:
        with open(part.path, "rb") as f:
            data = f.read(MEMORY_PART_BYTES + 1)
    except OSError:
        return None
    return data if len(data) == part.size else None


@dataclass(slots=True)
class StoreOutcome:
    stored: list[Stored] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)


def _is_dicom_part(content_type: str) -> bool:
    # a part without Content-Type takes the multipart's type="application/dicom"
    return content_type == "" or content_type.split(";")[0].strip().lower() == "application/dicom"


class Archive:
    """Files plus index. Methods are blocking: the web layer calls them in a
    worker thread (or directly, for index look-ups that take microseconds)."""

    def __init__(self, settings: Settings, index: Index) -> None:
        self.settings = settings
        self.blobs: BlobStore = open_blobs(settings)  # files, or objects (store/objects.py)
        self.index = index
        self.committer = GroupCommitter(index, Path(settings.data_dir) / "index.lock", metrics.INDEX_COMMITS.inc)
        self._busy = threading.Condition()
        self._in_flight = 0  # store() and delete() calls running (worker threads)
        self.routing: Routing | None = None  # set by open() when a routes file is configured
        self._pseudonyms = None  # deid/pseudonyms.py, opened when first needed (pseudonyms)
        self._pseudonyms_lock = threading.Lock()
        self._unrouted_ledger = False  # an in-memory archive opened without routes (_disarm_ledger)
        # the retention policy (policy/retention.py): its hard limit is checked by every store
        self.retention: retention.Policy | None = None
        self.hard_limit: retention.HardLimit | None = None
        # IOCM: a rejection note hides what it names in the commit that indexes it
        index.add_write_hook(reject.note_hook(index))

    @classmethod
    def open(cls, settings: Settings) -> Archive:
        """Open (creating if needed) the archive in ``settings.data_dir``.

        Safe while other worker processes serve the same folder (case P6): the
        index is opened (schema created, WAL switched on) under the index writer
        ``flock`` that every commit takes, so starting workers never race each
        other's schema creation nor a running commit; the spool sweep removes only
        folders of processes that are gone (:meth:`BlobStore.clean_spool`).
        """
        data = Path(settings.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        with _flocked(data / "index.lock"):
            if settings.index == "sqlite":
                from .store.sqlite import SQLiteIndex

                index: Index = SQLiteIndex(data / "index.sqlite")
            elif settings.index == "postgresql":
                from .store.postgresql import PostgreSQLIndex

                index = PostgreSQLIndex(settings.database_url, settings.database_pool_size)  # type: ignore[arg-type]
            else:
                from .store.memory import MemoryIndex

                # its change log beside routing's outbox (a webhook's rows commit with their change)
                index = MemoryIndex(journal=outbox_path(data, "memory"))
        try:
            archive = cls(settings, index)
            if settings.storage is not None:
                archive.blobs.check_bucket()  # type: ignore[attr-defined]
                archive.blobs.probe_conditional_put()  # type: ignore[attr-defined]
        except BaseException:
            index.close()
            raise
        archive.blobs.ensure_reserve()
        n = archive.blobs.clean_spool()
        if n:
            log.info("removed %d spool file(s) of stopped processes (never acknowledged)", n)
        log.debug("spooling into %s", archive.blobs.spool)  # claimed now, not at the first STOW-RS
        try:
            if settings.retention_file is not None:
                archive.retention = retention.load_policy(settings.retention_file)
                if archive.retention.quota.hard is not None:
                    archive.hard_limit = retention.HardLimit(archive.retention.quota.hard)
            if settings.routes_file is not None:
                # before the in-memory index's rebuild: what a crash left unrouted is owed (its
                # ledger decides, routing/__init__.py: nothing stored before is owed again), and
                # the webhooks hear of the changes the start-up finds (files never committed)
                archive.attach_routing(load_routes(settings.routes_file))
            elif settings.index == "memory":  # its first store disarms the ledger (if one was armed)
                archive._unrouted_ledger = True
            if settings.index == "memory":
                archive.rebuild()
                gone = index.reconcile_changes()  # type: ignore[attr-defined]
                if gone:  # (files gone while the archive was down: webhooks hear these too)
                    log.warning("%d instance(s) in the change log are no longer stored: logged as deleted", gone)
        except BaseException:
            archive.close()
            raise
        return archive

    def attach_routing(self, routes: Routes) -> Routing:
        """Match every instance indexed from now on against ``routes`` and owe its
        forwards in the same commit, and owe the webhooks every change (routing/).
        Raises RoutesError for a bad file."""
        outbox = open_outbox(self.settings, self.committer.writer)
        self.routing = Routing.attach(routes, self.index, outbox, ledger=self.settings.index == "memory")
        return self.routing

    def _disarm_ledger(self) -> None:
        """An in-memory archive that routed before stores without routes: its routing
        ledger no longer covers every stored instance; the next start with routes fills
        it again instead of owing what this process stored (no routes in force)."""
        self._unrouted_ledger = False
        from .routing import SQLiteOutbox

        outbox = SQLiteOutbox(outbox_path(Path(self.settings.data_dir), "memory"), self.committer.writer,
                              ledger=True)
        try:
            outbox.arm(False)
        finally:
            outbox.close()

    @property
    def pseudonyms(self):
        """The de-identification projects and pseudonyms (deid/pseudonyms.py), kept where the
        index keeps its transactions; opened at the first use."""
        with self._pseudonyms_lock:
            if self._pseudonyms is None:
                from .deid.pseudonyms import open_pseudonyms

                self._pseudonyms = open_pseudonyms(self.settings)
            return self._pseudonyms

    def close(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds, default ``settings.shutdown_timeout``)
        for the store and delete transactions running in worker threads, then remove this
        process's spool folder and close the index. A transaction still running
        after that was never acknowledged: its request was cancelled."""
        deadline = time.monotonic() + (self.settings.shutdown_timeout if timeout is None else timeout)
        with self._busy:
            while self._in_flight and self._busy.wait(max(0.0, deadline - time.monotonic())):
                pass
            if self._in_flight:
                log.error("closing with %d store/delete transaction(s) still running", self._in_flight)
        self.blobs.release_spool()
        self.blobs.close_locks()
        self.committer.close()
        if self.routing is not None:
            self.routing.outbox.close()
        if self._pseudonyms is not None:
            self._pseudonyms.close()
        self.index.close()

    @contextmanager
    def _tracked(self):
        with self._busy:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._busy:
                self._in_flight -= 1
                if not self._in_flight:  # close() waits for none running, nothing else waits
                    self._busy.notify_all()

    def rebuild(self) -> int:
        """Index every file under ``blobs/`` (start-up of the in-memory index), in
        the order the files were written, so that search order survives restarts."""
        with self.routing.rebuilding() if self.routing is not None else nullcontext():
            return self._rebuild()

    def _rebuild(self) -> int:
        batch: list[InstanceRecord] = []
        n = 0
        files = sorted((obj.modified, obj.path) for obj in self.blobs.listing())
        for _mtime, rel in files:
            if main_file(rel) is not None:
                continue  # a recompress side file: its main file holds the instance (policy/recompress.py)
            try:
                with self.blobs.local_copy(rel) as local:
                    rec = describe_instance(local, bulk_threshold=self.settings.bulk_threshold)
            except InstanceError as e:
                log.warning("not indexed: %s: %s", rel, e.message)
                continue
            except FileNotFoundError:  # removed meanwhile (e.g. by `check --repair`)
                continue
            base, version = split_version(rel)
            if base != rec.path:
                log.warning("not indexed: %s is filed under the wrong name (expected %s)", rel, rec.path)
                continue
            last = self.index.last_change(rec.sop_uid)  # type: ignore[attr-defined]
            if not current_file(rel, last):
                continue  # a kept earlier version, or the file of an update that never switched
            rec.path = rel
            batch.append(rec)
            if len(batch) >= 500:
                n += self._add_rebuilt(batch)
                batch = []
        if batch:
            n += self._add_rebuilt(batch)
        return n

    def _add_rebuilt(self, batch: list[InstanceRecord]) -> int:
        with self.committer.writer():  # the outbox's writes (routing's hook) assume it is held
            results = self.index.add(batch)
        for rec, res in zip(batch, results):
            if isinstance(res, Refused):
                log.warning("not indexed: %s: %s", rec.path, res.message)
        return sum(res is True for res in results)

    # --- STOW-RS ------------------------------------------------------------------------

    def store(self, parts: list[SpooledPart], expected_study_uid: str | None = None,
              access: Access = FULL, source: str = "", arrival: Arrival = NOWHERE) -> StoreOutcome:
        """Store the parts of one STOW-RS request (PS3.18 §10.5); durable on return.

        Each part succeeds or fails on its own. Spool files of parts that were not
        stored are removed. Duplicate policy: the same SOP Instance UID with
        byte-identical content is a success (nothing rewritten); with different
        content it fails with 0x0111 and the stored instance is kept.

        ``access`` (access/rules.py): a client restricted to labels stores only into
        studies it may see, and a new study it stores gets its write label
        (:meth:`_check_access`).

        ``source`` says where the instances came from (the front door's
        :func:`source_of_dimse`, :func:`source_of_stow`, :data:`IMPORT_SOURCE`): the index
        keeps it with each new instance (the operator's page shows it; docs/arrivals.md).
        ``arrival``: how the parts came (the C-STORE's calling AE title, the STOW-RS door),
        for the labels on arrival (access/labels_in.py), written in the commit that indexes
        each instance.
        """
        with self._tracked():
            return self._store(parts, expected_study_uid, access, source, arrival)

    def _store(self, parts: list[SpooledPart], expected_study_uid: str | None,
               access: Access = FULL, source: str = "", arrival: Arrival = NOWHERE) -> StoreOutcome:
        outcome = StoreOutcome()
        if self._unrouted_ledger:
            self._disarm_ledger()
        faults.point("spooled")
        with self.committer.expecting() as announced:
            self._store_parts(parts, expected_study_uid, outcome, announced, access, source, arrival)
        return outcome

    def _store_parts(self, parts: list[SpooledPart], expected_study_uid: str | None, outcome: StoreOutcome,
                     announced: Expected, access: Access = FULL, source: str = "",
                     arrival: Arrival = NOWHERE) -> StoreOutcome:
        described: list[tuple[InstanceRecord, SpooledPart]] = []
        seen: set[str] = set()
        verdict: dict[str, bool] = {}  # study -> whether a restricted client may store into it
        new_studies: set[str] = set()  # new studies a restricted client stores: given its write label
        routes = self.routing.routes if self.routing is not None else None
        for part in parts:
            # a small part still in memory is parsed from there, and written to its spool
            # file (data fdatasync'ed on the descriptor that wrote it) only once valid
            data = part.data
            failure = self._check_part(part)
            if failure is not None:
                outcome.failed.append(failure)
                continue
            try:
                # (a part in memory has no file yet: a name in the spool folder stands in,
                # whose folder takes the inflated copy of a Deflated data set)
                rec = describe_instance(part.path or self.blobs.spool / "in-memory.part",
                                        bulk_threshold=self.settings.bulk_threshold,
                                        expected_study_uid=expected_study_uid,
                                        data=data if data is not None else _small_file(part))
            except InstanceError as e:
                outcome.failed.append(Failed(e.reason, e.message, e.sop_class_uid, e.sop_instance_uid))
                continue
            if rec.sop_uid in seen:
                outcome.failed.append(Failed(FailureReason.DUPLICATE_SOP_INSTANCE,
                                             "the same SOP Instance UID twice in one request",
                                             rec.sop_class_uid, rec.sop_uid))
                continue
            if data is not None:
                part.spool(self.blobs.spool, sync=True)
                failure = self._check_part(part)
                if failure is not None:
                    outcome.failed.append(Failed(failure.reason, failure.message, rec.sop_class_uid, rec.sop_uid))
                    continue
            labels = labels_in.rule_labels(routes, rec, arrival)
            if not access.filter.unrestricted and not self._may_store(rec.study_uid, access, verdict, new_studies,
                                                                      labels):
                outcome.failed.append(Failed(FailureReason.NOT_AUTHORIZED,
                                             f"not authorized to store into study {rec.study_uid}",
                                             rec.sop_class_uid, rec.sop_uid))
                continue
            if self.routing is not None and self.routing.routes.store_as:
                rec = self._store_as(rec, part, expected_study_uid)
            rec.source = source
            # labels on arrival: written by the commit that indexes the instance (Index.add)
            rec.labels = tuple(sorted(labels_in.with_write_label(labels, access, rec.study_uid in new_studies)))
            seen.add(rec.sop_uid)
            described.append((rec, part))
        # the parts that failed so far, in order; later failures name their instance
        kept = {id(p) for _, p in described}
        for failure, part in zip(outcome.failed, [p for p in parts if id(p) not in kept]):
            failure.source = part.path
        first = len(outcome.failed)
        spooled = {r.sop_uid: p.path for r, p in described}
        if described:
            uids = [r.sop_uid for r, _ in described]
            try:
                with self.blobs.locked(uids), self.index.locked(uids):
                    self._place_and_index(described, outcome, announced)
            except IndexUnavailable as e:  # before anything was placed: nothing to undo
                log.error("store refused: %s", e)
                for rec, _part in described:
                    outcome.failed.append(Failed(FailureReason.PROCESSING_FAILURE, f"not stored: {e}",
                                                 rec.sop_class_uid, rec.sop_uid))
        for failure in outcome.failed[first:]:
            failure.source = spooled.get(failure.sop_instance_uid or "")
        for part in parts:  # spool files not linked into place (place() removed the others)
            if part.path is not None:
                try:
                    part.path.unlink()
                except FileNotFoundError:
                    pass
        return outcome

    def _store_as(self, rec: InstanceRecord, part: SpooledPart, expected_study_uid: str | None) -> InstanceRecord:
        """Compress on ingest (policy/ingest.py): the first ``[[store_as]]`` rule of the
        routes file that matches the received instance names the transfer syntax it is
        stored in. Its spool file is replaced by the verified, fdatasync'ed re-encoded
        one, described again (size, pixel layout); anything short of that keeps the
        instance as received. Before the acknowledgement: see policy/ingest.py."""
        rule = self.routing.routes.store_as_for(rec)  # type: ignore[union-attr]
        if rule is None or part.path is None or rec.transfer_syntax_uid == rule.transfer_syntax:
            return rec
        if rule.when == "after_ack":  # stored as received; re-encoded later (policy/recompress.py)
            return rec
        new = ingest.compress_spooled(part.path, rule, rec.sop_uid)
        if new is None:
            return rec
        try:
            encoded = describe_instance(new, bulk_threshold=self.settings.bulk_threshold,
                                        expected_study_uid=expected_study_uid)
        except InstanceError as e:
            log.warning("store_as: instance %s kept as received: the %s copy is not valid: %s", rec.sop_uid,
                        rule.transfer_syntax, e.message)
            new.unlink(missing_ok=True)
            return rec
        part.path.unlink(missing_ok=True)
        part.path, part.synced = new, True
        return encoded

    def _may_store(self, study_uid: str, access: Access, verdict: dict[str, bool], new_studies: set[str],
                   labels: Iterable[str] = ()) -> bool:
        """Whether a client restricted to labels may store into this study: one it may see,
        or a new one when it has a write label or the labels on arrival (``labels``) let it
        see it (then in ``new_studies``: labelled by the commit that stores it). An
        instance of a study that exists and it may not see fails with 0x0124
        (PS3.7 Annex C, Refused: Not Authorized; STOW-RS answers 409 when nothing was
        stored): never merged into that study. The message says no more than "not
        authorized", for a study that exists as for a new one it may not create."""
        if study_uid not in verdict:
            visible = self.index.labels(study_uid, access.filter) is not None
            exists = visible or self.index.labels(study_uid) is not None
            verdict[study_uid] = visible or (not exists and (access.write_label is not None
                                                             or access.filter.allows(labels)))
            if not exists and verdict[study_uid]:
                new_studies.add(study_uid)
        return verdict[study_uid]

    @staticmethod
    def _check_part(part: SpooledPart) -> Failed | None:
        if part.error is not None:
            reason = (FailureReason.OUT_OF_RESOURCES if is_out_of_resources(part.error)
                      else FailureReason.PROCESSING_FAILURE)
            return Failed(reason, f"cannot write the received part: {part.error.strerror}")
        if not part.complete or (part.path is None and part.data is None):
            return Failed(FailureReason.CANNOT_UNDERSTAND, "part not closed by a multipart boundary (body cut short)")
        if not _is_dicom_part(part.content_type):
            return Failed(FailureReason.CANNOT_UNDERSTAND,
                          f"part Content-Type {part.content_type!r} is not application/dicom")
        return None

    def _same_data_set(self, spooled: Path, relpath: str) -> bool:
        """Whether a stored instance that is not byte-identical to ``spooled`` holds
        the same data set under other file meta (the same instance received through the
        other front door: :func:`.dicom.reading.same_data_set`), or the same instance in
        another transfer syntax (stored re-encoded by ``recompress`` or an after-ack
        rule, re-sent as the modality has it: :func:`.policy.ingest.same_instance_transcoded`,
        decoded, paid only by such re-sends). The stored file, its index record (pixel
        offsets) included, is kept as it is."""
        with self.blobs.local_copy(relpath) as stored:
            return same_data_set(spooled, stored) or ingest.same_instance_transcoded(spooled, stored)

    def _place_and_index(self, described: list[tuple[InstanceRecord, SpooledPart]], outcome: StoreOutcome,
                         announced: Expected | None = None) -> None:
        """Steps 2 and 3 of the module docstring, under the instances' write locks."""
        pending: list[InstanceRecord] = []
        duplicates: list[InstanceRecord] = []
        replacing: list[tuple[InstanceRecord, Path]] = []  # duplicate_policy "replace"
        dirs: set[Path] = set()
        down: StorageUnavailable | None = None
        limit = self.hard_limit  # the retention policy's [quota] hard (policy/retention.py)
        room = limit.room(self) if limit is not None else 0
        for rec, part in described:
            spooled: Path = part.path  # type: ignore[assignment]
            if limit is not None:  # refused before its file is placed: nothing to undo
                if rec.size > room and self.index.locate(rec.sop_uid) is None:  # (a duplicate adds nothing)
                    outcome.failed.append(Failed(FailureReason.OUT_OF_RESOURCES, limit.refused(rec.size, room),
                                                 rec.sop_class_uid, rec.sop_uid))
                    continue
                room -= rec.size
                limit.take(rec.size)
            if down is not None:  # the storage failed an earlier instance (after its retries): not tried
                outcome.failed.append(Failed(FailureReason.PROCESSING_FAILURE,
                                             f"not tried: the storage failed an earlier instance: {down.strerror}",
                                             rec.sop_class_uid, rec.sop_uid))
                continue
            try:
                placed = self.blobs.place(spooled, rec.path, sync_dir=False, synced=part.synced)
                if placed is Placed.NEW:
                    part.path = None  # linked into place; its spool name is gone
                else:
                    loc = self.index.locate(rec.sop_uid)
                    if loc is not None:  # compared with its current version (lifecycle/versions.py)
                        if self.blobs.same(spooled, loc.path) or self._same_data_set(spooled, loc.path):
                            duplicates.append(rec)
                            outcome.stored.append(Stored(rec.sop_class_uid, rec.sop_uid, rec.study_uid,
                                                         rec.series_uid, duplicate=True))
                        elif self.settings.duplicate_policy == "keep":  # success, the stored one kept
                            outcome.stored.append(Stored(rec.sop_class_uid, rec.sop_uid, rec.study_uid,
                                                         rec.series_uid, duplicate=True))
                        elif self.settings.duplicate_policy == "replace":  # a new version, as an update
                            replacing.append((rec, spooled))
                        else:
                            outcome.failed.append(Failed(
                                FailureReason.DUPLICATE_SOP_INSTANCE,
                                f"SOP Instance {rec.sop_uid} is already stored with different content",
                                rec.sop_class_uid, rec.sop_uid))
                        continue
                    same = self.blobs.same(spooled, rec.path)
                    if not same:  # a crash orphan (we hold the lock): never acknowledged, replace it
                        self.blobs.replace(spooled, rec.path)
                folder = self.blobs.directory(rec.path)  # None: the object store's PUT was durable
                if folder is not None:
                    dirs.add(folder)
            except OSError as e:
                if isinstance(e, StorageUnavailable):
                    down = e
                reason = FailureReason.OUT_OF_RESOURCES if is_out_of_resources(e) else FailureReason.PROCESSING_FAILURE
                outcome.failed.append(Failed(reason, f"cannot write the file: {e.strerror or e}",
                                             rec.sop_class_uid, rec.sop_uid))
                continue
            pending.append(rec)
        if duplicates:
            self._acknowledge_duplicates(duplicates, outcome)
        for rec, spooled in replacing:  # (under the instances' locks, as an update's switch)
            try:
                replace_version(self, rec, spooled)
            except UpdateError as e:
                outcome.failed.append(Failed(FailureReason.DUPLICATE_SOP_INSTANCE, e.message, rec.sop_class_uid,
                                             rec.sop_uid))
            except OSError as e:
                outcome.failed.append(Failed(FailureReason.PROCESSING_FAILURE, f"cannot write the new version: {e}",
                                             rec.sop_class_uid, rec.sop_uid))
            else:
                outcome.stored.append(Stored(rec.sop_class_uid, rec.sop_uid, rec.study_uid, rec.series_uid))
        if not pending:
            return
        faults.point("placed")
        if self.routing is not None:  # the rules are matched here, outside the index writer lock
            self.routing.plan(pending)
        try:
            added = self.committer.commit(pending, dirs, announced)
        except Exception as e:  # disk full, I/O error or database gone: nothing of it is visible
            log.error("index commit failed: %s", e)
            reason = FailureReason.OUT_OF_RESOURCES if _index_full(e) else FailureReason.PROCESSING_FAILURE
            for rec in pending:
                try:
                    self.blobs.remove(rec.path)  # never acknowledged: leave nothing behind
                except OSError as err:
                    log.error("could not remove %s after the failed commit: %s", rec.path, err)
                outcome.failed.append(Failed(reason, f"cannot commit the index: {e}", rec.sop_class_uid, rec.sop_uid))
            return
        finally:
            if self.routing is not None:
                self.routing.forget(pending)
        faults.point("indexed")
        metrics.STORED.inc(sum(1 for new in added if new))  # (Index.add may answer objects, not bools)
        if self.routing is not None:
            self.routing.committed()
        for rec, new in zip(pending, added):
            if isinstance(new, Refused):  # its file was placed under its own UIDs: no one else's
                try:
                    self.blobs.remove(rec.path)
                except OSError as err:
                    log.error("could not remove %s after the index refused it: %s", rec.path, err)
                outcome.failed.append(Failed(new.reason, new.message, rec.sop_class_uid, rec.sop_uid))
                continue
            outcome.stored.append(Stored(rec.sop_class_uid, rec.sop_uid, rec.study_uid, rec.series_uid,
                                         duplicate=not new))

    def _acknowledge_duplicates(self, records: list[InstanceRecord], outcome: StoreOutcome) -> None:
        """Identical duplicates are a success once every forward their rules name is
        owed (routing: a forward never written, e.g. of an orphan that ``check
        --repair`` indexed without the routes, is owed now); else they fail."""
        if self.routing is None:
            return
        try:
            self.routing.owe_missing(records)
        except Exception as e:  # the outbox cannot be written: not acknowledged
            log.error("duplicate store: the outbox cannot be written: %s", e)
            sops = {r.sop_uid for r in records}
            outcome.stored = [x for x in outcome.stored if not (x.duplicate and x.sop_instance_uid in sops)]
            outcome.failed += [Failed(FailureReason.PROCESSING_FAILURE, f"cannot record the instance's forwards: {e}",
                                      rec.sop_class_uid, rec.sop_uid) for rec in records]
            return
        self.routing.committed()

    # --- DELETE -------------------------------------------------------------------------

    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> int:
        """Remove index rows (one durable commit: readers never see half of it),
        then the files. Returns the number of instances removed."""
        with self._tracked():
            with self.committer.writer():
                try:
                    paths = self.index.delete(study_uid, series_uid, sop_uid)
                except Exception as e:
                    if not _disk_full(e):
                        raise
                    if not self.blobs.release_reserve():  # see BlobStore.reserve
                        raise DiskFull(f"the index cannot record the delete: {e}") from e
                    log.warning("disk full: the reserve was released so that a DELETE can free space")
                    try:
                        paths = self.index.delete(study_uid, series_uid, sop_uid)
                    except Exception as e2:
                        if _disk_full(e2):
                            raise DiskFull(f"the index cannot record the delete: {e2}") from e2
                        raise
            if self.routing is not None:  # webhooks owed the deletes: wake the forwarder
                self.routing.committed()
            self.remove_files(paths)
            self.blobs.ensure_reserve()
            return len(paths)

    def remove_files(self, paths: list[str]) -> None:
        """Remove the files of instances whose rows are gone (DELETE, purge of rejected
        instances), with the instance's kept versions (lifecycle/versions.py), but not one
        stored again meanwhile."""
        uids = {Path(split_version(rel)[0]).stem: rel for rel in paths}
        with self.blobs.locked(uids), self.index.locked(uids):
            for uid, rel in uids.items():
                if self.index.locate(uid) is not None:
                    continue  # stored again since the rows were deleted: keep its file
                base = split_version(rel)[0]
                try:  # its kept versions go with it
                    for old in [base] + [v for v, _ in kept_files(self.blobs, base) if v != rel]:
                        if old != rel:
                            self.blobs.remove(old)
                    self.blobs.remove(rel)
                except OSError as e:  # left for `check` to collect
                    log.warning("could not remove %s: %s", rel, e)


class DiskFull(Exception):
    """The index cannot commit a DELETE for lack of space, even with the reserve
    given up (HTTP 507)."""


def _disk_full(err: BaseException) -> bool:
    if isinstance(err, OSError):
        return is_out_of_resources(err)
    return "disk is full" in str(err)  # sqlite3.OperationalError (SQLITE_FULL) has no errno


def _index_full(err: BaseException) -> bool:
    """An index commit that failed for lack of room or write access (STOW-RS FailureReason and
    C-STORE status 0xA700, PS3.4 B.2.3 "Refused: Out of Resources"): a full disk or
    read-only storage (OSError), SQLite's SQLITE_FULL or SQLITE_READONLY, PostgreSQL's
    SQLSTATE 53100 disk_full. Anything else, a database that cannot be reached above all
    (:class:`IndexUnavailable`, a connection lost mid-commit), is a processing failure
    (0x0110, PS3.7 Annex C): unavailable is not full, and the instance may be sent again."""
    if isinstance(err, IndexUnavailable):
        return False
    if getattr(err, "sqlstate", None) == "53100":  # psycopg.errors.DiskFull
        return True
    return _disk_full(err) or "readonly database" in str(err)


@contextmanager
def _flocked(path: Path):
    """An exclusive ``flock`` on ``path`` (across worker processes)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def retrieve_url(base_url: str, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> str:
    """RetrieveURL of a study, series or instance (PS3.18 §10.4)."""
    if sop_uid is not None and series_uid is not None:
        return base_url + instance_url(study_uid, series_uid, sop_uid)
    if series_uid is not None:
        return f"{base_url}/studies/{study_uid}/series/{series_uid}"
    return f"{base_url}/studies/{study_uid}"

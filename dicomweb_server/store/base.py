"""The index interface: what the archive needs from a metadata index, whatever
keeps it (Python structures or SQLite). One contract test suite runs against
every implementation (tests/store/test_index_contract.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.instance import InstanceRecord
from ..dicom.matching import Query
from ..dicom.mpps import Performed, sps_ids
from ..dicom.patient import PatientIdentity
from ..dicom.status import FailureReason
from ..dicom.worklist import Entry as WorklistEntry
from .changes import Change
from . import arrivals as arrivals_table
from . import shares as shares_table
from . import mpps as mpps_table
from . import worklist as worklist_table
from .rejections import Rejection


@dataclass(frozen=True, slots=True)
class InstanceLocation:
    """Where an instance lives and how to read its pixels."""

    study_uid: str
    series_uid: str
    sop_uid: str
    sop_class_uid: str
    transfer_syntax_uid: str
    path: str  # relative to the blob root
    size: int
    pixel: dict | None  # see dicom.instance.InstanceRecord.pixel


@dataclass(frozen=True, slots=True)
class IndexCounts:
    """What the index holds, for the landing page (api/landing.py)."""

    studies: int
    series: int
    instances: int
    stored_bytes: int = 0  # the sizes of the stored instances' files or objects, summed


@dataclass(frozen=True, slots=True)
class Refused:
    """Index.add's answer for a record the index cannot hold: its place in the
    study/series hierarchy contradicts what is indexed (falsy, like "not added")."""

    reason: FailureReason
    message: str

    def __bool__(self) -> bool:
        return False


def hierarchy_conflict(record: InstanceRecord, sop_place: tuple[str, str] | None,
                       series_study: str | None, study_patient: PatientIdentity | None
                       ) -> Refused | None:
    """The rule every index enforces inside its commit: a study belongs to one patient,
    a series to one study, an instance to one series (PS3.3 §A.1.2; PS3.4 §C.6.1, the
    Patient Root information model).

    ``sop_place`` is the (study, series) under which ``record``'s SOP Instance UID is
    already indexed, ``series_study`` the study its Series Instance UID is indexed
    under, ``study_patient`` the patient its study is indexed under (what the study's
    record says: dicom/patient.py); each None when new. A series of another study, or
    a new instance of a study of another patient: 0xA900 (the data set does not match
    what the archive holds for its UIDs); a SOP Instance UID already stored in another
    series or study: 0x0111 (a duplicate SOP Instance with other content). An instance
    already indexed in its own place is not a conflict (the caller answers "already
    indexed"), whoever its study's patient is.
    """
    if sop_place is not None and sop_place != (record.study_uid, record.series_uid):
        return Refused(FailureReason.DUPLICATE_SOP_INSTANCE,
                       f"SOP Instance {record.sop_uid} is already stored in study {sop_place[0]}, "
                       f"series {sop_place[1]}")
    if series_study is not None and series_study != record.study_uid:
        return Refused(FailureReason.DATASET_MISMATCH,
                       f"Series {record.series_uid} belongs to study {series_study}, "
                       f"not to this instance's study {record.study_uid}")
    if sop_place is None and study_patient is not None and study_patient != record.patient:
        return Refused(FailureReason.DATASET_MISMATCH,
                       f"Study {record.study_uid} belongs to patient {study_patient}, "
                       f"not to this instance's patient {record.patient}")
    return None


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One QIDO-RS match: the stored JSON of its levels and the computed attributes.

    ``study_json``/``series_json``/``instance_json`` are DICOM JSON objects as
    bytes (``series_json`` None for study searches, ``instance_json`` None above
    the instance level); ``computed`` maps keyword -> value for
    ModalitiesInStudy, SOPClassesInStudy, NumberOfStudyRelatedSeries,
    NumberOfStudyRelatedInstances, NumberOfSeriesRelatedInstances (those that apply).
    """

    study_uid: str
    series_uid: str | None
    sop_uid: str | None
    study_json: bytes
    series_json: bytes | None
    instance_json: bytes | None
    computed: dict[str, object]


class ReplaceRefused(Exception):
    """Index.replace refused a record (its Refused in ``refused``): nothing changed."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.message)
        self.refused = refused


class IndexUnavailable(Exception):
    """The index's database cannot be reached now (a PostgreSQL server down or
    restarting): a temporary condition, answered 503 with Retry-After (a STOW-RS
    fails its instances, nothing acknowledged)."""


class Index(ABC):
    """Metadata index of the archive. Implementations are safe to call from
    worker threads; ``add`` and ``delete`` are durable when they return."""

    @abstractmethod
    def add(self, records: list[InstanceRecord]) -> list[bool | Refused]:
        """Index new instances in one durable commit. Returns, per record, True
        when it was added, False when that SOP Instance UID was already indexed in
        the same series (the existing row is kept unchanged), and :class:`Refused`
        when the record contradicts the hierarchy, its study's patient included
        (:func:`hierarchy_conflict`, checked inside the commit, against the records
        before it too).

        ``action="restore"`` (lifecycle/reject.py: rejected instances shown again)
        indexes a rejected instance (a ``create`` files it under its rejection) and
        forgets its rejection row in the same commit, unless it is refused: a refused
        one keeps its row exactly as it was (its file's path, reason, time)."""

    @abstractmethod
    def locate(self, sop_uid: str, allowed: Filter = UNRESTRICTED) -> InstanceLocation | None:
        """The instance with this SOP Instance UID, or None (None too when its study is
        not one ``allowed`` lets through: access/filter.py, applied in the look-up)."""

    @abstractmethod
    def instances(self, study_uid: str, series_uid: str | None = None,
                  allowed: Filter = UNRESTRICTED) -> list[InstanceLocation]:
        """Instances of a study (or one of its series) in a stable order:
        series in arrival order, then instances in arrival order (none when the
        study is not one ``allowed`` lets through)."""

    @abstractmethod
    def metadata(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None,
                 allowed: Filter = UNRESTRICTED) -> list[bytes]:
        """Stored DICOM JSON of the instances of a study, series or one instance
        (empty list when nothing matches, or the study is not allowed), in the order
        of :meth:`instances`."""

    @abstractmethod
    def search(self, query: Query, allowed: Filter = UNRESTRICTED) -> list[SearchHit]:
        """QIDO-RS matches of ``query`` in a stable order (arrival order of the
        entity searched), after ``offset``, at most ``limit`` (PS3.18 §10.6),
        among the studies ``allowed`` lets through (the filter is part of the
        query: the offset and the limit count allowed matches only).

        The study's (series') record, for matching and returning, is that of its
        earliest received instance still stored; computed attributes count only
        instances still stored."""

    @abstractmethod
    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None
               ) -> list[str]:
        """Remove the rows of a study, series or instance in one durable commit;
        returns the relative paths of the files the caller must now remove."""

    def replace(self, records: list[InstanceRecord], study_uid: str, series_uid: str | None = None,
                sop_uid: str | None = None, action: str = "update") -> None:
        """Switch the instances of a study, series or instance to new versions in ONE
        durable transaction (lifecycle/update.py): the rows of the scope are replaced by
        ``records`` (the same SOP Instance UIDs, new files), the change log gets one
        ``action`` row (update | restore) per instance, earlier rows ``replaced``. Readers
        see all old or all new. Raises :class:`ReplaceRefused` (nothing changed) when a
        record contradicts the hierarchy (a study of another patient's...)."""
        raise NotImplementedError

    def refile(self, record: InstanceRecord, old_path: str) -> bool:
        """Point one instance's row at another file holding the same data set in another
        encoding (policy/recompress.py: a lossless re-encoding is the same SOP Instance,
        PS3.5 §10), in ONE durable commit, if the row still names ``old_path``: its file,
        size, transfer syntax, pixel layout and stored metadata become ``record``'s. No
        change-log row (the data set did not change) and no hook runs. False, nothing
        changed, when the row is gone (deleted, rejected) or names another file."""
        raise NotImplementedError

    def history(self, sop_uid: str) -> list[Change]:
        """The change-log rows of one instance, in Sequence order."""
        raise NotImplementedError

    @abstractmethod
    def count(self) -> int:
        """Number of indexed instances."""

    def counts(self, allowed: Filter = UNRESTRICTED) -> IndexCounts:
        """Numbers of studies, series and instances and the bytes of the instances, from
        the index alone and cheaply (no scan of the instances' rows: their sizes are
        summed from an index of the size column, or a counter). Restricted by ``allowed``:
        those of the allowed studies (their study rows' counts; the sizes of their
        instances summed)."""
        raise NotImplementedError

    @abstractmethod
    def paths(self) -> Iterator[tuple[str, str]]:
        """(sop_uid, relative path) of every indexed instance (for ``check``)."""

    def locked(self, sop_uids: Iterable[str]) -> AbstractContextManager:
        """Exclusive right to place the files of these instances across the nodes
        that share this index. One machine needs none beyond the blob store's
        ``flock`` stripes; a shared index (store/postgresql.py) takes its locks."""
        return nullcontext()

    # --- study labels (access/filter.py) -------------------------------------------------

    def labels(self, study_uid: str, allowed: Filter = UNRESTRICTED) -> list[str] | None:
        """The labels of a study, sorted; None when the study is not indexed (or not
        allowed: the same answer)."""
        raise NotImplementedError

    def set_label(self, study_uid: str, label: str, present: bool = True,
                  allowed: Filter = UNRESTRICTED) -> bool | None:
        """Put (``present``) or take away a label of a study, durably. None when the study
        is not indexed or not allowed; else whether anything changed. Labels are kept by
        StudyInstanceUID: an update or a rejection keeps them, a DELETE of the whole
        study drops them."""
        raise NotImplementedError

    def all_labels(self, allowed: Filter = UNRESTRICTED) -> dict[str, int]:
        """Every label carried by an allowed study -> how many allowed studies carry it."""
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - default no-op
        """Release resources."""

    # --- rejected instances (store/rejections.py, lifecycle/reject.py) -----------------

    def reject(self, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        """Hide the instances (study, series, SOP Instance UID) in one durable commit:
        their rows leave the searchable tables for the rejection table (those not stored
        yet are remembered), the study/series computed attributes are recomputed, a
        ``reject`` change-log row is appended per stored instance. Returns how many
        stored instances were hidden now."""
        raise NotImplementedError

    def reject_in(self, con: object, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        """:meth:`reject` inside a write hook's transaction ``con`` (an :meth:`add`'s:
        lifecycle/reject.py applies a rejection note in the commit that stores it).
        An index without a transaction (``con`` None: the in-memory index, whose hooks
        run under its lock before the add's change-log rows) commits it on its own."""
        return self.reject(refs, code, now)

    def rejections(self, study_uid: str | None = None, series_uid: str | None = None,
                   before: float | None = None) -> list[Rejection]:
        """The rejected instances (of a study or series; rejected before ``before``)."""
        raise NotImplementedError

    def unreject(self, rows: list[Rejection]) -> None:
        """Forget these rejections (of instances never stored: a restore has nothing to
        show again). A stored one is shown again by :meth:`add` with ``action="restore"``,
        which forgets its row in its own commit."""
        raise NotImplementedError

    def purge(self, rows: list[Rejection]) -> list[Rejection]:
        """Forget these rejections and append a ``delete`` change-log row for each stored
        one, in one durable commit; returns those still rejected until then (not restored
        nor purged meanwhile): the caller removes their files."""
        raise NotImplementedError

    # --- the modality worklist (store/worklist.py, dicom/worklist.py) ---------------------

    def _table_reading(self) -> AbstractContextManager:
        """An :data:`changes.Execute` on the index's side tables (the worklist, the share
        links), for reads."""
        raise NotImplementedError

    def _table_writing(self, keys: list[str]) -> AbstractContextManager:
        """An :data:`changes.Execute` on the index's side tables in a durable write
        transaction (``keys``: what it writes, for the nodes' locks of PostgreSQL)."""
        raise NotImplementedError

    def put_worklist(self, entries: list[WorklistEntry]) -> None:
        """Add worklist entries (replacing those with the same Scheduled Procedure Step ID),
        in one durable commit."""
        with self._table_writing([f"worklist:{e.sps_id}" for e in entries]) as x:
            worklist_table.put(x, entries)

    def worklist(self, prefilter: dict[str, tuple]) -> list[dict]:
        """The entries (DICOM JSON) the prefilter lets through (dicom/worklist.py ``prefilter``;
        the caller matches every key), oldest first."""
        with self._table_reading() as x:
            return worklist_table.select(x, prefilter)

    def worklist_entry(self, sps_id: str) -> dict | None:
        with self._table_reading() as x:
            return worklist_table.get(x, sps_id)

    def delete_worklist(self, sps_id: str) -> bool:
        """Remove an entry; False when there was none."""
        with self._table_writing([f"worklist:{sps_id}"]) as x:
            return worklist_table.drop(x, sps_id)

    # --- modality performed procedure steps (store/mpps.py, dicom/mpps.py) --------------

    def create_mpps(self, sop_uid: str, requester: str, attributes: dict, now: float) -> Performed:
        """An N-CREATE (DICOM JSON ``attributes``), its worklist entries marked, in one durable
        commit; :class:`dicom.mpps.MppsError` when refused (nothing written then)."""
        keys = [f"mpps:{sop_uid}", *(f"worklist:{s}" for s in sps_ids(attributes))]
        with self._table_writing(keys) as x:
            return mpps_table.create(x, sop_uid, requester, attributes, now)

    def modify_mpps(self, sop_uid: str, requester: str, changes: dict, now: float) -> Performed:
        """An N-SET (DICOM JSON ``changes``), its worklist entries marked and, once completed,
        its instances declared (store/arrivals.py), in one durable commit; :class:`dicom.mpps.MppsError`
        when refused (nothing written then)."""
        stored = self.mpps(sop_uid) or {}
        keys = [f"mpps:{sop_uid}", *(f"worklist:{s}" for s in sps_ids(stored))]
        with self._table_writing(keys) as x:
            return mpps_table.modify(x, sop_uid, requester, changes, now)

    def mpps(self, sop_uid: str) -> dict | None:
        """A performed procedure step (DICOM JSON); None when there is none."""
        with self._table_reading() as x:
            return mpps_table.get(x, sop_uid)

    def mpps_among(self, sop_uids: list[str]) -> set[str]:
        """Those of these UIDs that are performed procedure steps."""
        with self._table_reading() as x:
            return mpps_table.known(x, sop_uids)

    # --- what arrived, and what senders declared (store/arrivals.py) ---------------------

    def arrived(self, study_uid: str, allowed: Filter = UNRESTRICTED) -> "list[arrivals_table.Arrived] | None":
        """The study's stored instances grouped by series (in arrival order) and source, each
        group with its count and the sizes of its files summed; None when the study is not
        indexed (or not one ``allowed`` lets through: the same answer)."""
        raise NotImplementedError

    def declare(self, transaction_uid: str, requester: str, refs: list[tuple[str, str]], now: float) -> None:
        """Keep, durably, the instances (SOP Class, SOP Instance UID) a Storage Commitment
        request named (dimse/commitment.py)."""
        with self._table_writing([f"commitment:{transaction_uid}"]) as x:
            arrivals_table.declare(x, transaction_uid, requester, refs, now)

    def declarations(self, sop_uids: list[str]) -> "list[arrivals_table.Declared]":
        """The instances named by the Storage Commitment requests that named any of these."""
        with self._table_reading() as x:
            return arrivals_table.declarations(x, sop_uids)

    # --- share links (store/shares.py, api/shares.py) ------------------------------------

    def put_share(self, share: "shares_table.Share") -> None:
        """Keep a new share link, durably."""
        with self._table_writing([f"share:{share.id}"]) as x:
            shares_table.put(x, share)

    def share(self, share_id: str | None = None, token_sha256: str | None = None) -> "shares_table.Share | None":
        """The link by its id or by its token's SHA-256 (hex); None when there is none."""
        with self._table_reading() as x:
            return shares_table.by_id(x, share_id) if share_id is not None else shares_table.by_token(x, token_sha256)

    def shares(self) -> "list[shares_table.Share]":
        """Every link, revoked and expired ones too, newest first."""
        with self._table_reading() as x:
            return shares_table.every(x)

    def revoke_share(self, share_id: str) -> bool:
        """Revoke a link, durably; False when there is none by that id."""
        with self._table_writing([f"share:{share_id}"]) as x:
            return shares_table.revoke(x, share_id)

    # --- write hooks (routing's outbox) -------------------------------------------------

    def add_write_hook(self, hook: "WriteHook") -> None:
        """Run ``hook(con, records, added)`` inside every :meth:`add`, before it
        commits: ``con`` is the index's connection in its open transaction
        (sqlite3 or psycopg; None for an index without one), ``added`` says
        which records are new. An exception
        from the hook fails (rolls back) the whole add."""
        self._write_hooks = (*getattr(self, "_write_hooks", ()), hook)

    def _run_write_hooks(self, con: object, records: list[InstanceRecord], added: list[bool]) -> None:
        for hook in getattr(self, "_write_hooks", ()):
            hook(con, records, added)

    def add_replace_hook(self, hook: "ReplaceHook") -> None:
        """Run ``hook(con, records, action)`` inside every :meth:`replace`, before it
        commits, with the new versions it makes current (``action``: update | restore):
        ``con`` is the connection holding the change log in that transaction (as for
        :meth:`add_change_hook`). An exception from the hook fails the whole replace."""
        self._replace_hooks = (*getattr(self, "_replace_hooks", ()), hook)

    def _run_replace_hooks(self, con: object, records: list[InstanceRecord], action: str) -> None:
        if records:
            for hook in getattr(self, "_replace_hooks", ()):
                hook(con, records, action)

    # --- the change log (store/changes.py) ----------------------------------------------

    def add_change_hook(self, hook: "ChangeHook") -> None:
        """Run ``hook(con, changes)`` inside every transaction that appends to the change
        log (an add, a delete), after the rows are appended and before it commits:
        ``con`` is the connection holding the change log in that transaction (the
        index's; the in-memory index's journal, a sqlite3 connection). An exception
        from the hook fails (rolls back) the whole change."""
        self._change_hooks = (*getattr(self, "_change_hooks", ()), hook)

    def _run_change_hooks(self, con: object, changes: list[Change]) -> None:
        if changes:
            for hook in getattr(self, "_change_hooks", ()):
                hook(con, changes)

    def changes(self, after: int = 0, limit: int = 10, start: float | None = None, end: float | None = None,
                skip: int = 0, allowed: Filter = UNRESTRICTED) -> list[Change]:
        """Change-log rows with Sequence > ``after`` and ``start`` <= time < ``end``
        (seconds since the epoch), in Sequence order, ``skip`` left out, at most ``limit``.
        A reader never meets a row with a lower Sequence than one it has already seen."""
        raise NotImplementedError

    def latest_change(self, allowed: Filter = UNRESTRICTED) -> Change | None:
        """The change-log row with the highest Sequence (None when empty); both of the
        studies ``allowed`` lets through, by their labels now."""
        raise NotImplementedError

    def received(self, study_uid: str | None = None) -> dict[str, tuple[float, float]]:
        """Study -> (first, latest) arrival of its stored instances' current versions,
        seconds since the epoch, from the change log (:func:`store.changes.received`);
        every study, or the one named."""
        raise NotImplementedError


WriteHook = Callable[[object, list[InstanceRecord], list[bool]], None]
ChangeHook = Callable[[object, list[Change]], None]
ReplaceHook = Callable[[object, list[InstanceRecord], str], None]

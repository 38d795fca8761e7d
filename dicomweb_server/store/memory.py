"""In-memory metadata index (``--index memory``): Python objects with
``__slots__``, rebuilt from the data folder at start-up, so nothing is lost on
restart. It lives in one process (the server refuses more than one worker).

The change log (store/changes.py) is a SQLite table: in the journal file given
(``data/outbox.sqlite``, beside routing's outbox, so that a webhook's outbox rows
commit with the change they carry), or in memory when none is given (tests). Its rows
are committed (``synchronous=FULL``) before an add returns and before a delete
changes the index; at start-up the re-indexing of every file logs only the instances
the log does not hold as current (:meth:`MemoryIndex.reconcile_changes` logs the
deletes of those gone meanwhile).

Kept lean: per instance, the index holds its column values, location and the
stored DICOM JSON as zlib-compressed bytes (no per-element Python objects); see
docs/performance.md for the measured bytes per instance.
"""

from __future__ import annotations

import itertools
import sqlite3
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path

import orjson

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.attributes import SEQUENCES_OF, STORED, Kind
from ..dicom.instance import InstanceRecord, dumps
from ..dicom.matching import Query, level_record, match_value
from ..dicom.patient import PatientIdentity, patient_identity
from . import arrivals as arrivals_table
from . import changes as changelog
from . import labels as study_labels
from . import rejections
from . import shares as shares_table
from . import mpps as mpps_table
from . import worklist as worklist_table
from .base import Index, IndexCounts, InstanceLocation, Refused, ReplaceRefused, SearchHit, hierarchy_conflict
from .connections import immediate

_STUDY_COLS = tuple(a.keyword for a in STORED["study"])
_SERIES_COLS = tuple(a.keyword for a in STORED["series"])
_INSTANCE_COLS = tuple(a.keyword for a in STORED["instance"])
_COL_INDEX = {
    "study": {k: i for i, k in enumerate(_STUDY_COLS)},
    "series": {k: i for i, k in enumerate(_SERIES_COLS)},
    "instance": {k: i for i, k in enumerate(_INSTANCE_COLS)},
}


def _seqs(values: dict[str, object], level: str) -> dict[str, object] | None:
    """The items of the level's matchable sequences (None when it has none: the common case)."""
    return {a.keyword: values[a.keyword] for a in SEQUENCES_OF[level] if values.get(a.keyword)} or None  # type: ignore[index]


class _Study:
    __slots__ = ("uid", "cols", "seqs", "json", "patient", "series")

    def __init__(self, uid: str, cols: tuple, seqs: dict | None, json: bytes, patient: PatientIdentity) -> None:
        self.uid, self.cols, self.seqs, self.json = uid, cols, seqs, json
        self.patient = patient  # what its record says (dicom/patient.py)
        self.series: dict[str, _Series] = {}

    def modalities(self) -> list[str]:
        """Every value of every series' Modality (a multi-valued one counts each)."""
        mods = (s.cols[_COL_INDEX["series"]["Modality"]] for s in self.series.values())
        return sorted({v for m in mods if m for v in m.split("\\") if v})

    def first(self) -> _Instance:
        """The earliest received instance still stored: it speaks for the study."""
        return min((next(iter(se.instances.values())) for se in self.series.values()), key=lambda i: i.seq)

    def sop_classes(self) -> list[str]:
        return sorted({i.sop_class for s in self.series.values() for i in s.instances.values()})

    def n_instances(self) -> int:
        return sum(len(s.instances) for s in self.series.values())


class _Series:
    __slots__ = ("uid", "study", "cols", "seqs", "json", "instances")

    def __init__(self, uid: str, study: _Study, cols: tuple, seqs: dict | None, json: bytes) -> None:
        self.uid, self.study, self.cols, self.seqs, self.json = uid, study, cols, seqs, json
        self.instances: dict[str, _Instance] = {}


class _Instance:
    __slots__ = ("uid", "seq", "series", "cols", "seqs", "sop_class", "ts", "path", "size", "pixel", "metadata",
                 "source")

    def __init__(self, r: InstanceRecord, series: _Series, seq: int, source: str) -> None:
        self.uid = r.sop_uid
        self.seq = seq  # arrival order across the whole index
        self.series = series
        self.cols = tuple(r.instance[c] for c in _INSTANCE_COLS)
        self.seqs = _seqs(r.instance, "instance")
        self.sop_class = r.sop_class_uid
        self.ts = r.transfer_syntax_uid
        self.path = r.path
        self.size = r.size
        self.pixel = r.pixel
        self.metadata = zlib.compress(r.metadata, 1)  # ~4x smaller; 10-30 µs to inflate on read
        # one string object per distinct source (an AE title, a user): a pointer per instance
        self.source = sys.intern(source)

    @property
    def json(self) -> bytes:
        return zlib.decompress(self.metadata)

    def location(self) -> InstanceLocation:
        se = self.series
        return InstanceLocation(se.study.uid, se.uid, self.uid, self.sop_class, self.ts, self.path,
                                self.size, self.pixel)


class MemoryIndex(Index):
    """Everything in dicts keyed by UID; insertion order is the stable order."""

    def __init__(self, journal: Path | None = None) -> None:
        self._lock = threading.RLock()
        self._studies: dict[str, _Study] = {}
        self._series: dict[str, _Series] = {}
        self._instances: dict[str, _Instance] = {}
        self._seq = itertools.count()
        self._bytes = 0  # sizes of the indexed instances, summed (counts())
        # the change log: one connection, used under self._lock
        if journal is None:
            self._journal = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            self._journal = sqlite3.connect(journal, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._journal.execute("PRAGMA journal_mode=WAL")
            self._journal.execute("PRAGMA synchronous=FULL")
        self._journal.executescript(changelog.sqlite_schema() + rejections.sqlite_schema()
                                    + worklist_table.sqlite_schema()
                                    + study_labels.sqlite_schema() + shares_table.sqlite_schema()
                                    + arrivals_table.journal_schema() + mpps_table.sqlite_schema())
        # study labels (store/labels.py): their rows in the journal, a set per study here
        self._labels: dict[str, set[str]] = {}
        for study_uid, label in study_labels.every(self._x):
            self._labels.setdefault(study_uid, set()).add(label)
        # the rejected instances (store/rejections.py): their rows in the journal, their UIDs here
        self._rejected = {uid for (uid,) in self._x("SELECT SOPInstanceUID FROM rejection")}
        self._rejecting: list | None = None  # inside add(): the rejections its hooks ask for (reject_in)

    def close(self) -> None:
        self._journal.close()

    def _x(self, sql: str, params: list | tuple = ()):
        return self._journal.execute(sql, params)

    def _log(self, action: str, instances: list[tuple[str, str, str]], also=None) -> None:
        """Append the change-log rows and run the change hooks, in one durable transaction
        (with ``also(execute)``'s statements, when given)."""
        if not instances and also is None:
            return
        with immediate(self._journal) as con:  # (the caller holds self._lock)
            if also is not None:
                also(self._x)
            self._run_change_hooks(con, changelog.append(self._x, changelog.now(), action, instances))

    @contextmanager
    def _table_reading(self) -> Iterator:
        with self._lock:
            yield self._x

    @contextmanager
    def _table_writing(self, keys: list[str]) -> Iterator:
        """(the worklist and the share links live in the journal: kept across restarts with a journal file)"""
        with self._lock, immediate(self._journal):
            yield self._x

    def reconcile_changes(self) -> int:
        """After the start-up indexing: a delete for every instance the change log holds
        as current that is no longer indexed (its file went while the archive was down).
        Returns how many."""
        with self._lock:
            gone = [t for t in changelog.current(self._x) if t[2] not in self._instances]
            self._log("delete", gone)
            return len(gone)

    def changes(self, after: int = 0, limit: int = 10, start: float | None = None, end: float | None = None,
                skip: int = 0, allowed: Filter = UNRESTRICTED) -> list[changelog.Change]:
        with self._lock:  # (the labels are in the journal too: the filter is part of the query)
            return changelog.read(self._x, after, limit, start, end, skip, allowed)

    def latest_change(self, allowed: Filter = UNRESTRICTED) -> changelog.Change | None:
        with self._lock:
            return changelog.latest(self._x, allowed)

    def received(self, study_uid: str | None = None) -> dict[str, tuple[float, float]]:
        with self._lock:
            return changelog.received(self._x, study_uid)

    def history(self, sop_uid: str) -> list[changelog.Change]:
        with self._lock:
            return changelog.history(self._x, sop_uid)

    def last_change(self, sop_uid: str) -> tuple[str, str, int] | None:
        """(action, state, version) of the instance's latest change-log row (start-up:
        which file of a versioned instance is current, Archive.rebuild)."""
        with self._lock:
            return changelog.last(self._x, sop_uid)

    def replace(self, records: list[InstanceRecord], study_uid: str, series_uid: str | None = None,
                sop_uid: str | None = None, action: str = "update") -> None:
        """Index.replace: the change log's rows first (durable: they decide at start-up
        which file of each instance is current), then the switch, under the lock (readers
        wait for it: they never see a mix)."""
        with self._lock:
            study = self._studies.get(study_uid)
            old_patient = study.patient if study is not None else None
            old = [i for i in (self._iter_instances(study, series_uid) if study is not None else [])
                   if sop_uid is None or i.uid == sop_uid]
            scope = {i.uid for i in old}
            # a rejected instance (rejected after the update read the study) stays rejected:
            # its new version's file is left as a kept version, never indexed
            records = [r for r in records if r.sop_uid not in self._rejected]
            others = study is not None and any(i.uid not in scope for i in self._iter_instances(study, None))
            for r in records:  # the hierarchy rule, against what stays outside the scope
                inst = self._instances.get(r.sop_uid)
                se = self._series.get(r.series_uid)
                refused = hierarchy_conflict(
                    r, (inst.series.study.uid, inst.series.uid) if inst is not None and r.sop_uid not in scope
                    else None, se.study.uid if se is not None else None,
                    old_patient if others else None)
                if refused is not None:
                    raise ReplaceRefused(refused)
            with immediate(self._journal) as con:
                self._run_change_hooks(con, changelog.append(
                    self._x, changelog.now(), action, [(r.study_uid, r.series_uid, r.sop_uid) for r in records]))
                self._run_replace_hooks(con, records, action)  # routing's forwards: the same transaction
            self._remove(study_uid, series_uid, sop_uid, log=None)
            self._insert(records, action)

    def refile(self, record: InstanceRecord, old_path: str) -> bool:
        """Index.refile: nothing to write (the files are the index: at start-up the file at
        the instance's name is read, lifecycle/versions.py side files are skipped)."""
        with self._lock:
            inst = self._instances.get(record.sop_uid)
            if inst is None or inst.path != old_path:
                return False
            self._bytes += record.size - inst.size
            inst.ts, inst.path, inst.size, inst.pixel = (record.transfer_syntax_uid, record.path, record.size,
                                                         record.pixel)
            inst.metadata = zlib.compress(record.metadata, 1)
            return True

    def _insert(self, records: list[InstanceRecord], action: str = "create") -> list[bool | Refused]:
        """The in-memory part of :meth:`add` (under the lock)."""
        out: list[bool | Refused] = []
        for r in records:
            if action == "create" and r.sop_uid in self._rejected:
                # rejected before it arrived (IOCM), or at start-up: filed with its rejection
                rejections.arrived(self._x, r.sop_uid, r.path)
                out.append(False)
                continue
            old = self._instances.get(r.sop_uid)
            old_series = self._series.get(r.series_uid)
            old_study = self._studies.get(r.study_uid)
            refused = hierarchy_conflict(
                r, (old.series.study.uid, old.series.uid) if old is not None else None,
                old_series.study.uid if old_series is not None else None,
                old_study.patient if old_study is not None else None)
            if refused is not None or old is not None:
                out.append(refused if refused is not None else False)
                continue
            study = old_study
            if study is None:
                study = self._studies[r.study_uid] = _Study(
                    r.study_uid, tuple(r.study[c] for c in _STUDY_COLS), _seqs(r.study, "study"), r.study_json,
                    r.patient)
            series = self._series.get(r.series_uid)
            if series is None:
                series = self._series[r.series_uid] = _Series(
                    r.series_uid, study, tuple(r.series[c] for c in _SERIES_COLS), _seqs(r.series, "series"),
                    r.series_json)
                study.series[r.series_uid] = series
            # a restart, an update's new version or a restore: the source kept in the journal
            inst = _Instance(r, series, next(self._seq), r.source or arrivals_table.kept_source(self._x, r.sop_uid))
            series.instances[r.sop_uid] = inst
            self._instances[r.sop_uid] = inst
            self._bytes += r.size
            out.append(True)
        return out

    def add(self, records: list[InstanceRecord], action: str = "create") -> list[bool | Refused]:
        with self._lock:
            out = self._insert(records, action)
            self._rejecting = []  # the rejections the write hooks ask for (reject_in)
            try:  # routing's outbox and the change log (on disk): durable before the answer, or
                # nothing of this add stays
                self._run_write_hooks(None, records, out)
                sources = [(r.sop_uid, r.source) for r, new in zip(records, out) if new is True and r.source]
                labelled = sorted({(r.study_uid, label) for r, new in zip(records, out) if new is True
                                   for label in r.labels})  # labels on arrival: in the same transaction
                # a restore: the rejection rows of those shown again go in the same transaction (a
                # refused one keeps its row as it was: Index.add)
                shown = [r.sop_uid for r, new in zip(records, out)
                         if action == "restore" and not isinstance(new, Refused) and r.sop_uid in self._rejected]

                def also(x) -> None:
                    if sources:
                        arrivals_table.keep_sources(x, sources)
                    rejections.forget(x, shown)

                hide = self._log_add(action, [(r.study_uid, r.series_uid, r.sop_uid) for r, new in zip(records, out)
                                              if new is True], self._rejecting,
                                     also if sources or shown else None, labelled)
                self._rejected.difference_update(shown)
            except BaseException:
                for r, new in zip(records, out):
                    if new is True:
                        self._remove(r.study_uid, r.series_uid, r.sop_uid, log=None)
                raise
            finally:
                self._rejecting = None
            for study, sops in hide:  # logged: now hidden
                self._remove(study, None, None, log=None, only=sops)
        return out

    def reject_in(self, con, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        """Index.reject_in from a write hook of :meth:`add` (a rejection note): kept, and
        written by the add in the journal transaction of its own change-log rows (the
        note's create, then a reject row per instance hidden): the note and its effect are
        durable together or not at all."""
        if self._rejecting is None:  # (not inside an add)
            return self.reject(refs, code, now)
        self._rejecting.append((refs, code, now))
        return sum(1 for _st, _se, sop in refs if sop in self._instances)

    def _log_add(self, action: str, instances: list[tuple[str, str, str]],
                 rejecting: list[tuple[list[tuple[str, str, str]], str, float]], also=None,
                 labelled: list[tuple[str, str]] = ()) -> list[tuple[str, set[str]]]:
        """The change-log rows of an add (and ``also(execute)``'s statements: the new
        instances' sources) and, in the same durable transaction, the labels on arrival of
        its new instances' studies (``labelled``: (study, label); a label new to its study
        logs a ``label`` row per instance, as :meth:`set_label`) and the rejections its
        hooks asked for (rows in the rejection table, reject rows); returns (study, SOP
        Instance UIDs) to hide from the index now."""
        if not rejecting and not labelled:
            self._log(action, instances, also)
            return []
        hide: list[tuple[str, set[str]]] = []
        hidden: set[str] = set()
        with immediate(self._journal) as con:
            if also is not None:
                also(self._x)
            changes = changelog.append(self._x, changelog.now(), action, instances)
            put = [(study, label) for study, label in labelled if study_labels.put(self._x, study, label, True)]
            for study, _label in put:
                changes += changelog.append(self._x, changelog.now(), "label", [
                    (study, i.series.uid, i.uid) for i in sorted(self._iter_instances(self._studies[study], None),
                                                                 key=lambda i: i.seq)])
            for refs, code, now in rejecting:
                rows, by_study = self._rejection_rows(refs)
                rejections.record(self._x, rows, code, now)
                for study, sops in by_study.items():
                    sops = sops - hidden
                    hidden |= sops
                    victims = sorted(((study, self._instances[s].series.uid, s) for s in sops),
                                     key=lambda t: self._instances[t[2]].seq)
                    changes += changelog.append(self._x, changelog.now(), "reject", victims)
                    hide.append((study, sops))
            self._run_change_hooks(con, changes)
        for study, label in put:
            self._labels.setdefault(study, set()).add(label)
        self._rejected.update(sop for refs, _code, _now in rejecting for _st, _se, sop in refs)
        return hide

    def _rejection_rows(self, refs: list[tuple[str, str, str]]
                        ) -> tuple[list[tuple[str, str, str, str | None]], dict[str, set[str]]]:
        """The rejection table's rows of ``refs`` (a stored one filed under the UIDs it
        has, not the note's) and the stored ones by study."""
        rows: list[tuple[str, str, str, str | None]] = []
        by_study: dict[str, set[str]] = {}
        for study, series, sop in refs:
            inst = self._instances.get(sop)
            if inst is None:
                rows.append((study, series, sop, None))
                continue
            rows.append((inst.series.study.uid, inst.series.uid, sop, inst.path))
            by_study.setdefault(inst.series.study.uid, set()).add(sop)
        return rows, by_study

    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> list[str]:
        return self._remove(study_uid, series_uid, sop_uid, log="delete")

    # --- rejected instances (store/rejections.py) ---------------------------------------

    def reject(self, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        with self._lock:
            rows, by_study = self._rejection_rows(refs)
            hidden = 0
            if not by_study:
                with immediate(self._journal):
                    rejections.record(self._x, rows, code, now)
            for n, (study, sops) in enumerate(by_study.items()):
                hidden += len(self._remove(study, None, None, log="reject", only=sops,
                                           also=(lambda x: rejections.record(x, rows, code, now)) if n == 0 else None))
            self._rejected.update(sop for _st, _se, sop in refs)
            return hidden

    def rejections(self, study_uid: str | None = None, series_uid: str | None = None,
                   before: float | None = None) -> list[rejections.Rejection]:
        with self._lock:
            return rejections.select(self._x, study_uid, series_uid, before)

    def unreject(self, rows: list[rejections.Rejection]) -> None:
        with self._lock:
            with immediate(self._journal):
                rejections.drop(self._x, rows)
            self._rejected.difference_update(r.sop_uid for r in rows)

    def purge(self, rows: list[rejections.Rejection]) -> list[rejections.Rejection]:
        with self._lock:
            rows = [r for r in rows if r.sop_uid in self._rejected]
            self._log("delete", [(r.study_uid, r.series_uid, r.sop_uid) for r in rows if r.path is not None],
                      also=lambda x: (rejections.drop(x, rows),
                                      arrivals_table.drop_sources(x, [r.sop_uid for r in rows])))
            self._rejected.difference_update(r.sop_uid for r in rows)
            return rows

    def _remove(self, study_uid: str, series_uid: str | None, sop_uid: str | None, log: str | None,
                only: set[str] | None = None, also=None) -> list[str]:
        with self._lock:
            study = self._studies.get(study_uid)
            if study is None:
                return []
            victims = [i for i in self._iter_instances(study, series_uid) if (sop_uid is None or i.uid == sop_uid)
                       and (only is None or i.uid in only)]
            unlabel = log == "delete" and study_uid in self._labels and len(victims) == study.n_instances()
            if unlabel:  # a DELETE of the whole study drops its labels, in the change log's transaction
                first = also
                also = lambda x: (first(x) if first else None, study_labels.drop_study(x, study_uid))  # noqa: E731
            if log == "delete":  # and the deleted instances' sources (a rejected one keeps its own)
                before = also
                also = lambda x: (before(x) if before else None,  # noqa: E731
                                  arrivals_table.drop_sources(x, [i.uid for i in victims]))
            if log:  # the change log first (durable): then the index changes
                self._log(log, sorted(((study_uid, i.series.uid, i.uid) for i in victims),
                                      key=lambda t: self._instances[t[2]].seq), also)
            if unlabel:
                self._labels.pop(study_uid, None)
            touched: dict[str, _Series] = {}
            for inst in victims:
                se = inst.series
                del se.instances[inst.uid]
                del self._instances[inst.uid]
                self._bytes -= inst.size
                touched[se.uid] = se
                if not se.instances:
                    del se.study.series[se.uid]
                    del self._series[se.uid]
            if not study.series:
                del self._studies[study_uid]
            elif victims:  # what the deleted instances said is said again by those left
                for se in touched.values():
                    if se.instances:
                        se.cols, se.seqs, se.json = self._record(next(iter(se.instances.values())), "series")
                study.cols, study.seqs, study.json = self._record(study.first(), "study")
                study.patient = patient_identity(orjson.loads(study.json))
            return [i.path for i in victims]

    @staticmethod
    def _record(inst: _Instance, level: str) -> tuple[tuple, dict | None, bytes]:
        """The study or series record ``inst`` gives (as describe_instance made it)."""
        cols, json = level_record(orjson.loads(inst.json), level)  # type: ignore[arg-type]
        names = _STUDY_COLS if level == "study" else _SERIES_COLS
        return tuple(cols[c] for c in names), _seqs(cols, level), dumps(json)

    def _iter_instances(self, study: _Study, series_uid: str | None) -> list[_Instance]:
        if series_uid is not None:
            se = study.series.get(series_uid)
            return list(se.instances.values()) if se is not None else []
        return [i for se in study.series.values() for i in se.instances.values()]

    def _allowed(self, study_uid: str, allowed: Filter) -> bool:
        return allowed.unrestricted or allowed.allows(self._labels.get(study_uid, ()), study_uid)

    def _study(self, study_uid: str, allowed: Filter) -> _Study | None:
        study = self._studies.get(study_uid)
        return study if study is not None and self._allowed(study_uid, allowed) else None

    def locate(self, sop_uid: str, allowed: Filter = UNRESTRICTED) -> InstanceLocation | None:
        inst = self._instances.get(sop_uid)
        if inst is None or not self._allowed(inst.series.study.uid, allowed):
            return None
        return inst.location()

    def instances(self, study_uid: str, series_uid: str | None = None,
                  allowed: Filter = UNRESTRICTED) -> list[InstanceLocation]:
        with self._lock:
            study = self._study(study_uid, allowed)
            return [i.location() for i in self._iter_instances(study, series_uid)] if study else []

    def metadata(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None,
                 allowed: Filter = UNRESTRICTED) -> list[bytes]:
        with self._lock:
            study = self._study(study_uid, allowed)
            if study is None:
                return []
            return [i.json for i in self._iter_instances(study, series_uid)
                    if sop_uid is None or i.uid == sop_uid]

    # --- search -----------------------------------------------------------------------

    @staticmethod
    def _study_value(study: _Study, keyword: str) -> object:
        if keyword == "ModalitiesInStudy":
            return study.modalities()
        if keyword == "SOPClassesInStudy":
            return study.sop_classes()
        if keyword == "NumberOfStudyRelatedSeries":
            return len(study.series)
        if keyword == "NumberOfStudyRelatedInstances":
            return study.n_instances()
        return study.cols[_COL_INDEX["study"][keyword]]

    def _matches(self, query: Query, level: str, entity) -> bool:
        for m in query.matches:
            if m.attribute.level != level or m.type == "universal":
                continue
            if m.attribute.kind is Kind.SEQUENCE:
                value = entity.seqs.get(m.attribute.keyword) if entity.seqs else None
            elif level == "study":
                value = self._study_value(entity, m.attribute.keyword)
            elif m.attribute.keyword == "NumberOfSeriesRelatedInstances":
                value = len(entity.instances)
            else:
                value = entity.cols[_COL_INDEX[level][m.attribute.keyword]]
            if not match_value(m, value, query.fuzzy and m.attribute.kind is Kind.PN):
                return False
        return True

    # --- what arrived (store/arrivals.py) ------------------------------------------------

    def arrived(self, study_uid: str, allowed: Filter = UNRESTRICTED) -> list[arrivals_table.Arrived] | None:
        with self._lock:
            study = self._study(study_uid, allowed)
            if study is None:
                return None
            out = []
            for se in study.series.values():
                groups: dict[str, list[int]] = {}
                for inst in se.instances.values():
                    g = groups.setdefault(inst.source, [0, 0])
                    g[0] += 1
                    g[1] += inst.size
                out += [arrivals_table.Arrived(se.uid, src, n, size) for src, (n, size) in sorted(groups.items())]
            return out

    # --- study labels (store/labels.py) -----------------------------------------------

    def labels(self, study_uid: str, allowed: Filter = UNRESTRICTED) -> list[str] | None:
        with self._lock:
            if self._study(study_uid, allowed) is None:
                return None
            return sorted(self._labels.get(study_uid, ()))

    def set_label(self, study_uid: str, label: str, present: bool = True,
                  allowed: Filter = UNRESTRICTED) -> bool | None:
        with self._lock:
            if self._study(study_uid, allowed) is None:
                return None
            study = self._studies[study_uid]
            with immediate(self._journal) as con:
                changed = study_labels.put(self._x, study_uid, label, present)
                if changed:  # the change feed shows it: a label row per instance of the study
                    self._run_change_hooks(con, changelog.append(
                        self._x, changelog.now(), "label",
                        [(study_uid, i.series.uid, i.uid) for i in sorted(self._iter_instances(study, None),
                                                                         key=lambda i: i.seq)]))
            if present:
                self._labels.setdefault(study_uid, set()).add(label)
            elif study_uid in self._labels:
                self._labels[study_uid].discard(label)
                if not self._labels[study_uid]:
                    del self._labels[study_uid]
            return changed

    def all_labels(self, allowed: Filter = UNRESTRICTED) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for study_uid, names in self._labels.items():
                if study_uid in self._studies and self._allowed(study_uid, allowed):
                    for name in names:
                        out[name] = out.get(name, 0) + 1
            return dict(sorted(out.items()))

    def search(self, query: Query, allowed: Filter = UNRESTRICTED) -> list[SearchHit]:
        with self._lock:
            if query.study_uid is not None:
                s = self._study(query.study_uid, allowed)
                studies = [s] if s is not None else []
            else:
                studies = list(self._studies.values())
            gen = self._generate(query, studies, allowed)
            return list(islice(gen, query.offset, query.offset + query.limit))

    def _generate(self, query: Query, studies: list[_Study], allowed: Filter = UNRESTRICTED) -> Iterator[SearchHit]:
        level = query.level
        if not allowed.unrestricted:  # the label filter is part of the match of the study level
            query_matches = self._matches

            def matches(q: Query, lv: str, entity) -> bool:
                return (lv != "study" or self._allowed(entity.uid, allowed)) and query_matches(q, lv, entity)
        else:
            matches = self._matches
        # stable order = arrival order of the entity searched
        if level == "study":
            for st in studies:
                if matches(query, "study", st):
                    yield SearchHit(st.uid, None, None, st.json, None, None, self._computed(st, None))
            return
        if level == "series":
            candidates = (se for se in self._series.values()) if query.study_uid is None else \
                (se for st in studies for se in st.series.values())
            for se in candidates:
                if query.series_uid is not None and se.uid != query.series_uid:
                    continue
                if matches(query, "study", se.study) and matches(query, "series", se):
                    yield SearchHit(se.study.uid, se.uid, None, se.study.json, se.json, None,
                                    self._computed(se.study, se))
            return
        insts = (i for i in self._instances.values()) if query.study_uid is None else \
            iter(sorted((i for st in studies for se in st.series.values() for i in se.instances.values()),
                        key=lambda i: i.seq))
        ok_study: dict[str, bool] = {}
        ok_series: dict[str, bool] = {}
        for inst in insts:
            se = inst.series
            if query.series_uid is not None and se.uid != query.series_uid:
                continue
            st = se.study
            if st.uid not in ok_study:
                ok_study[st.uid] = matches(query, "study", st)
            if se.uid not in ok_series:
                ok_series[se.uid] = matches(query, "series", se)
            if ok_study[st.uid] and ok_series[se.uid] and matches(query, "instance", inst):
                yield SearchHit(st.uid, se.uid, inst.uid, st.json, se.json, inst.json,
                                self._computed(st, se))

    @staticmethod
    def _computed(st: _Study, se: _Series | None) -> dict[str, object]:
        c: dict[str, object] = {
            "ModalitiesInStudy": st.modalities(),
            "SOPClassesInStudy": st.sop_classes(),
            "NumberOfStudyRelatedSeries": len(st.series),
            "NumberOfStudyRelatedInstances": st.n_instances(),
        }
        if se is not None:
            c["NumberOfSeriesRelatedInstances"] = len(se.instances)
        return c

    def count(self) -> int:
        return len(self._instances)

    def counts(self, allowed: Filter = UNRESTRICTED) -> IndexCounts:
        with self._lock:
            if allowed.unrestricted:
                return IndexCounts(len(self._studies), len(self._series), len(self._instances), self._bytes)
            studies = [st for st in self._studies.values() if self._allowed(st.uid, allowed)]
            return IndexCounts(len(studies), sum(len(st.series) for st in studies),
                               sum(st.n_instances() for st in studies),
                               sum(i.size for st in studies for se in st.series.values() for i in se.instances.values()))

    def paths(self) -> Iterator[tuple[str, str]]:
        with self._lock:
            items = [(i.uid, i.path) for i in self._instances.values()] + rejections.paths(self._x)
        yield from items

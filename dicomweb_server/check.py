"""``dicomweb-server check``: reconcile the index with the files on disk.

Every problem is named (the file's path under ``blobs/``, or the SOP Instance UID
of an index row) with what it is and, with ``repair``, what was done:

- **orphan**: a readable file at the path its UIDs give, without an index row (a
  crash between writing and indexing; never acknowledged): re-indexed.
- **misfiled**: a readable file whose UIDs give another path. If no file is at that
  path it is moved there and indexed; if a byte-identical file is already there it
  is a redundant copy and removed; if a different file is there it is a conflicting
  copy and moved to ``lost+found/``.
- **unreadable**: not a DICOM file with valid Study/Series/SOP Instance UIDs: moved to
  ``lost+found/`` (in the data folder, never deleted) with the reason.
- **missing file**: an index row whose file is gone: the row is dropped.
- **recompress leftover** / **recompress unfinished** (policy/recompress.py): a side file
  ``{sop}[.vN].recompressed.dcm`` no row names (removed by ``repair``), or a row naming one
  (readable; ``repair`` finishes the switch).
- **versions** (lifecycle/versions.py): ``{sop}.vN.dcm`` files, and the base file of an
  instance whose current file is a version, are kept versions (or the files of an update
  a crash stopped before its index switch): counted, never indexed nor moved; with
  ``repair`` those older than ``keep_versions`` days are removed (the base file, the
  instance as first received, stays while the instance is stored: a store of the same
  SOP Instance UID finds it there and is compared with the current version). A version file of an
  instance no longer indexed is an orphan version: removed by ``repair``.

Without ``repair`` nothing changes (dry run).

Every run writes what it found (:meth:`Report.totals`) to ``last-check.json`` in the
data folder (missing_data.save_check): the landing page shows the number of missing
files the last check found.

Objects (``--storage s3://...``, store/s3.py) are checked by :func:`reconcile_objects`:
an **orphan** there is an object no index row names that is older than the grace
period (a PUT whose index commit never came: never acknowledged), removed by
``repair``; younger ones may belong to a store in flight and are only counted. A
**missing file** is a row whose object is gone: the row is dropped. Both repairs are
re-checked under the instance's placement locks (the locks a store holds from its
PUT to its commit), so a store in flight is never undone.
"""

from __future__ import annotations

import filecmp
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from . import missing_data
from .archive import Archive
from .dicom.instance import describe_instance
from .dicom.status import InstanceError
from .store.base import Refused
from .lifecycle.versions import expired, main_file, split_version
from .store.blobs import fsync_dir

log = logging.getLogger("dicomweb_server.check")

LOST_AND_FOUND = "lost+found"
#: seconds an unindexed object is left alone (a store may be between its PUT and its commit)
GRACE = 900.0


@dataclass(slots=True)
class Problem:
    kind: str     # orphan, misfiled, unreadable, missing file
    subject: str  # path under blobs/ (files) or SOP Instance UID (index rows)
    why: str
    action: str = ""  # what repair did


@dataclass
class Report:
    indexed: int = 0
    files: int = 0
    problems: list[Problem] = field(default_factory=list)
    repaired: bool = False
    young: int = 0  # unindexed objects younger than the grace period (not examined)
    versions: int = 0  # kept versions of indexed instances (lifecycle/versions.py)
    purged: int = 0  # of which removed (older than keep_versions days)
    refused: bool = False  # repair asked, nothing done: the index and the storage are unrelated

    @property
    def clean(self) -> bool:
        return not self.problems

    def totals(self) -> dict:
        """The counts of this report (``last-check.json``, the landing page)."""
        return {"indexed": self.indexed, "files": self.files, "problems": len(self.problems),
                "missing_files": sum(p.kind == "missing file" for p in self.problems),
                "repaired": self.repaired and not self.refused}

    def summary(self) -> str:
        lines = [f"{self.indexed} indexed instance(s), {self.files} file(s) on disk, "
                 f"{len(self.problems)} problem(s)"]
        if self.versions:
            lines.append(f"  {self.versions} earlier version(s) of updated instances kept"
                         + (f", {self.purged} older than keep_versions removed" if self.purged else ""))
        if self.young:
            lines.append(f"  {self.young} unindexed object(s) younger than the grace period: left alone "
                         "(a store may be in flight; --grace SECONDS)")
        for p in self.problems:
            lines.append(f"  {p.kind}: {p.subject}: {p.why}" + (f" -> {p.action}" if p.action else ""))
        if self.refused:
            lines.append("nothing repaired: none of the indexed instances is in this storage; check --data-dir, "
                         "--storage and --database-url name the same archive")
        elif self.problems and not self.repaired:
            lines.append("nothing changed (dry run); `dicomweb-server check --repair` fixes each problem as shown "
                         "(unreadable and conflicting files go to lost+found/ in the data folder)")
        return "\n".join(lines)


def reconcile(archive: Archive, repair: bool = False, grace: float = GRACE) -> Report:
    """Compare the index with the stored instances; with ``repair``, fix each problem.
    ``grace``: seconds an unindexed object is left alone (object stores only). What was
    found is kept in the data folder (module docstring)."""
    if archive.blobs.orphans == "remove":
        report = reconcile_objects(archive, repair, grace)
    else:
        report = reconcile_files(archive, repair)
    try:
        missing_data.save_check(archive.settings.data_dir, report.totals())
    except OSError as e:  # a read-only data folder: the report is still printed
        log.warning("cannot keep the check's summary in %s: %s", archive.settings.data_dir, e)
    return report


def reconcile_files(archive: Archive, repair: bool = False) -> Report:
    """:func:`reconcile` for files in the data folder (module docstring)."""
    report = Report(repaired=repair)
    rows = dict(archive.index.paths())
    by_path = {p: uid for uid, p in rows.items()}
    files = set(archive.blobs.walk())
    report.indexed, report.files = len(rows), len(files)
    unrelated = _unrelated(by_path, files)
    report.refused = repair and unrelated
    rest = _versions(archive, report, by_path, {rel: None for rel in files - set(by_path)}, repair and not unrelated)
    _side_rows(archive, report, by_path, repair and not unrelated)
    for rel in sorted(rest):
        report.problems.append(_file_problem(archive, rel, repair))
    for rel, uid in sorted(by_path.items()):
        if rel not in files:
            problem = Problem("missing file", uid, f"indexed at {rel}, but no file is there")
            if repair and archive.blobs.resolve(rel).exists():
                problem.action = "file restored from its misfiled copy"
            elif repair and unrelated:
                problem.action = UNRELATED
            elif repair:
                loc = archive.index.locate(uid)
                if loc is not None:
                    archive.index.delete(loc.study_uid, loc.series_uid, uid)
                problem.action = "index row dropped"
            report.problems.append(problem)
    return report


#: the action of every repair refused by :func:`_unrelated`
UNRELATED = "not repaired: the index and the storage share no instance (the wrong --storage or database?)"


def _versions(archive: Archive, report: Report, by_path: dict[str, str], unindexed: dict[str, float | None],
              repair: bool) -> list[str]:
    """Take the versions out of the unindexed files (module docstring); returns the rest.
    With ``repair``, versions older than ``keep_versions`` days and version files of
    instances no longer indexed are removed (under the instance's locks: an update in
    flight is not undone)."""
    bases = {split_version(p)[0]: uid for p, uid in by_path.items()}
    rest: list[str] = []
    blobs, index = archive.blobs, archive.index
    for rel, modified in unindexed.items():
        base, n = split_version(rel)
        if main_file(rel) is not None:
            report.problems.append(_side_leftover(archive, rel, base, repair))
        elif base in bases:
            report.versions += 1
            if repair:
                if modified is None:
                    try:
                        modified = blobs.resolve(rel).stat().st_mtime
                    except FileNotFoundError:
                        continue
                if n is not None and expired(modified, archive.settings.keep_versions):  # (the original stays)
                    uid = bases[base]
                    with blobs.locked([uid]), index.locked([uid]):
                        loc = index.locate(uid)
                        if loc is not None and loc.path != rel:
                            blobs.remove(rel)
                            report.purged += 1
        elif n is not None:
            problem = Problem("orphan version", rel, "a version file of an instance no longer indexed")
            if repair:
                uid = PurePosixPath(base).stem
                with blobs.locked([uid]), index.locked([uid]):
                    loc = index.locate(uid)
                    if loc is None or split_version(loc.path)[0] != base:
                        blobs.remove(rel)
                        problem.action = "removed"
                    else:
                        problem.action = "its instance was stored meanwhile: kept"
            report.problems.append(problem)
        else:
            rest.append(rel)
    return rest


def _side_leftover(archive: Archive, rel: str, base: str, repair: bool) -> Problem:
    """A recompress side file no index row names (policy/recompress.py: a stop before its
    first commit or after its last): the instance is whole in its main file; removed by
    ``repair`` (under the instance's locks: a recompress in flight is not undone)."""
    problem = Problem("recompress leftover", rel, "the re-encoded copy of a stored file that a stopped "
                                                  "`recompress` left; no index row names it")
    if repair:
        uid = PurePosixPath(base).stem
        with archive.blobs.locked([uid]), archive.index.locked([uid]):
            loc = archive.index.locate(uid)
            if loc is None or loc.path != rel:
                archive.blobs.remove(rel)
                problem.action = "removed"
            else:
                problem.action = "indexed meanwhile: kept"
    return problem


def _side_rows(archive: Archive, report: Report, by_path: dict[str, str], repair: bool) -> None:
    """Index rows naming a recompress side file (a stop between the two commits of its
    switch, policy/recompress.py): readable as they are; ``repair`` finishes the switch."""
    for rel, uid in sorted(by_path.items()):
        if main_file(rel) is None:
            continue
        problem = Problem("recompress unfinished", uid, f"indexed at the side file {rel} (a `recompress` "
                                                        "stopped during its switch; the instance is readable)")
        if repair:
            from .policy.recompress import finish

            problem.action = "switch finished" if finish(archive, uid) else "nothing left to do"
        report.problems.append(problem)


def _unrelated(by_path: dict[str, str], stored: set[str]) -> bool:
    """Whether a non-empty index and the storage have no instance in common: the wrong
    ``--storage`` bucket/prefix, an unmounted blobs folder, another archive's database.
    Repairing would then drop every index row as a "missing file" (and, for objects,
    remove every object as an "orphan"): nothing is repaired. (An empty index is the
    file store's recovery case, every file re-indexed; objects have their own guard.)"""
    return bool(by_path) and by_path.keys().isdisjoint(stored)


def _file_problem(archive: Archive, rel: str, repair: bool) -> Problem:
    blobs = archive.blobs
    try:
        rec = describe_instance(blobs.resolve(rel), bulk_threshold=archive.settings.bulk_threshold)
    except InstanceError as e:
        problem = Problem("unreadable", rel, e.message)
        if repair:
            problem.action = f"moved to {_to_lost_and_found(archive, rel)}"
        return problem
    if rec.path == rel:
        problem = Problem("orphan", rel, f"SOP Instance {rec.sop_uid} is on disk but not in the index "
                                         "(never acknowledged: a stop between writing and indexing)")
        if repair:
            with blobs.locked([rec.sop_uid]), archive.index.locked([rec.sop_uid]):
                refused = _index(archive, rec)
            problem.action = "indexed" if refused is None else \
                f"not indexed ({refused.message}): moved to {_to_lost_and_found(archive, rel)}"
        return problem
    target = blobs.resolve(rec.path)
    if not target.exists():
        problem = Problem("misfiled", rel, f"SOP Instance {rec.sop_uid} belongs at {rec.path}, where no file is")
        if repair:
            with blobs.locked([rec.sop_uid]), archive.index.locked([rec.sop_uid]):
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(blobs.resolve(rel), target)
                fsync_dir(target.parent)
                refused = _index(archive, rec) if archive.index.locate(rec.sop_uid) is None else None
                if refused is not None:  # its UIDs contradict what is indexed: keep it aside
                    blobs.remove(rec.path)
            if refused is None:
                blobs.remove(rel)
                problem.action = f"moved to {rec.path} and indexed"
            else:
                problem.action = f"not indexed ({refused.message}): moved to {_to_lost_and_found(archive, rel)}"
        return problem
    if filecmp.cmp(blobs.resolve(rel), target, shallow=False):
        problem = Problem("misfiled", rel, f"a byte-identical copy of SOP Instance {rec.sop_uid}, "
                                           f"which is stored at {rec.path}")
        if repair:
            blobs.remove(rel)
            problem.action = "redundant copy removed"
        return problem
    problem = Problem("misfiled", rel, f"another version of SOP Instance {rec.sop_uid}, which is stored at "
                                       f"{rec.path} with different content")
    if repair:
        problem.action = f"moved to {_to_lost_and_found(archive, rel)} (the stored version is kept)"
    return problem


def _index(archive: Archive, rec) -> Refused | None:
    """Index one record; the refusal when its place in the study/series hierarchy
    contradicts what the index holds (store.base.hierarchy_conflict)."""
    added = archive.index.add([rec])[0]
    return added if isinstance(added, Refused) else None


def _to_lost_and_found(archive: Archive, rel: str) -> str:
    """Move a file out of ``blobs/`` into ``lost+found/`` (same relative path) in the
    data folder: out of the archive's way, never deleted. Returns the new location."""
    dest = archive.blobs.root / LOST_AND_FOUND / rel
    while dest.exists():  # an earlier repair left a file of this name
        dest = dest.with_name(dest.name + ".1")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.link(archive.blobs.resolve(rel), dest)
    fsync_dir(dest.parent)
    archive.blobs.remove(rel)
    return str(dest.relative_to(archive.blobs.root))


def reconcile_objects(archive: Archive, repair: bool = False, grace: float = GRACE) -> Report:
    """:func:`reconcile` for an object store (module docstring). The index is read
    before the listing, so an instance stored in between shows as an unindexed
    object: young, and looked up again under its locks before anything is removed."""
    report = Report(repaired=repair)
    blobs, index = archive.blobs, archive.index
    by_path = {p: uid for uid, p in index.paths()}
    listed = {obj.path: obj for obj in blobs.listing()}
    report.indexed, report.files = len(by_path), len(listed)
    unrelated = _unrelated(by_path, set(listed))
    report.refused = repair and unrelated
    now = time.time()
    rest = _versions(archive, report, by_path, {rel: listed[rel].modified for rel in set(listed) - set(by_path)},
                     repair and not unrelated and bool(by_path))
    _side_rows(archive, report, by_path, repair and not unrelated)
    for rel in sorted(rest):
        obj = listed[rel]
        age = now - obj.modified
        if age < grace:
            report.young += 1
            continue
        uid = PurePosixPath(rel).stem
        problem = Problem("orphan", rel, f"an object of {obj.size} bytes, {age:.0f} s old, that no index row "
                                         "names (never acknowledged: a stop between its PUT and the index commit)")
        if repair and not by_path:
            problem.action = "not removed: the index is empty (is this the archive's database?)"
        elif repair and unrelated:
            problem.action = UNRELATED
        elif repair:
            with blobs.locked([uid]), index.locked([uid]):
                loc = index.locate(uid)
                if loc is not None and loc.path == rel:
                    problem.action = "indexed meanwhile: kept"
                else:
                    blobs.remove(rel)
                    problem.action = "object removed"
        report.problems.append(problem)
    for rel, uid in sorted(by_path.items()):
        if rel in listed:
            continue
        problem = Problem("missing file", uid, f"indexed at {rel}, but no object is there")
        if repair and unrelated:
            problem.action = UNRELATED
        elif repair:
            with blobs.locked([uid]), index.locked([uid]):
                loc = index.locate(uid)
                if loc is None or loc.path != rel:
                    problem.action = "row gone meanwhile"
                elif blobs.exists(rel):
                    problem.action = "object present (stored meanwhile): row kept"
                else:
                    index.delete(loc.study_uid, loc.series_uid, uid)
                    problem.action = "index row dropped"
        report.problems.append(problem)
    return report

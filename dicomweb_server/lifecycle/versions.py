"""Where the versions of an instance live, and which are kept.

An instance's first file is ``{study}/{series}/{sop}.dcm`` (dicom/instance.py
instance_path). Each later version (an update, a restore: lifecycle/update.py) is a new
file beside it, ``{study}/{series}/{sop}.v{N}.dcm``, N its version in the change log
(store/changes.py). The index names the current file; the change log says which version
is current, so that:

- ``check`` does not take a kept version, nor the file of an update that never switched
  the index (a crash), for an orphan or a misfiled copy (:func:`is_version_of`);
- the in-memory index, re-reading every file at start-up, indexes the file of the
  current version only (:func:`current_file`).

A *side file* ``{sop}[.vN].recompressed.dcm`` (:func:`side_file`) is the re-encoded copy of
the file beside it while ``recompress`` switches the instance to it (policy/recompress.py):
it holds the same data set (version) as its main file, is indexed only between the two
commits of that switch, and is never read at start-up.

The files of earlier versions are kept ``keep_versions`` days (settings) after they were
replaced (the time of the change-log row of the version that followed), then removed by
:func:`purge`: in the server at start and hourly (the timer of the rejected instances'
purge, lifecycle/reject.py), and by ``dicomweb-server purge``. ``dicomweb-server check
--repair`` also removes them (by the age of their files), with the files of updates a
crash left unswitched.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ..store.changes import Change

_VERSIONED = re.compile(r"^(?P<base>.+)\.v(?P<n>[1-9][0-9]{0,8})\.dcm$")


def version_path(base: str, version: int) -> str:
    """The file of ``version`` of the instance filed at ``base`` (its ``.dcm`` path)."""
    assert base.endswith(".dcm")
    return f"{base[:-4]}.v{version}.dcm"


#: the suffix of a side file (policy/recompress.py): the re-encoded copy of a stored file,
#: indexed while its bytes take the stored file's place
SIDE = ".recompressed.dcm"


def side_file(rel: str) -> str:
    """The side file of the stored file ``rel`` (``{sop}[.vN].recompressed.dcm``)."""
    assert rel.endswith(".dcm") and not rel.endswith(SIDE)
    return rel[:-4] + SIDE


def main_file(rel: str) -> str | None:
    """The stored file whose side file ``rel`` is; None when ``rel`` is not a side file."""
    return rel[: -len(SIDE)] + ".dcm" if rel.endswith(SIDE) else None


def split_version(rel: str) -> tuple[str, int | None]:
    """(the instance's base path, version) of a stored file; version None for the base
    file itself. A side file gives those of its main file."""
    rel = main_file(rel) or rel
    m = _VERSIONED.match(rel)
    if m is None:
        return rel, None
    return m["base"] + ".dcm", int(m["n"])


def file_of(base: str, change: Change) -> str:
    """The file holding the version a change-log row made: a create's is the base file,
    an update's or restore's its own."""
    return base if change.action == "create" else version_path(base, change.version)


def current_file(rel: str, last: tuple[str, str, int] | None) -> bool:
    """Whether ``rel`` is the current file of its instance, given its latest change-log
    row (action, state, version), None when never logged (start-up of the in-memory index).
    A side file never is: its main file is there, with the same data set (policy/recompress.py)."""
    if main_file(rel) is not None:
        return False
    _base, n = split_version(rel)
    made_by_version = last is not None and last[0] in ("update", "restore")
    if n is None:
        return not made_by_version
    # (a rejected instance's file is its current version's: filed again under its rejection)
    return made_by_version and last[1] in ("current", "rejected") and last[2] == n  # type: ignore[index]


@dataclass(frozen=True, slots=True)
class Version:
    """One version of an instance, as ``GET .../versions`` lists it."""

    version: int
    action: str  # what made it: create | update | restore
    time: float
    path: str
    size: int | None  # None: its file is gone (purged)
    current: bool

    def to_json(self) -> dict:
        from ..store.changes import iso

        return {"version": self.version, "action": self.action, "time": iso(self.time),
                "size": self.size, "current": self.current}


def versions(blobs, base: str, history: list[Change]) -> list[Version]:
    """The versions of an instance from its change-log rows (its files' sizes looked up)."""
    made: list[Change] = []
    shown: dict[int, bool] = {}  # version -> current, of a version shown again after its rejection
    for prev, c in zip([None, *history], history):
        if c.action == "restore" and prev is not None and prev.action == "reject" and prev.version == c.version:
            shown[c.version] = c.state == "current"  # (lifecycle/reject.py: the same version, no new file)
        elif c.action in ("create", "update", "restore"):
            made.append(c)
    out = []
    for n, c in enumerate(made):
        path = file_of(base, c)
        later_create = any(d.action == "create" for d in made[n + 1:])
        if c.action == "create" and later_create:
            continue  # a create's base file was deleted and later re-stored: not this version
        try:
            size = _size(blobs, path)
        except FileNotFoundError:
            size = None
        current = c.state == "current" or (shown.get(c.version, False) and c is made[-1])
        out.append(Version(c.version, c.action, c.timestamp, path, size, current))
    return out


def _size(blobs, rel: str) -> int:
    sizes = getattr(blobs, "sizes", None)
    if sizes is not None:  # objects (store/s3.py)
        found = sizes([rel])
        if rel not in found:
            raise FileNotFoundError(rel)
        return found[rel]
    return blobs.resolve(rel).stat().st_size


#: change-log rows read per page by :func:`purge`
PURGE_PAGE = 1000


def purge(archive, now: float | None = None) -> int:
    """Remove the files of earlier versions replaced more than ``keep_versions`` days ago
    (``{sop}.vN.dcm`` no longer current; the first file ``{sop}.dcm`` stays while the
    instance is stored, as ``check --repair`` leaves it). The change log is read in
    Sequence order from where this process's last purge stopped (the first purge of a
    process reads it whole) up to the first row inside the keep period; each ``update``
    or ``restore`` row older than that lets the versions before it go. An instance deleted
    (its versions went with it) or rejected (its files wait for the rejection's purge,
    ``keep_rejected``) is left alone. Each instance is done under its locks (an update in
    flight is not undone). Returns how many files were removed."""
    cutoff = (time.time() if now is None else now) - archive.settings.keep_versions * 86400
    after = getattr(archive, "_versions_purged_to", 0)
    removed = 0
    with archive._tracked():
        while True:
            page = archive.index.changes(after=after, limit=PURGE_PAGE)
            due: dict[str, int] = {}  # SOP Instance UID -> the version whose predecessors may go
            inside = False
            for c in page:
                if c.timestamp >= cutoff:
                    inside = True
                    break
                if c.action in ("update", "restore"):
                    due[c.sop_uid] = max(due.get(c.sop_uid, 0), c.version)
                after = c.sequence
            removed += sum(_purge_instance(archive, sop, version) for sop, version in due.items())
            archive._versions_purged_to = after
            if inside or len(page) < PURGE_PAGE:
                return removed


def _purge_instance(archive, sop_uid: str, upto: int) -> int:
    """Remove the version files of ``sop_uid`` older than ``upto`` that are not current."""
    blobs, index = archive.blobs, archive.index
    with blobs.locked([sop_uid]), index.locked([sop_uid]):
        loc = index.locate(sop_uid)
        if loc is None:
            return 0
        n = 0
        for v in versions(blobs, split_version(loc.path)[0], index.history(sop_uid)):
            if v.version < upto and not v.current and v.size is not None and v.path != loc.path \
                    and split_version(v.path)[1] is not None:
                blobs.remove(v.path)
                n += 1
        return n


def expired(modified: float, keep_days: float, now: float | None = None) -> bool:
    return (now if now is not None else time.time()) - modified > keep_days * 86400


def kept_files(blobs, base: str) -> list[tuple[str, float]]:
    """(path, modified) of the version files (and side files) beside the instance filed at
    ``base``."""
    folder, _, name = base.rpartition("/")
    stem = name[:-4]
    if getattr(blobs, "sizes", None) is not None:  # objects: the series folder listed
        return [(o.path, o.modified) for o in blobs.listing(folder + "/")
                if split_version(o.path)[0] == base and o.path != base]
    out = []
    try:
        entries = list(blobs.resolve(folder).iterdir())
    except FileNotFoundError:
        return []
    for p in entries:
        rel = f"{folder}/{p.name}"
        if p.name.startswith(stem + ".") and split_version(rel)[0] == base and rel != base:
            try:
                out.append((rel, p.stat().st_mtime))
            except FileNotFoundError:
                pass
    return out

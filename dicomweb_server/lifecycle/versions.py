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

The files of earlier versions are kept ``keep_versions`` days (settings), then removed by
:func:`purge` (``dicomweb-server check --repair`` and at start-up).
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


def split_version(rel: str) -> tuple[str, int | None]:
    """(the instance's base path, version) of a stored file; version None for the base
    file itself."""
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
    row (action, state, version), None when never logged (start-up of the in-memory index)."""
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


def expired(modified: float, keep_days: float, now: float | None = None) -> bool:
    return (now if now is not None else time.time()) - modified > keep_days * 86400


def kept_files(blobs, base: str) -> list[tuple[str, float]]:
    """(path, modified) of the version files beside the instance filed at ``base``."""
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
        if p.name.startswith(stem + ".v") and split_version(rel) [0] == base and rel != base:
            try:
                out.append((rel, p.stat().st_mtime))
            except FileNotFoundError:
                pass
    return out

"""Instance data missing: a stored file (or object) that the index names but that is
gone, of another size than its row says, or unreadable: damaged storage (a disk or a
bucket changed by hand, a restore that left files out), never a DELETE.

The index is the truth of what the archive holds (QIDO-RS and the metadata
resources keep listing such an instance) until ``dicomweb-server check --repair``
drops the row. A read that finds the data missing tells apart the two reasons a
file can be absent (retrieve.py, "Reads racing DELETE"): when the index still holds
the row the read looked up (same path, same size), the data is missing; when the
row is gone or another one took its place, a DELETE (or a new store) raced the read.

Each instance found missing is logged at ERROR once per process (a bounded set of
SOP Instance UIDs) and every finding is counted (``dicomweb_instance_data_missing_total``
at /metrics). ``check`` writes what it found to ``last-check.json`` in the data
folder (:func:`save_check`), read by the landing page (:func:`last_check`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from . import metrics
from .store.base import InstanceLocation

log = logging.getLogger("dicomweb_server.missing")

#: the reason every answer about missing data starts with
MESSAGE = "instance data missing"
#: SOP Instance UIDs already logged in this process (emptied when full: bounded memory)
LOGGED_MAX = 10_000
_logged: set[str] = set()
_lock = threading.Lock()


def still_indexed(index, loc: InstanceLocation) -> bool:
    """Whether the index still holds the row ``loc`` was read from (same file, same size)."""
    row = index.locate(loc.sop_uid)
    return row is not None and row.path == loc.path and row.size == loc.size


def report(loc: InstanceLocation, cause: object) -> None:
    """Count one finding of ``loc``'s data missing; log it, at ERROR, the first time
    this process finds that instance."""
    metrics.INSTANCE_DATA_MISSING.inc()
    with _lock:
        first = loc.sop_uid not in _logged
        if first:
            if len(_logged) >= LOGGED_MAX:
                _logged.clear()
            _logged.add(loc.sop_uid)
    if first:
        log.error("%s: instance %s (study %s) is indexed at %s (%d bytes) but its stored data is gone or "
                  "unreadable: %s; `dicomweb-server check` names every such instance, `check --repair` "
                  "drops their index rows", MESSAGE, loc.sop_uid, loc.study_uid, loc.path, loc.size, cause)


def confirm(index, loc: InstanceLocation, cause: object) -> bool:
    """After a read of ``loc`` found no data: True (reported) when the index still holds
    its row, so the data is missing; False when a DELETE or a new store raced the read."""
    if not still_indexed(index, loc):
        return False
    report(loc, cause)
    return True


def message(locs: Iterable[InstanceLocation]) -> str:
    """The reason given to a client: MESSAGE and the SOP Instance UIDs."""
    uids = [loc.sop_uid for loc in locs]
    return f"{MESSAGE} ({len(uids)} instance(s): stored file or object gone or unreadable): {', '.join(uids)}"


def absent(blobs, locs: list[InstanceLocation]) -> list[InstanceLocation]:
    """The instances of ``locs`` whose stored data is not there as their rows say (no
    file or object, another size, unreadable): files by one ``stat`` each, objects by
    listing their series (or study) folders (``S3BlobStore.sizes``: one request per
    1000 objects, no GET). Blocking: run it in a worker thread."""
    if not getattr(blobs, "local_files", True):
        sizes = blobs.sizes([loc.path for loc in locs])
        return [loc for loc in locs if sizes.get(loc.path) != loc.size]
    out = []
    for loc in locs:
        try:
            if os.stat(blobs.resolve_str(loc.path)).st_size == loc.size:
                continue
        except OSError:
            pass
        out.append(loc)
    return out


# --- the last check's summary ----------------------------------------------------------------

LAST_CHECK = "last-check.json"


def save_check(data_dir: str | Path, summary: dict) -> None:
    """Write ``summary`` (what ``check`` found) to the data folder, replacing the last
    one (a new file renamed over it: a reader sees one whole summary)."""
    path = Path(data_dir) / LAST_CHECK
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**summary, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    os.replace(tmp, path)


def last_check(data_dir: str | Path) -> dict | None:
    """The last check's summary (:func:`save_check`), or None when none ran here."""
    try:
        return json.loads((Path(data_dir) / LAST_CHECK).read_text())
    except (OSError, ValueError):
        return None

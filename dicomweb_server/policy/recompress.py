"""``recompress``: re-encode what is already stored by the ``[[store_as]]`` rules of the
routes file (policy/ingest.py encodes on arrival; this does the instances stored before a
rule existed, and those of ``when = "after_ack"`` rules after their acknowledgement).

A job (jobs/__init__.py, kind ``recompress``): ``dicomweb-server recompress`` runs it in its
process (``--resume FILE``), the server as an admin job and, for ``after_ack`` rules, every
:data:`AFTER_ACK_INTERVAL` seconds over the instances that arrived since its last pass
(:func:`after_ack_periodically`).

Items, in a stable order: the change log (store/changes.py) in Sequence order, each row that
made the current version of an instance (a create, update or restore still ``current``), up
to the latest row when the job started. The checkpoint is the Sequence of the last item
finished, so a resumed job neither misses nor repeats an instance.

Lossless and the same instance: the new file is decoded and compared with the stored one
before anything changes (:func:`.ingest.encode_verified`, in a decode worker); the SOP
Instance UID and the data set are kept, only the transfer syntax changes (PS3.5 §10: a
transfer syntax is an encoding of the same data set; PS3.5 §8.2 for the compressed
encapsulation). The change log gets no row: its readers (the change feed, webhooks,
routing rules with ``on = ["update"]``) see no new version, because there is none.

The switch (crash safety; the stored file keeps its name ``F``, the version's file,
lifecycle/versions.py), under the instance's write locks (those a store, an ``$update`` or
a ``check --repair`` of it takes, so none of them is lost or interleaved):

1. the verified file is placed durably as the side file ``X = F.recompressed.dcm``
   (lifecycle/versions.py :func:`side_file`);
2. commit 1: the index row names ``X`` (its size, transfer syntax and pixel layout,
   :meth:`Index.refile`) if it still names ``F`` unchanged (else nothing is switched);
3. the new bytes take ``F``'s name atomically (a rename over it, then its folder fsynced;
   an object: a PUT over it);
4. commit 2: the row names ``F`` again, now with the new bytes;
5. ``X`` is removed.

At every point the row names a complete file that holds what the row says, and ``F``
exists (old bytes, then new): a SIGKILL anywhere leaves every instance readable, old or new.
What a crash leaves is finished by the next run (its checkpoint names the instance in
flight) or by ``dicomweb-server check --repair`` (check.py: a side file the row names is
finished, one it does not name is removed). Readers that looked the row up just before a
switch and open the file just after it find another size and answer 404 (retrieve.Gone):
each destructive step waits :data:`SETTLE` seconds after the commit before it.

Never bigger: an instance stored in a lossy syntax (its pixels are the lossy ones; a lossless
copy of them only grows it) and one whose re-encoded file is not smaller than the stored one
are skipped, the reason in the report, nothing switched.

Throttled: at most ``rate`` instances/s and ``bytes_rate`` stored bytes/s read, and it
yields to stores: while the change log got a row in the last ``quiet`` seconds (or this
process is storing), it waits (at most :data:`MAX_YIELD` seconds per instance).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import faults
from ..dicom.compressed import LOSSY
from ..dicom.instance import InstanceRecord, describe_instance
from ..dicom.status import InstanceError
from ..jobs import Context, JobError, Progress, run_inline
from ..lifecycle.versions import main_file, side_file
from ..routing.rules import StoreAs, match_alternatives
from ..store.blobs import Placed
from ..store.changes import Change
from . import ingest

log = logging.getLogger("dicomweb_server.policy.recompress")

__all__ = ["run", "recompress_instance", "finish", "Throttle", "AFTER_ACK_INTERVAL", "after_ack_periodically"]

#: seconds between a switch's commit and the step that takes the earlier file away
SETTLE = 0.05
#: the longest an instance waits for stores to pause (then it goes on: progress is owed too)
MAX_YIELD = 10.0
#: change-log rows read per page
PAGE = 500
#: a checkpoint at least every SAVE_EVERY items or SAVE_SECONDS (and before every switch)
SAVE_EVERY = 50
SAVE_SECONDS = 2.0
#: the server's pass over the instances that arrived under ``when = "after_ack"`` rules
AFTER_ACK_INTERVAL = 5.0
#: the job's parameters and their types (a JSON object; all optional)
PARAMS = {"match": dict, "rate": (int, float), "bytes_rate": (int, float), "dry_run": bool, "limit": int,
          "quiet": (int, float), "after_ack": bool, "follow": bool}
#: why an instance is left as it is though its rule matches (the report's ``skipped_why``)
STORED_LOSSY = "stored lossy: re-encoding it losslessly only grows it"
NOT_SMALLER = "not smaller"
#: the failures listed in the report (the count goes on)
MAX_LISTED = 100


@dataclass(slots=True)
class Outcome:
    """What became of one instance: ``done`` (re-encoded, or would be in a dry run),
    ``skipped`` (``why``), or ``failed`` (``why``; the stored file is kept as it is)."""

    kind: str
    why: str = ""
    from_ts: str = ""
    to_ts: str = ""
    before: int = 0
    after: int = 0


class Throttle:
    """At most ``rate`` items/s and ``bytes_rate`` bytes/s, on average from the first item
    (each item's share of time is paid before the next one starts). Counts what it did."""

    def __init__(self, rate: float | None = None, bytes_rate: float | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if (rate is not None and rate <= 0) or (bytes_rate is not None and bytes_rate <= 0):
            raise JobError("rate and bytes_rate must be positive")
        self.rate, self.bytes_rate = rate, bytes_rate
        self.clock, self.sleep = clock, sleep
        self._free: float | None = None  # when the next item may start
        self.waits = 0
        self.slept = 0.0

    def take(self, nbytes: int = 0) -> None:
        """Wait until one more item of ``nbytes`` may start."""
        now = self.clock()
        if self._free is not None and self._free > now:
            wait = self._free - now
            self.waits += 1
            self.slept += wait
            self.sleep(wait)
            now = self._free
        share = max(1 / self.rate if self.rate else 0.0, nbytes / self.bytes_rate if self.bytes_rate else 0.0)
        self._free = now + share


@dataclass(slots=True)
class Report:
    """The counts and bytes of a run (``Progress.detail``; the handler's result)."""

    dry_run: bool = False
    bytes_before: int = 0
    bytes_after: int = 0
    by_syntax: dict[str, dict[str, int]] = field(default_factory=dict)  # "from -> to": instances, bytes
    skipped: dict[str, int] = field(default_factory=dict)  # why -> instances
    failures: list[dict[str, str]] = field(default_factory=list)
    throttled_seconds: float = 0.0
    yielded_seconds: float = 0.0

    def count(self, o: Outcome) -> None:
        if o.kind == "done":
            self.bytes_before += o.before
            self.bytes_after += o.after
            row = self.by_syntax.setdefault(f"{o.from_ts} -> {o.to_ts}",
                                            {"instances": 0, "bytes_before": 0, "bytes_after": 0})
            row["instances"] += 1
            row["bytes_before"] += o.before
            row["bytes_after"] += o.after
        elif o.kind == "skipped":
            self.skipped[o.why] = self.skipped.get(o.why, 0) + 1

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "bytes_saved": self.bytes_before - self.bytes_after, "by_syntax": self.by_syntax,
                "skipped_why": self.skipped, "failures": self.failures,
                "throttled_seconds": round(self.throttled_seconds, 3),
                "yielded_seconds": round(self.yielded_seconds, 3)}

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        return cls(bool(d.get("dry_run", False)), int(d.get("bytes_before", 0)), int(d.get("bytes_after", 0)),
                   {k: dict(v) for k, v in (d.get("by_syntax") or {}).items()}, dict(d.get("skipped_why") or {}),
                   list(d.get("failures") or []), float(d.get("throttled_seconds", 0.0)),
                   float(d.get("yielded_seconds", 0.0)))


def check_params(params: dict) -> dict:
    """The parameters validated (JobError names the bad one)."""
    if not isinstance(params, dict):
        raise JobError("the parameters are a JSON object")
    for k, v in params.items():
        if k not in PARAMS:
            raise JobError(f"unknown parameter {k!r}; expected {', '.join(PARAMS)}")
        if v is not None and (not isinstance(v, PARAMS[k]) or (PARAMS[k] is not bool and isinstance(v, bool))):
            raise JobError(f"{k}: {v!r} is not a {getattr(PARAMS[k], '__name__', 'number')}")
    for k in ("rate", "bytes_rate"):
        if params.get(k) is not None and params[k] <= 0:
            raise JobError(f"{k}: must be positive")
    if params.get("limit") is not None and params["limit"] < 1:
        raise JobError("limit: at least 1")
    if params.get("quiet") is not None and params["quiet"] < 0:
        raise JobError("quiet: seconds, 0 or more")
    if params.get("match"):
        try:
            match_alternatives(params["match"])
        except ValueError as e:
            raise JobError(f"match: {e}") from None
    return params


def run(ctx: Context) -> dict:
    """The ``recompress`` job handler (module docstring). Parameters (all optional):
    ``match`` (QIDO-RS keys: only the instances they match), ``rate`` (instances/s),
    ``bytes_rate`` (bytes/s read), ``dry_run`` (encode and measure, change nothing),
    ``limit`` (at most this many instances re-encoded), ``quiet`` (seconds without a
    store before each instance; default 1), ``after_ack`` (only ``when = "after_ack"``
    rules), ``follow`` (each run goes on from the last one's end: the after-ack passes)."""
    archive, p = ctx.archive, check_params(ctx.params)
    routes = archive.routing.routes if archive.routing is not None else None
    rules = [r for r in (routes.store_as if routes is not None else ())
             if not p.get("after_ack") or r.when == "after_ack"]
    if not rules:
        raise JobError("no [[store_as]] rule" + (' with when = "after_ack"' if p.get("after_ack") else "")
                       + " in the routes file (--routes FILE): nothing to re-encode to")
    scope = StoreAs("match", match_alternatives(p["match"]), "") if p.get("match") else None
    throttle = Throttle(p.get("rate"), p.get("bytes_rate"))
    quiet = 1.0 if p.get("quiet") is None else float(p["quiet"])
    dry_run = bool(p.get("dry_run"))
    progress = ctx.progress
    report = Report.from_dict(progress.detail)
    report.dry_run = dry_run
    cp = dict(ctx.checkpoint)
    latest = archive.index.latest_change()
    top = latest.sequence if latest is not None else 0
    if "upto" not in cp or (p.get("follow") and cp.get("after", 0) >= cp["upto"]):
        cp = {"after": cp.get("after", 0), "upto": top}
        if progress.total is None or p.get("follow"):
            progress.total = (progress.done + progress.skipped + progress.failed
                              + (archive.index.count() if not p.get("follow") else _pending(archive, cp)))
    counts = {"done": progress.done, "skipped": progress.skipped, "failed": progress.failed}
    throttled0 = report.throttled_seconds

    def save(checkpoint: dict) -> None:
        report.throttled_seconds = throttled0 + throttle.slept
        ctx.save(checkpoint, total=progress.total, detail=report.as_dict(), **counts)

    if cp.get("in_flight"):  # the switch a stop interrupted: finished (or undone) first
        fl = cp.pop("in_flight")
        if _settled(archive, fl):
            report.count(Outcome("done", "", fl["from"], fl["to"], fl["before"], fl["after"]))
            counts["done"] += 1
            cp["after"] = fl["seq"]
        save(cp)
    last_save, since_save = time.monotonic(), 0
    encoded = 0
    for change in _walk(archive.index, cp["after"], cp["upto"]):
        if p.get("limit") is not None and encoded >= p["limit"]:
            break
        report.yielded_seconds += _yield_to_stores(archive, quiet)
        loc = archive.index.locate(change.sop_uid)
        throttle.take(loc.size if loc is not None else 0)

        def before_switch(o: Outcome) -> None:  # durable first: a stop during the switch is counted once
            save({**cp, "in_flight": {"seq": change.sequence, "sop": change.sop_uid, "from": o.from_ts,
                                      "to": o.to_ts, "before": o.before, "after": o.after}})

        try:
            o = recompress_instance(archive, change.sop_uid, rules, scope, dry_run=dry_run,
                                    before_switch=before_switch)
        except (OSError, InstanceError) as e:  # this instance's storage: kept as it is, the job goes on
            o = Outcome("failed", f"{type(e).__name__}: {getattr(e, 'message', None) or e}")
        counts[o.kind] += 1
        report.count(o)
        if o.kind == "failed":
            log.warning("recompress: instance %s kept as stored: %s", change.sop_uid, o.why)
            if len(report.failures) < MAX_LISTED:
                report.failures.append({"SOPInstanceUID": change.sop_uid, "why": o.why})
        if o.kind == "done":
            encoded += 1
        cp["after"] = change.sequence
        since_save += 1
        if o.kind == "done" or since_save >= SAVE_EVERY or time.monotonic() - last_save >= SAVE_SECONDS:
            save(cp)
            last_save, since_save = time.monotonic(), 0
    save(cp)
    return {**report.as_dict(), **counts}


def _pending(archive, cp: dict) -> int:
    """How many items a follow pass has (rows after the checkpoint: an upper bound)."""
    return max(0, cp["upto"] - cp["after"])


def _walk(index, after: int, upto: int) -> Iterator[Change]:
    """The change-log rows after ``after`` up to ``upto`` that made an instance's current
    version (module docstring), in Sequence order."""
    while after < upto:
        page = index.changes(after=after, limit=PAGE)
        if not page:
            return
        for c in page:
            if c.sequence > upto:
                return
            after = c.sequence
            if c.action in ("create", "update", "restore") and c.state == "current":
                yield c


def _yield_to_stores(archive, quiet: float) -> float:
    """Wait while the archive is storing (the change log got a row in the last ``quiet``
    seconds, on any node; or this process has a store in flight), at most MAX_YIELD
    seconds; returns the seconds waited."""
    if quiet <= 0:
        return 0.0
    started = time.monotonic()
    while time.monotonic() - started < MAX_YIELD:
        latest = archive.index.latest_change()
        busy = getattr(archive, "_in_flight", 0) > 0 or (latest is not None and time.time() - latest.timestamp < quiet)
        if not busy:
            break
        time.sleep(min(0.2, quiet))
    return time.monotonic() - started if time.monotonic() - started > 0.01 else 0.0


def _rule_for(rules: list[StoreAs], rec: InstanceRecord) -> StoreAs | None:
    return next((r for r in rules if r.matches(rec)), None)


def recompress_instance(archive, sop_uid: str, rules: list[StoreAs], scope: StoreAs | None = None, *,
                        dry_run: bool = False, settle: float | None = None,
                        before_switch: Callable[[Outcome], None] | None = None) -> Outcome:
    """Re-encode one stored instance by the first of ``rules`` that matches it (and
    ``scope``, when given), verified lossless, and switch the index to it (module
    docstring). ``before_switch(outcome)`` runs once the new file is verified, before
    anything changes (the job's checkpoint). A dry run encodes and measures only."""
    index, blobs = archive.index, archive.blobs
    loc = index.locate(sop_uid)
    if loc is None:
        return Outcome("skipped", "no longer stored")
    if main_file(loc.path) is not None:  # a switch a crash interrupted (its checkpoint was lost)
        if dry_run:
            return Outcome("skipped", "a switch to finish")
        finish(archive, sop_uid)
        return Outcome("skipped", "already in its syntax")
    with blobs.local_copy(loc.path) as local:
        rec = describe_instance(local, bulk_threshold=archive.settings.bulk_threshold)
        if scope is not None and not scope.matches(rec):
            return Outcome("skipped", "outside the match")
        rule = _rule_for(rules, rec)
        if rule is None:
            return Outcome("skipped", "no rule matches")
        if rule.lossy:  # re-encoding here keeps the SOP Instance UID: lossless only (PS3.3 C.7.6.1.1.5)
            return Outcome("skipped", "its rule is lossy: a lossy copy is a new instance, made on arrival only")
        if loc.transfer_syntax_uid == rule.transfer_syntax:
            return Outcome("skipped", "already in its syntax")
        if loc.transfer_syntax_uid in LOSSY:  # its pixels are the lossy ones: a lossless copy is bigger
            return Outcome("skipped", STORED_LOSSY)
        if loc.pixel is None:
            return Outcome("skipped", "no pixel data")
        tmp, problem = ingest.encode_verified(Path(local), rule.transfer_syntax, blobs.spool)
    if tmp is None:
        return Outcome("failed", problem) if problem else Outcome("skipped", "no pixel data")
    try:
        new = describe_instance(tmp, bulk_threshold=archive.settings.bulk_threshold)
        if (new.study_uid, new.series_uid, new.sop_uid, new.sop_class_uid) != \
                (loc.study_uid, loc.series_uid, loc.sop_uid, loc.sop_class_uid):
            return Outcome("failed", "the re-encoded file names other UIDs")
        if new.size >= loc.size:  # (noise, or already well compressed): the new file goes, nothing switched
            return Outcome("skipped", NOT_SMALLER)
        o = Outcome("done", "", loc.transfer_syntax_uid, rule.transfer_syntax, loc.size, new.size)
        if dry_run:
            return o
        if before_switch is not None:
            before_switch(o)
        if not _switch(archive, loc, new, tmp, SETTLE if settle is None else settle):
            return Outcome("skipped", "changed meanwhile")
        return o
    finally:
        tmp.unlink(missing_ok=True)


def _spool_copy(archive, source: Path, name: str) -> Path:
    """A second name (or copy, across file systems) of ``source`` in the spool folder."""
    dest = archive.blobs.spool / name
    dest.unlink(missing_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)
    return dest


def _switch(archive, loc, new: InstanceRecord, tmp: Path, settle: float) -> bool:
    """Steps 1-5 of the module docstring; False when the row changed since ``loc`` was read
    (nothing switched)."""
    index, blobs = archive.index, archive.blobs
    main, side = loc.path, side_file(loc.path)
    with archive._tracked(), blobs.locked([loc.sop_uid]), index.locked([loc.sop_uid]):
        now = index.locate(loc.sop_uid)
        if now is None or (now.path, now.size, now.transfer_syntax_uid) != (loc.path, loc.size,
                                                                          loc.transfer_syntax_uid):
            return False
        link = _spool_copy(archive, tmp, f"side-{loc.sop_uid}.dcm")
        try:  # 1. the side file (an earlier run's, no row naming it: we hold the locks, the row names F)
            if blobs.place(link, side, sync_dir=True, synced=True) is Placed.EXISTS:
                blobs.replace(link, side)
        finally:
            link.unlink(missing_ok=True)
        faults.point("recompress-side")
        new.path = side
        with archive.committer.writer():  # 2.
            switched = index.refile(new, main)
        if not switched:  # (locate said otherwise a moment ago: a DELETE without these locks)
            blobs.remove(side)
            return False
        faults.point("recompress-switched")
        time.sleep(settle)
        blobs.replace(tmp, main)  # 3. files: a rename over it, then its folder fsynced
        faults.point("recompress-replaced")
        new.path = main
        with archive.committer.writer():  # 4.
            back = index.refile(new, side)
        faults.point("recompress-refiled")
        if back:  # (else deleted or rejected meanwhile: the side file is what its row names)
            time.sleep(settle)
            blobs.remove(side)  # 5.
    return True


def finish(archive, sop_uid: str) -> bool:
    """Finish the switch of an instance whose row names its side file (a crash between
    commits 1 and 4), or remove a side file its row does not name; under its locks.
    True when something was done."""
    index, blobs = archive.index, archive.blobs
    with archive._tracked(), blobs.locked([sop_uid]), index.locked([sop_uid]):
        loc = index.locate(sop_uid)
        if loc is None:
            return False
        main = main_file(loc.path)
        if main is None:  # the row names its main file: a side file left after commit 4 goes
            side = side_file(loc.path)
            if blobs.exists(side):
                blobs.remove(side)
                return True
            return False
        with blobs.local_copy(loc.path) as local:
            tmp = _spool_copy(archive, Path(local), f"finish-{sop_uid}.dcm")
        try:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            rec = describe_instance(tmp, bulk_threshold=archive.settings.bulk_threshold)
            blobs.replace(tmp, main)
            rec.path = main
            with archive.committer.writer():
                back = index.refile(rec, loc.path)
            if back:
                blobs.remove(loc.path)
        finally:
            tmp.unlink(missing_ok=True)
        log.info("recompress: the interrupted switch of instance %s finished", sop_uid)
        return True


def _settled(archive, fl: dict) -> bool:
    """After a stop: the switch of the instance in flight finished (or its leftovers
    removed), and whether the instance is now the re-encoded file the checkpoint names."""
    finish(archive, fl["sop"])
    loc = archive.index.locate(fl["sop"])
    return loc is not None and loc.transfer_syntax_uid == fl["to"] and loc.size == fl["after"] \
        and main_file(loc.path) is None


# --- after the acknowledgement ---------------------------------------------------------------

#: the job's parameters in the server's after-ack passes
AFTER_ACK_PARAMS = {"after_ack": True, "follow": True}


def after_ack_pass(archive, resume_file: Path) -> Progress | None:
    """One pass over the instances that arrived since the last one, re-encoded by the
    ``when = "after_ack"`` rules (the job, its checkpoint in ``resume_file``); None when
    another process of this node is running one (an ``flock`` on the file's lock)."""
    lock = resume_file.with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return run_inline("recompress", AFTER_ACK_PARAMS, archive, resume_file)[1]
    finally:
        os.close(fd)


async def after_ack_periodically(archive, interval: float | None = None) -> None:
    """The server's after-ack passes (:func:`after_ack_pass`) every ``interval`` seconds
    (default :data:`AFTER_ACK_INTERVAL`) while the routes file has a ``when = "after_ack"``
    rule; one process of a node at a time."""
    from ..periodic import every

    resume_file = Path(archive.settings.data_dir) / "recompress-after-ack.json"
    await every(AFTER_ACK_INTERVAL if interval is None else interval,
                lambda: after_ack_pass(archive, resume_file), "recompress after the acknowledgement", log)

"""Retention and quotas: which stored studies go, when, and what a full archive refuses.

The policy file (``--retention FILE``, ``DICOMWEB_RETENTION_FILE``; TOML, in the style of
the routes file, routing/rules.py)::

    protect_recent = 1          # days: a study with an instance received this recently never goes

    [[rules]]                   # tried in order; a study takes the first rule that matches it
    name = "CT after ten years"
    match = { Modality = "CT", SourceApplicationEntityTitle = "SCANNER1" }   # optional
    older_than = 3650           # days; without it the rule only allows removal by the quota
    by = "StudyDate"            # or "received" (the latest arrival of its stored instances)
    action = "delete"           # or "reject" (Data Retention Policy Expired, 113039^DCM)
    when_delivered = true       # only once every routing forward of the study is delivered

    [quota]                     # the archive's own bytes: the index's sum of the stored sizes
    high = "800 GB"             # past it a run removes the oldest studies the rules allow ...
    low = "700 GB"              # ... until the stored bytes are at or below this
    hard = "900 GB"             # a store that would pass it is refused: 0xA700 / 507

A rule's ``match`` is the routes file's (:func:`routing.rules.match_alternatives`: QIDO-RS
matching keys, PS3.18 §8.3.4), tried with the routing rule index (routing/matcher.py)
against the first instance of each series of the study: the study matches when one of
them does. ``SourceApplicationEntityTitle`` (0002,0016), the calling AE title the DIMSE
front door writes into the file meta (PS3.10 §7.1), is also a key (exact values, or
wildcards ``*``/``?``); a study stored by STOW-RS has none, and matches no such rule.

A run (:func:`run`) first plans (:func:`plan`: what a ``--dry-run`` lists), then removes
each planned study through the archive's own paths: :meth:`archive.Archive.delete` (a
``delete`` change-log row per instance, webhooks told, files removed) or
:func:`lifecycle.reject.reject_stored` with ``113039^DCM`` (PS3.16 CID 7011 "Data Retention
Policy Expired"; the files kept ``keep_rejected`` days, then purged). Each run is written to
the audit log, when one is configured.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pydicom
from pydantic import ByteSize, TypeAdapter, ValidationError

from .. import metrics
from ..config_values import name_problem
from ..dicom.matching import Match, level_values, match_value
from ..lifecycle.reject import reject_stored
from ..routing.matcher import RuleIndex
from ..routing.rules import _line_of, match_alternatives, split_sources

if TYPE_CHECKING:
    from ..archive import Archive
    from ..store.base import InstanceLocation

log = logging.getLogger(__name__)
audit_log = logging.getLogger("dicomweb_server.audit")  # api/auth.py's: configured by serve or the command

#: PS3.16 CID 7011 "Data Retention Policy Expired": the code a rejecting rule uses
RETENTION_EXPIRED = "113039^DCM"
DAY = 86400.0
_BYTES = TypeAdapter(ByteSize)


class PolicyError(ValueError):
    """The retention policy file cannot be used; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class RetentionRule:
    name: str
    alternatives: tuple[tuple[Match, ...], ...]  # QIDO-RS matches (routing/rules.py)
    sources: tuple[re.Pattern[str], ...] = ()  # SourceApplicationEntityTitle values (any of them)
    older_than: float | None = None  # days
    by: str = "received"  # "StudyDate" or "received"
    action: str = "delete"  # "delete" or "reject"
    when_delivered: bool = False

    def matches(self, view: _InstanceView) -> bool:
        if self.sources and not any(p.fullmatch(view.source or "") for p in self.sources):
            return False
        return any(all(_match(m, view) for m in conj) for conj in self.alternatives)


def _match(m: Match, view: _InstanceView) -> bool:
    return match_value(m, getattr(view, m.attribute.level).get(m.attribute.keyword))


@dataclass(frozen=True, slots=True)
class Quota:
    high: int | None = None  # bytes
    low: int | None = None
    hard: int | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[RetentionRule, ...] = ()
    quota: Quota = Quota()
    protect_recent: float = 1.0  # days
    _index: RuleIndex | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", RuleIndex(self.rules))

    def rule_for(self, views: list[_InstanceView]) -> RetentionRule | None:
        """The first rule (file order) that one of the study's instances matches."""
        found = [self.rules.index(r) for v in views for r in self._index.matching(v)[:1]]  # type: ignore[union-attr]
        return self.rules[min(found)] if found else None


class _InstanceView:
    """An instance as the rules see it: the index's values of its three levels (from its
    stored DICOM JSON) and, read from its file only when a rule asks, the Source AE Title."""

    def __init__(self, archive: Archive, loc: InstanceLocation, meta: dict) -> None:
        self._archive, self._loc = archive, loc
        self.study = level_values(meta, "study")
        self.series = level_values(meta, "series")
        self.instance = level_values(meta, "instance")

    @cached_property
    def source(self) -> str | None:
        try:
            with self._archive.blobs.local_copy(self._loc.path) as local:
                meta = pydicom.filereader.read_file_meta_info(local)
        except Exception as e:  # noqa: BLE001 - a file that cannot be read matches no source
            log.warning("retention: cannot read the file meta of %s: %s", self._loc.path, e)
            return None
        value = meta.get("SourceApplicationEntityTitle")
        return str(value).strip() if value else None


# --- the policy file ----------------------------------------------------------------------

_RULE_KEYS = {"name", "match", "older_than", "by", "action", "when_delivered"}


def load_policy(path: Path | str) -> Policy:
    """Read and check a retention policy file. Raises :class:`PolicyError` naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"{path}: cannot read the retention policy: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{path}: not valid TOML: {e}") from None

    def fail(index: int, key: str | None, message: str) -> PolicyError:
        line = _line_of(text, "rules", index, key)
        return PolicyError(f"{path}: " + (f"line {line}: " if line else "") + f"[[rules]] #{index + 1}"
                           + (f" {key}" if key else "") + f": {message}")

    unknown = set(doc) - {"rules", "quota", "protect_recent"}
    if unknown:
        raise PolicyError(f"{path}: unknown top-level key(s) {sorted(unknown)}; "
                          "expected protect_recent, [[rules]], [quota]")
    protect = doc.get("protect_recent", 1.0)
    if isinstance(protect, bool) or not isinstance(protect, (int, float)) or not 0 <= protect <= 36500:
        raise PolicyError(f"{path}: protect_recent: a number of days from 0 to 36500 is required")
    tables = doc.get("rules", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise PolicyError(f"{path}: 'rules' must be an array of tables: [[rules]]")
    rules = tuple(_rule(r, i, fail) for i, r in enumerate(tables))
    names = [r.name for r in rules]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail(i, "name", f"rule {name!r} is defined twice")
    return Policy(rules, _quota(doc.get("quota", {}), path), float(protect))


def _rule(r: dict, i: int, fail) -> RetentionRule:
    extra = set(r) - _RULE_KEYS
    if extra:
        raise fail(i, sorted(extra)[0], "unknown field; expected " + ", ".join(sorted(_RULE_KEYS)))
    name = r.get("name", f"rule {i + 1}")
    if problem := name_problem(name):
        raise fail(i, "name", problem)
    try:
        match, sources = split_sources(r.get("match", {}))
        alternatives = match_alternatives(match)
    except ValueError as e:
        raise fail(i, "match", str(e)) from None
    older = r.get("older_than")
    if older is not None and (isinstance(older, bool) or not isinstance(older, (int, float))
                              or not 0 < older <= 36500):
        raise fail(i, "older_than", "a number of days from 0 (exclusive) to 36500 is required")
    by = r.get("by", "received")
    if by not in ("StudyDate", "received"):
        raise fail(i, "by", f"{by!r}: expected \"StudyDate\" or \"received\"")
    action = r.get("action", "delete")
    if action not in ("delete", "reject"):
        raise fail(i, "action", f"{action!r}: expected \"delete\" or \"reject\"")
    delivered = r.get("when_delivered", False)
    if not isinstance(delivered, bool):
        raise fail(i, "when_delivered", "true or false is required")
    return RetentionRule(name, alternatives, sources, float(older) if older is not None else None, by, action,
                         delivered)


def _quota(q: object, path: Path) -> Quota:
    if not isinstance(q, dict):
        raise PolicyError(f"{path}: [quota] must be a table")
    extra = set(q) - {"high", "low", "hard"}
    if extra:
        raise PolicyError(f"{path}: [quota] {sorted(extra)[0]}: unknown; expected high, low, hard")
    sizes: dict[str, int] = {}
    for key, value in q.items():
        try:
            sizes[key] = int(_BYTES.validate_python(value))
        except ValidationError:
            raise PolicyError(f"{path}: [quota] {key}: {value!r} is not a size (bytes, or \"800 GB\", "
                              "\"1.5 TiB\")") from None
        if sizes[key] <= 0:
            raise PolicyError(f"{path}: [quota] {key}: must be more than 0 bytes")
    high, low, hard = sizes.get("high"), sizes.get("low"), sizes.get("hard")
    if (high is None) != (low is None):
        raise PolicyError(f"{path}: [quota]: give both high and low (the watermarks), or neither")
    if high is not None and low >= high:  # type: ignore[operator]
        raise PolicyError(f"{path}: [quota]: low ({low} bytes) must be below high ({high} bytes)")
    if hard is not None and high is not None and hard < high:
        raise PolicyError(f"{path}: [quota]: hard ({hard} bytes) must be at least high ({high} bytes)")
    return Quota(high, low, hard)


# --- planning -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Removal:
    """A study a run removes, and why."""

    study_uid: str
    study_date: str | None  # DA YYYYMMDD, as stored
    received: float  # the latest arrival of its stored instances (seconds since the epoch)
    size: int  # bytes of its stored instances
    instances: int
    rule: str
    action: str  # "delete" or "reject"
    reason: str  # "expired: ..." or "quota: ..."

    def as_dict(self) -> dict:
        return {"study": self.study_uid, "date": self.study_date, "received": _iso(self.received),
                "size": self.size, "instances": self.instances, "rule": self.rule, "action": self.action,
                "reason": self.reason}


@dataclass(slots=True)
class Plan:
    removals: list[Removal]
    stored_bytes: int  # the index's sum before the run
    now: float

    @property
    def bytes(self) -> int:
        return sum(r.size for r in self.removals)


@dataclass(slots=True)
class _Candidate:
    study_uid: str
    study_date: str | None
    received: float
    size: int
    instances: int
    rule: RetentionRule

    def age_key(self) -> float:
        """When the study counts as from, by its rule (the quota's oldest-first order)."""
        if self.rule.by == "StudyDate":
            day = _date(self.study_date)
            if day is not None:
                return day
        return self.received


def _date(da: str | None) -> float | None:
    try:
        return datetime.strptime(da[:8], "%Y%m%d").replace(tzinfo=UTC).timestamp() if da else None
    except ValueError:
        return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _candidate(archive: Archive, policy: Policy, study_uid: str, received: float) -> _Candidate | None:
    """The study with the rule that governs it, or None when no rule matches (it never goes)."""
    locs = archive.index.instances(study_uid)
    if not locs:
        return None
    firsts: dict[str, InstanceLocation] = {}
    for loc in locs:
        firsts.setdefault(loc.series_uid, loc)
    views = []
    for loc in firsts.values():
        meta = archive.index.metadata(study_uid, loc.series_uid, loc.sop_uid)
        if meta:
            views.append(_InstanceView(archive, loc, orjson.loads(meta[0])))
    rule = policy.rule_for(views)
    if rule is None:
        return None
    date = views[0].study.get("StudyDate") if views else None
    return _Candidate(study_uid, date if isinstance(date, str) else None, received, sum(x.size for x in locs),
                      len(locs), rule)


def _undelivered(archive: Archive, study_uid: str) -> dict[str, int]:
    return archive.routing.outbox.undelivered(study_uid) if archive.routing is not None else {}


def plan(archive: Archive, policy: Policy, now: float | None = None) -> Plan:
    """What a run at ``now`` removes: first every study its rule says has expired, then,
    while the stored bytes are past the high watermark, the oldest of the other studies a
    rule allows, until they are at or below the low one. A study with an instance received
    within ``protect_recent``, one no rule matches, and (``when_delivered``) one with a
    forward not delivered never go."""
    now = time.time() if now is None else now
    stored = archive.index.counts().stored_bytes
    protect_after = now - policy.protect_recent * DAY
    candidates: list[_Candidate] = []
    for study_uid, (_first, latest) in sorted(archive.index.received().items(), key=lambda kv: kv[1]):
        if latest >= protect_after:
            continue
        c = _candidate(archive, policy, study_uid, latest)
        if c is None or (c.rule.when_delivered and _undelivered(archive, study_uid)):
            continue
        candidates.append(c)
    removals: list[Removal] = []
    left: list[_Candidate] = []
    for c in candidates:
        older = c.rule.older_than
        if older is not None:
            since = _date(c.study_date) if c.rule.by == "StudyDate" else c.received
            if since is not None and since < now - older * DAY:
                what = f"StudyDate {c.study_date}" if c.rule.by == "StudyDate" else f"received {_iso(c.received)}"
                removals.append(_removal(c, f"expired: {what} is more than {older:g} days old"))
                continue
        left.append(c)
    after = stored - sum(r.size for r in removals)
    high, low = policy.quota.high, policy.quota.low
    if high is not None and low is not None and after > high:
        for c in sorted(left, key=lambda c: (c.age_key(), c.study_uid)):
            if after <= low:
                break
            removals.append(_removal(c, f"quota: {after} bytes stored, past the high watermark of {high} "
                                        f"(down to {low})"))
            after -= c.size
    return Plan(removals, stored, now)


def _removal(c: _Candidate, reason: str) -> Removal:
    return Removal(c.study_uid, c.study_date, c.received, c.size, c.instances, c.rule.name, c.rule.action, reason)


# --- running --------------------------------------------------------------------------------


@dataclass(slots=True)
class Report:
    plan: Plan
    dry_run: bool
    done: list[Removal] = field(default_factory=list)
    skipped: list[tuple[Removal, str]] = field(default_factory=list)  # not removed after all, and why

    def summary(self) -> str:
        if self.dry_run:
            return (f"would remove {len(self.plan.removals)} study(ies), {self.plan.bytes} bytes "
                    f"({self.plan.stored_bytes} bytes stored)")
        return (f"removed {len(self.done)} study(ies), {sum(r.size for r in self.done)} bytes "
                f"({self.plan.stored_bytes} bytes stored before)"
                + (f"; {len(self.skipped)} left: received or changed meanwhile" if self.skipped else ""))


def run(archive: Archive, policy: Policy, dry_run: bool = False, now: float | None = None,
        user: str = "server") -> Report:
    """Plan, and (unless ``dry_run``) remove what the plan names, each study checked again
    just before (an instance received since the plan, or a forward owed since, keeps it).
    Audited either way."""
    p = plan(archive, policy, now)
    report = Report(p, dry_run)
    if not dry_run:
        for r in p.removals:
            why = _still_removable(archive, policy, r, time.time() if now is None else p.now)
            if why is not None:
                report.skipped.append((r, why))
                continue
            if r.action == "reject":
                reject_stored(archive, r.study_uid, None, RETENTION_EXPIRED, now)
            else:
                archive.delete(r.study_uid)
            metrics.RETENTION_REMOVED.labels(r.action, r.reason.partition(":")[0]).inc()
            report.done.append(r)
    _audit(report, user)
    log.info("retention: %s", report.summary())
    return report


def _still_removable(archive: Archive, policy: Policy, r: Removal, now: float) -> str | None:
    latest = archive.index.received(r.study_uid).get(r.study_uid)
    if latest is None:
        return "no longer stored"
    if latest[1] != r.received or latest[1] >= now - policy.protect_recent * DAY:
        return "an instance was received since the plan"
    rule = next(x for x in policy.rules if x.name == r.rule)
    if rule.when_delivered and _undelivered(archive, r.study_uid):
        return "a forward is owed since the plan"
    return None


def _audit(report: Report, user: str) -> None:
    items = report.plan.removals if report.dry_run else report.done
    audit_log.info(orjson.dumps({
        "time": _iso(time.time()), "action": "retention", "user": user, "dry_run": report.dry_run,
        "stored_bytes": report.plan.stored_bytes, "bytes": sum(r.size for r in items),
        "studies": [r.as_dict() for r in items],
        "skipped": [{"study": r.study_uid, "why": why} for r, why in report.skipped],
    }).decode())


# --- the hard limit (archive.py's store path) ------------------------------------------------


#: seconds a process trusts its last reading of the index's stored bytes (plus what it placed
#: since): the sum is a scan of the size index, ~0.25 s at a million instances (SQLite)
HARD_LIMIT_REFRESH = 1.0


class HardLimit:
    """The ``[quota] hard`` check of one archive process: the stored bytes as the index
    counted them at most :data:`HARD_LIMIT_REFRESH` seconds ago, plus the instances this
    process let through since (deletes elsewhere are seen at the next reading)."""

    def __init__(self, hard: int) -> None:
        self.hard = hard
        self._lock = threading.Lock()
        self._read_at = -HARD_LIMIT_REFRESH
        self._stored = 0

    def room(self, archive: Archive) -> int:
        """Bytes a store may still add."""
        with self._lock:
            if time.monotonic() - self._read_at >= HARD_LIMIT_REFRESH:
                self._stored = archive.index.counts().stored_bytes
                self._read_at = time.monotonic()
            return self.hard - self._stored

    def take(self, size: int) -> None:
        """An instance of ``size`` bytes let through (counted until the next reading)."""
        with self._lock:
            self._stored += size

    def refused(self, size: int, room_left: int) -> str:
        return (f"the archive's hard storage limit of {self.hard} bytes would be passed: "
                f"{self.hard - room_left} bytes stored, this instance is {size} bytes "
                "(retention policy [quota] hard)")


# --- in the server ----------------------------------------------------------------------------


@contextmanager
def _node_lock(data_dir: Path):
    """One run at a time on this node: an exclusive ``flock``, not waited for (True when held)."""
    fd = os.open(Path(data_dir) / "retention.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def run_once(archive: Archive, policy: Policy) -> Report | None:
    """A run unless another process of this node is running one (None then)."""
    with _node_lock(archive.settings.data_dir) as held:
        return run(archive, policy) if held else None


async def run_periodically(archive: Archive, policy: Policy, interval: float) -> None:
    """The server's retention (as lifecycle/reject.py's purge): every ``interval`` seconds,
    the first one ``interval`` after start; each worker tries, one runs at a time per node."""
    from ..periodic import every

    await every(interval, lambda: run_once(archive, policy), "retention run failed", log)

"""The routes file (``--routes FILE``, TOML): destinations, rules and delivery knobs.

::

    [[destinations]]
    name = "pacs"
    stow_url = "https://pacs.example/dicom-web"          # STOW-RS to this root (PS3.18 §10.5)
    headers = { Authorization = "Bearer ..." }            # optional
    # or: dimse = { ae_title = "PACS", host = "pacs.example", port = 104, calling_ae_title = "DICOMWEB" }
    #     (+ tls = true, tls_ca_file, tls_cert_file, tls_key_file: DICOM TLS, dimse/tls.py)
    # or: webhook = { url = "https://hooks.example/dicom", secret = "...", stable_after = 60 }
    #     (every change, and optionally "study stable" events: routing/webhook.py)
    deidentify = "basic"                                  # optional: PS3.15 Annex E on the way out (deid/)
    deidentify_options = ["retain_modified_dates"]        # optional: the profile's options
    project = "trial-a"                                   # its secret and pseudonyms (default: the name)
    allow_burned_in = false                               # default: burned-in annotation is dead-lettered
    safe_private = ["ACME 1.0:0009:02"]                   # with retain_safe_private: private elements kept

    [[rules]]
    name = "CT and MR to the PACS"
    match = { Modality = ["CT", "MR"], StudyDescription = "*HEAD*" }  # optional
    destinations = ["pacs"]
    on = ["store", "update"]   # optional, default ["store"]: also forward each new version
    labels = ["radio"]  # optional: the study of a matching instance gets these labels (access/filter.py)

    [[rules]]           # labels on arrival by how the instance came (access/labels_in.py); labels only
    match = { SourceApplicationEntityTitle = ["ECHO*"] }  # the C-STORE calling AE title (wildcards * ?)
    stow_prefix = "cardio"   # or/and: STOW-RS to {prefix}/cardio/studies (a list: any of them)
    labels = ["cardio"]

    [delivery]          # optional, the defaults shown (allowed ranges: DELIVERY_BOUNDS)
    batch_size = 20     concurrency = 2     max_attempts = 10    max_age = 86400
    backoff_base = 1.0  backoff_max = 300   poll_interval = 1.0  lease = 120   timeout = 60
    keep_delivered = 86400

    [[store_as]]        # optional: compress on ingest, first matching rule wins (policy/ingest.py)
    name = "CT lossless"
    match = { Modality = "CT" }     # QIDO-RS matching keys, as for [[rules]]
    store_as = "jpeg-ls-lossless"   # or "j2k-lossless", "htj2k-lossless", "htj2k-rpcl-lossless",
                                    # "rle-lossless"; lossy only with lossy = true:
                                    # "j2k-lossy", "htj2k-lossy", "jpeg-baseline" (a new SOP
                                    # Instance UID, PS3.3 C.7.6.1.1.5: policy/ingest.py)
    when = "before_ack"             # or "after_ack" (lossless only): stored as received,
                                    # re-encoded in the background (policy/recompress.py)

A rule's ``match`` holds QIDO-RS matching keys (PS3.18 §8.3.4, PS3.4 C.2.2.2) and is
parsed by the same :func:`dicom.matching.parse_query` as a search for instances, then
evaluated with :func:`dicom.matching.match_value` against the values the index keeps
for the stored instance: a rule matches exactly the instances that the search
``GET /instances?{match}`` finds. A TOML list of values, or values separated by a
backslash as in DICOM (``Modality = "CT\\MR"``), means "any of them".
No ``match`` means every instance. ``SourceApplicationEntityTitle`` (0002,0016) in a
``match`` is the calling AE title of the DIMSE association that stored the instance
(exact values, or wildcards ``*``/``?``; as in the retention policy, policy/retention.py),
and ``stow_prefix`` names the STOW-RS doors (``POST {prefix}/{name}/studies``,
api/stow.py) it came through: an instance another way (STOW-RS for the first,
C-STORE or the plain ``/studies`` for the second) matches no such rule. Both say how
an instance arrived, which only its first store knows: a rule with them may give
labels, not destinations. ``on`` says which events a rule forwards: ``store``
(an instance first indexed, the default) and ``update`` (a new version made by
``$update``, ``$merge``, ``$restore`` or a re-store under ``duplicate_policy =
"replace"``: lifecycle/update.py), matched against the new version. A bad file is refused with its line number, and so
is any value outside its range (:data:`DELIVERY_BOUNDS`, ``lease`` at least twice
``timeout``), a header that is not an RFC 9110 field, and a name that is not one
printable line (config_values.py).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..access.filter import validate_label
from ..config_values import PORT, Bound, ae_title_problem, header_problem, host_problem, name_problem
from ..deid import profile as deid_profile
from ..deid.apply import parse_safe_private
from ..deid.export import Spec
from ..dicom.instance import InstanceRecord
from ..dimse.tls import TLS_KEYS, TlsClient, TlsError, parse_client
from ..dicom.matching import Match, QueryError, match_value, parse_query, wildcard_regex
from .matcher import RuleIndex


class RoutesError(ValueError):
    """The routes file cannot be used; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class DimseAddress:
    ae_title: str
    host: str
    port: int
    calling_ae_title: str = "DICOMWEB"
    tls: TlsClient | None = None  # DICOM TLS (PS3.15 Annex B; dimse/tls.py), None: plain TCP


@dataclass(frozen=True, slots=True)
class Webhook:
    url: str
    secret: str | None = None  # HMAC-SHA256 key of the signature header (routing/webhook.py)
    stable_after: float | None = None  # seconds without a new instance of a study: a "stable" event


@dataclass(frozen=True, slots=True)
class Destination:
    name: str
    stow_url: str | None = None  # DICOMweb root; STOW-RS posts to {stow_url}/studies
    headers: dict[str, str] = field(default_factory=dict)
    dimse: DimseAddress | None = None
    webhook: Webhook | None = None  # receives every change of the change log, no rule names it
    deidentify: Spec | None = None  # de-identified on the way out (deid/export.py), else sent as stored


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    alternatives: tuple[tuple[Match, ...], ...]  # OR of AND-ed matches (a TOML list expands)
    destinations: tuple[str, ...]
    on: frozenset[str] = frozenset({"store"})  # the events it forwards (:data:`EVENTS`)
    labels: tuple[str, ...] = ()  # put on the study of each new instance that matches
    sources: tuple[re.Pattern[str], ...] = ()  # calling AE titles (match's SourceApplicationEntityTitle)
    stow_prefixes: tuple[str, ...] = ()  # STOW-RS doors (``stow_prefix``)

    def matches(self, record: InstanceRecord) -> bool:
        return any(all(_match(m, record) for m in conj) for conj in self.alternatives)

    def arrived(self, arrival: Arrival) -> bool:
        """Whether an instance that arrived so passes the rule's arrival keys (a rule
        without them: any arrival)."""
        if self.sources and not any(p.fullmatch(arrival.calling_ae or "") for p in self.sources):
            return False
        return not self.stow_prefixes or arrival.stow_prefix in self.stow_prefixes


@dataclass(frozen=True, slots=True)
class Arrival:
    """How an instance came in: the calling AE title of its C-STORE association, or the
    STOW-RS door (``stow_prefix``) it was posted to; neither: the plain STOW-RS route,
    an import (access/labels_in.py)."""

    calling_ae: str | None = None
    stow_prefix: str | None = None


NOWHERE = Arrival()


#: what a rule's ``on`` may name: an instance first indexed (``store``), a new version of
#: a stored instance (``update``: an update, merge, restore or replacing re-store)
EVENTS = ("store", "update")


@dataclass(frozen=True, slots=True)
class StoreAs:
    """A compress-on-ingest rule: instances it matches are stored in ``transfer_syntax``
    (policy/ingest.py), the first matching rule of the file winning."""

    name: str
    alternatives: tuple[tuple[Match, ...], ...]
    transfer_syntax: str
    lossy: bool = False  # a lossy syntax, which the rule had to ask for with ``lossy = true``
    #: "before_ack": encoded before the sender's success (policy/ingest.py); "after_ack": stored
    #: as received, acknowledged, then re-encoded in the background (policy/recompress.py)
    when: str = "before_ack"

    def matches(self, record: InstanceRecord) -> bool:
        return any(all(_match(m, record) for m in conj) for conj in self.alternatives)


#: when a ``[[store_as]]`` rule encodes: before the acknowledgement, or after it
STORE_AS_WHEN = ("before_ack", "after_ack")


@dataclass(frozen=True, slots=True)
class Delivery:
    batch_size: int = 20  # instances per STOW-RS request / association
    concurrency: int = 2  # batches in flight per destination, across all workers
    max_attempts: int = 10  # then dead-letter
    max_age: float = 86400.0  # seconds since enqueued; then dead-letter
    backoff_base: float = 1.0  # seconds; delay = uniform(0, min(max, base * 2**attempts)) ("full jitter")
    backoff_max: float = 300.0
    poll_interval: float = 1.0  # bounded poll for rows committed by other worker processes
    lease: float = 120.0  # a claimed batch is another worker's to retry after this many seconds
    timeout: float = 60.0  # per request / association
    keep_delivered: float = 86400.0  # seconds a delivered row is kept (the queue's counts), then removed


#: the allowed range of each ``[delivery]`` setting. Beyond them: ``lease`` at least twice
#: ``timeout`` (the forwarder cuts a send at half the lease, so that its rows are settled
#: before another worker may take them over: a longer timeout would never apply), and
#: ``backoff_max`` at least ``backoff_base``.
DELIVERY_BOUNDS: dict[str, Bound] = {
    "batch_size": Bound(1, 1000, integer=True),  # one STOW-RS request / association
    "concurrency": Bound(1, 64, integer=True),  # lanes per destination in every worker, each polling the outbox
    "max_attempts": Bound(1, 1_000_000, integer=True),
    "max_age": Bound(1, 365 * 86400),
    "backoff_base": Bound(0.001, 3600),
    "backoff_max": Bound(0.001, 86400),
    "poll_interval": Bound(0.05, 300),
    "lease": Bound(1, 86400),
    "timeout": Bound(0.1, 3600),
    "keep_delivered": Bound(1, 365 * 86400),
}


@dataclass(frozen=True, slots=True)
class Routes:
    destinations: dict[str, Destination]
    rules: tuple[Rule, ...]
    delivery: Delivery = Delivery()
    store_as: tuple[StoreAs, ...] = ()
    _index: RuleIndex | None = field(default=None, init=False, repr=False, compare=False)

    def store_as_for(self, record: InstanceRecord) -> StoreAs | None:
        """The first ``[[store_as]]`` rule that matches a received instance, if any."""
        return next((r for r in self.store_as if r.matches(record)), None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", RuleIndex(self.rules))

    def destinations_for(self, record: InstanceRecord, event: str = "store") -> list[tuple[str, str]]:
        """(destination, rule name) pairs owed for a newly stored instance (``event``
        ``store``) or a new version of one (``update``), one per destination (the first
        rule of that event that names it); the rules tried are those the index says can
        match (routing/matcher.py)."""
        out: dict[str, str] = {}
        for rule in self._index.matching(record):  # type: ignore[union-attr]
            if event not in rule.on:
                continue
            for d in rule.destinations:
                out.setdefault(d, rule.name)
        return list(out.items())

    @property
    def on_update(self) -> bool:
        """Whether a rule forwards new versions (``on`` names ``update``)."""
        return any("update" in rule.on for rule in self.rules)

    def labels_for(self, record: InstanceRecord, arrival: Arrival = NOWHERE) -> set[str]:
        """The labels the matching rules give a newly stored instance's study."""
        if not self.labelling:
            return set()
        return {label for rule in self._index.matching(record) if rule.arrived(arrival)  # type: ignore[union-attr]
                for label in rule.labels}

    @property
    def labelling(self) -> bool:
        return any(rule.labels for rule in self.rules)

    @property
    def stow_prefixes(self) -> dict[str, frozenset[str]]:
        """Every STOW-RS door the rules name -> the labels of the rules naming it."""
        out: dict[str, set[str]] = {}
        for rule in self.rules:
            for prefix in rule.stow_prefixes:
                out.setdefault(prefix, set()).update(rule.labels)
        return {k: frozenset(v) for k, v in out.items()}


def _match(m: Match, record: InstanceRecord) -> bool:
    values = getattr(record, m.attribute.level)  # record.study, .series or .instance
    return match_value(m, values.get(m.attribute.keyword))


# --- loading -------------------------------------------------------------------------------


def _line_of(text: str, table: str, index: int, key: str | None) -> int | None:
    """1-based line of ``key`` in the ``index``-th ``[[table]]`` (or of its header)."""
    header = re.compile(r"^\s*\[\[\s*" + re.escape(table) + r"\s*\]\]")
    any_header = re.compile(r"^\s*\[")
    seen, start = -1, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if header.match(line):
            seen += 1
            if seen == index:
                start = i
                break
    if start is None:
        return None
    if key is None:
        return start + 1
    pat = re.compile(r"^\s*" + re.escape(key) + r"\s*[=.]")
    for j in range(start + 1, len(lines)):
        if any_header.match(lines[j]):
            break
        if pat.match(lines[j]):
            return j + 1
    return start + 1


def load_routes(path: Path | str) -> Routes:
    """Read and check a routes file. Raises :class:`RoutesError` naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RoutesError(f"{path}: cannot read the routes file: {e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message names line and column
        raise RoutesError(f"{path}: not valid TOML: {e}") from None

    def fail(table: str, index: int, key: str | None, message: str) -> RoutesError:
        line = _line_of(text, table, index, key)
        where = f"line {line}: " if line else ""
        return RoutesError(f"{path}: {where}[[{table}]] #{index + 1}"
                           + (f" {key}" if key else "") + f": {message}")

    unknown = set(doc) - {"destinations", "rules", "delivery", "store_as"}
    if unknown:
        raise RoutesError(f"{path}: unknown top-level key(s) {sorted(unknown)}; "
                          "expected [[destinations]], [[rules]], [delivery], [[store_as]]")
    destinations: dict[str, Destination] = {}
    for i, d in enumerate(_tables(doc, "destinations", path)):
        _destination(d, i, destinations, fail)
    rules = tuple(_rule(r, i, destinations, fail) for i, r in enumerate(_tables(doc, "rules", path)))
    store_as = tuple(_store_as(r, i, fail) for i, r in enumerate(_tables(doc, "store_as", path)))
    return Routes(destinations, rules, _delivery(doc.get("delivery", {}), path, text), store_as)


def _tables(doc: dict, name: str, path: Path) -> list[dict]:
    value = doc.get(name, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RoutesError(f"{path}: '{name}' must be an array of tables: [[{name}]]")
    return value


_DEID_FIELDS = {"deidentify", "deidentify_options", "project", "allow_burned_in", "safe_private"}


def _deidentify(d: dict, i: int, name: str, fail) -> Spec | None:
    """A destination's de-identification (deid/): None when it has no ``deidentify``."""
    if "deidentify" not in d:
        if set(d) & _DEID_FIELDS:
            raise fail("destinations", i, sorted(set(d) & _DEID_FIELDS)[0], "only with deidentify = \"basic\"")
        return None
    opts = d.get("deidentify_options", [])
    if not isinstance(d["deidentify"], str) or not isinstance(opts, list) or not all(
            isinstance(o, str) for o in opts):
        raise fail("destinations", i, "deidentify", "a profile name and a list of option names are required")
    try:
        options = deid_profile.parse(d["deidentify"], opts)
    except ValueError as e:
        raise fail("destinations", i, "deidentify", str(e)) from None
    project = d.get("project", name)
    if not isinstance(project, str) or not 1 <= len(project) <= 64:
        raise fail("destinations", i, "project", "a name of 1 to 64 characters is required")
    allow = d.get("allow_burned_in", False)
    if not isinstance(allow, bool):
        raise fail("destinations", i, "allow_burned_in", "true or false")
    safe = d.get("safe_private", [])
    if not isinstance(safe, list) or not all(isinstance(t, str) for t in safe):
        raise fail("destinations", i, "safe_private", 'a list of "CREATOR:gggg:ee" strings is required')
    try:
        entries = frozenset(parse_safe_private(t) for t in safe)
    except ValueError as e:
        raise fail("destinations", i, "safe_private", str(e)) from None
    return Spec(options, project, allow_burned_in=allow, safe_private=entries)


def _destination(d: dict, i: int, out: dict[str, Destination], fail) -> None:
    extra = set(d) - {"name", "stow_url", "headers", "dimse", "webhook"} - _DEID_FIELDS
    if extra:
        raise fail("destinations", i, sorted(extra)[0],
                   "unknown field; expected name, stow_url, headers, dimse, webhook, deidentify, "
                   "deidentify_options, project, allow_burned_in, safe_private")
    name = d.get("name")
    if problem := name_problem(name):
        raise fail("destinations", i, "name", problem)
    if name.startswith(("dimse:", "job:")):  # the outbox's own jobs (dimse/commitment.py, jobs/store.py)
        raise fail("destinations", i, "name", f"{name!r}: names beginning with 'dimse:' or 'job:' are the "
                                              "archive's own")
    if name in out:
        raise fail("destinations", i, "name", f"destination {name!r} is defined twice")
    stow, dimse, hook = d.get("stow_url"), d.get("dimse"), d.get("webhook")
    if sum(x is not None for x in (stow, dimse, hook)) != 1:
        raise fail("destinations", i, None,
                   "give exactly one of stow_url (DICOMweb), dimse (C-STORE) or webhook (the change feed)")
    headers = d.get("headers", {})
    if not isinstance(headers, dict):
        raise fail("destinations", i, "headers", "a table of string values is required")
    seen: set[str] = set()
    for key, value in headers.items():
        if problem := header_problem(key, value):
            raise fail("destinations", i, "headers", problem)
        if key.lower() in seen:  # field names are case-insensitive (RFC 9110 §5.1)
            raise fail("destinations", i, "headers", f"{key} is given twice")
        seen.add(key.lower())
    deid = _deidentify(d, i, name, fail)
    if hook is not None:
        if deid is not None:
            raise fail("destinations", i, "deidentify", "a webhook is told of changes, it is sent no instances")
        out[name] = Destination(name, headers=headers, webhook=_webhook(hook, i, fail))
        return
    if stow is not None:
        if problem := _url_problem(stow):
            raise fail("destinations", i, "stow_url", problem)
        out[name] = Destination(name, stow_url=stow.rstrip("/"), headers=headers, deidentify=deid)
        return
    if not isinstance(dimse, dict):
        raise fail("destinations", i, "dimse", "a table { ae_title, host, port } is required")
    extra = set(dimse) - {"ae_title", "host", "port", "calling_ae_title", *TLS_KEYS}
    ae, host, port = dimse.get("ae_title"), dimse.get("host"), dimse.get("port")
    calling = dimse.get("calling_ae_title", "DICOMWEB")
    if extra:
        raise fail("destinations", i, "dimse", f"unknown field(s) {sorted(extra)}")
    for label, title in (("ae_title", ae), ("calling_ae_title", calling)):
        if problem := ae_title_problem(title):  # PS3.5 §6.2 AE
            raise fail("destinations", i, "dimse", f"{label}: {problem}")
    if problem := host_problem(host):
        raise fail("destinations", i, "dimse", f"host: {problem}")
    if problem := PORT.problem(port):
        raise fail("destinations", i, "dimse", f"port: {problem}")
    try:
        tls = parse_client(dimse)
    except TlsError as e:
        raise fail("destinations", i, "dimse", str(e)) from None
    out[name] = Destination(name, headers=headers,
                            dimse=DimseAddress(ae.strip(), host, port, calling.strip(), tls), deidentify=deid)


def _webhook(hook: object, i: int, fail) -> Webhook:
    if not isinstance(hook, dict):
        raise fail("destinations", i, "webhook", "a table { url, secret } is required")
    extra = set(hook) - {"url", "secret", "stable_after"}
    if extra:
        raise fail("destinations", i, "webhook",
                   f"unknown field(s) {sorted(extra)}; expected url, secret, stable_after")
    url, secret, stable = hook.get("url"), hook.get("secret"), hook.get("stable_after")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise fail("destinations", i, "webhook", f"url {url!r} is not an http(s) URL")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise fail("destinations", i, "webhook", "secret must be a non-empty string")
    if stable is not None and (isinstance(stable, bool) or not isinstance(stable, (int, float)) or stable <= 0):
        raise fail("destinations", i, "webhook", "stable_after must be a positive number of seconds")
    return Webhook(url, secret, float(stable) if stable is not None else None)


def _named(r: dict, table: str, i: int, fields: tuple[str, ...], default: str, fail) -> str:
    """The name of table ``i`` (``default`` when absent), its fields checked."""
    extra = set(r) - set(fields)
    if extra:
        raise fail(table, i, sorted(extra)[0], f"unknown field; expected {', '.join(fields)}")
    name = r.get("name", default)
    if problem := name_problem(name):
        raise fail(table, i, "name", problem)
    return name


#: a DICOMweb path segment naming a STOW-RS door: what a label may be (access/filter.py)
STOW_PREFIX_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: the segments the DICOMweb routes use: not a door's name
_RESERVED_PREFIXES = frozenset({"studies", "series", "instances", "labels", "shares", "workitems", "changefeed",
                                "v2", "admin", "viewer", "worklist", "patients", "downloads", "metrics"})
SOURCE_AE = "SourceApplicationEntityTitle"


def split_sources(match: object) -> tuple[object, tuple[re.Pattern[str], ...]]:
    """A ``match`` table without its ``SourceApplicationEntityTitle`` key, and that key's
    values as patterns (exact, or wildcards ``*``/``?``: PS3.4 C.2.2.2.4). Raises
    ValueError saying what is wrong. (The routes file's rules and the retention policy's.)"""
    if not isinstance(match, dict) or SOURCE_AE not in match:
        return match, ()
    match = dict(match)
    value = match.pop(SOURCE_AE)
    values = value if isinstance(value, list) else str(value).split("\\")
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise ValueError(f"{SOURCE_AE}: an AE title or a list of them is required")
    return match, tuple(wildcard_regex(v.strip()) for v in values)


def _stow_prefixes(r: dict, i: int, fail) -> tuple[str, ...]:
    value = r.get("stow_prefix", [])
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not isinstance(v, str) or STOW_PREFIX_RE.fullmatch(v) is None:
            raise fail("rules", i, "stow_prefix", f"{v!r}: a path segment of 1 to 64 of a-z 0-9 . _ -, "
                                                  "starting with a letter or digit, is required")
        if v in _RESERVED_PREFIXES:
            raise fail("rules", i, "stow_prefix", f"{v!r} is a DICOMweb path segment of the archive")
    return tuple(dict.fromkeys(values))


def _rule(r: dict, i: int, destinations: dict[str, Destination], fail) -> Rule:
    name = _named(r, "rules", i, ("name", "match", "destinations", "on", "labels", "stow_prefix"),
                  f"rule {i + 1}", fail)
    on = r.get("on", ["store"])
    if not isinstance(on, list) or not on or not all(isinstance(x, str) and x in EVENTS for x in on):
        raise fail("rules", i, "on", f"{on!r}: a non-empty list of {', '.join(map(repr, EVENTS))} is required")
    labels = r.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise fail("rules", i, "labels", "a list of labels is required")
    for x in labels:
        try:
            validate_label(x)
        except ValueError as e:
            raise fail("rules", i, "labels", str(e)) from None
    dests = r.get("destinations", None if not labels else [])
    if not isinstance(dests, list) or not (dests or labels) or not all(isinstance(x, str) for x in dests):
        raise fail("rules", i, "destinations", "a non-empty list of destination names is required "
                                               "(or labels)")
    for x in dests:
        if x not in destinations:
            raise fail("rules", i, "destinations", f"no destination named {x!r} "
                                                   f"(defined: {', '.join(destinations) or 'none'})")
        if destinations[x].webhook is not None:
            raise fail("rules", i, "destinations", f"{x!r} is a webhook: it receives every change, "
                                                   "no rule sends it instances")
    try:
        match, sources = split_sources(r.get("match", {}))
        alternatives = match_alternatives(match)
    except ValueError as e:
        raise fail("rules", i, "match", str(e)) from None
    prefixes = _stow_prefixes(r, i, fail)
    if (sources or prefixes) and (dests or not labels):
        raise fail("rules", i, "stow_prefix" if prefixes else "match",
                   f"{'stow_prefix' if prefixes else SOURCE_AE} says how an instance arrived: a rule with it "
                   "gives labels, and has no destinations")
    return Rule(name, alternatives, tuple(dict.fromkeys(dests)), frozenset(on), tuple(dict.fromkeys(labels)),
                sources, prefixes)


def match_alternatives(match: object) -> tuple[tuple[Match, ...], ...]:
    """A rule's ``match`` table as alternatives of QIDO-RS matches (module docstring): a
    TOML list of values, or values separated by a backslash, expand into alternatives.
    Raises ValueError saying what is wrong (the routes file's and the retention policy's
    rules: policy/retention.py)."""
    if not isinstance(match, dict):
        raise ValueError("a table of QIDO-RS matching keys is required")
    choices: list[list[tuple[str, str]]] = [[]]
    for key, value in match.items():
        # a TOML list, or DICOM's backslash between values (``"CT\\MR"``), means any of them
        values = value if isinstance(value, list) else value.split("\\") if isinstance(value, str) else [value]
        if not values or not all(isinstance(v, (str, int)) for v in values):
            raise ValueError(f"{key}: a string, integer or list of them is required")
        choices = [c + [(key, str(v))] for c in choices for v in values]
        if len(choices) > 256:
            raise ValueError("too many combinations of listed values (at most 256)")
    alternatives = []
    for params in choices:
        try:
            query = parse_query("instance", params)
        except QueryError as e:
            raise ValueError(str(e)) from None
        for m in query.matches:
            if m.attribute.computed:
                raise ValueError(f"{m.attribute.keyword} is computed over the whole study or "
                                 "series; a rule sees one instance (use Modality, SOPClassUID)")
        alternatives.append(query.matches)
    return tuple(alternatives)


#: ``store_as`` values -> transfer syntax (lossless: policy/ingest.py verifies each)
STORE_AS = {
    "jpeg-ls-lossless": "1.2.840.10008.1.2.4.80",
    "j2k-lossless": "1.2.840.10008.1.2.4.90",
    "htj2k-lossless": "1.2.840.10008.1.2.4.201",
    "htj2k-rpcl-lossless": "1.2.840.10008.1.2.4.202",  # progressive (PS3.5 10.18)
    "rle-lossless": "1.2.840.10008.1.2.5",
}
#: lossy ``store_as`` values: only in a rule that also says ``lossy = true`` (never a
#: default); the stored image is a new, derived one (PS3.3 C.7.6.1.1.5: policy/ingest.py)
LOSSY_STORE_AS = {
    "j2k-lossy": "1.2.840.10008.1.2.4.91",
    "htj2k-lossy": "1.2.840.10008.1.2.4.203",
    "jpeg-baseline": "1.2.840.10008.1.2.4.50",
}


def _store_as(r: dict, i: int, fail) -> StoreAs:
    name = _named(r, "store_as", i, ("name", "match", "store_as", "lossy", "when"), f"store_as {i + 1}", fail)
    value, lossy = r.get("store_as"), r.get("lossy", False)
    if not isinstance(lossy, bool):
        raise fail("store_as", i, "lossy", "true or false is required")
    if value in LOSSY_STORE_AS and not lossy:
        raise fail("store_as", i, "store_as", f"{value!r} is lossy: the rule must also say lossy = true "
                   "(the stored image is then a new, derived instance with a new SOP Instance UID)")
    if value in STORE_AS and lossy:
        raise fail("store_as", i, "lossy", f"{value!r} is lossless: remove lossy = true")
    if value not in STORE_AS and value not in LOSSY_STORE_AS:
        raise fail("store_as", i, "store_as", f"one of {', '.join(STORE_AS)} is required "
                   f"(or, with lossy = true, {', '.join(LOSSY_STORE_AS)})")
    when = r.get("when", "before_ack")
    if when not in STORE_AS_WHEN:
        raise fail("store_as", i, "when", f"{when!r}: one of {', '.join(map(repr, STORE_AS_WHEN))} is required")
    if lossy and when == "after_ack":  # recompress re-encodes in place (same UID): lossless only
        raise fail("store_as", i, "when", "'after_ack' re-encodes the stored instance in place, keeping its "
                   "SOP Instance UID: lossless syntaxes only (a lossy copy is a new instance, made on arrival)")
    try:
        alternatives = match_alternatives(r.get("match", {}))
    except ValueError as e:
        raise fail("store_as", i, "match", str(e)) from None
    return StoreAs(name, alternatives, STORE_AS.get(value) or LOSSY_STORE_AS[value], lossy, when)


def _url_problem(url: object) -> str | None:
    """A destination's DICOMweb root: an http(s) URL with a host, on one line."""
    if not isinstance(url, str) or any(c.isspace() or not c.isprintable() for c in url):
        return f"{url!r} is not an http(s) URL (on one line, without spaces)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as e:
        return f"{url!r}: {e}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    if problem := host_problem(parts.hostname):
        return f"{url!r}: {problem}"
    return None


def _delivery_line(text: str, key: str) -> int | None:
    """1-based line of ``key`` in the ``[delivery]`` table (the first line setting it)."""
    lines = text.splitlines()
    header = next((n for n, ln in enumerate(lines) if re.match(r"^\s*\[\s*delivery\s*\]", ln)), None)
    pat = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for n in range(header + 1 if header is not None else 0, len(lines)):
        if header is not None and re.match(r"^\s*\[", lines[n]):
            break
        if pat.match(lines[n]):
            return n + 1
    return header + 1 if header is not None else None


def _delivery(d: object, path: Path, text: str) -> Delivery:
    """The ``[delivery]`` table: known keys, each within :data:`DELIVERY_BOUNDS`, and the
    rules between them."""
    if not isinstance(d, dict):
        raise RoutesError(f"{path}: [delivery] must be a table")

    def fail(key: str, message: str) -> RoutesError:
        line = _delivery_line(text, key)
        return RoutesError(f"{path}: " + (f"line {line}: " if line else "") + f"[delivery] {key}: {message}")

    for key, value in d.items():
        if key not in DELIVERY_BOUNDS:
            raise fail(key, "unknown; known: " + ", ".join(DELIVERY_BOUNDS))
        if problem := DELIVERY_BOUNDS[key].problem(value):
            raise fail(key, problem)
    delivery = Delivery(**d)
    if delivery.lease < 2 * delivery.timeout:
        raise fail("lease" if "lease" in d else "timeout",
                   f"lease ({delivery.lease:g} s) must be at least twice timeout ({delivery.timeout:g} s): "
                   "a send is cut at half the lease, so that its outcome is recorded before another "
                   "worker may take the rows over")
    if delivery.backoff_max < delivery.backoff_base:
        raise fail("backoff_max" if "backoff_max" in d else "backoff_base",
                   f"backoff_max ({delivery.backoff_max:g} s) must be at least backoff_base "
                   f"({delivery.backoff_base:g} s)")
    return delivery

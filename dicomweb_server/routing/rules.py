"""The routes file (``--routes FILE``, TOML): destinations, rules and delivery knobs.

::

    [[destinations]]
    name = "pacs"
    stow_url = "https://pacs.example/dicom-web"          # STOW-RS to this root (PS3.18 §10.5)
    headers = { Authorization = "Bearer ..." }            # optional
    # or: dimse = { ae_title = "PACS", host = "pacs.example", port = 104, calling_ae_title = "DICOMWEB" }
    # or: webhook = { url = "https://hooks.example/dicom", secret = "...", stable_after = 60 }
    #     (every change, and optionally "study stable" events: routing/webhook.py)

    [[rules]]
    name = "CT and MR to the PACS"
    match = { Modality = ["CT", "MR"], StudyDescription = "*HEAD*" }  # optional
    destinations = ["pacs"]
    labels = ["radio"]  # optional: the study of a matching instance gets these labels (access/filter.py)

    [delivery]          # optional, the defaults shown (allowed ranges: DELIVERY_BOUNDS)
    batch_size = 20     concurrency = 2     max_attempts = 10    max_age = 86400
    backoff_base = 1.0  backoff_max = 300   poll_interval = 1.0  lease = 120   timeout = 60
    keep_delivered = 86400

A rule's ``match`` holds QIDO-RS matching keys (PS3.18 §8.3.4, PS3.4 C.2.2.2) and is
parsed by the same :func:`dicom.matching.parse_query` as a search for instances, then
evaluated with :func:`dicom.matching.match_value` against the values the index keeps
for the stored instance: a rule matches exactly the instances that the search
``GET /instances?{match}`` finds. A TOML list of values, or values separated by a
backslash as in DICOM (``Modality = "CT\\MR"``), means "any of them".
No ``match`` means every instance. A bad file is refused with its line number, and so
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
from ..dicom.instance import InstanceRecord
from ..dicom.matching import Match, QueryError, match_value, parse_query
from .matcher import RuleIndex


class RoutesError(ValueError):
    """The routes file cannot be used; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class DimseAddress:
    ae_title: str
    host: str
    port: int
    calling_ae_title: str = "DICOMWEB"


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


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    alternatives: tuple[tuple[Match, ...], ...]  # OR of AND-ed matches (a TOML list expands)
    destinations: tuple[str, ...]
    labels: tuple[str, ...] = ()  # put on the study of each new instance that matches

    def matches(self, record: InstanceRecord) -> bool:
        return any(all(_match(m, record) for m in conj) for conj in self.alternatives)


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
    _index: RuleIndex | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", RuleIndex(self.rules))

    def destinations_for(self, record: InstanceRecord) -> list[tuple[str, str]]:
        """(destination, rule name) pairs owed for a newly stored instance, one per
        destination (the first rule that names it); the rules tried are those the
        index says can match (routing/matcher.py)."""
        out: dict[str, str] = {}
        for rule in self._index.matching(record):  # type: ignore[union-attr]
            for d in rule.destinations:
                out.setdefault(d, rule.name)
        return list(out.items())

    def labels_for(self, record: InstanceRecord) -> set[str]:
        """The labels the matching rules give a newly stored instance's study."""
        if not self.labelling:
            return set()
        return {label for rule in self._index.matching(record) for label in rule.labels}  # type: ignore[union-attr]

    @property
    def labelling(self) -> bool:
        return any(rule.labels for rule in self.rules)


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

    unknown = set(doc) - {"destinations", "rules", "delivery"}
    if unknown:
        raise RoutesError(f"{path}: unknown top-level key(s) {sorted(unknown)}; "
                          "expected [[destinations]], [[rules]], [delivery]")
    destinations: dict[str, Destination] = {}
    for i, d in enumerate(_tables(doc, "destinations", path)):
        _destination(d, i, destinations, fail)
    rules = tuple(_rule(r, i, destinations, fail) for i, r in enumerate(_tables(doc, "rules", path)))
    return Routes(destinations, rules, _delivery(doc.get("delivery", {}), path, text))


def _tables(doc: dict, name: str, path: Path) -> list[dict]:
    value = doc.get(name, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RoutesError(f"{path}: '{name}' must be an array of tables: [[{name}]]")
    return value


def _destination(d: dict, i: int, out: dict[str, Destination], fail) -> None:
    extra = set(d) - {"name", "stow_url", "headers", "dimse", "webhook"}
    if extra:
        raise fail("destinations", i, sorted(extra)[0],
                   "unknown field; expected name, stow_url, headers, dimse, webhook")
    name = d.get("name")
    if problem := name_problem(name):
        raise fail("destinations", i, "name", problem)
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
    if hook is not None:
        out[name] = Destination(name, headers=headers, webhook=_webhook(hook, i, fail))
        return
    if stow is not None:
        if problem := _url_problem(stow):
            raise fail("destinations", i, "stow_url", problem)
        out[name] = Destination(name, stow_url=stow.rstrip("/"), headers=headers)
        return
    if not isinstance(dimse, dict):
        raise fail("destinations", i, "dimse", "a table { ae_title, host, port } is required")
    extra = set(dimse) - {"ae_title", "host", "port", "calling_ae_title"}
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
    out[name] = Destination(name, headers=headers, dimse=DimseAddress(ae.strip(), host, port, calling.strip()))


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


def _rule(r: dict, i: int, destinations: dict[str, Destination], fail) -> Rule:
    extra = set(r) - {"name", "match", "destinations", "labels"}
    if extra:
        raise fail("rules", i, sorted(extra)[0], "unknown field; expected name, match, destinations, labels")
    name = r.get("name", f"rule {i + 1}")
    if problem := name_problem(name):
        raise fail("rules", i, "name", problem)
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
    match = r.get("match", {})
    if not isinstance(match, dict):
        raise fail("rules", i, "match", "a table of QIDO-RS matching keys is required")
    # a TOML list of values expands into alternatives (any value matches)
    choices: list[list[tuple[str, str]]] = [[]]
    for key, value in match.items():
        # a TOML list, or DICOM's backslash between values (``"CT\\MR"``), means any of them
        values = value if isinstance(value, list) else value.split("\\") if isinstance(value, str) else [value]
        if not values or not all(isinstance(v, (str, int)) for v in values):
            raise fail("rules", i, "match", f"{key}: a string, integer or list of them is required")
        choices = [c + [(key, str(v))] for c in choices for v in values]
        if len(choices) > 256:
            raise fail("rules", i, "match", "too many combinations of listed values (at most 256)")
    alternatives = []
    for params in choices:
        try:
            query = parse_query("instance", params)
        except QueryError as e:
            raise fail("rules", i, "match", str(e)) from None
        for m in query.matches:
            if m.attribute.computed:
                raise fail("rules", i, "match", f"{m.attribute.keyword} is computed over the whole study or "
                                                "series; a rule sees one instance (use Modality, SOPClassUID)")
        alternatives.append(query.matches)
    return Rule(name, tuple(alternatives), tuple(dict.fromkeys(dests)), tuple(dict.fromkeys(labels)))


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

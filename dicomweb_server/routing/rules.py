"""The routes file (``--routes FILE``, TOML): destinations, rules and delivery knobs.

::

    [[destinations]]
    name = "pacs"
    stow_url = "https://pacs.example/dicom-web"          # STOW-RS to this root (PS3.18 §10.5)
    headers = { Authorization = "Bearer ..." }            # optional
    # or: dimse = { ae_title = "PACS", host = "pacs.example", port = 104, calling_ae_title = "DICOMWEB" }

    [[rules]]
    name = "CT and MR to the PACS"
    match = { Modality = ["CT", "MR"], StudyDescription = "*HEAD*" }  # optional
    destinations = ["pacs"]

    [delivery]          # optional, the defaults shown
    batch_size = 20     concurrency = 2     max_attempts = 10    max_age = 86400
    backoff_base = 1.0  backoff_max = 300   poll_interval = 1.0  lease = 120   timeout = 60
    keep_delivered = 86400

A rule's ``match`` holds QIDO-RS matching keys (PS3.18 §8.3.4, PS3.4 C.2.2.2) and is
parsed by the same :func:`dicom.matching.parse_query` as a search for instances, then
evaluated with :func:`dicom.matching.match_value` against the values the index keeps
for the stored instance: a rule matches exactly the instances that the search
``GET /instances?{match}`` finds. A TOML list of values, or values separated by a
backslash as in DICOM (``Modality = "CT\\MR"``), means "any of them".
No ``match`` means every instance. A bad file is refused with its line number.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

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
class Destination:
    name: str
    stow_url: str | None = None  # DICOMweb root; STOW-RS posts to {stow_url}/studies
    headers: dict[str, str] = field(default_factory=dict)
    dimse: DimseAddress | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    alternatives: tuple[tuple[Match, ...], ...]  # OR of AND-ed matches (a TOML list expands)
    destinations: tuple[str, ...]

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
    extra = set(d) - {"name", "stow_url", "headers", "dimse"}
    if extra:
        raise fail("destinations", i, sorted(extra)[0], "unknown field; expected name, stow_url, headers, dimse")
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail("destinations", i, "name", "a non-empty string is required")
    if name in out:
        raise fail("destinations", i, "name", f"destination {name!r} is defined twice")
    stow, dimse = d.get("stow_url"), d.get("dimse")
    if (stow is None) == (dimse is None):
        raise fail("destinations", i, None, "give exactly one of stow_url (DICOMweb) or dimse (C-STORE)")
    headers = d.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise fail("destinations", i, "headers", "a table of string values is required")
    if stow is not None:
        parts = urlsplit(stow) if isinstance(stow, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise fail("destinations", i, "stow_url", f"{stow!r} is not an http(s) URL")
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
        # PS3.5 §6.2: AE is 1-16 characters of the default repertoire, no backslash
        if not isinstance(title, str) or not 0 < len(title.strip()) <= 16 or "\\" in title:
            raise fail("destinations", i, "dimse", f"{label} must be 1-16 characters (PS3.5 AE)")
    if not isinstance(host, str) or not host or not isinstance(port, int) or not 0 < port < 65536:
        raise fail("destinations", i, "dimse", "host (string) and port (1-65535) are required")
    out[name] = Destination(name, headers=headers, dimse=DimseAddress(ae.strip(), host, port, calling.strip()))


def _rule(r: dict, i: int, destinations: dict[str, Destination], fail) -> Rule:
    extra = set(r) - {"name", "match", "destinations"}
    if extra:
        raise fail("rules", i, sorted(extra)[0], "unknown field; expected name, match, destinations")
    name = r.get("name", f"rule {i + 1}")
    if not isinstance(name, str):
        raise fail("rules", i, "name", "a string is required")
    dests = r.get("destinations")
    if not isinstance(dests, list) or not dests or not all(isinstance(x, str) for x in dests):
        raise fail("rules", i, "destinations", "a non-empty list of destination names is required")
    for x in dests:
        if x not in destinations:
            raise fail("rules", i, "destinations", f"no destination named {x!r} "
                                                   f"(defined: {', '.join(destinations) or 'none'})")
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
    return Rule(name, tuple(alternatives), tuple(dict.fromkeys(dests)))


def _delivery(d: object, path: Path, text: str) -> Delivery:
    if not isinstance(d, dict):
        raise RoutesError(f"{path}: [delivery] must be a table")
    defaults = Delivery()
    kwargs = {}
    for key, value in d.items():
        line = next((n + 1 for n, ln in enumerate(text.splitlines()) if re.match(rf"^\s*{re.escape(key)}\s*=", ln)),
                    None)
        where = f"line {line}: " if line else ""
        if key not in Delivery.__dataclass_fields__:
            raise RoutesError(f"{path}: {where}[delivery] {key}: unknown; known: "
                              + ", ".join(Delivery.__dataclass_fields__))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise RoutesError(f"{path}: {where}[delivery] {key}: a positive number is required")
        if isinstance(getattr(defaults, key), int) and not isinstance(value, int):
            raise RoutesError(f"{path}: {where}[delivery] {key}: an integer is required")
        kwargs[key] = value
    return Delivery(**kwargs)

"""Access rules: who may see which studies (docs/notes/access-labels.md).

A rules document maps identities to the labels whose studies they may see, or to all
(``"*"``)::

    {"identities": {"key:key-1a2b3c4d": ["cardio"],       API key (its name: api/auth.py)
                    "basic:alice": ["radio", "trial-42"],  HTTP Basic user
                    "oidc:cardiology": ["cardio"],         a value of the OIDC claim (``claim``)
                    "oidc-sub:3f1c...": "*",               an OIDC subject
                    "ae:CT_ROOM1": ["radio"]},             a DIMSE calling AE title
     "claim": "groups",                                    the OIDC claim read (default "groups")
     "default": "*"}                                       identities no rule names (default "*")

An identity named by several entries (an OIDC token with several groups) sees the union;
``"*"`` anywhere: everything. Scopes (read, write, delete) are the credential's own and
combine: a rule says *which* studies, the scope *what* may be done to them. Without
rules, or for the anonymous identity of an archive without authentication, nothing
changes (:data:`~.filter.UNRESTRICTED`).

A restricted identity's *write label* (the first label of its first matching entry, in
the document's order) is put on every new study it stores (STOW-RS, C-STORE), so that
it can see what it stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..identity import Identity
from .filter import UNRESTRICTED, Filter, only, validate_label

ALL = "*"
_PREFIX = {"api-key": "key", "basic": "basic", "dimse-peer": "ae", "oidc": "oidc-sub"}


class RulesError(ValueError):
    """A rules document the archive cannot use (refused at start)."""


@dataclass(frozen=True, slots=True)
class Access:
    """What one identity may see, and the label its new studies get."""

    filter: Filter = UNRESTRICTED
    write_label: str | None = None


FULL = Access()


@dataclass(frozen=True)
class AccessRules:
    identities: dict[str, frozenset[str] | None] = field(default_factory=dict)  # None: all
    order: tuple[str, ...] = ()  # the keys in the document's order (write labels)
    first_label: dict[str, str] = field(default_factory=dict)
    claim: str = "groups"
    default: frozenset[str] | None = None

    @classmethod
    def parse(cls, doc: dict | None) -> AccessRules:
        if doc is None:
            return cls()
        if not isinstance(doc, dict):
            raise RulesError("access rules: a JSON object is expected")
        unknown = set(doc) - {"identities", "claim", "default"}
        if unknown:
            raise RulesError(f"access rules: unknown keys {sorted(unknown)}")
        identities, first = {}, {}
        for name, value in (doc.get("identities") or {}).items():
            kind, _, who = str(name).partition(":")
            if kind not in ("key", "basic", "oidc", "oidc-sub", "ae") or not who:
                raise RulesError(f"access rules: {name!r}: expected key:, basic:, oidc:, oidc-sub: or ae: "
                                 "and a name")
            identities[name] = cls._labels(name, value)
            if isinstance(value, list) and value:
                first[name] = value[0]
        claim = doc.get("claim", "groups")
        if not isinstance(claim, str) or not claim:
            raise RulesError("access rules: 'claim' must name a claim")
        return cls(identities, tuple(identities), first, claim, cls._labels("default", doc.get("default", ALL)))

    @staticmethod
    def _labels(name: str, value) -> frozenset[str] | None:
        if value == ALL:
            return None
        if not isinstance(value, list):
            raise RulesError(f"access rules: {name!r}: a list of labels or \"*\" is expected")
        try:
            return frozenset(validate_label(v) for v in value)
        except ValueError as e:
            raise RulesError(f"access rules: {name!r}: {e}") from None

    @classmethod
    def load(cls, inline: dict | None, path: Path | None) -> AccessRules:
        doc = dict(orjson.loads(Path(path).read_bytes())) if path is not None else {}
        if inline:
            doc.update(inline)
        return cls.parse(doc)

    @property
    def configured(self) -> bool:
        return bool(self.identities) or self.default is not None

    def keys_of(self, identity: Identity) -> list[str]:
        """The rule names that can speak for ``identity``, most specific first."""
        prefix = _PREFIX.get(identity.method)
        if prefix is None:  # anonymous (no authentication configured) ...
            return []
        keys = [f"{prefix}:{identity.subject}"]
        if identity.method == "oidc":
            keys += [f"oidc:{g}" for g in identity.groups]
        return keys

    def access(self, identity: Identity | None, dimse: bool = False) -> Access:
        """What ``identity`` may see. The anonymous identity of an archive without
        authentication sees everything over HTTP; a DIMSE peer (``dimse``) is named by
        its calling AE title whether or not authentication is configured."""
        if identity is None or not self.configured:
            return FULL
        if dimse:
            keys = [f"ae:{identity.subject}"]
        elif identity.method == "anonymous":
            return FULL
        else:
            keys = self.keys_of(identity)
        found = [k for k in keys if k in self.identities]
        if not found:
            return FULL if self.default is None else Access(only(self.default), min(self.default, default=None))
        if any(self.identities[k] is None for k in found):
            return FULL
        labels = frozenset().union(*(self.identities[k] for k in found))
        write = next((self.first_label[k] for k in self.order if k in found and k in self.first_label), None)
        return Access(only(labels), write)

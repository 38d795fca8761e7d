"""Who is asking: the identity both front doors give a request (HTTP: api/auth.py, from its
credentials; DIMSE: dimse/access.py, from the peers file), and the scopes it may hold. Kept
apart from both so that either imports it without the other (the DIMSE listener process
loads no web framework)."""

from __future__ import annotations

from dataclasses import dataclass

SCOPES = ("read", "write", "delete", "admin")  # admin: re-identification (GET /admin/deid/...)


@dataclass(frozen=True, slots=True)
class Identity:
    subject: str  # who: key name, JWT "sub", user name, or a DIMSE peer's AE title
    scopes: frozenset[str]
    method: str  # "api-key" | "oidc" | "basic" | "dimse-peer" | "anonymous" | "share" (api/shares.py)
    groups: tuple[str, ...] = ()  # OIDC: the values of the access rules' claim (access/rules.py)

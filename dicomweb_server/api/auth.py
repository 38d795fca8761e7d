"""Access control and audit: a plain ASGI middleware in front of the app.

- Static API keys (bearer tokens) with scopes ``read`` (GET/HEAD), ``write``
  (POST) and ``delete`` (DELETE), from a JSON file ``{"token": ["read", ...]}`` or
  the ``DICOMWEB_API_KEYS`` setting.
- OAuth2/OIDC access tokens (JWT) checked with PyJWT against the issuer's JWKS:
  signature, ``exp``/``nbf``, ``iss`` and ``aud``; scopes from the ``scope``
  (space separated) or ``scp`` claim, by the same three names (a ``dicomweb:``
  or ``dicomweb.`` prefix is accepted).
- Basic auth (optional): users from a JSON file ``{"user": {"password_sha256": hex,
  "scopes": [...]}}``.
Missing or invalid credentials: 401 with ``WWW-Authenticate``; a valid identity
without the scope: 403. CORS preflight (OPTIONS), the API description and the
viewer's static files need no credentials.

The audit log (JSON lines, one per DICOMweb request) records who did what to
which study, when, from where, and the outcome: the questions of an IHE ATNA
audit (ITI-20), in a simple form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response

SCOPES = ("read", "write", "delete")
_METHOD_SCOPE = {"GET": "read", "HEAD": "read", "POST": "write", "DELETE": "delete"}
_OPEN_PREFIXES = ("/docs", "/openapi.json", "/viewer")

audit_log = logging.getLogger("dicomweb_server.audit")


@dataclass(frozen=True, slots=True)
class Identity:
    subject: str  # who: key name, JWT "sub", or user name
    scopes: frozenset[str]
    method: str  # "api-key" | "oidc" | "basic" | "anonymous"


def _norm_scopes(values) -> frozenset[str]:
    out = set()
    for v in values:
        v = str(v).lower()
        for prefix in ("dicomweb:", "dicomweb."):
            if v.startswith(prefix):
                v = v[len(prefix):]
        if v in SCOPES:
            out.add(v)
    return frozenset(out)


class Authenticator:
    """Turns an Authorization header into an Identity (or None)."""

    def __init__(self, api_keys: dict[str, list[str]] | None = None, *, oidc_issuer: str | None = None,
                 oidc_audience: str | None = None, oidc_jwks_url: str | None = None,
                 basic_users: dict[str, dict] | None = None) -> None:
        # keys are compared by their SHA-256, in constant time, never logged
        self._keys = {hashlib.sha256(k.encode()).digest(): (f"key-{hashlib.sha256(k.encode()).hexdigest()[:8]}",
                                                             _norm_scopes(v)) for k, v in (api_keys or {}).items()}
        self._basic = basic_users or {}
        self._issuer, self._audience = oidc_issuer, oidc_audience
        self._jwks = None
        if oidc_jwks_url:
            import jwt

            self._jwks = jwt.PyJWKClient(oidc_jwks_url, cache_keys=True, lifespan=300)

    @property
    def enabled(self) -> bool:
        return bool(self._keys or self._basic or self._jwks)

    def identify(self, authorization: str | None) -> Identity | None:
        if not authorization:
            return None
        scheme, _, cred = authorization.strip().partition(" ")
        scheme = scheme.lower()
        cred = cred.strip()
        if scheme == "bearer" and cred:
            digest = hashlib.sha256(cred.encode()).digest()
            for known, (name, scopes) in self._keys.items():
                if hmac.compare_digest(known, digest):
                    return Identity(name, scopes, "api-key")
            if self._jwks is not None and cred.count(".") == 2:
                return self._jwt(cred)
            return None
        if scheme == "basic" and self._basic:
            try:
                user, _, password = base64.b64decode(cred).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            entry = self._basic.get(user)
            if entry and hmac.compare_digest(hashlib.sha256(password.encode()).hexdigest(),
                                             str(entry.get("password_sha256", ""))):
                return Identity(user, _norm_scopes(entry.get("scopes", [])), "basic")
        return None

    def _jwt(self, token: str) -> Identity | None:
        import jwt

        try:
            key = self._jwks.get_signing_key_from_jwt(token)  # type: ignore[union-attr]
            claims = jwt.decode(
                token, key.key, algorithms=["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"],
                audience=self._audience, issuer=self._issuer,
                options={"require": ["exp", "iss"] + (["aud"] if self._audience else [])},
            )
        except (jwt.PyJWTError, OSError, ValueError):
            return None
        raw = claims.get("scope", claims.get("scp", []))
        scopes = raw.split() if isinstance(raw, str) else list(raw)
        return Identity(str(claims.get("sub", "unknown")), _norm_scopes(scopes), "oidc")


def _action(method: str, path: str) -> str:
    if method == "POST":
        return "store"
    if method == "DELETE":
        return "delete"
    if path.rstrip("/").endswith(("/studies", "/series", "/instances")):
        return "search"
    return "retrieve"


def _study_of(path: str) -> str | None:
    parts = path.split("/")
    try:
        return parts[parts.index("studies") + 1] or None
    except (ValueError, IndexError):
        return None


class AuthAuditMiddleware:
    """Checks credentials (when configured) and writes the audit log (when configured)."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator, prefix: str = "", audit: bool = False) -> None:
        self.app = app
        self.auth = authenticator
        self.prefix = prefix
        self.audit = audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        path = scope["path"]
        rel = path[len(self.prefix):] if self.prefix and path.startswith(self.prefix) else path
        identity = Identity("anonymous", frozenset(SCOPES), "anonymous")
        if self.auth.enabled and method != "OPTIONS" and not rel.startswith(_OPEN_PREFIXES):
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            found = self.auth.identify(header)
            if found is None:
                response = error_response(401, "authentication required: send an API key or an access token "
                                               "as 'Authorization: Bearer ...'")
                response.headers["WWW-Authenticate"] = 'Bearer realm="dicomweb"'
                await self._audit(scope, None, 401, rel, method)
                await response(scope, receive, send)
                return
            # the admin endpoints (routing queue, export) change what leaves the archive: write scope
            need = "write" if rel.startswith("/admin/") else _METHOD_SCOPE.get(method, "read")
            if need not in found.scopes:
                await self._audit(scope, found, 403, rel, method)
                await error_response(403, f"the credentials lack the '{need}' scope")(scope, receive, send)
                return
            identity = found
        scope.setdefault("state", {})["identity"] = identity
        if not self.audit or rel.startswith(_OPEN_PREFIXES) or method == "OPTIONS":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            await self._audit(scope, identity, status, rel, method)

    async def _audit(self, scope: Scope, identity: Identity | None, status: int, rel: str, method: str) -> None:
        if not self.audit:
            return
        client = scope.get("client") or ("", 0)
        state = scope.get("state", {})
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z",
            "action": _action(method, rel),
            "user": identity.subject if identity else None,
            "auth": identity.method if identity else None,
            "client": client[0],
            "method": method,
            "path": rel,
            "query": (scope.get("query_string") or b"").decode("latin-1"),
            "study": _study_of(rel),
            "outcome": status,
        }
        if state.get("audit_studies"):
            record["studies_stored"] = sorted(state["audit_studies"])
        audit_log.info(orjson.dumps(record).decode())


def load_json_file(path: Path | None) -> dict:
    if path is None:
        return {}
    return orjson.loads(Path(path).read_bytes())


def configure_audit_file(path: Path) -> None:
    """Send the audit logger to ``path`` (JSON lines, appended)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    for old in list(audit_log.handlers):
        if isinstance(old, logging.FileHandler) and Path(old.baseFilename) == Path(path).resolve():
            return
    audit_log.addHandler(handler)
    audit_log.setLevel(logging.INFO)
    audit_log.propagate = False

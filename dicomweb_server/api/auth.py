"""Access control and audit: a plain ASGI middleware in front of the app.

- Static API keys (bearer tokens) with scopes ``read`` (GET/HEAD), ``write``
  (POST), ``delete`` (DELETE) and ``admin`` (the pseudonym tables under
  ``/admin/deid/``, which re-identify patients), from a JSON file ``{"token": ["read", ...]}`` or
  the ``DICOMWEB_API_KEYS`` setting.
- OAuth2/OIDC access tokens (JWT) checked with PyJWT against the issuer's JWKS:
  signature, ``exp``/``nbf``, ``iss`` and ``aud``; scopes from the ``scope``
  (space separated) or ``scp`` claim, by the same three names (a ``dicomweb:``
  or ``dicomweb.`` prefix is accepted). The token's ``alg`` must belong to the
  named key's type (RFC 8725 §3.1: no algorithm confusion); a token that is
  malformed in any way (header, claims of the wrong JSON type) is 401, never
  500. The JWKS is fetched asynchronously (:class:`JWKSCache`), never on the
  request path's event loop thread.
- Basic auth (optional): users from a JSON file ``{"user": {"password_sha256": hex,
  "scopes": [...]}}``.
Missing credentials: 401 "authentication required" with ``WWW-Authenticate: Bearer``;
credentials sent and not accepted: 401 "invalid credentials" with ``error="invalid_token"``
(RFC 6750 §3.1); a valid identity
without the scope: 403. The API description, the viewer's and the operator's page's (``/ui``) static files need no
credentials. ``OPTIONS`` needs them like ``GET`` (the ``write`` scope under
``/admin/``): its answer (``204`` with ``Allow``, or ``404``) tells which resources
exist and what they accept, more than a 401 may tell an unauthenticated client.
CORS preflights carry no credentials (Fetch standard, "CORS-preflight request"):
when origins are configured, the CORS middleware outside this one answers them
before authentication, the same for every path (allowed methods and headers, or
400 for an origin not allowed); without CORS configured there is no cross-origin
access to grant, and a preflight is an OPTIONS like any other.

A share link's token (api/shares.py), as ``Authorization: Bearer`` or as the ``share``
query parameter (taken out of the query the routes see, and of the audit log's),
yields an identity with the read scope only, for its one study (api/deps.py
:func:`~.deps.access_of`); an expired or revoked one: 401 "invalid credentials".

The audit log (JSON lines, one per DICOMweb request) records who did what to
which study, when, from where, and the outcome: the questions of an IHE ATNA
audit (ITI-20), in a simple form.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import time
from urllib.parse import unquote_plus

import httpx
import jwt
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..access.audit import audit_log
from ..store.shares import Share
from ..identity import SCOPES, Identity
from .errors import error_response

_METHOD_SCOPE = {"GET": "read", "HEAD": "read", "POST": "write", "PUT": "write", "DELETE": "delete"}
_OPEN_PREFIXES = ("/docs", "/openapi.json", "/viewer", "/ui")

log = logging.getLogger("dicomweb_server.auth")

# JWS algorithms allowed per JWK key type when the JWK names none (RFC 7518 §3.1)
_ALGORITHMS_OF_KTY = {"RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"), "OKP": ("EdDSA",)}


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
                 basic_users: dict[str, dict] | None = None, jwks_timeout: float = 5.0,
                 jwks_cache_seconds: float = 300.0, labels_claim: str = "groups") -> None:
        # keys are compared by their SHA-256, in constant time, never logged
        self._keys = {hashlib.sha256(k.encode()).digest(): (f"key-{hashlib.sha256(k.encode()).hexdigest()[:8]}",
                                                             _norm_scopes(v)) for k, v in (api_keys or {}).items()}
        self._basic = basic_users or {}
        self._issuer, self._audience = oidc_issuer, oidc_audience
        self._claim = labels_claim  # the claim whose values the access rules name (access/rules.py)
        self._jwks = JWKSCache(oidc_jwks_url, ttl=jwks_cache_seconds, timeout=jwks_timeout) if oidc_jwks_url \
            else None

    @property
    def enabled(self) -> bool:
        return bool(self._keys or self._basic or self._jwks)

    async def identify(self, authorization: str | None) -> Identity | None:
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
                return await self._jwt(cred)
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

    async def _jwt(self, token: str) -> Identity | None:
        """The identity of a valid access token, else None (401). Everything here is
        a function of client bytes: any failure, of any type, means 'not
        authenticated' (a PyJWT or cryptography error we did not foresee included)."""
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = await self._jwks.key(kid) if isinstance(kid, (str, type(None))) else None  # type: ignore[union-attr]
            if key is None:
                return None
            claims = jwt.decode(
                token, key[0].key, algorithms=key[1], audience=self._audience, issuer=self._issuer,
                options={"require": ["exp", "iss"] + (["aud"] if self._audience else [])},
            )
            return _identity_of(claims, self._claim)
        except Exception as e:  # noqa: BLE001 - see the docstring
            log.info("access token refused: %s: %s", type(e).__name__, e)
            return None


def _algorithms(item: dict, key: "jwt.PyJWK") -> list[str]:
    """Algorithms a token may use with ``key``: the JWK's ``alg``, else those of its
    key type (EC keys: the one of their curve)."""
    if isinstance(item.get("alg"), str):
        return [item["alg"]]
    return list(_ALGORITHMS_OF_KTY.get(key.key_type, (key.algorithm_name,)))


def _identity_of(claims: dict, groups_claim: str = "groups") -> Identity | None:
    """Scopes from ``scope`` (space-separated string, RFC 8693 §4.2) or ``scp``
    (string or list of strings); any other JSON type is a malformed token. The values of
    ``groups_claim`` (a string or a list of strings; anything else: none) are what the
    access rules' ``oidc:`` entries name (access/rules.py)."""
    raw = claims.get("scope", claims.get("scp", []))
    if isinstance(raw, str):
        scopes = raw.split()
    elif isinstance(raw, list) and all(isinstance(v, str) for v in raw):
        scopes = raw
    else:
        return None
    subject = claims.get("sub", "unknown")
    if not isinstance(subject, str):
        return None
    raw_groups = claims.get(groups_claim, [])
    groups = (raw_groups,) if isinstance(raw_groups, str) else \
        tuple(g for g in raw_groups if isinstance(g, str)) if isinstance(raw_groups, list) else ()
    return Identity(subject, _norm_scopes(scopes), "oidc", groups)


class JWKSCache:
    """The issuer's signing keys (RFC 7517 JWK Set), fetched with an async HTTP
    client so that a slow identity provider delays only the requests that need
    it. Keys are kept ``ttl`` seconds; concurrent refreshes share one fetch
    (single flight); a ``kid`` not in the set triggers at most one refetch per
    ``min_refetch`` seconds (key rotation, without letting unknown kids hammer the
    provider); a fetch that fails or exceeds ``timeout`` keeps the old keys."""

    def __init__(self, url: str, *, ttl: float = 300.0, timeout: float = 5.0, min_refetch: float = 30.0) -> None:
        self.url, self.ttl, self.timeout, self.min_refetch = url, ttl, timeout, min_refetch
        self._keys: dict[str | None, tuple[jwt.PyJWK, list[str]]] = {}
        self._fetched = False
        self._attempted = float("-inf")  # monotonic time of the last fetch attempt
        self._inflight: asyncio.Future | None = None
        self.fetches = 0

    async def key(self, kid: str | None) -> tuple[jwt.PyJWK, list[str]] | None:
        """The key named ``kid`` and the algorithms it may verify, or None."""
        if self._inflight is not None and not self._inflight.done():
            await asyncio.shield(self._inflight)  # a fetch is under way: its keys
        age = time.monotonic() - self._attempted
        if age >= (self.ttl if self._fetched else self.min_refetch) or (
                kid not in self._keys and age >= self.min_refetch):
            await self._refresh()
        return self._keys.get(kid)

    async def _refresh(self) -> None:
        if self._inflight is None or self._inflight.done():
            self._attempted = time.monotonic()
            self._inflight = asyncio.ensure_future(self._fetch())
        await asyncio.shield(self._inflight)

    async def _fetch(self) -> None:
        self.fetches += 1
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await asyncio.wait_for(client.get(self.url), self.timeout)  # total, not per read
                response.raise_for_status()
                data = response.json()
            keys = {}
            for item in data.get("keys", []):
                try:
                    k = jwt.PyJWK(item)
                except (jwt.PyJWTError, ValueError, TypeError, KeyError):
                    continue  # a key type PyJWT does not support: skipped
                if item.get("use", "sig") == "sig":
                    keys[item.get("kid")] = (k, _algorithms(item, k))
        except Exception as e:  # noqa: BLE001 - an unreachable or broken provider keeps the old keys
            log.warning("JWKS %s not fetched: %s: %s", self.url, type(e).__name__, e)
            return
        self._keys, self._fetched = keys, True


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
        state = scope.setdefault("state", {})
        if not rel.startswith(_OPEN_PREFIXES):  # OPTIONS too: see the module docstring
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            in_query = _take_share_parameter(scope)
            found = await self.auth.identify(header) if self.auth.enabled and in_query is None else None
            token = in_query if in_query is not None else _bearer(header) if found is None else None
            share = await _share_of(scope, token) if token else None
            if share is not None:  # a share link's token (api/shares.py): read, its one study
                state["share"] = share
                if share.valid(time.time()):
                    found = Identity(f"share-{share.id}", frozenset({"read"}), "share")
            if found is None and (self.auth.enabled or in_query is not None or share is not None):
                response = _unauthenticated(header or token)
                await self._audit(scope, None, 401, rel, method)
                await response(scope, receive, send)
                return
            if found is not None:
                # the admin endpoints (routing queue, export) change what leaves the archive: write scope;
                # the pseudonym tables re-identify patients: admin scope (deid/pseudonyms.py), as
                # a pull from another PACS (dimse/pull.py: what enters the archive) and a recompress
                # (it rewrites every stored file: policy/recompress.py);
                # labels are changed with the write scope, a DELETE of one included; the share
                # links are listed and revoked with the write scope (api/shares.py), and so are
                # background jobs (api/jobs.py)
                need = ("admin" if rel.startswith(("/admin/deid/", "/admin/pull", "/admin/recompress"))
                        else "write" if rel.startswith(("/admin/", "/shares", "/jobs"))
                        or (method == "DELETE" and "/labels/" in rel)
                        else _METHOD_SCOPE.get(method, "read"))
                if need not in found.scopes:
                    await self._audit(scope, found, 403, rel, method)
                    await error_response(403, f"the credentials lack the '{need}' scope")(scope, receive, send)
                    return
                identity = found
        state["identity"] = identity
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
        if state.get("share") is not None:  # each use of a share link (its id; never its token)
            record["share"] = state["share"].id
        if state.get("audit_studies"):
            record["studies_stored"] = sorted(state["audit_studies"])
        if state.get("audit_changes"):  # an update: what changed from what to what (api/lifecycle.py)
            record["changes"] = state["audit_changes"]
        audit_log.info(orjson.dumps(record).decode())


def _bearer(header: str | None) -> str | None:
    scheme, _, cred = (header or "").strip().partition(" ")
    return cred.strip() or None if scheme.lower() == "bearer" else None


def _take_share_parameter(scope: Scope) -> str | None:
    """The ``share`` query parameter's value (a share link's token), taken out of the
    request's query string (the routes, QIDO-RS's matching keys among them, and the audit
    log never see it); None when there is none."""
    raw = scope.get("query_string") or b""
    if b"share=" not in raw:
        return None
    items = raw.split(b"&")  # the other parameters are passed on byte for byte
    found = [i for i in items if i.startswith(b"share=")]
    if not found:
        return None
    scope["query_string"] = b"&".join(i for i in items if not i.startswith(b"share="))
    return unquote_plus(found[0][len(b"share="):].decode("latin-1"))


async def _share_of(scope: Scope, token: str) -> Share | None:
    """The share link of ``token`` (by its SHA-256), whatever its state; None when none."""
    from starlette.concurrency import run_in_threadpool

    from .shares import token_hash

    archive = getattr(scope["app"].state, "archive", None) if "app" in scope else None
    if archive is None:
        return None
    return await run_in_threadpool(archive.index.share, None, token_hash(token))


def _unauthenticated(header: str | None):
    """401 (RFC 9110 §15.5.2): credentials missing, or sent and not accepted (a wrong or
    expired key or token, a wrong password), told apart, the second with RFC 6750 §3.1's
    ``error="invalid_token"``. Which check failed is not said (a key, a token's signature,
    its audience...): that is for the server's log."""
    if not (header or "").strip():
        response = error_response(401, "authentication required: send an API key or an access token "
                                       "as 'Authorization: Bearer ...'")
        response.headers["WWW-Authenticate"] = 'Bearer realm="dicomweb"'
        return response
    response = error_response(401, "invalid credentials: the API key, access token or password sent was not "
                                   "accepted (unknown, expired or for another service)")
    response.headers["WWW-Authenticate"] = 'Bearer realm="dicomweb", error="invalid_token"'
    return response

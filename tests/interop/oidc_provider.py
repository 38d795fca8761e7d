"""A small OpenID Provider for the browser tests: the authorization code flow with PKCE
and nothing else, on 127.0.0.1 in a thread.

- ``GET /.well-known/openid-configuration``: the discovery document (OpenID Connect
  Discovery 1.0 §3).
- ``GET /jwks``: its one RSA signing key (RFC 7517).
- ``GET /authorize``: a login form (user name only: the test's users have no password),
  or, with the session cookie of an earlier login, straight back with a code (``prompt=none``
  without one: ``error=login_required``); ``POST /authorize``: the form sent, back to ``redirect_uri``
  with ``code`` and ``state`` (OpenID Connect Core 1.0 §3.1.2.5). A request without
  ``code_challenge_method=S256`` is refused: PKCE is required (RFC 7636 §4.3).
- ``POST /token``: a code for tokens, once, for the same client and redirect URI, and only
  with the ``code_verifier`` whose S256 hash is the code's challenge (RFC 7636 §4.6; else
  400 ``invalid_grant``). The access token is an RS256 JWT for the archive (``aud``), with
  the user's ``scope`` and ``groups``; the ID token one for the client (``aud`` = client id,
  the request's ``nonce``). With ``refresh_tokens`` on, the answer has a refresh token too,
  and ``grant_type=refresh_token`` (RFC 6749 §6) trades it, once (rotated), for new tokens.

What the tests turn: ``lifetime`` (seconds an access token lives), ``claimed_lifetime`` (the
``expires_in`` the answer says, when it should differ from the token's ``exp``: a page whose
renewal is late), ``refresh_tokens``, ``audience``, ``forge`` (``"state"``: the redirect
carries another state; ``"nonce"``: the ID token another nonce; what a page must refuse), and
``unavailable`` (the next N token requests answered 503: an outage, not a refusal),
``pairwise`` (the access token's ``sub`` is a pairwise identifier for the archive, not the
ID token's: OpenID Connect Core 1.0 §8), ``refresh_id_token`` (off: a refresh answer has no
ID token, as §12.2 allows),
``end_sessions()`` (the user logged out at the provider: no session cookie and no refresh
token works any more).

Every answer carries ``Access-Control-Allow-Origin: *``: the pages call the discovery
document and the token endpoint from the archive's origin, as they would a real provider.
What happened is kept in ``authorizations`` and ``token_requests``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import json
import secrets
import threading
import time
from urllib.parse import parse_qs, urlencode, urlparse

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


def s256(verifier: str) -> str:
    """RFC 7636 §4.2: BASE64URL(SHA256(ASCII(code_verifier))), no padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()


class OidcProvider:
    def __init__(self, users: dict[str, dict], *, audience: str, client_id: str) -> None:
        """``users``: user name -> extra claims of its access token (``groups``, ``scope``)."""
        self.users, self.audience, self.client_id = users, audience, client_id
        self.lifetime = 3600  # seconds an access token lives (exp - iat)
        self.claimed_lifetime: int | None = None  # expires_in, when not the lifetime
        self.refresh_tokens = False  # give refresh tokens (and take them: grant_type=refresh_token)
        self.refreshes: dict[str, dict] = {}  # refresh token -> its grant (user, client, scope)
        self.forge: set[str] = set()  # "state", "nonce": answers a page must refuse
        self.unavailable = 0  # the next so many /token requests: 503, no answer (an outage)
        self.pairwise = False  # the access token's sub: pairwise for the archive (OIDC Core §8)
        self.refresh_id_token = True  # a refresh answer carries an ID token (optional, OIDC Core §12.2)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.codes: dict[str, dict] = {}
        self.sessions: dict[str, str] = {}  # cookie -> user
        self.authorizations: list[dict] = []  # the query of each /authorize
        self.token_requests: list[dict] = []  # each /token form, with the answer's status
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "OidcProvider":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- what it answers ------------------------------------------------------------------

    def discovery(self) -> dict:
        return {"issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
                "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"], "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"], "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": ["openid", "dicomweb:read", "dicomweb:write", "dicomweb:delete"]}

    def jwks(self) -> dict:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        jwk.update(kid="stub-1", use="sig", alg="RS256")
        return {"keys": [jwk]}

    def _sign(self, claims: dict) -> str:
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "stub-1"})

    def issue_code(self, user: str, query: dict) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = {"user": user, "client_id": query.get("client_id"),
                            "redirect_uri": query.get("redirect_uri"), "challenge": query.get("code_challenge"),
                            "nonce": query.get("nonce"), "scope": query.get("scope", "")}
        return code

    def end_sessions(self) -> None:
        """The users logged out here: a silent request answers ``login_required``, a refresh
        token ``invalid_grant``."""
        self.sessions.clear()
        self.refreshes.clear()

    def token(self, form: dict) -> tuple[int, dict]:
        """RFC 6749 §4.1.3 with RFC 7636 §4.5-4.6; §6 (refresh) with ``refresh_tokens``."""
        if form.get("grant_type") == "refresh_token" and self.refresh_tokens:
            grant = self.refreshes.pop(form.get("refresh_token", ""), None)  # one use: rotated
            if grant is None or form.get("client_id") != grant["client_id"]:
                return 400, {"error": "invalid_grant", "error_description": "unknown, used or revoked refresh token"}
            doc = self._tokens({**grant, "nonce": None})
            if not self.refresh_id_token:
                del doc["id_token"]
            return 200, doc
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        grant = self.codes.pop(form.get("code", ""), None)  # one use, right or wrong
        if grant is None:
            return 400, {"error": "invalid_grant", "error_description": "unknown or used code"}
        if form.get("client_id") != grant["client_id"] or form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "client or redirect_uri differs"}
        verifier = form.get("code_verifier") or ""
        if not verifier or s256(verifier) != grant["challenge"]:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verification failed"}
        return 200, self._tokens(grant)

    def pairwise_sub(self, user: str) -> str:
        """OpenID Connect Core 1.0 §8.1: a subject identifier for one audience, not the user's name."""
        return hashlib.sha256(f"{self.audience}|{user}|stub-salt".encode()).hexdigest()[:32]

    def _tokens(self, grant: dict) -> dict:
        now, user = int(time.time()), grant["user"]
        extra = self.users[user]
        sub = self.pairwise_sub(user) if self.pairwise else user
        access = {"iss": self.url, "aud": self.audience, "sub": sub, "iat": now, "exp": now + self.lifetime,
                  "azp": self.client_id, "scope": extra.get("scope", "dicomweb:read"), "jti": secrets.token_urlsafe(8),
                  "groups": extra.get("groups", [])}
        id_token = {"iss": self.url, "aud": grant["client_id"], "sub": user, "iat": now, "exp": now + 3600,
                    "preferred_username": user, "name": user.title()}
        if grant["nonce"]:
            id_token["nonce"] = "forged" if "nonce" in self.forge else grant["nonce"]
        doc = {"access_token": self._sign(access), "id_token": self._sign(id_token), "token_type": "Bearer",
               "expires_in": self.claimed_lifetime or self.lifetime, "scope": access["scope"]}
        if self.refresh_tokens:
            doc["refresh_token"] = secrets.token_urlsafe(32)
            self.refreshes[doc["refresh_token"]] = {"user": user, "client_id": grant["client_id"], "scope": grant["scope"]}
        return doc

    # -- HTTP ---------------------------------------------------------------------------------

    def _handler(self):
        provider = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_a):
                pass

            def _send(self, status: int, body: bytes = b"", ctype: str = "application/json",
                      headers: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Access-Control-Allow-Headers", "*")
                self.send_header("Cache-Control", "no-store")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                if body:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, doc: dict) -> None:
                self._send(status, json.dumps(doc).encode())

            def _back(self, query: dict, user: str) -> None:
                code = provider.issue_code(user, query)
                target = query["redirect_uri"] + ("&" if "?" in query["redirect_uri"] else "?") + urlencode(
                    {"code": code, "state": "forged" if "state" in provider.forge else query.get("state", ""),
                     "iss": provider.url})
                cookie = secrets.token_urlsafe(16)
                provider.sessions[cookie] = user
                self._send(302, headers={"Location": target, "Set-Cookie": f"stub_session={cookie}; Path=/"})

            def do_OPTIONS(self):  # noqa: N802 - CORS preflight
                self._send(204, headers={"Access-Control-Allow-Methods": "GET, POST"})

            def do_GET(self):  # noqa: N802
                url = urlparse(self.path)
                if url.path == "/.well-known/openid-configuration":
                    return self._json(200, provider.discovery())
                if url.path == "/jwks":
                    return self._json(200, provider.jwks())
                if url.path != "/authorize":
                    return self._json(404, {"error": "not_found"})
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                provider.authorizations.append(query)
                if query.get("client_id") != provider.client_id or "redirect_uri" not in query:
                    return self._json(400, {"error": "invalid_request", "error_description": "unknown client"})
                if query.get("response_type") != "code" or query.get("code_challenge_method") != "S256" \
                        or not query.get("code_challenge"):
                    return self._json(400, {"error": "invalid_request", "error_description": "PKCE (S256) required"})
                cookies = dict(c.strip().partition("=")[::2] for c in self.headers.get("Cookie", "").split(";")
                               if "=" in c)
                user = provider.sessions.get(cookies.get("stub_session", ""))
                if user is not None:  # logged in here before: straight back, as providers do
                    return self._back(query, user)
                if query.get("prompt") == "none":
                    target = query["redirect_uri"] + "?" + urlencode(
                        {"error": "login_required", "state": query.get("state", "")})
                    return self._send(302, headers={"Location": target})
                hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                                 for k, v in query.items())
                page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Stub identity provider"
                        f"</title></head><body><h1>Log in</h1><form method=post action=/authorize>{hidden}"
                        f"<label for=username>User name</label><input id=username name=username>"
                        f"<button type=submit>Log in</button></form></body></html>")
                return self._send(200, page.encode(), "text/html; charset=utf-8")

            def do_POST(self):  # noqa: N802
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if url.path == "/authorize":
                    user = form.pop("username", "")
                    if user not in provider.users:
                        return self._send(401, b"unknown user", "text/plain")
                    return self._back(form, user)
                if url.path == "/token":
                    if provider.unavailable > 0:
                        provider.unavailable -= 1
                        provider.token_requests.append({**form, "status": 503})
                        return self._send(503, b"down for maintenance", "text/plain")
                    status, doc = provider.token(form)
                    provider.token_requests.append({**form, "status": status})
                    return self._json(status, doc)
                return self._json(404, {"error": "not_found"})

        return Handler

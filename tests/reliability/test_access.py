"""Access control, CORS (case H1) and the audit log (issue #6)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import subprocess
import sys
import threading
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

KEYS = {"reader-key": ["read"], "writer-key": ["read", "write"], "admin-key": ["read", "write", "delete"]}


@pytest.fixture(scope="module")
def jwks():
    """An OIDC issuer's signing key and its JWKS, served on 127.0.0.1."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid="k1", use="sig", alg="RS256")
    body = json.dumps({"keys": [jwk]}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield key, f"http://127.0.0.1:{srv.server_address[1]}/jwks.json"
    srv.shutdown()


def token(key, **claims) -> str:
    base = {"iss": "https://idp.example", "aud": "dicomweb", "sub": "dr-who", "exp": int(time.time()) + 300,
            "scope": "dicomweb:read dicomweb:write"}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, key, algorithm="RS256",
                      headers={"kid": "k1"})


@pytest.fixture
def secured(tmp_path, jwks):
    key, url = jwks
    users = {"alice": {"password_sha256": hashlib.sha256(b"s3cret").hexdigest(), "scopes": ["read"]}}
    (tmp_path / "users.json").write_text(json.dumps(users))
    srv = LiveServer(tmp_path / "data", "sqlite", api_keys=KEYS, oidc_issuer="https://idp.example",
                     oidc_audience="dicomweb", oidc_jwks_url=url, basic_users_file=tmp_path / "users.json",
                     audit_log=tmp_path / "audit.jsonl", cors_origins=["https://viewer.example"]).start()
    yield srv, key, tmp_path / "audit.jsonl"
    srv.stop()


def _stow(c, headers):
    body, ctype = multipart([to_bytes(make_dataset(PatientID="acl"))])
    return c.post("/studies", content=body, headers={"Content-Type": ctype, **headers})


def bearer(t: str) -> dict:
    return {"Authorization": f"Bearer {t}"}


def test_api_keys_and_scopes(secured):
    srv, _key, _audit = secured
    with httpx.Client(base_url=srv.url) as c:
        r = c.get("/studies")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert c.get("/studies", headers=bearer("wrong")).status_code == 401
        assert c.get("/studies", headers=bearer("reader-key")).status_code == 200
        assert _stow(c, bearer("reader-key")).status_code == 403
        r = _stow(c, bearer("writer-key"))
        assert r.status_code == 200
        study = r.json()["00081190"]["Value"][0].rsplit("/", 1)[1]
        assert c.delete(f"/studies/{study}", headers=bearer("writer-key")).status_code == 403
        assert c.delete(f"/studies/{study}", headers=bearer("admin-key")).status_code == 204
        assert c.get("/openapi.json").status_code == 200  # the API description is public


@pytest.mark.parametrize("claims, status", [
    ({}, 200),
    ({"scope": "read"}, 200),
    ({"scope": None, "scp": ["dicomweb.read"]}, 200),
    ({"scope": "dicomweb:write"}, 403),
    ({"aud": "someone-else"}, 401),
    ({"iss": "https://evil.example"}, 401),
    ({"exp": int(time.time()) - 10}, 401),
])
def test_oidc_tokens(secured, claims, status):
    srv, key, _audit = secured
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/studies", headers=bearer(token(key, **claims))).status_code == status


def test_oidc_token_signed_by_another_key(secured):
    srv, _key, _audit = secured
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/studies", headers=bearer(token(other))).status_code == 401


def test_basic_auth(secured):
    srv, _key, _audit = secured
    with httpx.Client(base_url=srv.url) as c:
        good = base64.b64encode(b"alice:s3cret").decode()
        bad = base64.b64encode(b"alice:nope").decode()
        assert c.get("/studies", headers={"Authorization": f"Basic {good}"}).status_code == 200
        assert c.get("/studies", headers={"Authorization": f"Basic {bad}"}).status_code == 401
        assert _stow(c, {"Authorization": f"Basic {good}"}).status_code == 403


def test_h1_cors(secured):
    srv, _key, _audit = secured
    origin = {"Origin": "https://viewer.example"}
    with httpx.Client(base_url=srv.url) as c:
        r = c.options("/studies", headers={**origin, "Access-Control-Request-Method": "GET",
                                           "Access-Control-Request-Headers": "accept, authorization"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://viewer.example"
        assert set(r.headers["access-control-allow-methods"].replace(" ", "").split(",")) >= {"GET", "POST", "DELETE", "OPTIONS"}
        assert {"accept", "authorization"} <= set(r.headers["access-control-allow-headers"].lower().replace(" ", "").split(","))
        r = c.options("/studies", headers={**origin, "Access-Control-Request-Method": "POST",
                                           "Access-Control-Request-Headers": "content-type"})
        assert r.status_code == 200 and "content-type" in r.headers["access-control-allow-headers"].lower()
        for path, hdrs, status in [("/studies", {}, 401), ("/studies/1.2.3/metadata", bearer("reader-key"), 404),
                                   ("/studies", {**bearer("reader-key"), "Accept": "text/html"}, 406)]:
            r = c.get(path, headers={**origin, **hdrs})
            assert r.status_code == status
            assert r.headers["access-control-allow-origin"] == "https://viewer.example"
            exposed = r.headers["access-control-expose-headers"].lower()
            assert "content-type" in exposed and "warning" in exposed and "content-location" in exposed
        r = c.get("/studies", headers={"Origin": "https://evil.example", **bearer("reader-key")})
        assert "access-control-allow-origin" not in r.headers


ADMIN = "/admin/export/pacs/studies/1.2.3"


def _options_reveal_nothing(c: httpx.Client) -> None:
    denied = c.get("/studies")
    assert denied.status_code == 401
    for path in (ADMIN, "/admin/queue", "/studies", "/metrics", "/no/such/resource"):
        r = c.options(path)
        assert (r.status_code, r.content, r.headers["www-authenticate"]) == (401, denied.content,
                                                                             'Bearer realm="dicomweb"'), path
        assert "allow" not in r.headers, path
    # with credentials: the methods of the resource (the write scope under /admin/, as for POST)
    assert c.options("/studies", headers=bearer("reader-key")).headers["allow"] == "GET, HEAD, OPTIONS, POST"
    assert c.options(ADMIN, headers=bearer("reader-key")).status_code == 403
    r = c.options(ADMIN, headers=bearer("writer-key"))
    assert (r.status_code, r.headers["allow"]) == (204, "OPTIONS, POST")


def test_options_tells_an_unauthenticated_client_no_more_than_a_401(tmp_path):
    """OPTIONS skipped authentication: ``Allow: OPTIONS, POST`` on /admin/export/...
    told anyone that routing's export exists, and 204 vs 404 which paths do."""
    srv = LiveServer(tmp_path / "data", "sqlite", api_keys=KEYS).start()
    try:
        with httpx.Client(base_url=srv.url) as c:
            _options_reveal_nothing(c)
            # no CORS configured: a preflight is an OPTIONS like any other
            pre = c.options(ADMIN, headers={"Origin": "https://viewer.example", "Access-Control-Request-Method": "POST"})
            assert pre.status_code == 401 and "allow" not in pre.headers
    finally:
        srv.stop()


def test_cors_preflights_stay_answered_and_say_the_same_for_every_path(secured):
    """With CORS origins configured, preflights (sent without credentials, Fetch
    standard) are answered before authentication, and identically whether the path
    exists or not; any other OPTIONS needs credentials."""
    srv, _key, _audit = secured
    with httpx.Client(base_url=srv.url) as c:
        _options_reveal_nothing(c)
        for origin, status in (("https://viewer.example", 200), ("https://evil.example", 400)):
            pre = {"Origin": origin, "Access-Control-Request-Method": "POST"}
            answers = [c.options(p, headers=pre) for p in (ADMIN, "/studies", "/no/such/resource")]
            seen = {(r.status_code, r.content, tuple(sorted((k, v) for k, v in r.headers.items() if k != "date")))
                    for r in answers}
            assert len(seen) == 1 and answers[0].status_code == status, seen
            assert "allow" not in answers[0].headers


def test_audit_log(secured):
    srv, _key, audit = secured
    with httpx.Client(base_url=srv.url) as c:
        r = _stow(c, bearer("writer-key"))
        study = r.json()["00081190"]["Value"][0].rsplit("/", 1)[1]
        c.get("/studies", params={"PatientID": "acl"}, headers=bearer("reader-key"))
        c.get(f"/studies/{study}/metadata", headers=bearer("reader-key"))
        c.get(f"/studies/{study}/metadata")
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    store, search, retrieve, denied = lines[-4:]
    assert store["action"] == "store" and store["studies_stored"] == [study] and store["outcome"] == 200
    assert store["user"].startswith("key-") and store["client"] == "127.0.0.1" and store["auth"] == "api-key"
    assert "writer-key" not in audit.read_text()  # secrets never reach the log
    assert search["action"] == "search" and search["query"] == "PatientID=acl"
    assert retrieve["action"] == "retrieve" and retrieve["study"] == study and retrieve["outcome"] == 200
    assert denied["outcome"] == 401 and denied["user"] is None
    assert all(x["time"].endswith("Z") for x in lines)


def test_refuses_public_address_without_auth(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "serve", "--host", "0.0.0.0",
                        "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--insecure" in r.stderr


def test_open_by_default_on_loopback(tmp_path):
    srv = LiveServer(tmp_path / "data", "sqlite").start()
    try:
        assert httpx.get(srv.url + "/studies").status_code == 200
    finally:
        srv.stop()


def test_a_wrong_api_key_is_invalid_credentials(tmp_path):
    """Issue 26 item 10: a wrong key got the message of a missing one."""
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app
    from dicomweb_server.settings import Settings

    with TestClient(create_app(Settings(data_dir=tmp_path, dimse_port=0, api_keys={"right": ["read"]}))) as c:
        missing = c.get("/studies")
        wrong = c.get("/studies", headers={"Authorization": "Bearer wrong"})
        right = c.get("/studies", headers={"Authorization": "Bearer right"})
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == 'Bearer realm="dicomweb"'
    assert "authentication required" in missing.text
    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"] == 'Bearer realm="dicomweb", error="invalid_token"'
    assert "invalid credentials" in wrong.text and "authentication required" not in wrong.text
    assert right.status_code == 200

"""Pre-auth harm, tokens (issue 14 §3): every malformed access token is 401 (a JWT
with ``alg`` ES256 naming an RSA key gave 500, an integer ``scope`` too), and the
JWKS fetch never blocks other clients (it ran synchronously on the event loop)."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.helpers import LiveServer

ISS, AUD = "https://idp.example", "dicomweb"


class IdP:
    """A JWKS endpoint on 127.0.0.1 that counts fetches and can be held."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        k1 = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key())) | {"kid": "k1", "alg": "RS256"}
        k2 = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa2.public_key())) | {"kid": "k2"}  # no alg
        e1 = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key())) | {"kid": "e1", "alg": "ES256"}
        odd = {"kty": "XYZ", "kid": "odd"}  # a key type nobody supports: skipped
        self.body = json.dumps({"keys": [k1, k2, e1, odd]}).encode()
        self.hits = 0
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        idp = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                idp.hits += 1
                idp.entered.set()
                idp.release.wait(30)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(idp.body)

            def log_message(self, *_a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/jwks.json"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def token(self, key=None, alg="RS256", kid="k1", headers=None, **claims) -> str:
        base = {"iss": ISS, "aud": AUD, "sub": "dr-who", "exp": int(time.time()) + 300, "scope": "dicomweb:read"}
        base.update(claims)
        h = {"typ": "JWT", "alg": alg} | ({"kid": kid} if kid is not None else {}) | (headers or {})
        # signed by hand: PyJWT refuses to encode many of the malformed claims tried here
        msg = _b64(h) + "." + _b64({k: v for k, v in base.items() if v is not None})
        return msg + "." + _b64(jwt.algorithms.get_default_algorithms()[alg].sign(msg.encode(), key or self.rsa))


@pytest.fixture
def idp():
    p = IdP()
    yield p
    p.release.set()
    p.srv.shutdown()


def _server(tmp_path, idp, **extra):
    return LiveServer(tmp_path / "data", api_keys={"reader-key": ["read"]}, oidc_issuer=ISS, oidc_audience=AUD,
                      oidc_jwks_url=idp.url, **extra).start()


def _b64(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def malformed_tokens(idp: IdP) -> dict[str, str]:
    pem = idp.rsa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    good = idp.token()
    head, payload, sig = good.split(".")
    claims = {"iss": ISS, "aud": AUD, "sub": "x", "exp": int(time.time()) + 300}
    out = {
        "ES256 naming an RSA kid": idp.token(idp.ec, alg="ES256", kid="k1"),
        "ES256 naming an RSA kid without alg": idp.token(idp.ec, alg="ES256", kid="k2"),
        "RS256 naming an EC kid": idp.token(idp.rsa, alg="RS256", kid="e1"),
        "PS256 where the JWK says RS256": idp.token(idp.rsa, alg="PS256", kid="k1"),
        "HS256 keyed with the public key": _b64({"alg": "HS256", "kid": "k1"}) + "." + _b64(claims) + "."
        + _b64(b"x" * 32),
        "alg none": _b64({"alg": "none", "kid": "k1"}) + "." + _b64(claims) + ".",
        "alg integer": _b64({"alg": 256, "kid": "k1"}) + "." + payload + "." + sig,
        "alg list": _b64({"alg": ["RS256"], "kid": "k1"}) + "." + payload + "." + sig,
        "header a list": _b64(["RS256"]) + "." + payload + "." + sig,
        "header not json": _b64(b"{not json") + "." + payload + "." + sig,
        "header not base64": "***." + payload + "." + sig,
        "crit header": idp.token(headers={"crit": ["exp"], "exp": 1}),
        "kid integer": idp.token(kid=1),
        "kid list": idp.token(kid=["k1"]),
        "kid object": idp.token(kid={"k": "k1"}),
        "kid missing": idp.token(kid=None),
        "kid unknown": idp.token(kid="nope"),
        "kid of an unsupported key type": idp.token(kid="odd"),
        "signature of another key": idp.token(idp.rsa2, kid="k1"),
        "signature truncated": head + "." + payload + "." + sig[:20],
        "signature empty": head + "." + payload + ".",
        "payload not json": head + "." + _b64(b"[1,") + "." + sig,
        "payload a list": head + "." + _b64([1, 2]) + "." + sig,
        "scope integer": idp.token(scope=5),
        "scope list of integers": idp.token(scope=[1, 2]),
        "scope object": idp.token(scope={"read": True}),
        "scope boolean": idp.token(scope=True),
        "scp object": idp.token(scope=None, scp={"a": "read"}),
        "sub object": idp.token(sub={"id": 1}),
        "sub integer": idp.token(sub=7),
        "exp string": idp.token(exp="tomorrow"),
        "exp list": idp.token(exp=[1]),
        "exp passed": idp.token(exp=int(time.time()) - 3600),
        "exp missing": idp.token(exp=None),
        "nbf in the future": idp.token(nbf=int(time.time()) + 3600),
        "nbf object": idp.token(nbf={"t": 1}),
        "iat string": idp.token(iat="now"),
        "iss list": idp.token(iss=[ISS]),
        "iss other": idp.token(iss="https://evil.example"),
        "aud integer": idp.token(aud=5),
        "aud object": idp.token(aud={"a": AUD}),
        "four segments": good + ".x",
        "empty segments": "..",
        "non-ASCII": good[:-4] + "éé€€",
    }
    return out


def test_every_malformed_token_is_401(tmp_path, idp):
    srv = _server(tmp_path, idp)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for name, tok in malformed_tokens(idp).items():
                r = c.get("/studies", headers={"authorization": ("Bearer " + tok).encode()})
                assert r.status_code == 401, (name, r.status_code, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer")
            # the good ones still work, by every key type of the set
            for tok in (idp.token(), idp.token(idp.rsa2, alg="PS256", kid="k2"),
                        idp.token(idp.ec, alg="ES256", kid="e1"), idp.token(scope=None, scp=["read"])):
                assert c.get("/studies", headers={"authorization": "Bearer " + tok}).status_code == 200
    finally:
        srv.stop()


def test_a_slow_identity_provider_does_not_stall_other_clients(tmp_path, idp):
    """While the JWKS fetch hangs, API-key and unauthenticated requests are answered;
    concurrent token requests share one fetch; unknown kids do not refetch each time."""
    srv = _server(tmp_path, idp)
    idp.release.clear()
    try:
        with httpx.Client(base_url=srv.url, timeout=20) as c, ThreadPoolExecutor(8) as pool:
            pending = [pool.submit(c.get, "/studies", headers={"authorization": "Bearer " + idp.token()})
                       for _ in range(8)]
            assert idp.entered.wait(20)
            # the provider is still holding its answer: others are served meanwhile
            assert c.get("/studies", headers={"authorization": "Bearer reader-key"}).status_code == 200
            assert c.get("/studies").status_code == 401
            assert not idp.release.is_set()
            idp.release.set()
            assert [f.result().status_code for f in pending] == [200] * 8
            assert idp.hits == 1  # single flight
            for _ in range(5):
                r = c.get("/studies", headers={"authorization": "Bearer " + idp.token(kid="rotated")})
                assert r.status_code == 401
            assert idp.hits == 1  # unknown kids refetch at most once per min_refetch (30 s)
    finally:
        srv.stop()


def test_a_hung_identity_provider_answers_401_after_the_fetch_timeout(tmp_path, idp):
    srv = _server(tmp_path, idp, oidc_jwks_timeout=0.5)
    idp.release.clear()
    try:
        r = httpx.get(srv.url + "/studies", headers={"authorization": "Bearer " + idp.token()}, timeout=20)
        assert r.status_code == 401
    finally:
        idp.release.set()
        srv.stop()


def test_jwks_cache_refetches_for_a_rotated_key_within_its_bound(idp):
    import asyncio

    from dicomweb_server.api.auth import JWKSCache

    async def run(min_refetch: float) -> tuple[bool, bool, int]:
        cache = JWKSCache(idp.url, min_refetch=min_refetch)
        found = await cache.key("k1") is not None
        missing = all([await cache.key("rotated") is None for _ in range(3)])
        return found, missing, cache.fetches

    assert asyncio.run(run(min_refetch=0)) == (True, True, 4)  # rotation: each unknown kid looks again
    assert asyncio.run(run(min_refetch=3600)) == (True, True, 1)  # bounded: no refetch within the bound

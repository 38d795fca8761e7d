"""Issue 28 ("the viewer with a login") and issue 32 ("log in with OIDC"): the OHIF viewer
and the operator's page log in at an OpenID Provider (authorization code + PKCE) and then
see only the studies the user's token allows, in headless Chromium (set up as
tests/interop/test_ohif_viewer.py does).

The provider is the stub of tests/interop/oidc_provider.py, started by the test: a login
form, a token endpoint that checks the PKCE code verifier, RS256 tokens with a ``groups``
claim. The archive runs with ``oidc_issuer``/``oidc_jwks_url`` on that stub,
``oidc_client_id``, and access rules that show the ``cardiology`` group the studies
labelled ``cardio`` only. Two studies are stored, one labelled ``cardio`` and one
``radio``; the user ``carol`` (group ``cardiology``) logs in and must see the first and not
the second, in the viewer's study list (and the QIDO-RS answers it got) and on /ui/.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.helpers import LiveServer

from .oidc_provider import OidcProvider, s256
from .studies import make_study, stow_body
from .test_ohif_viewer import TIMEOUT_MS, VIEWPORT, RequestLog, browser, ohif_dist  # noqa: F401 (fixtures)

CLIENT_ID = "archive-web"
AUDIENCE = "dicomweb"
ADMIN = {"Authorization": "Bearer admin-key"}


@pytest.fixture(scope="module")
def provider():
    p = OidcProvider({"carol": {"groups": ["cardiology"], "scope": "openid dicomweb:read"}},
                     audience=AUDIENCE, client_id=CLIENT_ID).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def archive(provider, ohif_dist, tmp_path_factory):  # noqa: F811 (ohif_dist: the fixture)
    """The archive with OIDC, the viewer, an admin key, and a cardio and a radio study."""
    server, studies = start_archive(provider, tmp_path_factory.mktemp("oidc") / "data", viewer=True,
                                    viewer_dir=ohif_dist)
    yield server, studies
    server.stop()


def start_archive(provider, data_dir, **extra) -> tuple[LiveServer, dict[str, str]]:
    """The archive logging in at ``provider``, with an admin key, access rules that show the
    ``cardiology`` group the ``cardio`` label only, and a cardio and a radio study
    (label -> StudyInstanceUID)."""
    server = LiveServer(data_dir, "sqlite", oidc_issuer=provider.url, oidc_audience=AUDIENCE,
                        oidc_jwks_url=f"{provider.url}/jwks", oidc_client_id=CLIENT_ID,
                        api_keys={"admin-key": ["read", "write", "delete"]},
                        access_rules={"identities": {"oidc:cardiology": ["cardio"]}, "default": "*"}, **extra).start()
    studies = {}
    for label, patient in (("cardio", "Cardio^Allowed"), ("radio", "Radio^Hidden")):
        datasets = make_study(slices=1, size=32, patient=patient, patient_id=label.upper())
        _store(server.url, datasets)
        uid = str(datasets[0].StudyInstanceUID)
        r = httpx.put(f"{server.url}/studies/{uid}/labels/{label}", headers=ADMIN, timeout=30)
        assert r.status_code in (200, 201, 204), r.text
        studies[label] = uid
    return server, studies


def _store(url: str, datasets) -> None:
    body, ctype = stow_body(datasets)
    r = httpx.post(f"{url}/studies", content=body, headers={"Content-Type": ctype, **ADMIN}, timeout=60)
    assert r.status_code == 200, r.text


def _log_in_at_the_provider(page, provider) -> None:
    page.wait_for_url(f"{provider.url}/authorize?*", timeout=TIMEOUT_MS)
    page.get_by_label("User name").fill("carol")
    page.get_by_role("button", name="Log in").click()


def _pkce_of_the_last_login(provider) -> tuple[dict, dict]:
    """The last /authorize query and /token form: S256 challenge sent, and the verifier
    the page sent later hashes to it."""
    authorize, token = provider.authorizations[-1], provider.token_requests[-1]
    assert authorize["response_type"] == "code" and authorize["code_challenge_method"] == "S256"
    assert token["status"] == 200 and s256(token["code_verifier"]) == authorize["code_challenge"]
    assert re.fullmatch(r"[A-Za-z0-9._~-]{43,128}", token["code_verifier"])  # RFC 7636 §4.1
    return authorize, token


def test_the_archive_refuses_without_a_token(archive):
    server, _studies = archive
    assert httpx.get(f"{server.url}/studies", timeout=30).status_code == 401
    assert len(httpx.get(f"{server.url}/studies", headers=ADMIN, timeout=30).json()) == 2


def test_app_config_and_pages_name_the_provider(archive, provider):
    """The viewer's app-config has OHIF's oidc entry (code flow, the issuer as authority);
    /ui/ carries the same login; no Content-Security-Policy of the archive stands in the
    way of the provider's origin (the archive sets none)."""
    server, _ = archive
    config = httpx.get(f"{server.url}/viewer/app-config.js", timeout=30)
    entry = json.loads(re.search(r"oidc: \[(\{.*?\})\]", config.text).group(1))
    assert entry == {"authority": provider.url, "client_id": CLIENT_ID, "redirect_uri": "/callback",
                     "silent_redirect_uri": "/silent-callback.html", "post_logout_redirect_uri": "/signed-out",
                     "response_type": "code", "scope": "openid dicomweb:read dicomweb:write dicomweb:delete"}
    ui = httpx.get(f"{server.url}/ui/", timeout=30)
    assert f'content="{{&quot;authority&quot;: &quot;{provider.url}&quot;' in ui.text
    for r in (config, ui, httpx.get(f"{server.url}/viewer/", timeout=30)):
        assert "content-security-policy" not in r.headers
    silent = httpx.get(f"{server.url}/viewer/silent-callback.html", timeout=30)
    assert silent.status_code == 200 and 'source: "oidc-client"' in silent.text


def test_the_provider_refuses_a_wrong_code_verifier(provider):
    """The stub really checks PKCE: the code of a login with a challenge is refused with
    another verifier, and (a new code) given with the right one."""
    verifier = "v" * 43

    def code() -> str:
        with httpx.Client(base_url=provider.url, timeout=30) as c:
            r = c.post("/authorize", data={"username": "carol", "client_id": CLIENT_ID, "redirect_uri": "http://x/cb",
                                           "code_challenge": s256(verifier), "code_challenge_method": "S256",
                                           "response_type": "code", "state": "s"})
            assert r.status_code == 302
            return parse_qs(urlparse(r.headers["location"]).query)["code"][0]

    form = {"grant_type": "authorization_code", "client_id": CLIENT_ID, "redirect_uri": "http://x/cb"}
    r = httpx.post(f"{provider.url}/token", data={**form, "code": code(), "code_verifier": "w" * 43}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    r = httpx.post(f"{provider.url}/token", data={**form, "code": code()}, timeout=30)  # no verifier at all
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    r = httpx.post(f"{provider.url}/token", data={**form, "code": code(), "code_verifier": verifier}, timeout=30)
    assert r.status_code == 200 and r.json()["token_type"] == "Bearer"


def test_viewer_login_shows_only_the_allowed_studies(browser, archive, provider, artifacts):  # noqa: F811
    server, studies = archive
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    try:
        page.goto(f"{server.url}/viewer/")  # no user yet: OHIF sends the browser to the provider
        with page.expect_response(lambda r: r.url.startswith(f"{server.url}/studies?"), timeout=TIMEOUT_MS) as info:
            _log_in_at_the_provider(page, provider)
        qido = info.value
        assert qido.status == 200, qido.url
        assert qido.request.headers["authorization"].startswith("Bearer ey")
        found = [s["0020000D"]["Value"][0] for s in qido.json()]
        assert found == [studies["cardio"]], found
        page.get_by_text("Cardio, Allowed").first.wait_for(timeout=TIMEOUT_MS)
        page.wait_for_timeout(500)
        assert page.get_by_text("Radio, Hidden").count() == 0
        page.screenshot(path=str(artifacts / "viewer-oidc-list.png"))
        authorize, _token = _pkce_of_the_last_login(provider)
        assert authorize["redirect_uri"] == f"{server.url}/viewer/callback"
        assert authorize["client_id"] == CLIENT_ID and "openid" in authorize["scope"].split()

        # a reload: back from the provider without its form (its session), the token kept
        # by oidc-client-ts in sessionStorage under oidc.user:{authority}:{client_id}
        user = json.loads(page.evaluate(f"sessionStorage.getItem('oidc.user:{provider.url}:{CLIENT_ID}')"))
        bearer = {"Authorization": f"Bearer {user['access_token']}"}

        # the study the token does not allow, opened by its URL: answered like one that does not exist
        radio = studies["radio"]
        with page.expect_response(lambda r: r.url.startswith(f"{server.url}/studies") and radio in r.url,
                                  timeout=TIMEOUT_MS):
            page.goto(f"{server.url}/viewer/viewer?StudyInstanceUIDs={radio}")
        page.wait_for_timeout(3000)
        hidden = [e for e in log.dicomweb(server.url) if radio in e["url"]]
        for e in hidden:  # each: 404, or a search with no match (the same URL, the same token)
            if e["status"] != 404:
                again = httpx.get(e["url"], headers=bearer, timeout=30)
                assert e["status"] == again.status_code == 200 and again.json() == [], (e, again.text[:200])
        assert hidden, "the viewer asked nothing about the study"
        assert page.get_by_text("Radio, Hidden").count() == 0
        allowed = httpx.get(f"{server.url}/studies/{studies['cardio']}/metadata", headers=bearer, timeout=30)
        assert allowed.status_code == 200 and allowed.json()[0]["00100010"]["Value"][0]["Alphabetic"] == "Cardio^Allowed"
        assert not [e for e in log.entries if e["status"] == 401], "a request went without the token"
        assert len(provider.token_requests) >= 2  # the reload logged in again, through the provider
    finally:
        log.save(artifacts / "viewer-oidc-requests.json")
        context.close()


def test_viewer_renews_its_token_silently(browser, archive, provider, artifacts):  # noqa: F811
    """A token about to expire (oidc-client-ts renews 60 s before): renewed in a hidden
    frame through the provider's session, landing on /viewer/silent-callback.html, with a
    new code and PKCE verifier; the new token is the one kept."""
    server, _studies = archive
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    provider.lifetime = 65
    try:
        page.goto(f"{server.url}/viewer/")
        with page.expect_response(lambda r: r.url.startswith(f"{server.url}/studies?"), timeout=TIMEOUT_MS):
            _log_in_at_the_provider(page, provider)
        key = f"oidc.user:{provider.url}:{CLIENT_ID}"
        first = json.loads(page.evaluate(f"sessionStorage.getItem('{key}')"))["access_token"]
        silent = f"{server.url}/viewer/silent-callback.html"
        with page.expect_response(lambda r: r.url == f"{provider.url}/token", timeout=TIMEOUT_MS):
            pass  # the renewal: about 5 s after the login
        page.wait_for_timeout(1000)
        authorize, token = _pkce_of_the_last_login(provider)
        assert authorize["redirect_uri"] == token["redirect_uri"] == silent and authorize["prompt"] == "none"
        second = json.loads(page.evaluate(f"sessionStorage.getItem('{key}')"))["access_token"]
        assert second != first
        assert httpx.get(f"{server.url}/studies", headers={"Authorization": f"Bearer {second}"},
                         timeout=30).status_code == 200
    finally:
        provider.lifetime = 3600
        context.close()


def test_operator_page_login_shows_only_the_allowed_studies(browser, archive, provider, artifacts):  # noqa: F811
    server, studies = archive
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    try:
        page.goto(f"{server.url}/ui/#/find")
        page.locator("#results").get_by_text("401").wait_for(timeout=TIMEOUT_MS)  # not logged in yet
        page.get_by_role("button", name="Log in").click()
        _log_in_at_the_provider(page, provider)
        page.locator("#who", has_text="logged in as carol").wait_for(timeout=TIMEOUT_MS)
        assert page.url == f"{server.url}/ui/#/find"  # back where it was, the code gone from the address
        page.locator("#results tbody tr").first.wait_for(timeout=TIMEOUT_MS)
        assert page.locator("#results tbody tr td:first-child").all_inner_texts() == ["Cardio^Allowed"]
        page.screenshot(path=str(artifacts / "operator-oidc-find.png"))
        authorize, token = _pkce_of_the_last_login(provider)
        assert authorize["redirect_uri"] == token["redirect_uri"] == f"{server.url}/ui/"
        token_kept = page.evaluate("sessionStorage.getItem('auth-token')")
        qido = [e for e in log.entries if e["url"].startswith(f"{server.url}/studies?")]
        assert qido[-1]["status"] == 200
        r = httpx.get(f"{server.url}/studies", headers={"Authorization": f"Bearer {token_kept}"}, timeout=30)
        assert [s["0020000D"]["Value"][0] for s in r.json()] == [studies["cardio"]]

        # the study not allowed: its page says it is not there
        page.goto(f"{server.url}/ui/#/study/{studies['radio']}")
        page.get_by_text(f"No study {studies['radio']} (deleted, or never stored).").wait_for(timeout=TIMEOUT_MS)
        assert "Radio^Hidden" not in page.locator("#view").inner_text()
        page.goto(f"{server.url}/ui/#/study/{studies['cardio']}")
        page.locator("#fact-patient-id", has_text="CARDIO").wait_for(timeout=TIMEOUT_MS)
        assert page.locator("#viewer-note").inner_text().strip() == \
            "The viewer asks you to log in with the same identity provider."
        assert httpx.get(f"{server.url}/studies/{studies['radio']}/metadata",
                         headers={"Authorization": f"Bearer {token_kept}"}, timeout=30).status_code == 404
    finally:
        log.save(artifacts / "operator-oidc-requests.json")
        context.close()

"""Issue 28, the operator's page (/ui/) with an OIDC login: its access token is renewed
without the user, in headless Chromium (as tests/interop/test_oidc_login.py), against the
stub provider (tests/interop/oidc_provider.py) giving tokens that live a few seconds.

- The page renews at 80 % of the token's lifetime: with the refresh token when the provider
  gave one (RFC 6749 §6), else by a silent authorization request (``prompt=none``) in a
  hidden frame back at /ui/silent-callback.html (own PKCE verifier, state and nonce). A
  search made after the first token expired (the archive refuses that token) is answered
  200 with the allowed study.
- Renewal refused (the user logged out at the provider: refresh token revoked,
  ``login_required``): the page says the login expired, offers "Log in again", tries
  nothing more, and logs in again from that button.
- The provider down for a moment (503): the refresh token is kept and tried again while the
  token lasts; the user stays logged in.
- A silent answer with another state, an ID token with another nonce, or tokens of another
  user (sub) are refused.
- A 401 to a call (a token the page believed still good) makes one renewal and one retry;
  a 401 to the retry, or to a renewed token no call was yet answered with, logs out (the
  archive refuses the provider's tokens): at most one renewal, even with Watch polling every 2 s.
- Access tokens whose ``sub`` is pairwise (not the ID token's) and a refresh answer without
  an ID token: the renewal is kept (OpenID Connect Core 1.0 §8, §12.2).
"""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest

from .oidc_provider import s256
from .test_ohif_viewer import TIMEOUT_MS, VIEWPORT, RequestLog, browser  # noqa: F401 (fixture)
from .test_oidc_login import AUDIENCE, CLIENT_ID, provider, start_archive  # noqa: F401 (fixture)

LIFETIME = 5  # seconds an access token lives here


@pytest.fixture
def stub(provider):  # noqa: F811 (provider: the fixture)
    """The provider with short tokens, reset after each test."""
    provider.lifetime = LIFETIME
    yield provider
    provider.lifetime, provider.claimed_lifetime, provider.refresh_tokens = 3600, None, False
    provider.audience, provider.forge, provider.unavailable = AUDIENCE, set(), 0
    provider.pairwise, provider.refresh_id_token = False, True
    provider.users.pop("dave", None)
    provider.end_sessions()


@pytest.fixture(scope="module")
def archive(provider, tmp_path_factory):  # noqa: F811 (provider: the fixture)
    """The archive with OIDC (no viewer: /ui/ alone), a cardio and a radio study."""
    server, studies = start_archive(provider, tmp_path_factory.mktemp("renew") / "data")
    yield server, studies
    server.stop()


@pytest.fixture
def page(browser):  # noqa: F811 (browser: the fixture)
    context = browser.new_context(viewport=VIEWPORT)
    yield context.new_page()
    context.close()


def _claims(token: str) -> dict:
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def _log_in(page, server, idp, button: str = "Log in") -> str:
    """Log carol in on /ui/#/find; her access token, once the study list shows."""
    if not page.url.startswith(f"{server.url}/ui/"):
        page.goto(f"{server.url}/ui/#/find")
        page.locator("#results").get_by_text("401").wait_for(timeout=TIMEOUT_MS)
    page.get_by_role("button", name=button, exact=True).click()
    page.wait_for_url(f"{idp.url}/authorize?*", timeout=TIMEOUT_MS)
    page.get_by_label("User name").fill("carol")
    page.get_by_role("button", name="Log in").click()
    page.locator("#who", has_text="logged in as carol").wait_for(timeout=TIMEOUT_MS)
    page.locator("#results tbody tr").first.wait_for(timeout=TIMEOUT_MS)
    return page.evaluate("sessionStorage.getItem('auth-token')")


def _wait_past_expiry(page, token: str) -> None:
    """Until the archive refuses ``token`` (its exp passed), the page left alone."""
    page.wait_for_timeout(max(0.0, _claims(token)["exp"] - time.time() + 1.2) * 1000)


def _search(page, server, patient_id: str = "CARDIO"):
    """A search (a hash change, as the Search button makes); its QIDO-RS answer."""
    with page.expect_response(lambda r: r.url.startswith(f"{server.url}/studies?") and r.status != 401,
                              timeout=TIMEOUT_MS) as info:
        page.evaluate(f"location.hash = '#/find?PatientID={patient_id}'")
    return info.value


def _uids(doc) -> list[str]:
    return [s["0020000D"]["Value"][0] for s in doc]


def _silent_renewals(server, authorizations: list[dict], tokens: list[dict]) -> None:
    """Each renewal a silent one, answered with a code: prompt=none back at the silent page,
    S256 challenge, state and nonce, and the code redeemed with the verifier of that challenge."""
    silent = f"{server.url}/ui/silent-callback.html"
    assert authorizations and len(tokens) == len(authorizations)
    for a, t in zip(authorizations, tokens):
        assert a["prompt"] == "none" and a["redirect_uri"] == silent and a["code_challenge_method"] == "S256"
        assert len(a["state"]) == len(a["nonce"]) == 43
        assert t["grant_type"] == "authorization_code" and t["redirect_uri"] == silent and t["status"] == 200
        assert s256(t["code_verifier"]) == a["code_challenge"]
    assert len({a["state"] for a in authorizations}) == len(authorizations)  # a new state each time


@pytest.mark.parametrize("grant", ["refresh_token", "silent"])
def test_the_page_keeps_working_past_the_first_tokens_expiry(page, archive, stub, grant, artifacts):
    """No user action after the login: a search made after the first token expired goes
    with a renewed token and is answered 200 with the cardio study only; no call of the
    page was refused on the way; the tokens stay in sessionStorage, out of every URL."""
    server, studies = archive
    stub.refresh_tokens = grant == "refresh_token"
    log = RequestLog(page)
    first = _log_in(page, server, stub)
    seen, asked, told = len(log.entries), len(stub.authorizations), len(stub.token_requests)
    assert (page.evaluate("sessionStorage.getItem('auth-refresh')") is not None) == stub.refresh_tokens
    _wait_past_expiry(page, first)
    assert httpx.get(f"{server.url}/studies", headers={"Authorization": f"Bearer {first}"},
                     timeout=30).status_code == 401  # the first token is no good any more

    qido = _search(page, server)
    assert qido.status == 200 and _uids(qido.json()) == [studies["cardio"]]
    sent = qido.request.headers["authorization"]
    assert sent.startswith("Bearer ey") and sent != f"Bearer {first}"
    assert _claims(sent[7:])["iat"] > _claims(first)["iat"]
    page.locator("#results tbody tr td:first-child", has_text="Cardio^Allowed").wait_for(timeout=TIMEOUT_MS)
    assert page.locator("#results tbody tr td:first-child").all_inner_texts() == ["Cardio^Allowed"]
    assert page.locator("#who").inner_text() == "logged in as carol"
    page.screenshot(path=str(artifacts / f"operator-renewed-{grant}.png"))

    renewals, authorizations = stub.token_requests[told:], stub.authorizations[asked:]
    if grant == "refresh_token":  # the refresh token only: no frame, no authorization request
        assert authorizations == [] and renewals
        assert all(t["grant_type"] == "refresh_token" and t["status"] == 200 for t in renewals), renewals
        assert all(t["client_id"] == CLIENT_ID for t in renewals)
    else:
        _silent_renewals(server, authorizations, renewals)
    assert len(renewals) <= 3  # at 80 % of 5 s: one per 4 s, not more
    after = log.entries[seen:]
    assert not [e for e in after if e["status"] == 401], after  # renewed before expiry: nothing refused
    current = page.evaluate("sessionStorage.getItem('auth-token')")
    assert page.evaluate("localStorage.length") == 0
    for e in log.entries:
        assert first not in e["url"] and current not in e["url"]


def test_a_refused_renewal_shows_the_logged_out_state(page, archive, stub, artifacts):
    """The user logged out at the provider: the refresh token is refused (invalid_grant), the
    silent request answers login_required; the page forgets the tokens, says so, offers
    "Log in again", and asks the provider nothing more until the user does."""
    server, studies = archive
    stub.refresh_tokens = True
    _log_in(page, server, stub)
    asked, told = len(stub.authorizations), len(stub.token_requests)
    stub.end_sessions()

    page.locator("#who", has_text="none: the login expired").wait_for(timeout=TIMEOUT_MS)
    again = page.get_by_role("button", name="Log in again", exact=True)
    assert again.is_visible()
    status = page.locator("#status")
    assert "login_required" in status.inner_text() and "log in again" in status.inner_text()
    assert status.get_attribute("class") == "error"
    assert [(t["grant_type"], t["status"]) for t in stub.token_requests[told:]] == [("refresh_token", 400)]
    silent = stub.authorizations[asked:]
    assert [(a["prompt"], a["redirect_uri"]) for a in silent] == [("none", f"{server.url}/ui/silent-callback.html")]
    for key in ("auth-token", "auth-refresh", "auth-expires", "auth-renew-at"):
        assert page.evaluate(f"sessionStorage.getItem('{key}')") is None, key
    assert page.evaluate("sessionStorage.getItem('auth-scheme')") == "oidc-expired"
    page.screenshot(path=str(artifacts / "operator-login-expired.png"))

    # nothing more is tried: a search is sent without a token and answered 401, no renewal
    with page.expect_response(lambda r: r.url.startswith(f"{server.url}/studies?"), timeout=TIMEOUT_MS) as info:
        page.evaluate("location.hash = '#/find?PatientID=CARDIO'")
    assert info.value.status == 401 and "authorization" not in info.value.request.headers
    page.locator("#results").get_by_text("401").wait_for(timeout=TIMEOUT_MS)
    page.wait_for_timeout(LIFETIME * 1000)
    assert len(stub.authorizations) == asked + 1 and len(stub.token_requests) == told + 1

    # "Log in again": the provider's form, and the page works again
    _log_in(page, server, stub, button="Log in again")
    assert page.locator("#results tbody tr td:first-child").all_inner_texts() == ["Cardio^Allowed"]
    assert page.get_by_role("button", name="Log in", exact=True).is_visible()


def test_a_provider_outage_is_tried_again_while_the_token_lasts(page, archive, stub):
    """The refresh at 80 % of 12 s answered 503 (no error: not a refusal): the page keeps
    its refresh token, tries again halfway to the token's end, and stays logged in; the
    search after the first token's end goes with the renewed token."""
    server, studies = archive
    stub.lifetime, stub.refresh_tokens = 12, True
    first = _log_in(page, server, stub)
    asked, told = len(stub.authorizations), len(stub.token_requests)
    stub.unavailable = 1
    _wait_past_expiry(page, first)
    qido = _search(page, server)
    assert qido.status == 200 and _uids(qido.json()) == [studies["cardio"]]
    assert qido.request.headers["authorization"] != f"Bearer {first}"
    assert [(t["grant_type"], t["status"]) for t in stub.token_requests[told:]] == \
        [("refresh_token", 503), ("refresh_token", 200)]
    assert stub.token_requests[told]["refresh_token"] == stub.token_requests[told + 1]["refresh_token"]
    assert stub.authorizations[asked:] == [] and page.locator("#who").inner_text() == "logged in as carol"


@pytest.mark.parametrize("forged", ["state", "nonce"])
def test_a_silent_answer_not_for_this_renewal_is_refused(page, archive, stub, forged):
    """The silent renewal checks what the login checks: the state of the redirect (else the
    code is not even redeemed) and the nonce of the ID token (else the tokens are not kept)."""
    server, _studies = archive
    _log_in(page, server, stub)
    asked, told = len(stub.authorizations), len(stub.token_requests)
    stub.forge = {forged}
    page.locator("#who", has_text="none: the login expired").wait_for(timeout=TIMEOUT_MS)
    assert f"({forged})" in page.locator("#status").inner_text()
    assert [a["prompt"] for a in stub.authorizations[asked:]] == ["none"]
    assert [t["status"] for t in stub.token_requests[told:]] == ([] if forged == "state" else [200])
    assert page.evaluate("sessionStorage.getItem('auth-token')") is None


def test_a_renewal_for_another_user_is_refused(page, archive, stub):
    """Someone else logged in at the provider in the same browser: the silent renewal comes
    back with dave's tokens, not carol's (another sub); the page does not keep them."""
    server, _studies = archive
    _log_in(page, server, stub)
    told = len(stub.token_requests)
    stub.users["dave"] = {"groups": ["radiology"], "scope": "openid dicomweb:read"}
    for cookie in stub.sessions:
        stub.sessions[cookie] = "dave"
    page.locator("#who", has_text="none: the login expired").wait_for(timeout=TIMEOUT_MS)
    assert "(sub)" in page.locator("#status").inner_text()
    assert [(t["grant_type"], t["status"]) for t in stub.token_requests[told:]] == [("authorization_code", 200)]
    assert page.evaluate("sessionStorage.getItem('auth-token')") is None


def test_a_401_renews_once_and_retries_once(page, archive, stub):
    """The provider says the token lives an hour (expires_in) but it ends after 5 s (a page
    whose timer came late: a tab in the background). The search after its end is refused
    (401), the page renews once (the silent request) and sends it once more: 200."""
    server, studies = archive
    stub.claimed_lifetime = 3600
    log = RequestLog(page)
    first = _log_in(page, server, stub)
    asked, told = len(stub.authorizations), len(stub.token_requests)
    _wait_past_expiry(page, first)
    assert len(stub.token_requests) == told  # no renewal by the timer (at 80 % of an hour)
    seen = len(log.entries)

    qido = _search(page, server)
    assert qido.status == 200 and _uids(qido.json()) == [studies["cardio"]]
    page.locator("#results tbody tr td:first-child", has_text="Cardio^Allowed").wait_for(timeout=TIMEOUT_MS)
    searches = [e for e in log.entries[seen:] if e["url"].startswith(f"{server.url}/studies?")]
    assert [e["status"] for e in searches] == [401, 200], searches
    _silent_renewals(server, stub.authorizations[asked:], stub.token_requests[told:])
    assert len(stub.token_requests) == told + 1  # one renewal, shared by the search and the labels call
    assert qido.request.headers["authorization"] == "Bearer " + page.evaluate("sessionStorage.getItem('auth-token')")


def _refused_renewed_token(page) -> None:
    """The logged-out state, saying the archive refused the renewed token."""
    page.locator("#who", has_text="none: the login expired").wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_role("button", name="Log in again", exact=True).is_visible()
    assert "the archive refused the renewed token (401)" in page.locator("#status").inner_text()
    assert page.locator("#status").get_attribute("class") == "error"
    assert page.evaluate("sessionStorage.getItem('auth-scheme')") == "oidc-expired"
    for key in ("auth-token", "auth-refresh", "auth-expires", "auth-renew-at"):
        assert page.evaluate(f"sessionStorage.getItem('{key}')") is None, key


def test_a_second_401_is_the_answer_not_a_loop(page, archive, stub):
    """The renewed token is refused too (the provider now gives tokens for another
    audience): one renewal, one retry, then the page logs out saying the archive refused
    the renewed token, and stops."""
    server, _studies = archive
    stub.claimed_lifetime = 3600
    stub.refresh_tokens = True
    log = RequestLog(page)
    first = _log_in(page, server, stub)
    told = len(stub.token_requests)
    stub.audience = "another-service"
    _wait_past_expiry(page, first)
    seen = len(log.entries)

    page.evaluate("location.hash = '#/find?PatientID=CARDIO'")
    page.locator("#results").get_by_text("401").wait_for(timeout=TIMEOUT_MS)
    page.wait_for_timeout(3000)
    searches = [e for e in log.entries[seen:] if e["url"].startswith(f"{server.url}/studies?")]
    assert [e["status"] for e in searches] == [401, 401], searches
    renewals = stub.token_requests[told:]
    assert [(t["grant_type"], t["status"]) for t in renewals] == [("refresh_token", 200)]
    _refused_renewed_token(page)


@pytest.mark.parametrize("renewed_by", ["401", "timer"])
def test_refused_renewed_tokens_do_not_make_a_renewal_per_poll(page, archive, stub, renewed_by, artifacts):
    """The provider keeps issuing tokens the archive refuses (another audience) while Watch
    polls /metrics and / every 2 s. Renewed on the first 401 (the timer late: expires_in says
    an hour) or by the timer at 80 % of 5 s: either way one renewal in 10 s, not one per poll;
    the page logs out saying the archive refused the renewed token, and polls on without a
    token. Without the limit: a renewal (a rotated refresh token) every 2 s, logged in forever."""
    server, _studies = archive
    stub.refresh_tokens = True
    if renewed_by == "401":
        stub.claimed_lifetime = 3600
    first = _log_in(page, server, stub)
    told = len(stub.token_requests)
    stub.audience = "another-service"
    if renewed_by == "401":
        _wait_past_expiry(page, first)
    log = RequestLog(page)
    page.evaluate("location.hash = '#/watch'")
    page.wait_for_timeout(10_000)
    renewals = stub.token_requests[told:]
    assert [(t["grant_type"], t["status"]) for t in renewals] == [("refresh_token", 200)], renewals
    _refused_renewed_token(page)
    metrics = [e for e in log.entries if e["url"] == f"{server.url}/metrics"]
    assert len(metrics) >= 4 and metrics[-1]["status"] == 401  # Watch polled on: 401 without a token
    page.screenshot(path=str(artifacts / f"operator-renewed-token-refused-{renewed_by}.png"))


def test_a_pairwise_access_token_sub_and_a_refresh_without_id_token_are_kept(page, archive, stub):
    """The access token's sub is pairwise for the archive (OpenID Connect Core 1.0 §8), not
    the ID token's, and the refresh answer has no ID token (§12.2 allows it): the page keeps
    the renewal (the user is the login's ID token sub) and stays logged in; the search after
    the first token's end goes with the renewed token: 200, the cardio study."""
    server, studies = archive
    stub.refresh_tokens, stub.pairwise, stub.refresh_id_token = True, True, False
    first = _log_in(page, server, stub)
    assert _claims(first)["sub"] == stub.pairwise_sub("carol") != "carol"
    assert page.evaluate("sessionStorage.getItem('auth-sub')") == "carol"  # the ID token's
    told = len(stub.token_requests)
    _wait_past_expiry(page, first)
    qido = _search(page, server)
    assert qido.status == 200 and _uids(qido.json()) == [studies["cardio"]]
    sent = qido.request.headers["authorization"][7:]
    assert sent != first and _claims(sent)["sub"] == stub.pairwise_sub("carol")
    renewals = stub.token_requests[told:]
    assert renewals and all(t["grant_type"] == "refresh_token" and t["status"] == 200 for t in renewals), renewals
    assert page.locator("#who").inner_text() == "logged in as carol"
    assert page.evaluate("sessionStorage.getItem('auth-scheme')") == "oidc"
    assert page.evaluate("sessionStorage.getItem('auth-sub')") == "carol"

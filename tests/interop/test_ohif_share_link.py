"""A share link opened in the OHIF viewer (npm ``@ohif/app``) in headless Chromium
(api/shares.py; the browser set-up of test_ohif_viewer.py): the link's ``url`` shows the
study's image, every DICOMweb request the viewer makes with the token is answered, none
reaches another study; after revocation the same URL gets 401 and shows nothing."""

from __future__ import annotations

import httpx

from tests.helpers import LiveServer

from .studies import make_study, stow_body
from .test_ohif_viewer import (TIMEOUT_MS, VIEWPORT, RequestLog, _wait_for_response, browser,  # noqa: F401 - fixtures
                               ohif_dist, wait_for_image)

KEY = "share-test-key"


def _store(url: str, datasets) -> None:
    body, ctype = stow_body(datasets)
    r = httpx.post(f"{url}/studies", content=body, timeout=60,
                   headers={"Content-Type": ctype, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text


def test_a_share_link_opens_its_study_in_the_viewer(browser, ohif_dist, tmp_path, artifacts):  # noqa: F811
    server = LiveServer(tmp_path / "data", "sqlite", viewer=True, viewer_dir=ohif_dist,
                        api_keys={KEY: ["read", "write", "delete"]}).start()
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    try:
        shared = make_study(slices=4, size=128)
        other = make_study(slices=2, size=64, patient="Other^Patient", patient_id="OTHER")
        _store(server.url, shared)
        _store(server.url, other)
        study_uid, other_uid = str(shared[0].StudyInstanceUID), str(other[0].StudyInstanceUID)
        r = httpx.post(f"{server.url}/studies/{study_uid}/share", headers={"Authorization": f"Bearer {KEY}"},
                       json={"expires_in": 600})
        assert r.status_code == 201, r.text
        link = r.json()
        assert link["url"].startswith(f"{server.url}/viewer/viewer?StudyInstanceUIDs={study_uid}&token=")

        # without credentials the viewer gets nothing; with the link's URL, the study
        page.goto(link["url"])
        wait_for_image(page)
        page.get_by_text("CT phantom").first.wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artifacts / "share-link.png"))
        calls = log.dicomweb(server.url)
        assert calls and not log.failures, "\n".join(log.failures)
        assert any("/metadata" in e["url"] for e in calls) and any("/frames/" in e["url"] for e in calls)
        assert all(other_uid not in e["url"] for e in calls)
        assert link["token"] not in page.url  # OHIF took the token off the address

        # the token reaches that study only, even asked directly
        token = {"Authorization": f"Bearer {link['token']}"}
        assert httpx.get(f"{server.url}/studies/{other_uid}/metadata", headers=token).status_code == 404
        assert [s["0020000D"]["Value"][0] for s in httpx.get(f"{server.url}/studies", headers=token).json()] \
            == [study_uid]

        # revoked: the same URL's DICOMweb requests are 401
        assert httpx.delete(f"{server.url}/shares/{link['id']}",
                            headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        refused = _wait_for_response(page, lambda r: r.url.startswith(server.url + "/studies"),
                                     lambda: page.goto(link["url"]))
        assert refused.status == 401
    finally:
        log.save(artifacts / "share-link-requests.json")
        context.close()
        server.stop()

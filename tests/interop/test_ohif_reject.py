"""OHIF's reject action against the archive (issue 27), in the browser the viewer tests use
(Debian Chromium via Playwright, the fixtures of test_ohif_viewer.py).

OHIF 3.13's DICOMweb data source has ``reject.series`` when ``supportsReject`` is true:
``POST {wadoRoot}/studies/{study}/series/{series}/reject/113001%5EDCM`` (dcm4chee's form,
api/reject.py). The shipped build has no menu item that calls it (its Thumbnail takes
``canReject``/``onReject`` but nothing passes them), so the app-config the archive serves
adds "Reject series" to the study browser's thumbnail menu (viewer.py); the item calls
OHIF's own data source. The test clicks it as a person would, confirms, and checks with
QIDO-RS and GET /admin/rejected that the series is rejected.
"""

from __future__ import annotations

import httpx

from tests.helpers import LiveServer

from .conftest import store
from .studies import make_study
from .test_ohif_viewer import TIMEOUT_MS, VIEWPORT, RequestLog, browser, ohif_dist, wait_for_image  # noqa: F401


def test_reject_a_series_from_the_viewer(browser, ohif_dist, tmp_path, artifacts):  # noqa: F811
    study = make_study(slices=3, size=64)
    study_uid = str(study[0].StudyInstanceUID)
    ct_series, mr_series = str(study[0].SeriesInstanceUID), str(study[-1].SeriesInstanceUID)
    mr_sops = sorted(str(ds.SOPInstanceUID) for ds in study if ds.Modality == "MR")
    server = LiveServer(tmp_path / "data", "sqlite", viewer=True, viewer_dir=ohif_dist).start()
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    dialogs: list[str] = []

    def confirm(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    try:
        store(server.url, study)
        page.goto(f"{server.url}/viewer/viewer?StudyInstanceUIDs={study_uid}")
        wait_for_image(page)

        # OHIF 3.13.2's own reject.series fails before sending anything (an OHIF bug: its
        # dcm4cheeReject is given the auth header function before initialize sets it);
        # the menu item then sends the same request itself (viewer.py)
        error = page.evaluate("""([study, series]) => window.extensionManager.getActiveDataSource()[0]
            .reject.series(study, series).then(() => 'sent', e => String(e))""", [study_uid, "1.2.3.4"])
        assert error == "TypeError: getAuthrorizationHeader is not a function", error

        # the MR thumbnail's "..." menu in the study browser: Reject series, confirm
        thumb = page.locator("[id^='thumbnail-']").filter(has_text="MR phantom").first
        thumb.wait_for(timeout=TIMEOUT_MS)
        thumb.hover()
        thumb.locator("button[aria-haspopup=menu]").click(timeout=TIMEOUT_MS)  # the "..." button
        item = page.get_by_role("menuitem", name="Reject series")
        page.screenshot(path=str(artifacts / "viewer-reject-menu.png"))
        with page.expect_response(lambda r: r.request.method == "POST" and "/reject/" in r.url,
                                  timeout=TIMEOUT_MS) as info:
            item.click(timeout=TIMEOUT_MS)
        answer = info.value
        assert answer.url == f"{server.url}/studies/{study_uid}/series/{mr_series}/reject/113001%5EDCM"
        assert answer.status == 200 and answer.json() == {"count": 3}
        assert len(dialogs) == 1 and 'Reject series "MR phantom"' in dialogs[0], dialogs
        page.get_by_text("Series rejected").first.wait_for(timeout=TIMEOUT_MS)
        page.wait_for_timeout(500)
        assert page.locator("[id^='thumbnail-']").filter(has_text="MR phantom").count() == 0
        page.screenshot(path=str(artifacts / "viewer-rejected.png"))
        assert not log.failures, "\n".join(log.failures)

        # the archive: the series is gone from QIDO-RS, listed as rejected
        series = httpx.get(f"{server.url}/studies/{study_uid}/series", timeout=30).json()
        assert [s["0020000E"]["Value"][0] for s in series] == [ct_series]
        instances = httpx.get(f"{server.url}/studies/{study_uid}/instances", timeout=30).json()
        assert {i["0020000E"]["Value"][0] for i in instances} == {ct_series} and len(instances) == 3
        assert httpx.get(f"{server.url}/studies/{study_uid}/series/{mr_series}/metadata", timeout=30).status_code == 404
        rejected = httpx.get(f"{server.url}/admin/rejected", params={"study": study_uid}, timeout=30).json()
        assert sorted(r["SOPInstanceUID"] for r in rejected) == mr_sops
        assert {(r["SeriesInstanceUID"], r["Reason"], r["Stored"]) for r in rejected} == {(mr_series, "113001^DCM", True)}

        # opened again, the viewer shows the CT series only
        page.goto(f"{server.url}/viewer/viewer?StudyInstanceUIDs={study_uid}")
        wait_for_image(page)
        page.get_by_text("CT phantom").first.wait_for(timeout=TIMEOUT_MS)
        assert page.get_by_text("MR phantom").count() == 0
    finally:
        log.save(artifacts / "viewer-reject-requests.json")
        context.close()
        server.stop()

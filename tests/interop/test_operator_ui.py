"""The operator's page (``/ui/``, dicomweb_server/ui/) in headless Chromium, as an operator
uses it, against an archive with API keys: Debian's Chromium driven by Playwright, set up
as the viewer test does (tests/interop/test_ohif_viewer.py: its ``browser`` fixture).

Every request the browser makes to another origin is refused: the page (and ``/docs``)
must work on a network with nothing but the archive. One archive A routes to two
destinations: ``second`` (archive B) and ``late`` (a port nobody listens on until the test
starts archive C there, so its forwards go to the dead letters first). The test finds the
study, opens its page, uploads a file, sends the study to B and sees it delivered, sends
it to ``late``, sees the dead letter and its error, starts C, retries, sees it delivered,
edits PatientName, rejects and restores, watches the numbers, deletes; each time it checks
the archives' own answers (QIDO-RS), not only the page. Screenshots go to the artefacts
folder, and to docs/ (the pictures of docs/operator.md) with DICOMWEB_UPDATE_SCREENSHOTS=1, so a
test run leaves the checkout as it was.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.helpers import LiveServer, free_port, make_dataset
from tests.helpers import to_bytes as dataset_bytes

from .studies import make_study, stow_body
from .test_ohif_viewer import TIMEOUT_MS, VIEWPORT, RequestLog, browser  # noqa: F401 (the fixture)

KEY = "operator-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ADMIN = {"Authorization": "Bearer operator-admin-key"}  # the admin scope: makes de-identification projects
DOCS = Path(__file__).parents[2] / "docs"


def _routes(path: Path, second: str, late_port: int) -> Path:
    path.write_text(f"""
[[destinations]]
name = "second"
stow_url = "{second}"

[[destinations]]
name = "late"
stow_url = "http://127.0.0.1:{late_port}"

[delivery]
max_attempts = 1
backoff_base = 0.05
backoff_max = 0.2
poll_interval = 0.2
timeout = 5
""")
    return path


def _studies(url: str, headers=None, **query) -> list:
    r = httpx.get(f"{url}/studies", params=query, headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _confirm(page, label: str) -> None:
    """The page's confirm step: a modal dialog naming what will happen."""
    dialog = page.locator("dialog#confirm")
    dialog.wait_for(state="visible", timeout=TIMEOUT_MS)
    page.locator("#confirm-ok", has_text=label).click()
    dialog.wait_for(state="hidden", timeout=TIMEOUT_MS)


def _zip_members(path) -> list[str]:
    """The names in a downloaded ZIP, after zipfile's CRC check of every member."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        return z.namelist()


def _routing_row(page, destination: str):
    return page.locator("#routing tbody tr", has=page.locator("td", has_text=destination)).first


def login_basic(page, url: str, user: str, password: str) -> None:
    """Open the page and log in with Basic credentials (the login form, as typed)."""
    page.goto(f"{url}/ui/")
    page.locator("#login summary").click()
    page.get_by_label("Scheme").select_option("basic")
    page.get_by_label("User").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Use these credentials").click()
    page.locator("#who", has_text=f"Basic: {user}").wait_for()


def _offline(context, origin: str) -> list[str]:
    """Refuse (and note) every request to another origin than the archive's."""
    refused: list[str] = []

    def handle(route):
        u = urlparse(route.request.url)
        if f"{u.scheme}://{u.netloc}" == origin or u.scheme in ("data", "blob"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", handle)
    return refused


@pytest.fixture
def archives(tmp_path):
    second = LiveServer(tmp_path / "second", "sqlite").start()
    late_port = free_port()
    a = LiveServer(tmp_path / "a", "sqlite", api_keys={KEY: ["read", "write", "delete"], "operator-admin-key": ["admin"]},
                   routes_file=_routes(tmp_path / "routes.toml", second.url, late_port)).start()
    late = LiveServer(tmp_path / "late", "sqlite")
    late.settings = late.settings.model_copy(update={"port": late_port})
    late.url = f"http://127.0.0.1:{late_port}"
    yield a, second, late
    for s in (a, second, late):
        s.stop()


def test_operator_page(browser, archives, tmp_path, artifacts):  # noqa: F811 (browser: the fixture)
    shots = DOCS if os.environ.get("DICOMWEB_UPDATE_SCREENSHOTS") == "1" else artifacts
    from playwright.sync_api import expect  # here: without playwright, the browser fixture says what to install

    a, second, late = archives
    study = make_study(slices=3, size=64, patient="Operator^Find", patient_id="OP-1")
    uid = str(study[0].StudyInstanceUID)
    body, ctype = stow_body(study)  # the archive needs the key
    assert httpx.post(f"{a.url}/studies", content=body, headers={"Content-Type": ctype, **AUTH}, timeout=60).status_code == 200

    context = browser.new_context(viewport=VIEWPORT, permissions=["clipboard-read", "clipboard-write"])
    refused = _offline(context, a.url)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    log = RequestLog(page)
    try:
        # without credentials the API says 401 and the page says so
        page.goto(f"{a.url}/ui/")
        page.get_by_text("401").first.wait_for()

        # credentials: an API key, sent as Authorization: Bearer by every request of the page
        page.locator("#login summary").click()
        page.get_by_label("Scheme").select_option("key")
        page.get_by_label("API key").fill(KEY)
        page.get_by_role("button", name="Use these credentials").click()
        page.locator("#who", has_text="API key").wait_for()

        # Find: by name (a part of it, as typed) and a date range; the study's row links to its page
        page.get_by_label("Patient name").fill("operator")
        page.get_by_label("Study date from").fill("2024-03-01")
        page.get_by_label("Study date to").fill("2024-03-31")
        page.get_by_label("Modality").fill("CT")
        with page.expect_response(lambda x: "/studies?" in x.url and "StudyDate=20240301-20240331" in x.url) as q:
            page.get_by_role("button", name="Search").click()
        assert q.value.status == 200 and "PatientName=*operator*&" in q.value.url
        row = page.locator("#results tbody tr")
        row.first.wait_for()
        assert row.count() == 1
        cells = row.first.locator("td").all_inner_texts()
        assert cells == ["Operator^Find", "OP-1", "2024-03-15", "ACC-INTEROP", "CT, MR", "Interop CT and MR", "2", "6"]
        page.screenshot(path=str(shots / "operator-find.png"))
        # a date range without the study finds nothing
        page.get_by_label("Study date from").fill("2025-01-01")
        page.get_by_label("Study date to").fill("2025-12-31")
        page.get_by_role("button", name="Search").click()
        page.get_by_text("No study matches.").wait_for()

        # Upload: a file chosen (or dropped) -> confirm -> STOW-RS; the archive holds it
        extra = make_dataset(PatientName="Operator^Upload", PatientID="OP-2", StudyDate="20240316")
        upload = tmp_path / "upload.dcm"
        upload.write_bytes(dataset_bytes(extra))
        page.locator("#upload-files").set_input_files(str(upload))
        _confirm(page, "Upload")
        page.get_by_text("Stored 1, failed 0.").wait_for()
        assert [s["0020000D"]["Value"][0] for s in _studies(a.url, AUTH, PatientID="OP-2")] == \
            [str(extra.StudyInstanceUID)]
        assert page.get_by_role("link", name=f"Open study {extra.StudyInstanceUID}").count() == 1
        # ... and a file dropped on the box (a drop event carrying a File, as a drag from the desktop does)
        dropped = make_dataset(PatientName="Operator^Dropped", PatientID="OP-4", StudyDate="20240317")
        page.evaluate("""([b64, name]) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], name, { type: "application/dicom" }));
            document.getElementById("upload").dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
        }""", [base64.b64encode(dataset_bytes(dropped)).decode(), "dropped.dcm"])
        _confirm(page, "Upload")
        page.get_by_role("link", name=f"Open study {dropped.StudyInstanceUID}").wait_for()
        got = _studies(a.url, AUTH, PatientID="OP-4")
        assert [s["0020000D"]["Value"][0] for s in got] == [str(dropped.StudyInstanceUID)]

        # Study page: series with counts and thumbnails, the viewer link, routing state
        page.goto(f"{a.url}/ui/#/study/{uid}")
        page.get_by_role("heading", name="Study of Operator^Find").wait_for()
        series = page.locator("#series tbody tr")
        series.nth(1).wait_for()
        assert [series.nth(i).locator("td").nth(2).inner_text() for i in range(2)] == ["CT", "MR"]
        assert [series.nth(i).locator("td").nth(4).inner_text() for i in range(2)] == ["3", "3"]
        page.wait_for_function("[...document.querySelectorAll('#series img.thumb')].every(i => i.naturalWidth > 0)")
        assert page.get_by_role("link", name="Open in the viewer").get_attribute("href") == \
            f"/viewer/viewer?StudyInstanceUIDs={uid}"
        # with credentials in use, the viewer link says OHIF sends none
        assert "sends no credentials" in page.locator("#viewer-note").inner_text()

        # ZIP downloads (GET .../archive, with the page's key): the study, then one series
        with page.expect_download() as dl:
            page.get_by_role("button", name="Download study (ZIP with DICOMDIR)").click()
        assert dl.value.suggested_filename == f"study-{uid}.zip"
        members = _zip_members(dl.value.path())
        assert members[-1] == "DICOMDIR" and len(members) == 7, members  # 6 instances and the DICOMDIR
        series_uid = str(study[0].SeriesInstanceUID)
        with page.expect_download() as dl:
            page.locator("#series tbody tr", has_text=series_uid).get_by_role("button", name="Download series").click()
        assert dl.value.suggested_filename == f"series-{series_uid}.zip"
        members = _zip_members(dl.value.path())
        assert members[-1] == "DICOMDIR" and len(members) == 4, members

        # De-identified ZIP (docs/research-export.md): the project made first by an admin, as the
        # docs show; then, in the page, a project named, confirmed, the ZIP saved
        assert httpx.post(f"{a.url}/admin/deid/op-research/pseudonyms", content=b"", headers=ADMIN).status_code in (200, 201)
        page.get_by_label("Research project").fill("op-research")
        page.get_by_role("button", name="Download de-identified (ZIP)").click()
        page.locator("#confirm-text", has_text='project "op-research"').wait_for()
        with page.expect_download() as dl:
            _confirm(page, "Download")
        assert dl.value.suggested_filename == "deidentified-op-research.zip"
        members = _zip_members(dl.value.path())
        assert members[-1] == "DICOMDIR" and "DEIDENTIFICATION.json" in members and len(members) == 8, members
        import zipfile

        with zipfile.ZipFile(dl.value.path()) as z:
            leaked = [m for m in members if b"OP-1" in z.read(m) or b"Operator^Find" in z.read(m)]
        assert leaked == []  # neither the PatientID nor the PatientName in any member

        # Share link: made (expiry chosen, confirm); its token finds this study alone over QIDO-RS;
        # the URL copied; revoked in the page: the token gets 401
        page.locator("#share-none", has_text="No active share link.").wait_for()
        page.get_by_label("Expires after").select_option(label="1 day")
        page.get_by_role("button", name="Share…", exact=True).click()
        with page.expect_response(lambda x: x.url.endswith(f"/studies/{uid}/share")) as made:
            _confirm(page, "Share")
        assert made.value.status == 201 and made.value.request.post_data_json == {"expires_in": 86400}
        share_id = made.value.json()["id"]
        page.locator("#share-url").wait_for()
        url = page.locator("#share-url").input_value()
        token = parse_qs(urlparse(url).query)["token"][0]
        assert url == f"{a.url}/viewer/viewer?StudyInstanceUIDs={uid}&token={token}"
        bearer = {"Authorization": f"Bearer {token}"}
        assert [s["0020000D"]["Value"][0] for s in _studies(a.url, bearer)] == [uid]  # this study alone
        page.get_by_role("button", name="Copy", exact=True).click()
        page.get_by_text("Copied the viewer URL.").wait_for()
        assert page.evaluate("navigator.clipboard.readText()") == url
        assert page.locator("#share tbody tr").all_inner_texts()[0].startswith(share_id)
        page.get_by_role("button", name=f"Revoke share link {share_id}").click()
        _confirm(page, "Revoke")
        page.locator("#share-none").wait_for()
        assert httpx.get(f"{a.url}/studies", params={"StudyInstanceUID": uid}, headers=bearer).status_code == 401
        assert [(s["id"], s["revoked"]) for s in httpx.get(f"{a.url}/shares", headers=AUTH).json()] == [(share_id, True)]

        # Labels: add one (confirm), find by it, remove it (confirm); the API's answers each time
        page.locator("#label-list", has_text="No label.").wait_for()
        page.get_by_label("New label").fill("op-check")
        page.get_by_role("button", name="Add label").click()
        _confirm(page, "Add")
        page.get_by_role("button", name="Remove label op-check").wait_for()
        assert httpx.get(f"{a.url}/studies/{uid}/labels", headers=AUTH).json() == ["op-check"]
        page.locator("#label-list").get_by_role("link", name="op-check").click()  # Find, by this label
        page.get_by_label("Label", exact=True).wait_for()
        assert page.get_by_label("Label", exact=True).input_value() == "op-check"
        page.locator("#results tbody tr").first.wait_for()
        assert page.locator("#results tbody tr td:first-child").all_inner_texts() == ["Operator^Find"]
        with page.expect_response(lambda x: "/studies?" in x.url and "label=nobody-has-it" in x.url) as q:
            page.get_by_label("Label", exact=True).fill("nobody-has-it")
            page.get_by_role("button", name="Search").click()
        assert q.value.status == 200 and q.value.json() == []
        page.get_by_text("No study matches.").wait_for()
        page.goto(f"{a.url}/ui/#/study/{uid}")
        page.get_by_role("button", name="Remove label op-check").click()
        _confirm(page, "Remove")
        page.locator("#label-list", has_text="No label.").wait_for()
        assert httpx.get(f"{a.url}/studies/{uid}/labels", headers=AUTH).json() == []
        assert _studies(a.url, AUTH, label="op-check") == []
        _routing_row(page, "second").wait_for()
        page.set_viewport_size({"width": 768, "height": 1024})  # a tablet: nothing wider than the screen
        assert page.evaluate("document.documentElement.scrollWidth") <= 768
        page.set_viewport_size(VIEWPORT)
        assert _routing_row(page, "second").locator("td").nth(2).inner_text() == "not sent"

        # Send to a destination: the study arrives in the second archive
        page.get_by_role("button", name="Send to second").click()
        _confirm(page, "Send")
        expect(_routing_row(page, "second").locator("td").nth(2)).to_have_text("delivered", timeout=TIMEOUT_MS)
        assert _routing_row(page, "second").locator("td").nth(3).inner_text() == "6"
        got = _studies(second.url, StudyInstanceUID=uid)
        assert len(got) == 1 and got[0]["00201208"]["Value"] == [6]

        # Send to a destination that is down: dead letters, the error shown; retry once it is up
        page.get_by_role("button", name="Send to late").click()
        _confirm(page, "Send")
        expect(_routing_row(page, "late").locator("td").nth(2)).to_have_text("dead letter", timeout=TIMEOUT_MS)
        dead = _routing_row(page, "late").locator("td").all_inner_texts()
        assert dead[5] == "6" and dead[6] == "gave up after 1 attempt(s), 0 s: ConnectError: All connection attempts failed"  # six dead letters, and why
        page.locator("#routing").scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "operator-study.png"))
        late.start()
        page.get_by_role("button", name="Retry dead letters of late").click()
        _confirm(page, "Retry")
        expect(_routing_row(page, "late").locator("td").nth(2)).to_have_text("delivered", timeout=TIMEOUT_MS)
        assert _routing_row(page, "late").locator("td").nth(5).inner_text() == "0"
        assert _studies(late.url, StudyInstanceUID=uid)[0]["00201208"]["Value"] == [6]

        # Edit PatientName ($update): every instance changed, a new version each
        page.locator("#edit").get_by_label("Patient name").fill("Renamed^Operator")
        page.get_by_role("button", name="Save changes").click()
        _confirm(page, "Save")
        page.get_by_role("heading", name="Study of Renamed^Operator").wait_for()
        assert _studies(a.url, AUTH, StudyInstanceUID=uid)[0]["00100010"]["Value"] == [{"Alphabetic": "Renamed^Operator"}]
        page.locator("#versions tbody tr").first.wait_for()
        assert page.locator("#versions tbody tr").first.locator("td").nth(1).inner_text() == "2"
        page.locator("#history tbody tr", has_text="update").first.wait_for()

        # Reject (hidden from searches), then restore
        page.get_by_role("button", name="Reject study").click()
        _confirm(page, "Reject")
        page.locator("#rejection-state", has_text="6 instance(s) rejected").wait_for()
        assert "null" not in page.locator("#view").inner_text()  # (the parts a rejected study has not: left out)
        assert _studies(a.url, AUTH, StudyInstanceUID=uid) == []
        page.get_by_role("button", name="Restore rejected instances").click()
        _confirm(page, "Restore")
        page.locator("#rejection-state", has_text="Not rejected.").wait_for()
        assert len(_studies(a.url, AUTH, StudyInstanceUID=uid)) == 1

        # Merge ($merge): the uploaded study's patient OP-2 into OP-4 (the dropped file's patient)
        page.goto(f"{a.url}/ui/#/study/{extra.StudyInstanceUID}")
        page.get_by_role("heading", name="Study of Operator^Upload").wait_for()
        page.get_by_label("Target patient ID").fill("OP-4")
        page.get_by_label("Target patient name").fill("Operator^Dropped")
        page.get_by_role("button", name="Merge patient").click()
        page.locator("#confirm-text", has_text="Merge patient OP-2 into OP-4 (Operator^Dropped): 1 study of OP-2").wait_for()
        _confirm(page, "Merge")
        page.get_by_role("heading", name="Study of Operator^Dropped").wait_for()
        assert page.locator("#fact-patient-id").inner_text() == "OP-4"
        assert _studies(a.url, AUTH, PatientID="OP-2") == []
        assert sorted(s["0020000D"]["Value"][0] for s in _studies(a.url, AUTH, PatientID="OP-4")) == \
            sorted([str(extra.StudyInstanceUID), str(dropped.StudyInstanceUID)])

        # Watch: the numbers of /metrics, refreshed
        page.get_by_role("link", name="Watch").click()
        page.locator("#watch-numbers strong").first.wait_for()
        page.locator("#watch-queue tbody tr").nth(1).wait_for()
        page.get_by_text("/s").first.wait_for()
        page.wait_for_timeout(2500)  # a second sample: rates
        page.screenshot(path=str(shots / "operator-watch.png"))

        # Delete, after the confirm step (Cancel first: nothing happens)
        page.goto(f"{a.url}/ui/#/study/{uid}")
        page.get_by_role("button", name="Delete study").focus()
        page.keyboard.press("Enter")  # by keyboard: the dialog opens on Cancel; Escape closes it
        page.locator("dialog#confirm").wait_for(state="visible")
        assert page.evaluate("document.activeElement.id") == "confirm-cancel"
        page.keyboard.press("Escape")
        page.get_by_text("Cancelled.").wait_for()
        assert len(_studies(a.url, AUTH, StudyInstanceUID=uid)) == 1
        page.get_by_role("button", name="Delete study").click()
        _confirm(page, "Delete")
        page.wait_for_function("location.hash === '#/find'")
        assert _studies(a.url, AUTH, StudyInstanceUID=uid) == []

        # /docs on the same offline network: Swagger UI draws the API
        page.goto(f"{a.url}/docs")
        page.locator(".swagger-ui .info .title", has_text="dicomweb-archive").wait_for()
        page.locator(".opblock-summary-path", has_text="/admin/queue/studies/{study}").first.wait_for()

        assert refused == []
        assert [f for f in log.failures if " 401 " not in f and not f.startswith("401 ")] == [], log.failures
        assert not [c for c in log.console if c.startswith("pageerror")], log.console
    finally:
        log.save(artifacts / "operator-requests.json")
        page.screenshot(path=str(artifacts / "operator-last.png"))
        context.close()
    if shots is not artifacts:
        for name in ("operator-find.png", "operator-study.png", "operator-watch.png"):
            shutil.copy(shots / name, artifacts / name)


def test_operator_page_with_basic_auth_read_only(browser, tmp_path):  # noqa: F811 (browser: the fixture)
    """Basic credentials (a non-ASCII password: sent as UTF-8) of a user with the ``read``
    scope only: the page finds and shows the study; what needs ``write`` or ``delete`` is
    refused by the API, the page says so, and nothing changes."""
    import hashlib
    import json

    users = tmp_path / "users.json"
    users.write_text(json.dumps({"reader": {"password_sha256": hashlib.sha256("pässwörd".encode()).hexdigest(),
                                            "scopes": ["read"]}}))
    a = LiveServer(tmp_path / "a", "sqlite", basic_users_file=users,
                   api_keys={KEY: ["read", "write", "delete"]}).start()
    study = make_study(slices=1, size=32, patient="Basic^Reader", patient_id="OP-3")
    uid = str(study[0].StudyInstanceUID)
    body, ctype = stow_body(study)
    assert httpx.post(f"{a.url}/studies", content=body, headers={"Content-Type": ctype, **AUTH}).status_code == 200
    context = browser.new_context(viewport=VIEWPORT)
    refused = _offline(context, a.url)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        login_basic(page, a.url, "reader", "pässwörd")
        page.get_by_label("Patient ID").fill("OP-3")
        page.get_by_role("button", name="Search").click()
        page.get_by_role("link", name="Basic^Reader").click()
        page.get_by_role("heading", name="Study of Basic^Reader").wait_for()
        page.locator("#routing", has_text="403").wait_for()  # /admin/: the write scope
        page.get_by_role("button", name="Delete study").click()
        _confirm(page, "Delete")
        page.locator("#status.error", has_text="403").wait_for()
        assert "lack the scope" in page.locator("#status").inner_text()
        page.get_by_label("New label").fill("read-only")  # labels: shown (none), adding one needs write
        page.get_by_role("button", name="Add label").click()
        with page.expect_response(lambda x: x.url.endswith("/labels/read-only")) as put:
            _confirm(page, "Add")
        assert (put.value.request.method, put.value.status) == ("PUT", 403)
        page.locator("#label-list", has_text="No label.").wait_for()
        assert httpx.get(f"{a.url}/studies/{uid}/labels", headers=AUTH).json() == []
        assert len(_studies(a.url, AUTH, StudyInstanceUID=uid)) == 1
        assert refused == []
    finally:
        context.close()
        a.stop()

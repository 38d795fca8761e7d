"""The operator's page (``/ui/``) drives background jobs (docs/jobs.md,
docs/deidentify-jobs.md) in headless Chromium, as test_operator_ui.py drives the rest:

- a study de-identified from its page into a label: the job opened in the Jobs view and
  followed to ``done``; the copy then found in the Find view by the label, with the
  project's pseudonym as PatientName (not the original name or ID);
- the Find view's results de-identified by their QIDO-RS query (``POST /$deidentify``);
- a long job (a study of 40 instances into a destination that takes 0.3 s per instance)
  cancelled from the Jobs view after the confirm step: its state becomes ``cancelled``
  with fewer than 40 instances delivered;
- a caller with the ``read`` scope only: the Jobs view says the write scope is needed and
  offers no Cancel.

Screenshots go to the artefacts folder, and to docs/ with DICOMWEB_UPDATE_SCREENSHOTS=1.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.helpers import LiveServer

from .studies import make_study, stow_body
from .test_ohif_viewer import TIMEOUT_MS, VIEWPORT, RequestLog, browser  # noqa: F401 (the fixture)
from .test_operator_ui import ADMIN, AUTH, DOCS, KEY, _confirm, _offline, _studies

READER = "operator-reader-key"
DELAY = 0.3  # seconds the slow destination takes per request


class _SlowProxy(ThreadingHTTPServer):
    """A STOW-RS destination that is slow: each request waits DELAY, then goes to a real archive."""

    daemon_threads = True

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.requests = 0
        super().__init__(("127.0.0.1", 0), _SlowHandler)


class _SlowHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while (n := int(self.rfile.readline().split(b";")[0], 16)):
                out += self.rfile.read(n)
                self.rfile.readline()
            self.rfile.readline()
            return out
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self._body()
        self.server.requests += 1
        time.sleep(DELAY)
        r = httpx.post(self.server.upstream + self.path, content=body, timeout=30,
                       headers={"Content-Type": self.headers["Content-Type"], "Accept": "application/dicom+json"})
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/dicom+json"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)


@pytest.fixture
def archives(tmp_path):
    second = LiveServer(tmp_path / "second", "sqlite").start()
    proxy = _SlowProxy(second.url)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    routes = tmp_path / "routes.toml"
    routes.write_text(f"""
[[destinations]]
name = "slow"
stow_url = "http://127.0.0.1:{proxy.server_address[1]}"
""")
    a = LiveServer(tmp_path / "a", "sqlite", routes_file=routes, jobs_retry=0.05,
                   api_keys={KEY: ["read", "write", "delete"], "operator-admin-key": ["admin"], READER: ["read"]}).start()
    yield a, second, proxy
    a.stop()
    proxy.shutdown()
    second.stop()


def _store(url: str, study) -> str:
    body, ctype = stow_body(study)
    assert httpx.post(f"{url}/studies", content=body, headers={"Content-Type": ctype, **AUTH}, timeout=60).status_code == 200
    return str(study[0].StudyInstanceUID)


def _login_key(page, url: str, key: str) -> None:
    page.goto(f"{url}/ui/")
    page.locator("#login summary").click()
    page.get_by_label("Scheme").select_option("key")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Use these credentials").click()
    page.locator("#who", has_text="API key").wait_for()


def _study_form(page, url: str, uid: str, patient: str):
    """The study page's De-identify… form, opened, the project named."""
    page.goto(f"{url}/ui/#/study/{uid}")
    page.get_by_role("heading", name=f"Study of {patient}").wait_for()
    page.get_by_text("De-identify…", exact=True).click()
    form = page.get_by_role("form", name="De-identify this study")
    form.get_by_label("Project").fill("op-jobs")
    return form


def _job_of(page) -> str:
    page.wait_for_function("location.hash.startsWith('#/jobs/')")
    return page.evaluate("location.hash").rsplit("/", 1)[1]


def test_operator_jobs(browser, archives, artifacts):  # noqa: F811 (browser: the fixture)
    shots = DOCS if os.environ.get("DICOMWEB_UPDATE_SCREENSHOTS") == "1" else artifacts
    from playwright.sync_api import expect

    a, second, proxy = archives
    uid = _store(a.url, make_study(slices=3, size=32, patient="Jobs^Original", patient_id="JOB-1"))
    long_uid = _store(a.url, make_study(slices=20, size=32, patient="Jobs^Long", patient_id="JOB-2"))
    assert httpx.post(f"{a.url}/admin/deid/op-jobs/pseudonyms", content=b"", headers=ADMIN).status_code in (200, 201)

    context = browser.new_context(viewport=VIEWPORT)
    refused = _offline(context, a.url)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    log = RequestLog(page)
    try:
        _login_key(page, a.url, KEY)
        page.get_by_role("link", name="Jobs", exact=True).click()
        page.get_by_text("No job yet.").wait_for()

        # the study page: De-identify… -> project, an option, a label -> confirm -> the job, followed to done
        form = _study_form(page, a.url, uid, "Jobs^Original")
        form.get_by_label("Retain modified dates").check()
        form.get_by_label("a label of this archive").check()
        page.screenshot(path=str(artifacts / "operator-deidentify.png"))
        form.locator("#deid-study-target-label").fill("research-copy")
        assert form.get_by_label("a routing destination").is_enabled()  # "slow", from the routes file
        assert form.locator("#deid-study-target-destination option").all_inner_texts() == ["slow"]
        form.get_by_role("button", name="Start de-identification").click()
        page.locator("#confirm-text", has_text='project "op-jobs" into the label "research-copy"').wait_for()
        with page.expect_response(lambda x: x.url.endswith(f"/studies/{uid}/$deidentify")) as posted:
            _confirm(page, "De-identify")
        assert posted.value.status == 202
        assert posted.value.request.post_data_json == {
            "project": "op-jobs", "options": ["retain_modified_dates"], "target": {"label": "research-copy"}}
        job = _job_of(page)
        assert job == posted.value.json()["id"]
        expect(page.locator("#job-state")).to_have_text("done", timeout=TIMEOUT_MS)
        assert page.locator("#job-progress").inner_text().strip() == "6 of 6"
        assert page.locator("#job-progress progress").evaluate("p => [p.value, p.max]") == [6, 6]
        assert '"to": "label:research-copy"' in page.locator("#job-result").inner_text()
        assert httpx.get(f"{a.url}/jobs/{job}", headers=AUTH).json()["state"] == "done"

        # ... and the copy, found by the label: the pseudonym, not the original
        page.locator("#job-output").click()
        row = page.locator("#results tbody tr")
        row.first.wait_for()
        assert page.get_by_label("Label", exact=True).input_value() == "research-copy"
        copy = _studies(a.url, AUTH, label="research-copy")
        assert len(copy) == 1 and copy[0]["0020000D"]["Value"][0] != uid
        pseudonym = copy[0]["00100010"]["Value"][0]["Alphabetic"]
        assert pseudonym and "Jobs" not in pseudonym and copy[0]["00100020"]["Value"][0] != "JOB-1"
        assert row.count() == 1 and row.first.locator("td").nth(0).inner_text() == pseudonym
        assert row.first.locator("td").nth(1).inner_text() == copy[0]["00100020"]["Value"][0]

        # the Find view's results, by their query: POST /$deidentify {"query": ...}
        page.get_by_label("Label", exact=True).fill("")
        page.get_by_label("Patient ID").fill("JOB-1")
        page.get_by_role("button", name="Search").click()
        page.locator("#results tbody tr").first.wait_for()
        page.get_by_text("De-identify the results…").click()
        form = page.get_by_role("form", name="De-identify every study of these results")
        form.get_by_label("Project").fill("op-jobs")
        form.get_by_label("Retain modified dates").check()  # as before: the same copy (other options: other bytes, refused)
        form.locator("#deid-query-target-label").fill("results-copy")
        form.get_by_role("button", name="Start de-identification").click()
        with page.expect_response(lambda x: x.url.endswith("/$deidentify")) as posted:
            _confirm(page, "De-identify")
        assert posted.value.status == 202, posted.value.text()
        sent = posted.value.request.post_data_json
        assert sent["query"]["PatientID"] == "JOB-1" and sent["target"] == {"label": "results-copy"}
        _job_of(page)
        expect(page.locator("#job-state")).to_have_text("done", timeout=TIMEOUT_MS)
        assert page.locator("#job-progress").inner_text().strip() == "6 of 6"
        assert len(_studies(a.url, AUTH, label="results-copy")) == 1

        # a long job: 40 instances into the slow destination; cancelled from the Jobs view
        form = _study_form(page, a.url, long_uid, "Jobs^Long")
        form.get_by_label("a routing destination").check()
        form.get_by_role("button", name="Start de-identification").click()
        page.locator("#confirm-text", has_text='into the destination "slow"').wait_for()
        _confirm(page, "De-identify")
        long_job = _job_of(page)
        expect(page.locator("#job-state")).to_have_text("running", timeout=TIMEOUT_MS)
        page.wait_for_function("document.querySelector('#job-progress progress')?.value >= 1", timeout=TIMEOUT_MS)
        page.get_by_role("link", name="All jobs").click()
        jobs = page.locator("#jobs-list tbody tr")
        jobs.nth(2).wait_for()
        assert jobs.count() == 3
        first = jobs.first.locator("td").all_inner_texts()
        done_owner = httpx.get(f"{a.url}/jobs/{long_job}", headers=AUTH).json()["owner"]
        assert first[0] == long_job and first[1] == "deidentify" and first[2] == "running" and first[4] == done_owner
        assert [jobs.nth(i).locator("td").nth(2).inner_text() for i in (1, 2)] == ["done", "done"]
        page.screenshot(path=str(shots / "operator-jobs.png"))
        page.get_by_role("button", name=f"Cancel job {long_job}").focus()
        page.keyboard.press("Enter")  # by keyboard
        page.locator("#confirm-text", has_text=f"Cancel job {long_job} (deidentify)?").wait_for()
        _confirm(page, "Cancel job")
        expect(jobs.first.locator("td").nth(2)).to_have_text("cancelled", timeout=TIMEOUT_MS)
        assert page.get_by_role("button", name=f"Cancel job {long_job}").count() == 0
        done = httpx.get(f"{a.url}/jobs/{long_job}", headers=AUTH).json()
        assert done["state"] == "cancelled" and 1 <= done["progress"]["done"] < 40, done["progress"]
        page.locator(f"a[href='#/jobs/{long_job}']").click()
        expect(page.locator("#job-state")).to_have_text("cancelled")
        assert page.get_by_role("button", name=f"Cancel job {long_job}").count() == 0
        time.sleep(1)  # nothing more is sent once cancelled
        sent_then = proxy.requests
        time.sleep(2 * DELAY + 0.5)
        assert proxy.requests == sent_then < 40

        # a caller with the read scope only: told why, offered nothing
        page.locator("#login summary").click()
        page.get_by_label("API key").fill(READER)
        page.get_by_role("button", name="Use these credentials").click()
        page.goto(f"{a.url}/ui/#/jobs")
        page.locator("#jobs-denied", has_text="need the write scope").wait_for()
        assert page.get_by_role("button", name="Cancel").count() == 0
        page.goto(f"{a.url}/ui/#/jobs/{long_job}")
        page.locator("#jobs-denied").wait_for()
        assert page.locator("#job-state").count() == 0

        assert refused == []
        # (401: the page opened before the key was typed; 403: the reader's /jobs)
        assert [f for f in log.failures if f.split()[0] not in ("401", "403")] == [], log.failures
        assert not [c for c in log.console if c.startswith("pageerror")], log.console
    finally:
        log.save(artifacts / "operator-jobs-requests.json")
        page.screenshot(path=str(artifacts / "operator-jobs-last.png"))
        context.close()
    if shots is not artifacts:
        shutil.copy(shots / "operator-jobs.png", artifacts / "operator-jobs.png")

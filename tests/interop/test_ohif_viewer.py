"""The OHIF viewer (npm ``@ohif/app``) in headless Chromium against the archive.

Debian's Chromium driven by Playwright (``executable_path``; no downloaded browser),
WebGL on SwiftShader. The test stores a study with a CT and an MR series, then, as a
person would: filters the study list (wildcard name, date range, modalities...), opens
the study from the list, waits for the CT image, switches to the MR series, and checks
that each canvas shows a picture and that no request the viewer made failed. Screenshots
and the request log are kept in the artefacts folder (see conftest.py).

Two ways of serving: ``--viewer`` (same origin, /viewer) and the viewer alone on its
own origin (``python -m dicomweb_server.viewer serve``) against an archive with CORS.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from pydicom.uid import JPEGLSLossless

from tests.helpers import LiveServer, free_port

from .conftest import require, store
from .studies import make_study, to_bytes

CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
]
VIEWPORT = {"width": 1280, "height": 800}
TIMEOUT_MS = 60_000


# -- prerequisites -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ohif_dist() -> Path:
    from dicomweb_server import viewer

    given = os.environ.get("DICOMWEB_VIEWER_DIR")
    dist = viewer.dist_dir(given)
    if not viewer.is_installed(dist):
        require(not given, f"an OHIF build in DICOMWEB_VIEWER_DIR={given}",
                f"python -m dicomweb_server.viewer install --dist {given}")
        require(shutil.which("npm") is not None, "npm (fetches the OHIF viewer)", "apt-get install -y npm")
        viewer.install(dist)
    return dist


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "the playwright Python package", "pip install 'playwright>=1.45' (the interop extra)")
    exe = os.environ.get("DICOMWEB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    require(bool(exe) and os.path.exists(exe), "Chromium", "apt-get install -y chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


# -- what the viewer asked for --------------------------------------------------------------


class RequestLog:
    """Every request of a page: answers, failures, console errors."""

    def __init__(self, page) -> None:
        self.entries: list[dict] = []
        self.failures: list[str] = []
        self.aborted: list[str] = []
        self.console: list[str] = []
        page.on("response", self._response)
        page.on("requestfailed", self._failed)
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text[:500]}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def _response(self, response) -> None:
        req = response.request
        entry = {"status": response.status, "method": req.method, "url": response.url,
                 "accept": req.headers.get("accept", ""), "type": response.headers.get("content-type", ""),
                 "acao": response.headers.get("access-control-allow-origin")}
        self.entries.append(entry)
        if response.status >= 400:
            self.failures.append(f"{response.status} {req.method} {response.url} (Accept: {entry['accept']})")

    def _failed(self, request) -> None:
        text = f"{request.failure} {request.method} {request.url}"
        # ERR_ABORTED: the page itself cancelled the request (navigation, a viewport change)
        (self.aborted if "ERR_ABORTED" in (request.failure or "") else self.failures).append(text)

    def dicomweb(self, root: str) -> list[dict]:
        return [e for e in self.entries if e["url"].startswith(root + "/studies")]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"failures": self.failures, "aborted": self.aborted,
                                    "console": self.console, "requests": self.entries}, indent=1))


def _canvas_picture(page):
    """The first viewport's canvas, as a PIL image (a screenshot of the element)."""
    from PIL import Image

    canvas = page.locator("canvas.cornerstone-canvas").first
    canvas.wait_for(state="visible", timeout=TIMEOUT_MS)
    return Image.open(io.BytesIO(canvas.screenshot())).convert("L")


def _shows_a_picture(img) -> bool:
    from PIL import ImageStat

    lo, hi = img.getextrema()
    return hi - lo > 100 and ImageStat.Stat(img).stddev[0] > 20 and sum(1 for n in img.histogram() if n) > 16


def wait_for_image(page, deadline_s: float = 60):
    """Poll the canvas until it shows a picture (not blank, not one flat colour)."""
    end = time.monotonic() + deadline_s
    img = None
    while time.monotonic() < end:
        img = _canvas_picture(page)
        if _shows_a_picture(img):
            return img
        page.wait_for_timeout(250)
    raise AssertionError(f"the viewport stayed blank (extrema {img.getextrema() if img else None})")


def _wait_for_response(page, predicate, action):
    with page.expect_response(predicate, timeout=TIMEOUT_MS) as info:
        action()
    return info.value


# -- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study() -> list:
    """CT stored uncompressed, MR as JPEG-LS lossless: the viewer asks for frames with
    ``transfer-syntax=*`` and decodes what it gets (image/jls parts) itself."""
    datasets = make_study(slices=8, size=128)
    for ds in datasets:
        if ds.Modality == "MR":
            ds.compress(JPEGLSLossless)
    return datasets


def _upload(page, log: RequestLog, url: str, files: list[Path]) -> list[dict]:
    """The study list's Upload dialog: STOW-RS from the browser, one request per file.
    Returns the answers the page saw."""
    page.get_by_role("button", name="Upload").click(timeout=TIMEOUT_MS)
    page.locator("input[type=file]").first.set_input_files([str(f) for f in files])
    page.get_by_text(f"{len(files)} files completed").wait_for(timeout=TIMEOUT_MS)
    end = time.monotonic() + 10
    while True:  # the dialog may say so before the page's response events are delivered
        stow = [e for e in log.entries if e["method"] == "POST" and e["url"] == f"{url}/studies"]
        if len(stow) >= len(files) or time.monotonic() > end:
            return stow
        page.wait_for_timeout(100)


def test_viewer_on_the_archive(browser, ohif_dist, study, tmp_path, artifacts):
    server = LiveServer(tmp_path / "data", "sqlite", viewer=True, viewer_dir=ohif_dist).start()
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    try:
        store(server.url, study)
        study_uid = str(study[0].StudyInstanceUID)

        # 1. the study list, filtered as a person types: wildcard name, MRN, dates, modalities...
        query = ("patientName=interop&mrn=INTEROP&description=CT%20and&accession=ACC&modalities=CT,MR"
                 "&startDate=20240301&endDate=20240331")
        qido = _wait_for_response(page, lambda r: "/studies?" in r.url and "StudyDate=" in r.url,
                                  lambda: page.goto(f"{server.url}/viewer/?{query}"))
        assert qido.status == 200 and len(qido.json()) == 1, qido.url
        for key in ("PatientName=*interop*", "StudyDate=20240301-20240331", "ModalitiesInStudy=CT,MR",
                    "fuzzymatching=true", "includefield=", "limit=101"):
            assert key in unquote(qido.url), (key, qido.url)
        page.get_by_text("Interop, Viewer").first.wait_for(timeout=TIMEOUT_MS)

        # ... and a date range that excludes the study
        qido = _wait_for_response(page, lambda r: "/studies?" in r.url and "StudyDate=2025" in r.url,
                                  lambda: page.goto(f"{server.url}/viewer/?startDate=20250101&endDate=20251231"))
        assert qido.status == 200 and qido.json() == []
        page.wait_for_timeout(500)
        assert page.get_by_text("Interop, Viewer").count() == 0

        # 2. upload a study from the browser (STOW-RS); it appears in the list
        uploads = []
        for n, ds in enumerate(make_study(slices=1, size=32, patient="Uploaded^FromViewer", patient_id="UPL")):
            uploads.append(tmp_path / f"upload-{n}.dcm")
            uploads[-1].write_bytes(to_bytes(ds))
        page.goto(f"{server.url}/viewer/")
        page.get_by_text("Interop, Viewer").first.wait_for(timeout=TIMEOUT_MS)
        stow = _upload(page, log, server.url, uploads)
        assert len(stow) == len(uploads) and all(e["status"] == 200 for e in stow), stow
        page.goto(f"{server.url}/viewer/?patientName=uploaded")
        page.get_by_text("Uploaded, FromViewer").first.wait_for(timeout=TIMEOUT_MS)

        # 3. open the study from the list: select the row (series thumbnails), launch the viewer
        page.goto(f"{server.url}/viewer/")
        _wait_for_response(page, lambda r: "/thumbnail" in r.url and r.status == 200,
                           lambda: page.get_by_text("Interop, Viewer").first.click(timeout=TIMEOUT_MS))
        page.get_by_role("button", name="Basic Viewer").click(timeout=TIMEOUT_MS)
        page.wait_for_url(f"**/viewer/viewer?StudyInstanceUIDs={study_uid}*", timeout=TIMEOUT_MS)

        # 4. the CT image
        ct = wait_for_image(page)
        page.get_by_text("CT phantom").first.wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artifacts / "viewer-ct.png"))

        # 5. the MR series (JPEG-LS), from the study browser
        page.get_by_text("MR phantom").first.dblclick(timeout=TIMEOUT_MS)
        end = time.monotonic() + 60
        while True:
            mr = wait_for_image(page)
            if mr.tobytes() != ct.tobytes():
                break
            assert time.monotonic() < end, "the viewport still shows the CT after choosing the MR series"
            page.wait_for_timeout(250)
        page.wait_for_timeout(1000)  # let the overlays settle for the picture
        page.screenshot(path=str(artifacts / "viewer-mr.png"))

        # 6. every request answered; the DICOMweb calls a viewer makes were all there
        calls = log.dicomweb(server.url)
        assert not log.failures, "\n".join(log.failures)
        kinds = {
            "QIDO studies": lambda e: "/studies?" in e["url"],
            "QIDO series": lambda e: e["url"].split("?")[0].endswith("/series"),
            "series metadata": lambda e: e["url"].endswith("/metadata"),
            "frames, transfer-syntax=*": lambda e: "/frames/" in e["url"] and "transfer-syntax=*" in e["accept"],
            "thumbnails": lambda e: "/thumbnail" in e["url"],
        }
        missing = [k for k, f in kinds.items() if not any(f(e) for e in calls)]
        assert not missing, missing
        mr_series = str(study[-1].SeriesInstanceUID)
        mr_frames = [e for e in calls if "/frames/" in e["url"] and mr_series in e["url"]]
        assert mr_frames and all('type="image/jls"' in e["type"] for e in mr_frames), mr_frames[:1]
    finally:
        log.save(artifacts / "viewer-requests.json")
        context.close()
        server.stop()


def test_viewer_from_another_origin_with_cors(browser, ohif_dist, study, tmp_path, artifacts):
    """The viewer served alone (its own port, at /) talks to the archive across origins."""
    import uvicorn
    from starlette.applications import Starlette

    from dicomweb_server.viewer import viewer_router

    viewer_port = free_port()
    origin = f"http://127.0.0.1:{viewer_port}"
    server = LiveServer(tmp_path / "data", "memory", cors_origins=[origin]).start()
    app = Starlette(routes=viewer_router(ohif_dist, dicomweb_url=server.url, base="/").routes)
    viewer_server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=viewer_port, log_level="warning"))
    thread = threading.Thread(target=viewer_server.run, daemon=True)
    thread.start()
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    try:
        while not viewer_server.started:
            time.sleep(0.05)
        store(server.url, study)
        study_uid = str(study[0].StudyInstanceUID)
        page.goto(f"{origin}/viewer?StudyInstanceUIDs={study_uid}")
        wait_for_image(page)
        page.screenshot(path=str(artifacts / "viewer-cors.png"))
        calls = log.dicomweb(server.url)
        assert not log.failures, "\n".join(log.failures)
        assert any("/frames/" in e["url"] for e in calls)
        assert all(e["acao"] == origin for e in calls), {e["url"]: e["acao"] for e in calls if e["acao"] != origin}
    finally:
        log.save(artifacts / "viewer-cors-requests.json")
        context.close()
        viewer_server.should_exit = True
        thread.join(5)
        server.stop()


# -- the sample data a new user has (`dicomweb-server import --samples`) ----------------------

# transfer syntaxes whose frames OHIF 3.13 decodes and shows (seen with the sample data; its
# 12-bit JPEG Extended, 1.2.840.10008.1.2.4.51, stays blank in OHIF: not asserted)
SHOWN_SYNTAXES = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.5", "1.2.840.10008.1.2.4.50",
                  "1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.4.80",
                  "1.2.840.10008.1.2.4.81", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91"}
PIXEL_DATA = "7FE00010"


@pytest.fixture(scope="module")
def samples_data(tmp_path_factory) -> Path:
    from dicomweb_server.cli import main

    data = tmp_path_factory.mktemp("samples") / "data"
    assert main(["import", "--samples", "--quiet", "--data-dir", str(data)]) == 0
    return data


def _study_plan(url: str, data: Path, study_uid: str) -> tuple[list[str], set[str], bool]:
    """From the archive: (the study's series, its instances stored without Pixel Data,
    whether the viewer must show a picture: every instance an image, not a SEG, in a
    transfer syntax OHIF shows)."""
    import pydicom

    series = httpx.get(f"{url}/studies/{study_uid}/series", timeout=60).json()
    no_pixels: set[str] = set()
    shown = all(s.get("00080060", {}).get("Value") != ["SEG"] for s in series)
    for se in (s["0020000E"]["Value"][0] for s in series):
        for meta in httpx.get(f"{url}/studies/{study_uid}/series/{se}/metadata", timeout=60).json():
            sop = meta["00080018"]["Value"][0]
            if PIXEL_DATA not in meta:
                no_pixels.add(sop)
                continue
            stored = pydicom.dcmread(data / "blobs" / study_uid / se / f"{sop}.dcm", stop_before_pixels=True)
            shown = shown and stored.file_meta.TransferSyntaxUID in SHOWN_SYNTAXES
    return [s["0020000E"]["Value"][0] for s in series], no_pixels, shown and not no_pixels


def test_viewer_with_the_sample_data(browser, ohif_dist, samples_data, artifacts):
    """Issue 15 / case P5: the README's sample data in the viewer. The study list shows
    every stored study (three have no Modality, so an empty ModalitiesInStudy), and each
    study opens: the viewer loads the metadata of each of its series, none of its requests
    fails (except frames and thumbnails of instances stored without Pixel Data: 404 and
    406, as documented), and studies of images in syntaxes OHIF shows show a picture."""
    server = LiveServer(samples_data, "sqlite", viewer=True, viewer_dir=ohif_dist).start()
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    log = RequestLog(page)
    try:
        studies = httpx.get(f"{server.url}/studies", timeout=60).json()
        uids = [s["0020000D"]["Value"][0] for s in studies]
        # the 118 sample instances: 31 studies (two are data sets without a PS3.10 header,
        # imported since issue 26: an RT Structure Set and an Explicit VR image)
        assert len(uids) == 31, len(uids)

        # 1. the study list: every stored study, no data-source error
        qido = _wait_for_response(page, lambda r: "/studies?" in r.url,
                                  lambda: page.goto(f"{server.url}/viewer/?resultsPerPage=100"))
        assert qido.status == 200 and len(qido.json()) == len(uids), qido.url
        error = page.get_by_text("Data Source Connection Error")
        page.get_by_text(f"of {len(uids)}").first.or_(error).wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(artifacts / "viewer-samples-list.png"))
        assert error.count() == 0, ("the study list failed (case P5: empty ModalitiesInStudy?): "
                                    + "; ".join(c[:200] for c in log.console if c.startswith(("error", "pageerror"))))
        assert page.get_by_text(f"1-{len(uids)} of {len(uids)}").count() == 1

        # 2. each study opens
        problems = []
        for uid in uids:
            series, no_pixels, must_show = _study_plan(server.url, samples_data, uid)
            log.failures.clear()
            page.goto(f"{server.url}/viewer/viewer?StudyInstanceUIDs={uid}")
            end = time.monotonic() + 60
            while True:
                done = {se for se in series for e in log.entries
                        if e["url"].endswith(f"/series/{se}/metadata") and e["status"] == 200}
                if len(done) == len(series) or time.monotonic() > end:
                    break
                page.wait_for_timeout(200)
            if len(done) != len(series):
                problems.append(f"{uid}: metadata of {len(series) - len(done)} of {len(series)} series not loaded")
            if must_show:
                try:
                    wait_for_image(page, deadline_s=30)
                except AssertionError as e:
                    problems.append(f"{uid}: {e}")
            # this study's requests (a late answer to the previous page is not this one's); an
            # instance stored without Pixel Data has no frames (404) and no thumbnail (406)
            failed = [f for f in log.failures if f"/studies/{uid}" in f and not (
                any(f"/instances/{sop}/" in f for sop in no_pixels)
                and (f.startswith("404 ") and "/frames/" in f or f.startswith("406 ") and "/thumbnail" in f))]
            problems += [f"{uid}: {f}" for f in failed]
        assert not problems, "\n".join(problems)

        # 3. the picture of docs/viewer.md (docs/viewer.png): the CT of the README's curl walk-through
        page.goto(f"{server.url}/viewer/viewer?StudyInstanceUIDs={README_CT_STUDY}")
        wait_for_image(page)
        page.wait_for_timeout(1500)  # thumbnails and overlays settle
        page.screenshot(path=str(artifacts / "viewer-samples.png"))
    finally:
        log.save(artifacts / "viewer-samples-requests.json")
        context.close()
        server.stop()


README_CT_STUDY = "1.3.6.1.4.1.5962.1.2.1.20040119072730.12322"  # pydicom's CT_small, as in the README

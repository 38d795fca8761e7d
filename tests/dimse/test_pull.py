"""Pull from another PACS (dimse/pull.py): Orthanc (Debian package, DICOM port on) is the remote.

Studies made with pydicom are stored into Orthanc over its REST API; the archive pulls them
by C-FIND then C-MOVE to its own AE title (the instances arrive at its DIMSE listener) or
C-GET (on the pull's association), with the command line (``dicomweb-server pull``, its own
process) and with the job handler in this process. Each pulled instance is checked: its SOP
Instance UID and the SHA-256 of its Pixel Data as sent to Orthanc.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pydicom
import pytest
from pydicom.uid import generate_uid

from dicomweb_server.archive import Archive
from dicomweb_server.dimse.pull import parse_query
from dicomweb_server.dimse.scp import DimseServer
from dicomweb_server.jobs import JobError, run_inline
from dicomweb_server.settings import Settings
from tests.helpers import LiveServer, free_port, make_dataset, to_bytes
from tests.peers.conftest import Orthanc


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    """Orthanc with its DICOM port on (AE title ORTHANC); the archives of the tests are made
    known to it (its DicomModalities) over its REST API."""
    dicom_port = free_port()
    server = Orthanc(tmp_path_factory.mktemp("orthanc"), DicomServerEnabled=True, DicomAet="ORTHANC",
                     DicomPort=dicom_port).start()
    server.dicom_port = dicom_port
    server.rest = f"http://127.0.0.1:{server.port}"
    yield server
    server.stop()


def load(orthanc, datasets) -> None:
    for ds in datasets:
        r = httpx.post(f"{orthanc.rest}/instances", content=to_bytes(ds), timeout=30)
        assert r.status_code == 200, r.text


def knows(orthanc, ae_title: str, port: int) -> None:
    """Orthanc learns an AE title (allowed to query and retrieve; a C-MOVE destination)."""
    r = httpx.put(f"{orthanc.rest}/modalities/{ae_title}",
                  json={"AET": ae_title, "Host": "127.0.0.1", "Port": port}, timeout=10)
    assert r.status_code == 200, r.text


def peers_file(folder: Path, orthanc, method: str | None = None) -> Path:
    path = folder / "peers.toml"
    extra = f'retrieve_method = "{method}"\n' if method else ""
    path.write_text(f'[ORTHANC]\nhost = "127.0.0.1"\nport = {orthanc.dicom_port}\n{extra}')
    return path


def studies(patient: str, sizes: list[int], rows: int = 16) -> list[list[pydicom.Dataset]]:
    """One study per size, that many instances (two series when more than one)."""
    out = []
    for n in sizes:
        study, series = generate_uid(), [generate_uid(), generate_uid()]
        out.append([make_dataset(study=study, series=series[i % 2], rows=rows, columns=rows, PatientID=patient,
                                 InstanceNumber=i + 1) for i in range(n)])
    return out


def digest(ds_or_path) -> str:
    ds = ds_or_path if isinstance(ds_or_path, pydicom.Dataset) else pydicom.dcmread(ds_or_path)
    return hashlib.sha256(ds.PixelData).hexdigest()


def expected(datasets) -> dict[str, str]:
    return {str(d.SOPInstanceUID): digest(d) for d in datasets}


def stored(archive, datasets) -> dict[str, str]:
    """SOP Instance UID -> SHA-256 of the Pixel Data of what the archive holds of ``datasets``."""
    out = {}
    for d in datasets:
        loc = archive.index.locate(str(d.SOPInstanceUID))
        if loc is not None:
            out[loc.sop_uid] = digest(archive.blobs.resolve(loc.path))
    return out


def cli(data: Path, peers: Path, *args: str, ae_title: str = "DICOMWEB", wait: bool = True):
    argv = [sys.executable, "-m", "dicomweb_server.cli", "pull", "--from", "ORTHANC", "--data-dir", str(data),
            "--dimse-peers-file", str(peers), "--ae-title", ae_title, *args]
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}
    if not wait:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture
def live(tmp_path, orthanc):
    """An archive serving DIMSE (AE title PULLER) that Orthanc knows as a move destination."""
    port = free_port()
    peers = peers_file(tmp_path, orthanc)
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, ae_title="PULLER",
                     dimse_peers_file=peers).start()
    knows(orthanc, "PULLER", port)
    srv.peers = peers
    yield srv
    srv.stop()


def test_cli_pull_by_c_move(live, orthanc):
    """``dicomweb-server pull --query PatientID=...``: C-FIND matches the patient's two studies
    (not the other patient's), C-MOVE brings each to the listener: every instance there with
    its pixel data as sent, the counts from the C-MOVE responses; again with --skip-complete
    both studies are skipped, nothing retrieved."""
    mine = studies("PULLCLI", [3, 2])
    other = studies("PULLOTHER", [1])
    load(orthanc, [d for s in mine + other for d in s])
    proc = cli(live.settings.data_dir, live.peers, "--query", "PatientID=PULLCLI", "--json", ae_title="PULLER")
    assert proc.returncode == 0, proc.stderr
    result = orjson.loads(proc.stdout)
    assert result == {"from": "ORTHANC", "method": "C-MOVE", "studies": 2, "pulled": 2, "skipped": 0, "failed": 0,
                      "instances": {"completed": 5, "failed": 0, "warning": 0}, "failures": {}}
    assert "2/2 studies (2 pulled, 0 skipped, 0 failed)" in proc.stderr  # the progress lines
    flat = [d for s in mine for d in s]
    assert stored(live.archive, flat) == expected(flat)
    assert stored(live.archive, other[0]) == {}
    # the instances came through the listener's C-STORE path: Source AE Title is Orthanc's
    loc = live.archive.index.locate(str(flat[0].SOPInstanceUID))
    meta = pydicom.dcmread(live.archive.blobs.resolve(loc.path), stop_before_pixels=True).file_meta
    assert meta.SourceApplicationEntityTitle.strip() == "ORTHANC"

    again = cli(live.settings.data_dir, live.peers, "--query", "PatientID=PULLCLI", "--skip-complete", "--json",
                ae_title="PULLER")
    assert again.returncode == 0, again.stderr
    assert orjson.loads(again.stdout)["skipped"] == 2
    assert orjson.loads(again.stdout)["instances"] == {"completed": 0, "failed": 0, "warning": 0}


def _archive(tmp_path: Path, orthanc, ae_title: str, method: str | None = None) -> Archive:
    return Archive.open(Settings(data_dir=tmp_path / "data", index="memory", ae_title=ae_title,
                                 dimse_peers_file=peers_file(tmp_path, orthanc, method)))


def test_handler_pull_by_c_get(tmp_path, orthanc):
    """The job handler in this process, with a peer whose retrieve_method is C-GET: no listener,
    the instances come on the pull's association and are stored through the C-STORE path;
    explicit Study Instance UIDs (one not on Orthanc: a failed study, named)."""
    mine = studies("PULLGET", [2, 1])
    load(orthanc, [d for s in mine for d in s])
    knows(orthanc, "GETTER", 1)  # allowed to C-FIND and C-GET; never moved to
    archive = _archive(tmp_path, orthanc, "GETTER", "C-GET")
    missing = generate_uid()
    try:
        params = {"from": "ORTHANC", "studies": [str(mine[0][0].StudyInstanceUID), missing,
                                                 str(mine[1][0].StudyInstanceUID)]}
        result, progress = run_inline("pull", params, archive)
        flat = [d for s in mine for d in s]
        assert stored(archive, flat) == expected(flat)
    finally:
        archive.close()
    assert (result["method"], result["pulled"], result["failed"]) == ("C-GET", 2, 1)
    assert result["instances"] == {"completed": 3, "failed": 0, "warning": 0}
    assert result["failures"] == {missing: "not found on ORTHANC"}
    assert (progress.total, progress.done, progress.failed, progress.skipped) == (3, 2, 1, 0)


def test_c_get_keeps_the_transfer_syntax_as_stored(tmp_path, orthanc):
    """C-GET of compressed instances (pydicom's bundled JPEG baseline, JPEG lossless, JPEG 2000,
    RLE files): each arrives in its own transfer syntax, pixel data byte for byte. One storage
    context per SOP class listing every syntax let Orthanc pick Explicit VR Little Endian for
    the class: it decompressed each instance (other bytes), and failed the JPEG 2000 one."""
    from pydicom.data import get_testdata_file

    files = [get_testdata_file(n) for n in ("JPEG2000.dcm", "SC_rgb_jpeg_gdcm.dcm", "MR_small_RLE.dcm",
                                            "JPEG-lossy.dcm")]
    datasets = [pydicom.dcmread(f) for f in files]
    for f in files:
        assert httpx.post(f"{orthanc.rest}/instances", content=Path(f).read_bytes(), timeout=30).status_code == 200
    knows(orthanc, "GETTER", 1)
    archive = _archive(tmp_path, orthanc, "GETTER", "C-GET")
    try:
        uids = sorted({str(d.StudyInstanceUID) for d in datasets})
        result, _ = run_inline("pull", {"from": "ORTHANC", "studies": uids}, archive)
        syntaxes = {}
        for d in datasets:
            loc = archive.index.locate(str(d.SOPInstanceUID))
            syntaxes[loc.sop_uid] = str(pydicom.dcmread(archive.blobs.resolve(loc.path)).file_meta.TransferSyntaxUID)
        assert stored(archive, datasets) == expected(datasets)
    finally:
        archive.close()
    assert syntaxes == {str(d.SOPInstanceUID): str(d.file_meta.TransferSyntaxUID) for d in datasets}
    assert result["instances"] == {"completed": 4, "failed": 0, "warning": 0}


def test_handler_pull_by_c_move_and_skip_complete(tmp_path, orthanc):
    """The handler with the listener in this process (C-MOVE), a date range and a wildcard in
    the query; then skip_complete skips the study held whole and retrieves the one a deleted
    instance made incomplete."""
    mine = studies("PULLMOVE", [2, 2])
    for ds in mine[1]:
        ds.StudyDate = "20230615"
    load(orthanc, [d for s in mine for d in s])
    archive = _archive(tmp_path, orthanc, "MOVER")
    server = DimseServer(archive)
    knows(orthanc, "MOVER", server.start(host="127.0.0.1", port=0))
    try:
        query = parse_query(["PatientID=PULLMOV*", "StudyDate=20230101-20231231"])
        result, _ = run_inline("pull", {"from": "ORTHANC", "query": query}, archive)
        assert (result["studies"], result["pulled"], result["instances"]["completed"]) == (1, 1, 2)
        assert stored(archive, mine[1]) == expected(mine[1]) and stored(archive, mine[0]) == {}

        both = {"from": "ORTHANC", "query": {"PatientID": "PULLMOVE"}, "skip_complete": True}
        result, _ = run_inline("pull", both, archive)
        assert (result["pulled"], result["skipped"], result["instances"]["completed"]) == (1, 1, 2)
        archive.index.delete(str(mine[1][0].StudyInstanceUID), sop_uid=str(mine[1][0].SOPInstanceUID))
        result, _ = run_inline("pull", both, archive)
        assert (result["pulled"], result["skipped"], result["instances"]["completed"]) == (1, 1, 2)
        flat = [d for s in mine for d in s]
        assert stored(archive, flat) == expected(flat)
    finally:
        server.stop(grace=1)
        archive.close()


def test_query_matching_nothing(tmp_path, orthanc):
    """A query that matches no study: the job ends with nothing to do (total 0), not an error;
    the command line says so and exits 0."""
    knows(orthanc, "NOTHING", 1)
    archive = _archive(tmp_path, orthanc, "NOTHING")
    try:
        result, progress = run_inline("pull", {"from": "ORTHANC", "query": {"PatientID": "NOBODY-AT-ALL"}}, archive)
    finally:
        archive.close()
    assert (result["studies"], result["pulled"], result["failed"], progress.total) == (0, 0, 0, 0)
    data = tmp_path / "disk"
    Archive.open(Settings(data_dir=data)).close()
    proc = cli(data, tmp_path / "peers.toml", "--query", "PatientID=NOBODY-AT-ALL", ae_title="NOTHING")
    assert proc.returncode == 0, proc.stderr
    assert "0 of 0 studies pulled from ORTHANC by C-MOVE" in proc.stdout


def test_remote_that_refuses_fails_the_job_clearly(tmp_path, orthanc):
    """Orthanc aborts the association of an AE title it does not know (its C-FIND refused): the
    job fails (JobError, no retry) saying so; the command line exits 1 with that line. A peer
    not in the peers file is refused before any association."""
    archive = _archive(tmp_path, orthanc, "STRANGER")
    try:
        with pytest.raises(JobError, match="does it know this archive's AE title 'STRANGER'"):
            run_inline("pull", {"from": "ORTHANC", "query": {"PatientID": "PULLCLI"}}, archive)
        with pytest.raises(JobError, match="'ELSEWHERE' is not in the peers file"):
            run_inline("pull", {"from": "ELSEWHERE", "query": {"PatientID": "PULLCLI"}}, archive)
    finally:
        archive.close()
    data = tmp_path / "disk"
    Archive.open(Settings(data_dir=data)).close()
    proc = cli(data, tmp_path / "peers.toml", "--query", "PatientID=PULLCLI", ae_title="STRANGER")
    assert proc.returncode == 1
    assert "dicomweb-server pull: failed: C-FIND on ORTHANC: no final response (it aborted the association: " \
           "does it know this archive's AE title 'STRANGER'? Orthanc: DicomModalities)" in proc.stderr


def test_remote_down_is_retried_not_failed(tmp_path):
    """Nothing listens at the peer's port: RemoteUnavailable (a ConnectionError: the durable
    runner tries again later), not a failed job; the command line says to run it again."""
    from dicomweb_server.dimse.pull import RemoteUnavailable

    peers = tmp_path / "peers.toml"
    port = free_port()
    peers.write_text(f'[ORTHANC]\nhost = "127.0.0.1"\nport = {port}\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", dimse_peers_file=peers))
    try:
        with pytest.raises(RemoteUnavailable, match=f"cannot associate with ORTHANC at 127.0.0.1:{port}"):
            run_inline("pull", {"from": "ORTHANC", "studies": ["1.2.3"]}, archive)
    finally:
        archive.close()
    proc = cli(tmp_path / "data", peers, "1.2.3", "--resume", str(tmp_path / "r.json"))
    assert proc.returncode == 1
    assert f"run the same command again to go on ({tmp_path / 'r.json'})" in proc.stderr


def test_c_move_destination_unreachable_fails_each_study(tmp_path, orthanc):
    """Orthanc knows the AE title but nothing listens where it sends (0xC000 for each C-MOVE):
    every study failed, the job fails naming the status and what to check."""
    mine = studies("PULLNOWHERE", [1, 1])
    load(orthanc, [d for s in mine for d in s])
    knows(orthanc, "NOWHERE", free_port())
    archive = _archive(tmp_path, orthanc, "NOWHERE")
    try:
        with pytest.raises(JobError, match=r"no study pulled from ORTHANC: 2 failed \(C-MOVE status 0xC000.*"
                                           r"can ORTHANC reach this archive's AE title 'NOWHERE'"):
            run_inline("pull", {"from": "ORTHANC", "query": {"PatientID": "PULLNOWHERE"}}, archive)
    finally:
        archive.close()


def test_bad_arguments(tmp_path, orthanc):
    """Exit 2 with one line: a key that is no DICOM keyword, nothing to pull."""
    data = tmp_path / "disk"
    Archive.open(Settings(data_dir=data)).close()
    peers = peers_file(tmp_path, orthanc)
    proc = cli(data, peers, "--query", "PatientIdent=1")
    assert (proc.returncode, proc.stderr.strip()) == (2, "dicomweb-server pull: query key 'PatientIdent' is not a "
                                                         "DICOM keyword or tag")
    proc = cli(data, peers)
    assert proc.returncode == 2 and "nothing to pull" in proc.stderr


@pytest.mark.parametrize("params, message", [
    ({"query": {"PatientID": ""}}, "nothing to pull"),  # universal matching: the whole remote
    ({"studies": ["1.2.03"]}, "is not a Study Instance UID"),
    ({"query": {"ReferencedSeriesSequence": "x"}}, "not a study matching key"),
    ({"query": {"PatientID": "1"}, "skip_complete": "yes"}, "skip_complete"),
])
def test_parameters_refused(params, message):
    from dicomweb_server.dimse.pull import check_params

    with pytest.raises(JobError, match=message):
        check_params({"from": "ORTHANC", **params})
    assert check_params({"from": " ORTHANC ", "query": {"00100020": "1", "StudyInstanceUID": "1.2\\1.3"},
                         "studies": ["1.2"]}) == ("ORTHANC", {"PatientID": "1"}, ["1.2", "1.3"], False)


def test_post_admin_pull_is_a_durable_job(tmp_path, orthanc):
    """``POST /admin/pull`` (admin scope) queues a pull job: 202 with the job and its Location,
    ``GET /jobs/{id}`` until done: the counts and the instances as on Orthanc. With
    authentication configured Orthanc's C-MOVE sub-operations need its peers entry's write
    scope (they arrive as C-STOREs from Orthanc). A body naming no peer is 400; a pull whose
    studies are all missing on Orthanc ends failed, with the reason."""
    keys = {"admin-key": ["read", "write", "admin"], "writer-key": ["read", "write"]}
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[ORTHANC]\nhost = "127.0.0.1"\nport = {orthanc.dicom_port}\nscopes = ["write"]\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, ae_title="HTTPPULL",
                     dimse_peers_file=peers, api_keys=keys).start()
    knows(orthanc, "HTTPPULL", port)
    mine = studies("PULLHTTP", [2, 1])
    flat = [d for s in mine for d in s]
    load(orthanc, flat)
    admin, writer = ({"Authorization": f"Bearer {k}"} for k in keys)

    def job_of(body: dict) -> dict:
        r = httpx.post(f"{srv.url}/admin/pull", json=body, headers=admin, timeout=30)
        assert r.status_code == 202, r.text
        job = r.json()
        assert (r.headers["Location"], job["kind"]) == (f"/jobs/{job['id']}", "pull")
        deadline = time.monotonic() + 60
        while job["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
            job = httpx.get(f"{srv.url}/jobs/{job['id']}", headers=admin, timeout=30).json()
        return job

    try:
        body = {"from": "ORTHANC", "query": {"PatientID": "PULLHTTP"}}
        r = httpx.post(f"{srv.url}/admin/pull", json=body, headers=writer, timeout=30)
        assert r.status_code == 403 and "lack the 'admin' scope" in r.text
        r = httpx.post(f"{srv.url}/admin/pull", json={**body, "from": "NOPE"}, headers=admin, timeout=30)
        assert r.status_code == 400 and "'NOPE' is not in the peers file" in r.text
        r = httpx.post(f"{srv.url}/admin/pull", json={**body, "query": {"PatientKey": "1"}}, headers=admin,
                       timeout=30)
        assert r.status_code == 400 and "'PatientKey' is not a DICOM keyword" in r.text

        job = job_of(body)
        assert job["state"] == "done", job
        assert job["params"] == {"from": "ORTHANC", "query": {"PatientID": "PULLHTTP"}, "studies": [],
                                 "skip_complete": False}
        assert job["progress"] == {"total": 2, "done": 2, "failed": 0, "skipped": 0, "detail": {
            "instances": {"completed": 3, "failed": 0, "warning": 0}, "failures": {}}}
        assert (job["result"]["pulled"], job["result"]["method"]) == (2, "C-MOVE")
        assert stored(srv.archive, flat) == expected(flat)

        missing = generate_uid()
        job = job_of({"from": "ORTHANC", "studies": [missing]})
        assert job["state"] == "failed", job
        assert job["error"] == "no study pulled from ORTHANC: 1 failed (not found on ORTHANC)"
        assert job["progress"]["detail"]["failures"] == {missing: "not found on ORTHANC"}
    finally:
        srv.stop()


def test_sigkill_mid_pull_then_resume(live, orthanc, tmp_path):
    """The pull process SIGKILLed after its first studies, the same command with the same
    --resume file goes on: every study pulled once, the counts exactly the instances (the
    study under way at the kill is retrieved again; the archive holds each instance once)."""
    mine = studies("PULLKILL", [4] * 12, rows=64)
    flat = [d for s in mine for d in s]
    load(orthanc, flat)
    resume = tmp_path / "pull.json"
    args = ("--query", "PatientID=PULLKILL", "--resume", str(resume), "--json")
    proc = cli(live.settings.data_dir, live.peers, *args, ae_title="PULLER", wait=False)
    deadline = time.monotonic() + 120
    done_at_kill = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            saved = orjson.loads(resume.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            saved = None
        if saved and saved["checkpoint"].get("next", 0) >= 2:
            proc.send_signal(signal.SIGKILL)
            done_at_kill = saved["checkpoint"]["next"]
            break
        time.sleep(0.005)
    proc.wait(30)
    proc.stdout.close()
    proc.stderr.close()
    assert done_at_kill is not None and done_at_kill < 12, "the pull ended before it could be killed"
    assert proc.returncode == -signal.SIGKILL

    again = cli(live.settings.data_dir, live.peers, *args, ae_title="PULLER")
    assert again.returncode == 0, again.stderr
    result = orjson.loads(again.stdout)
    assert (result["studies"], result["pulled"], result["failed"]) == (12, 12, 0)
    assert result["instances"] == {"completed": 48, "failed": 0, "warning": 0}
    progress = orjson.loads(resume.read_bytes())["progress"]
    assert (progress["total"], progress["done"], progress["failed"]) == (12, 12, 0)
    assert stored(live.archive, flat) == expected(flat)
    uids = {str(s[0].StudyInstanceUID) for s in mine}
    assert sum(len(live.archive.index.instances(u)) for u in uids) == 48  # each instance once


def test_a_sigkilled_job_runner_resumes_the_pull(tmp_path, orthanc):
    """The durable path: a pull job run by a job runner in its own process
    (tests/jobs/runner_process.py), SIGKILLed after its first studies; the next runner (this
    process: it frees the dead process's lease at start) resumes the job from its checkpoint:
    done, 12 studies and 48 instances counted once, each instance stored once. The listener
    receiving the C-MOVEs runs in this process throughout."""
    from dicomweb_server.jobs.runner import Runner
    from dicomweb_server.routing import open_outbox
    from tests.routing.conftest import wait_for

    peers = peers_file(tmp_path, orthanc)
    settings = Settings(data_dir=tmp_path / "data", index="sqlite", ae_title="RUNKILL", dimse_peers_file=peers)
    archive = Archive.open(settings)
    server = DimseServer(archive)
    knows(orthanc, "RUNKILL", server.start(host="127.0.0.1", port=0))
    mine = studies("PULLRUNKILL", [4] * 12, rows=64)
    flat = [d for s in mine for d in s]
    load(orthanc, flat)
    outbox = open_outbox(settings, archive.committer.writer)
    runner = Runner(archive, outbox, retry=0.05, poll=0.05)
    env = {**os.environ, "DICOMWEB_AE_TITLE": "RUNKILL", "DICOMWEB_DIMSE_PEERS_FILE": str(peers),
           "DICOMWEB_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.jobs.runner_process", str(settings.data_dir), "sqlite"],
                            env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        job_id = runner.submit("pull", {"from": "ORTHANC", "query": {"PatientID": "PULLRUNKILL"}, "studies": [],
                                        "skip_complete": False})
        wait_for(lambda: (runner.store.get(job_id)["progress"] or {}).get("done", 0) >= 2, 60,
                 "the child to pull two studies")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed_at = runner.store.get(job_id)["progress"]["done"]
        assert killed_at < 12, "the pull ended before it could be killed"
        runner.start()
        job = wait_for(lambda: (j := runner.store.get(job_id))["state"] in ("done", "failed") and j, 120,
                       "the job to end")
        assert stored(archive, flat) == expected(flat)
        assert sum(len(archive.index.instances(str(s[0].StudyInstanceUID))) for s in mine) == 48
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        runner.stop()
        outbox.close()
        server.stop(grace=1)
        archive.close()
    assert (job["state"], job["attempts"]) == ("done", 2), job
    assert job["progress"] == {"total": 12, "done": 12, "failed": 0, "skipped": 0, "detail": {
        "instances": {"completed": 48, "failed": 0, "warning": 0}, "failures": {}}}

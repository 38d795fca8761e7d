"""The DIMSE walk-through of docs/dimse.md, run with DCMTK's own tools (Debian package ``dcmtk``)
against ``dicomweb-server serve`` as a user starts it: SQLite index, the listener in its
own processes. DCMTK is the reference SCU most departments test a PACS with; pynetdicom
(tests/dimse/) is built by the same people as our listener's DIMSE layer, so it cannot
catch a misreading both share.

PS3.4 Annex A (Verification), B (Storage), C (Query/Retrieve: C-FIND C.4.1, C-MOVE C.4.2,
C-GET C.4.3).

``scripts/test.sh`` installs ``dcmtk``; without it these tests fail with the install
command, or skip with ``DICOMWEB_PEERS=skip`` (as the HTTP peers in tests/peers/ do).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pydicom
import pytest
from pydicom.data import get_testdata_file

from loadtests import load01
from tests.helpers import free_port, stop_processes

CT = Path(get_testdata_file("CT_small.dcm"))
STUDY = "1.3.6.1.4.1.5962.1.2.1.20040119072730.12322"
SOP = "1.3.6.1.4.1.5962.1.1.1.1.1.20040119072730.12322"


def dcmtk(tool: str) -> str:
    """DCMTK's binary (load01.dcmtk: not pynetdicom's Python app of the same name in the venv's bin/)."""
    path = load01.dcmtk(tool)
    if os.path.isabs(path):
        return path
    message = f"DCMTK's {tool} is not installed (Debian package dcmtk)"
    if os.environ.get("DICOMWEB_PEERS", "").lower() == "skip":
        pytest.skip(message)
    pytest.fail(f"{message}; install it with: sudo apt-get install -y dcmtk"
                "  (or set DICOMWEB_PEERS=skip to skip the peer tests)", pytrace=False)


def run(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([dcmtk(tool), *args], cwd=cwd, check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{tool} {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture
def walkthrough(tmp_path):
    """DCMTK storescp as the C-MOVE destination STORESCP (named in a peers file, TOML as in
    docs/dimse.md), and ``dicomweb-server serve`` with it."""
    http, dport, sport = free_port(), free_port(), free_port()
    recv = tmp_path / "recv"
    recv.mkdir()
    storescp = subprocess.Popen([dcmtk("storescp"), "-od", str(recv), "-aet", "STORESCP", str(sport)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[STORESCP]\nhost = "127.0.0.1"\nport = {sport}\n')
    serve = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--port", str(http), "--dimse-port", str(dport), "--dimse-peers-file", str(peers), "--workers", "1"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([dcmtk("echoscu"), "-aec", "DICOMWEB", "127.0.0.1", str(dport)],
                             check=False, capture_output=True).returncode != 0:  # C-ECHO: the listener is up
            assert serve.poll() is None and storescp.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{http}/studies").raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        yield {"http": http, "dimse": str(dport), "recv": recv, "dir": tmp_path}
    finally:
        serve.send_signal(signal.SIGTERM)
        stop_processes([serve, storescp])


def test_readme_walkthrough_with_dcmtk(walkthrough):
    port, d = walkthrough["dimse"], walkthrough["dir"]
    sent = pydicom.dcmread(CT)
    run("storescu", "-aec", "DICOMWEB", "127.0.0.1", port, str(CT), cwd=d)  # C-STORE

    # QIDO-RS finds what C-STORE stored
    hits = httpx.get(f"http://127.0.0.1:{walkthrough['http']}/studies", params={"PatientName": "C*"}).json()
    assert [h["0020000D"]["Value"][0] for h in hits] == [STUDY]

    # C-FIND, Study Root, STUDY level: one answer with the keys asked for (-X: rsp0001.dcm)
    found = d / "found-study"
    found.mkdir()
    run("findscu", "-S", "-aec", "DICOMWEB", "-X", "-od", str(found), "-k", "QueryRetrieveLevel=STUDY",
        "-k", "PatientName=C*", "-k", "StudyInstanceUID", "-k", "PatientID", "127.0.0.1", port, cwd=d)
    [rsp] = sorted(found.iterdir())
    answer = pydicom.dcmread(rsp)
    assert answer.StudyInstanceUID == STUDY
    assert answer.PatientID == sent.PatientID
    assert answer.QueryRetrieveLevel == "STUDY"

    # C-FIND, Patient Root, PATIENT level
    found = d / "found-patient"
    found.mkdir()
    run("findscu", "-P", "-aec", "DICOMWEB", "-X", "-od", str(found), "-k", "QueryRetrieveLevel=PATIENT",
        "-k", "PatientName", "-k", "PatientID", "127.0.0.1", port, cwd=d)
    [rsp] = sorted(found.iterdir())
    answer = pydicom.dcmread(rsp)
    assert (str(answer.PatientName), answer.PatientID) == (str(sent.PatientName), sent.PatientID)

    # a query that matches nothing answers no data set, and still succeeds
    found = d / "found-none"
    found.mkdir()
    run("findscu", "-S", "-aec", "DICOMWEB", "-X", "-od", str(found), "-k", "QueryRetrieveLevel=STUDY",
        "-k", "PatientName=NOBODY*", "-k", "StudyInstanceUID", "127.0.0.1", port, cwd=d)
    assert list(found.iterdir()) == []

    # C-GET: the instance comes back on the same association, pixel data byte for byte
    got = d / "got"
    got.mkdir()
    run("getscu", "-S", "-aec", "DICOMWEB", "-od", str(got), "-k", "QueryRetrieveLevel=STUDY",
        "-k", f"StudyInstanceUID={STUDY}", "127.0.0.1", port, cwd=d)
    [file] = sorted(got.iterdir())
    back = pydicom.dcmread(file)
    assert back.SOPInstanceUID == SOP
    assert back.PixelData == sent.PixelData

    # C-MOVE to STORESCP (the peers file): DCMTK's storescp receives it
    run("movescu", "-S", "-aec", "DICOMWEB", "-aem", "STORESCP", "-k", "QueryRetrieveLevel=STUDY",
        "-k", f"StudyInstanceUID={STUDY}", "127.0.0.1", port, cwd=d)
    [file] = sorted(walkthrough["recv"].iterdir())
    moved = pydicom.dcmread(file)
    assert moved.SOPInstanceUID == SOP
    assert moved.PixelData == sent.PixelData
    assert moved.file_meta.SourceApplicationEntityTitle.strip() == "DICOMWEB"


def test_cmove_to_unknown_destination_is_refused(walkthrough):
    """PS3.4 C.4.2.1.4: a Move Destination the archive does not know: 0xA801, nothing sent."""
    port, d = walkthrough["dimse"], walkthrough["dir"]
    run("storescu", "-aec", "DICOMWEB", "127.0.0.1", port, str(CT), cwd=d)
    proc = subprocess.run([dcmtk("movescu"), "-v", "-S", "-aec", "DICOMWEB", "-aem", "NOWHERE",
                           "-k", "QueryRetrieveLevel=STUDY", "-k", f"StudyInstanceUID={STUDY}", "127.0.0.1", port],
                          cwd=d, check=False, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert "Final Move Response (Refused: MoveDestinationUnknown)" in out, out  # DCMTK's name of 0xA801
    assert list(walkthrough["recv"].iterdir()) == []


def test_a_retrieve_without_its_unique_keys_is_refused(walkthrough):
    """The integrator's commands: ``movescu -k QueryRetrieveLevel=STUDY`` without a Study
    Instance UID, or with ``StudyInstanceUID=*``, sent the whole archive; ``getscu -k
    QueryRetrieveLevel=SERIES -k PatientID=...`` the patient's series. A baseline retrieve
    (PS3.4 C.4.2.2.1, C.4.3.2.1) names its entities by their unique keys: 0xA900 (DCMTK's
    name: DataSetDoesNotMatchSOPClass) with an Error Comment naming the key, nothing sent."""
    port, d = walkthrough["dimse"], walkthrough["dir"]
    run("storescu", "-aec", "DICOMWEB", "127.0.0.1", port, str(CT), cwd=d)
    got = d / "got-none"
    got.mkdir()
    patient = pydicom.dcmread(CT).PatientID
    commands = [  # (Error Comment, tool, options)
        ("StudyInstanceUID missing (required at STUDY level)",
         "movescu", "-aem", "STORESCP", "-k", "QueryRetrieveLevel=STUDY"),
        ("StudyInstanceUID: no wildcard matching at STUDY level",
         "movescu", "-aem", "STORESCP", "-k", "QueryRetrieveLevel=STUDY", "-k", "StudyInstanceUID=*"),
        ("SeriesInstanceUID missing (required at SERIES level)",
         "getscu", "-od", str(got), "-k", "QueryRetrieveLevel=SERIES", "-k", f"PatientID={patient}"),
    ]
    for comment, tool, *args in commands:
        proc = subprocess.run([dcmtk(tool), "-d", "-S", "-aec", "DICOMWEB", *args, "127.0.0.1", port],
                              cwd=d, check=False, capture_output=True, text=True, timeout=60)
        out = proc.stdout + proc.stderr
        assert "DIMSE Status                  : 0xa900" in out, out
        assert f"LO [{comment}]" in out, out  # (0000,0902) Error Comment
    assert list(walkthrough["recv"].iterdir()) == [] and list(got.iterdir()) == []


def test_storescu_of_a_file_imported_before_is_a_success(walkthrough):
    """The walk-through's storescu step on the first command's archive (``import --samples``
    holds CT_small.dcm): DCMTK sends the data set under its own file meta and without
    the file's Data Set Trailing Padding, the same instance: Success, one copy kept.
    Before: 0x0111 (storescu exits 1)."""
    port, d = walkthrough["dimse"], walkthrough["dir"]
    subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "import", "--quiet", "--data-dir", str(d / "data"),
                    str(CT)], check=True, timeout=120)
    before = CT.read_bytes()
    run("storescu", "-aec", "DICOMWEB", "127.0.0.1", port, str(CT), cwd=d)
    url = f"http://127.0.0.1:{walkthrough['http']}"
    assert [h["00080018"]["Value"][0] for h in httpx.get(f"{url}/instances").json()] == [SOP]
    series = pydicom.dcmread(CT, stop_before_pixels=True).SeriesInstanceUID
    stored = httpx.get(f"{url}/studies/{STUDY}/series/{series}/instances/{SOP}",
                       headers={"Accept": "application/dicom; transfer-syntax=*"})
    assert stored.content == before  # the imported file, kept byte for byte

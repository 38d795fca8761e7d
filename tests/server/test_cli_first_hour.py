"""Issue 26, "the first hour, round 2": what a new user met from a fresh clone. Bad paths
are one line and exit 2 with nothing created; import accounts for every file (exit 1 when
some are refused), forwards with --routes, reads bare data sets; check and queue need an
archive; serve checks its port first and prints its addresses once they accept, and warns
when run as root beyond loopback. (The other items' tests: tests/dimse/test_serve.py,
tests/server/test_landing.py, tests/client/test_cli.py, tests/reliability/test_access.py,
tests/interop/test_viewer_serving.py.)"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pydicom
import pytest
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.cli import main
from dicomweb_server.settings import Settings
from tests.helpers import LiveServer, free_port, make_dataset, multipart, to_bytes


def cli(*args, cwd: Path, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dicomweb_server.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})})


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def bare(ds, implicit: bool) -> bytes:
    """The data set alone (no preamble, DICM or file meta), as old folders hold it."""
    fp = DicomBytesIO()
    fp.is_implicit_VR, fp.is_little_endian = implicit, True
    write_dataset(fp, ds)
    return fp.getvalue()


# -- 1. bad paths: one line, exit 2, nothing created --------------------------------------

def test_bad_paths_are_one_line_exit_2_and_create_nothing(tmp_path):
    good = tmp_path / "good.dcm"
    good.write_bytes(to_bytes(make_dataset()))
    (tmp_path / "a-file").write_text("x")
    before = listing(tmp_path)
    cases = [
        (["import", "/nonexistent/path"], "dicomweb-server import: /nonexistent/path: no such file or folder"),
        (["import", "--data-dir", "a-file", str(good)],
         "dicomweb-server import: --data-dir a-file: not a folder (a file is there)"),
        (["import", "--data-dir", "a-file/data", str(good)],
         f"dicomweb-server import: --data-dir a-file/data: cannot be created: {tmp_path / 'a-file'} is not a folder"),
        (["serve", "--data-dir", "a-file", "--port", "0", "--dimse-port", "0"],
         "dicomweb-server: --data-dir a-file: not a folder (a file is there)"),
        (["serve", "--data-dir", "a-file/data", "--port", "0", "--dimse-port", "0"],
         f"dicomweb-server: --data-dir a-file/data: cannot be created: {tmp_path / 'a-file'} is not a folder"),
        (["check"], f"dicomweb-server check: no archive at ./data ({tmp_path / 'data'})"),
        (["queue"], f"dicomweb-server queue: no archive at ./data ({tmp_path / 'data'})"),
        (["check", "--data-dir", "a-file"], "dicomweb-server check: no archive at ./a-file"),
    ]
    for args, line in cases:
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(line), (args, r.stderr)
        assert listing(tmp_path) == before, args


def test_serve_creates_the_archive_and_says_so(tmp_path):
    """serve in a folder without an archive makes one (the first command of the README),
    and says so; its addresses are printed once the ports accept (item 8)."""
    port, dport = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--port", str(port),
                             "--dimse-port", str(dport), "--workers", "1", "--dimse-processes", "1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        for line in proc.stderr:
            lines.append(line)
            if "DICOMweb at" in line:
                # printed once the port accepts: a connection made now succeeds
                with httpx.Client(timeout=5) as c:
                    assert c.get(f"http://127.0.0.1:{port}/").status_code == 200
            if "DIMSE DICOMWEB at" in line:
                import socket

                socket.create_connection(("127.0.0.1", dport), timeout=5).close()
                break
            assert time.monotonic() < deadline
    finally:
        proc.send_signal(signal.SIGTERM)
        lines += proc.communicate(timeout=30)[1].splitlines(keepends=True)
    text = "".join(lines)
    assert f"dicomweb-server: no archive at ./data: created ({tmp_path / 'data'})" in text
    assert f"dicomweb-server: DICOMweb at http://127.0.0.1:{port}/ (sqlite index, data in {tmp_path / 'data'}" in text
    assert f"dicomweb-server: DIMSE DICOMWEB at 127.0.0.1:{dport} (1 listener process(es), 64 associations, 16 per peer)" in text
    assert text.index("no archive at") < text.index("DICOMweb at") < text.index("DIMSE DICOMWEB at")
    assert "WARNING" not in text.replace("dicomweb-server: WARNING: running as root", "")  # item 7
    assert (tmp_path / "data" / "index.sqlite").is_file()


def test_a_taken_http_port_creates_nothing_and_prints_no_address(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("serve", "--port", str(port), "--dimse-port", "0", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"dicomweb-server: cannot listen on 127.0.0.1:{port}: Address already in use "
                        "(another program on that port? start with --port PORT)\n")
    assert listing(tmp_path) == []


# -- 2. import --routes ------------------------------------------------------------------

def test_import_with_routes_owes_forwards_the_running_server_delivers(tmp_path):
    from tests.routing.conftest import wait_for, write_routes
    from tests.routing.sink import Sink

    sink = Sink(tmp_path / "sink").start()
    routes = write_routes(tmp_path / "routes.toml", sink.url)
    data = tmp_path / "data"
    server = LiveServer(data, "sqlite", routes_file=routes).start()
    try:
        folder = tmp_path / "in"
        folder.mkdir()
        datasets = [make_dataset(PatientID="ROUTED") for _ in range(3)]
        for n, ds in enumerate(datasets):
            ds.save_as(folder / f"{n}.dcm", enforce_file_format=True)
        # the import's own process owes the forwards; the running server's forwarder sends them
        assert main(["import", "--quiet", "--routes", str(routes), "--data-dir", str(data), str(folder)]) == 0
        wait_for(lambda: len(sink.recorder.received) == 3, what="the forwards delivered")
        assert sink.recorder.received == {ds.SOPInstanceUID: 1 for ds in datasets}
    finally:
        server.stop()
        sink.stop()


def test_import_with_a_bad_routes_file_is_one_line_and_creates_nothing(tmp_path, capsys):
    routes = tmp_path / "routes.toml"
    routes.write_text("[[destinations]]\nname = 3\n")
    (tmp_path / "a.dcm").write_bytes(to_bytes(make_dataset()))
    assert main(["import", "--routes", str(routes), "--data-dir", str(tmp_path / "data"),
                 str(tmp_path / "a.dcm")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dicomweb-server import: --routes: ") and err.count("\n") == 1
    assert not (tmp_path / "data").exists()


# -- 3. exit status, summary, broken links -----------------------------------------------

def test_import_exit_status_and_summary_count_every_file(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    ds = make_dataset()
    (folder / "a.dcm").write_bytes(to_bytes(ds))
    (folder / "b-copy.dcm").write_bytes(to_bytes(ds))
    (folder / "c-notes.txt").write_text("not DICOM")
    os.symlink(tmp_path / "gone.dcm", folder / "d-link.dcm")
    report = tmp_path / "report.tsv"
    data = str(tmp_path / "data")
    assert main(["import", "--quiet", "--report", str(report), "--data-dir", data, str(folder)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "imported 1 new instance(s), 1 already stored, 2 refused (1 broken symbolic link, 1 not PS3.10 DICOM or "
        f"truncated); archive in {tmp_path / 'data'}")
    lines = dict(line.split("\t") for line in report.read_text().splitlines())
    assert lines[str(folder / "d-link.dcm")] == (
        f"BROKEN_LINK: a symbolic link to {tmp_path / 'gone.dcm'}, which does not exist")
    # all stored or already stored: 0
    assert main(["import", "--quiet", "--data-dir", data, str(folder / "a.dcm")]) == 0
    assert capsys.readouterr().out.startswith("imported 0 new instance(s), 1 already stored, 0 refused; archive")


# -- 4. bare data sets --------------------------------------------------------------------

@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "explicit"])
def test_a_bare_data_set_is_imported_and_retrieved_as_a_ps310_file(tmp_path, capsys, implicit):
    ds = make_dataset(PatientName="Bare^Data^Set", StudyDescription="no PS3.10 header")
    raw = bare(ds, implicit)
    assert raw[128:132] != b"DICM" and raw[:4] == b"\x08\x00\x16\x00"
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "IM0001").write_bytes(raw)
    data = tmp_path / "data"
    assert main(["import", "--quiet", "--data-dir", str(data), str(folder)]) == 0
    assert "imported 1 new instance(s), 0 already stored, 0 refused; 1 bare data set(s) given a PS3.10 header" in \
        capsys.readouterr().out
    from dicomweb_server.dicom.uids import IMPLEMENTATION_CLASS_UID

    ts = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
    url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
    with TestClient(create_app(Settings(data_dir=data, dimse_port=0))) as c:
        as_stored = c.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"})
        default = c.get(url, headers={"Accept": "application/dicom"})  # Explicit VR Little Endian (PS3.18 8.7.3.5)
        stow = c.post("/studies", content=multipart([raw])[0], headers={"Content-Type": multipart([raw])[1]})
    assert as_stored.status_code == 200 and default.status_code == 200
    stored = pydicom.dcmread(io.BytesIO(as_stored.content))  # a PS3.10 file: preamble, DICM, file meta
    assert as_stored.content[128:132] == b"DICM"
    assert as_stored.content.endswith(raw)  # the data set's bytes as they were
    meta = stored.file_meta
    assert (meta.TransferSyntaxUID, meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID,
            meta.ImplementationClassUID) == (ts, ds.SOPClassUID, ds.SOPInstanceUID, IMPLEMENTATION_CLASS_UID)
    for got in (stored, pydicom.dcmread(io.BytesIO(default.content))):
        assert [(e.tag, e.VR, e.value) for e in got] == [(e.tag, e.VR, e.value) for e in ds]
    # STOW-RS: application/dicom is a PS3.10 file (PS3.18 10.5.1): still refused there
    assert stow.status_code == 409
    assert stow.json()["00081198"]["Value"][0]["00081197"]["Value"] == [0xC000]


def test_which_files_get_a_header(tmp_path):
    """A file meta group without the preamble: its Transfer Syntax UID is used and the
    group replaced; a PS3.10 file, big endian, text, a data set without SOP UIDs: untouched
    (None: the archive refuses or stores them as they are)."""
    from dicomweb_server.dicom.bare import wrap_bare_data_set
    from dicomweb_server.dicom.instance import describe_instance

    ds = make_dataset()
    ps310 = to_bytes(ds)
    no_uid = make_dataset()
    del no_uid.SOPInstanceUID
    big = DicomBytesIO()
    big.is_implicit_VR, big.is_little_endian = False, False
    write_dataset(big, make_dataset())
    cases = {"meta-no-preamble": ps310[132:], "ps310": ps310, "big-endian": big.getvalue(), "text": b"not DICOM\n",
             "no-sop-uid": bare(no_uid, False), "empty": b""}
    out = {}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        out[name] = wrap_bare_data_set(tmp_path / name, tmp_path / f"{name}.out")
        assert (tmp_path / f"{name}.out").exists() == (out[name] is not None)
    assert out == {"meta-no-preamble": ExplicitVRLittleEndian, "ps310": None, "big-endian": None, "text": None,
                   "no-sop-uid": None, "empty": None}
    wrapped = (tmp_path / "meta-no-preamble.out").read_bytes()
    assert wrapped.endswith(ps310[132 + 12 + int.from_bytes(ps310[140:144], "little"):])  # the data set as it was
    assert describe_instance(tmp_path / "meta-no-preamble.out").sop_uid == ds.SOPInstanceUID


def test_the_import_report_says_why_a_file_without_header_got_none(tmp_path, capsys):
    """The store's refusal of a file without PS3.10 header says "preamble and 'DICM' prefix
    required", which told an import user nothing: import gives bare data sets a header
    (a new user's trial: pydicom's no_meta.dcm, ExplVR_BigEndNoMeta.dcm, README.txt). The
    report now names why this file got none."""
    folder = tmp_path / "old"
    folder.mkdir()
    big = DicomBytesIO()
    big.is_implicit_VR, big.is_little_endian = False, False
    write_dataset(big, make_dataset())
    no_uid = make_dataset()
    del no_uid.SOPInstanceUID
    (folder / "big-endian").write_bytes(big.getvalue())
    (folder / "no-sop-uid").write_bytes(bare(no_uid, True))
    (folder / "notes.txt").write_text("Test files of a modality\n")
    (folder / "good").write_bytes(bare(make_dataset(), True))
    report = tmp_path / "report.tsv"
    assert main(["import", "--quiet", "--report", str(report), "--data-dir", str(tmp_path / "data"), str(folder)]) == 1
    assert capsys.readouterr().out.startswith("imported 1 new instance(s), 0 already stored, 3 refused")
    lines = dict(line.split("\t") for line in report.read_text().splitlines())
    assert lines == {
        str(folder / "big-endian"): "CANNOT_UNDERSTAND (0xC000): a big endian data set without PS3.10 header "
                                    "(Explicit VR Big Endian, retired: PS3.5 A.3): import gives a header to Little "
                                    "Endian data sets only",
        str(folder / "no-sop-uid"): "CANNOT_UNDERSTAND (0xC000): a data set without PS3.10 header and without valid "
                                    "SOP Class and SOP Instance UIDs (0008,0016), (0008,0018), from which import "
                                    "makes one",
        str(folder / "notes.txt"): "CANNOT_UNDERSTAND (0xC000): not DICOM: neither a PS3.10 file (preamble, 'DICM', "
                                   "file meta) nor a data set",
    }


def test_implementation_class_uid_is_a_uid():
    from dicomweb_server.dicom.uids import IMPLEMENTATION_CLASS_UID, validate_uid

    assert validate_uid(IMPLEMENTATION_CLASS_UID).startswith("2.25.")


def _serve_exit(tmp_path, *args: str) -> tuple[int, str]:
    """Run ``serve`` with ``args``; its exit status and stderr, or a test failure when it
    is still running after 30 s (then its whole process group is killed)."""
    p = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"),
                          "--port", "0", "--dimse-port", "0", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"serve {' '.join(args)} kept running")
    return p.returncode, err


@pytest.mark.parametrize("where, words", [
    ("nolog/audit.jsonl", "folder {tmp}/nolog does not exist (create it, writable by the archive's user)"),
    ("", "a folder, not a file"),
])
def test_serve_refuses_an_audit_log_it_cannot_open(tmp_path, where, words):
    """docs/security.md's ``--audit-log /var/log/dicomweb/audit.jsonl`` on a machine without
    that folder: every worker and DIMSE listener died opening it with a traceback and was
    started again, forever (a new user's trial). Now one line and exit 2, nothing created."""
    status, err = _serve_exit(tmp_path, "--audit-log", str(tmp_path / where))
    assert status == 2, err
    assert err == f"dicomweb-server: --audit-log {tmp_path / where}: {words.format(tmp=tmp_path)}\n"
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flag, text, words", [
    ("--api-keys-file", None, "cannot read it: No such file or directory"),
    ("--basic-users-file", None, "cannot read it: No such file or directory"),
    ("--api-keys-file", "x\n", "not JSON: unexpected character, expected a JSON value: line 1 column 1 (char 0)"),
    ("--api-keys-file", '["tok"]', 'not of the form {"token": ["read", "write"]}'),
    ("--basic-users-file", '{"alice": "secret"}',
     'not of the form {"user": {"password_sha256": "...", "scopes": ["read"]}}'),
])
def test_serve_refuses_a_credentials_file_it_cannot_use(tmp_path, flag, text, words):
    """Every worker read these files as it started: a missing or malformed one killed each
    worker with a traceback, and uvicorn started them again, forever (a new user's trial)."""
    f = tmp_path / "creds.json"
    if text is not None:
        f.write_text(text)
    status, err = _serve_exit(tmp_path, flag, str(f))
    assert (status, err) == (2, f"dicomweb-server: {flag} {f}: {words}\n")
    assert not (tmp_path / "d").exists()


def test_an_empty_api_keys_file_is_no_authentication_beyond_loopback(tmp_path):
    """``--host 0.0.0.0 --api-keys-file`` of ``{}`` passed the "authentication needed" check
    (a file was given) and then served every anonymous STOW-RS and DELETE (the workers saw
    no key and turned authentication off)."""
    f = tmp_path / "keys.json"
    f.write_text("{}")
    status, err = _serve_exit(tmp_path, "--host", "0.0.0.0", "--api-keys-file", str(f))
    assert status == 2, err
    assert err.startswith("dicomweb-server: refusing to listen on 0.0.0.0 without authentication: ")
    assert err.endswith("; the files given hold no key or user\n") and err.count("\n") == 1


# -- 12. root ------------------------------------------------------------------------------

def test_root_beyond_loopback_is_warned(monkeypatch, capsys):
    from dicomweb_server.startup import warn_if_root

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    warn_if_root("127.0.0.1", True)
    assert capsys.readouterr().err == ""
    warn_if_root("0.0.0.0", False)
    assert capsys.readouterr().err.startswith("dicomweb-server: WARNING: running as root and listening on 0.0.0.0")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    warn_if_root("0.0.0.0", False)
    assert capsys.readouterr().err == ""


def test_port_zero_is_not_announced_as_an_address(tmp_path, capsys):
    """``--port 0`` printed "DICOMweb at http://127.0.0.1:0/", an address no client can use
    (a new user's trial): the line says the kernel picked the port and where to see it."""
    from dicomweb_server.settings import Settings
    from dicomweb_server.startup import announce_when_listening

    settings = Settings(port=0, data_dir=tmp_path, dimse_port=0, viewer=False)
    announce_when_listening(settings, 1, 0).join(10)
    err = capsys.readouterr().err
    assert err == (f"dicomweb-server: DICOMweb at http://127.0.0.1:<port>/ (sqlite index, data in {tmp_path.resolve()}, "
                   "1 worker(s)) (--port 0: a port the kernel picked; `ss -ltnp` shows it)\n")

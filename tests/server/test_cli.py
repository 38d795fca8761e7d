"""The dicomweb-server command line: settings from flags and DICOMWEB_* variables,
the one-process rule of the in-memory index, import and check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pydicom

from dicomweb_server.archive import Archive
from dicomweb_server.cli import main
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, sample_files


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dicomweb_server.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_memory_index_refuses_several_workers(tmp_path):
    r = run("serve", "--index", "memory", "--workers", "2", "--data-dir", str(tmp_path))
    assert r.returncode == 2 and "one process" in r.stderr


def test_settings_from_environment_and_defaults(monkeypatch):
    monkeypatch.setenv("DICOMWEB_PORT", "9999")
    monkeypatch.setenv("DICOMWEB_INDEX", "memory")
    monkeypatch.setenv("DICOMWEB_PREFIX", "dicomweb/")
    s = Settings()
    assert (s.port, s.index, s.prefix, s.effective_workers()) == (9999, "memory", "/dicomweb", 1)
    monkeypatch.delenv("DICOMWEB_INDEX")
    assert Settings().effective_workers() == (os.cpu_count() or 1)
    assert Settings(workers=3).effective_workers() == 3


def test_import_samples_then_again(tmp_path, capsys):
    """pydicom's samples, broken on purpose, are refused without exit status 1; those that
    are a data set without a PS3.10 header are imported (issue 26 item 4)."""
    from dicomweb_server.cli import _sample_files
    from dicomweb_server.dicom.bare import wrap_bare_data_set

    bare = [p for p in _sample_files() if wrap_bare_data_set(p, tmp_path / "bare.tmp") is not None]
    assert sorted(p.name for p in bare) == ["ExplVR_LitEndNoMeta.dcm", "rtstruct.dcm"]
    data = str(tmp_path / "data")
    assert main(["import", "--samples", "--quiet", "--data-dir", data]) == 0
    first = capsys.readouterr().out
    # pydicom ships one file twice byte for byte, and 9 instances again in another lossless
    # transfer syntax (the same data set, equal pixels: policy/ingest.same_instance_transcoded):
    # "already stored"; the other files of a stored SOP Instance UID are other content (refused)
    assert f"imported {len(sample_files()) + len(bare)} new instance(s), 10 already stored, 48 refused" in first
    assert "16 same SOP Instance UID as a stored file, other content" in first
    assert main(["import", "--samples", "--quiet", "--data-dir", data]) == 0
    assert f"imported 0 new instance(s), {len(sample_files()) + len(bare) + 10} already stored" in \
        capsys.readouterr().out


def test_help_lists_every_command_and_version():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for command in ("serve", "import", "check"):
        assert any(line.split()[:1] == [command] and len(line.split()) > 1 for line in r.stdout.splitlines()), \
            (command, r.stdout)
    from dicomweb_server import __version__

    r = run("--version")
    assert (r.returncode, r.stdout.strip()) == (0, f"dicomweb-server {__version__}")


def test_import_report_names_each_file_not_stored(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    study = make_dataset()
    study.save_as(folder / "a-good.dcm", enforce_file_format=True)
    (folder / "b-notes.txt").write_text("not DICOM")
    no_uid = make_dataset()
    del no_uid.StudyInstanceUID
    no_uid.save_as(folder / "c-no-study.dcm", enforce_file_format=True)
    other = make_dataset(sop=study.SOPInstanceUID, study=study.StudyInstanceUID, series=study.SeriesInstanceUID,
                         PatientName="Other^Content")
    other.save_as(folder / "d-other-content.dcm", enforce_file_format=True)  # same batch as a-good.dcm
    (folder / "e-same-bytes.dcm").write_bytes((folder / "a-good.dcm").read_bytes())
    report = tmp_path / "report.tsv"
    assert main(["import", "--quiet", "--verbose", "--report", str(report), "--data-dir", str(tmp_path / "d"),
                 str(folder)]) == 1  # some refused (issue 26 item 3)
    out = capsys.readouterr()
    assert "imported 1 new instance(s), 1 already stored" in out.out
    lines = dict(line.split("\t") for line in report.read_text().splitlines())
    assert sorted(lines) == [str(folder / n) for n in ("b-notes.txt", "c-no-study.dcm", "d-other-content.dcm")]
    assert lines[str(folder / "b-notes.txt")] == (
        "CANNOT_UNDERSTAND (0xC000): not DICOM: neither a PS3.10 file (preamble, 'DICM', file meta) nor a data set")
    assert "force=True" not in lines[str(folder / "b-notes.txt")]  # pydicom's hint to its own callers
    assert lines[str(folder / "c-no-study.dcm")].startswith("DATASET_MISMATCH (0xA900): StudyInstanceUID")
    assert lines[str(folder / "d-other-content.dcm")] == (
        f"DUPLICATE_SOP_INSTANCE (0x0111): SOP Instance {study.SOPInstanceUID} is already stored with different "
        "content")
    assert all(f"not stored: {path}\t{why}" in out.err for path, why in lines.items())


def test_import_refuses_an_instance_of_a_study_of_another_patient(tmp_path, capsys):
    """One patient per study (dicom/patient.py), in one batch and across imports."""
    folder, later = tmp_path / "in", tmp_path / "later"
    folder.mkdir()
    later.mkdir()
    first = make_dataset(PatientID="IMP-A")
    study = {"study": first.StudyInstanceUID}
    first.save_as(folder / "a-first.dcm", enforce_file_format=True)
    make_dataset(**study, PatientID="IMP-B").save_as(folder / "b-other-patient.dcm", enforce_file_format=True)
    make_dataset(**study, PatientID="IMP-A", PatientName="Renamed^P").save_as(folder / "c-renamed.dcm",
                                                                              enforce_file_format=True)
    make_dataset(**study, PatientID="IMP-A", IssuerOfPatientID="X").save_as(later / "d-issuer.dcm",
                                                                            enforce_file_format=True)
    report = tmp_path / "report.tsv"
    data = str(tmp_path / "d")
    assert main(["import", "--quiet", "--report", str(report), "--data-dir", data, str(folder)]) == 1
    out = capsys.readouterr().out
    assert "imported 2 new instance(s), 0 already stored, 1 refused (1 missing/invalid UIDs or against a " \
           "stored study's patient or series' study)" in out
    assert report.read_text() == (
        f"{folder / 'b-other-patient.dcm'}\tDATASET_MISMATCH (0xA900): Study {first.StudyInstanceUID} belongs to "
        "patient 'IMP-A' (no issuer), not to this instance's patient 'IMP-B' (no issuer)\n")
    assert main(["import", "--quiet", "--report", str(report), "--data-dir", data, str(later), str(folder)]) == 1
    assert "imported 0 new instance(s), 2 already stored, 2 refused (2 " in capsys.readouterr().out
    assert [line.split("\t")[0] for line in report.read_text().splitlines()] == [
        str(later / "d-issuer.dcm"), str(folder / "b-other-patient.dcm")]
    assert "not to this instance's patient 'IMP-A' (issuer 'X')" in report.read_text()


def test_check_finds_and_repairs(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        make_dataset().save_as(folder / f"{k}.dcm", enforce_file_format=True)
    data = tmp_path / "data"
    assert main(["import", "--quiet", "--data-dir", str(data), str(folder)]) == 0
    archive = Archive.open(Settings(data_dir=data))
    (uid0, rel0), (uid1, rel1), _third = list(archive.index.paths())
    # an orphan (file, no row: a crash before the commit) and a row whose file is gone
    orphan = archive.blobs.resolve(rel0).read_bytes()
    archive.index.delete(*rel0.split("/")[:2], uid0)
    os.unlink(archive.blobs.resolve(rel1))
    archive.blobs.resolve(rel0).write_bytes(orphan)
    archive.close()
    capsys.readouterr()
    assert main(["check", "--data-dir", str(data)]) == 1
    out = capsys.readouterr().out
    assert "3 indexed instance(s)" not in out and "2 indexed instance(s), 2 file(s) on disk, 2 problem(s)" in out
    assert f"  orphan: {rel0}: SOP Instance {uid0} is on disk but not in the index" in out
    assert f"  missing file: {uid1}: indexed at {rel1}, but no file is there" in out
    assert "nothing changed (dry run)" in out
    assert main(["check", "--repair", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"{rel0}: SOP Instance {uid0} is on disk" in out and out.count(" -> ") == 2
    assert "-> indexed" in out and "-> index row dropped" in out
    assert main(["check", "--data-dir", str(data)]) == 0
    archive = Archive.open(Settings(data_dir=data))
    assert archive.index.count() == 2
    assert archive.index.locate(uid0) is not None and archive.index.locate(uid1) is None
    archive.close()
    shutil.rmtree(data)


def test_check_names_and_repairs_each_kind_of_misfiled_or_unreadable_file(tmp_path, capsys):
    """A readable file in the wrong folder is not "unreadable": it is moved where it
    belongs, removed when a byte-identical copy is stored, or set aside when it differs."""
    data = tmp_path / "data"
    folder = tmp_path / "in"
    folder.mkdir()
    kept, lost = make_dataset(), make_dataset()
    for n, ds in enumerate((kept, lost)):
        ds.save_as(folder / f"{n}.dcm", enforce_file_format=True)
    assert main(["import", "--quiet", "--data-dir", str(data), str(folder)]) == 0
    archive = Archive.open(Settings(data_dir=data))
    paths = dict(archive.index.paths())
    blobs = archive.blobs
    # 1. a byte-identical copy of a stored instance in another folder
    copy = blobs.resolve("misc/copy.dcm")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(blobs.resolve(paths[kept.SOPInstanceUID]).read_bytes())
    # 2. another version of the stored instance, in another folder
    other = make_dataset(sop=kept.SOPInstanceUID, study=kept.StudyInstanceUID, series=kept.SeriesInstanceUID,
                         PatientName="Other^Version")
    other.save_as(blobs.resolve("misc/other.dcm"), enforce_file_format=True)
    # 3. an instance whose file is misfiled and whose row is gone (moved by hand)
    lost_rel = paths[lost.SOPInstanceUID]
    os.rename(blobs.resolve(lost_rel), blobs.resolve("misc/moved.dcm"))
    archive.index.delete(lost.StudyInstanceUID, lost.SeriesInstanceUID, lost.SOPInstanceUID)
    # 4. not DICOM at all
    blobs.resolve("misc/junk.dcm").write_bytes(b"not dicom")
    archive.close()
    capsys.readouterr()

    assert main(["check", "--data-dir", str(data)]) == 1
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("  unreadable")] == [
        line for line in out.splitlines() if line.startswith("  unreadable: misc/junk.dcm")]
    assert (f"  misfiled: misc/copy.dcm: a byte-identical copy of SOP Instance {kept.SOPInstanceUID}, "
            f"which is stored at {paths[kept.SOPInstanceUID]}") in out
    assert (f"  misfiled: misc/other.dcm: another version of SOP Instance {kept.SOPInstanceUID}, which is "
            f"stored at {paths[kept.SOPInstanceUID]} with different content") in out
    assert f"  misfiled: misc/moved.dcm: SOP Instance {lost.SOPInstanceUID} belongs at {lost_rel}" in out
    assert "  unreadable: misc/junk.dcm: not a PS3.10 DICOM file" in out

    assert main(["check", "--repair", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "misc/copy.dcm: a byte-identical copy" in out and "-> redundant copy removed" in out
    assert "-> moved to lost+found/misc/other.dcm (the stored version is kept)" in out
    assert f"-> moved to {lost_rel} and indexed" in out
    assert "-> moved to lost+found/misc/junk.dcm" in out
    assert main(["check", "--data-dir", str(data)]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    assert (data / "lost+found" / "misc" / "junk.dcm").read_bytes() == b"not dicom"
    archive = Archive.open(Settings(data_dir=data))
    assert dict(archive.index.paths()) == paths
    assert pydicom.dcmread(archive.blobs.resolve(paths[kept.SOPInstanceUID])).PatientName == "Test^Patient"
    assert not (data / "blobs" / "misc").exists()
    archive.close()


def test_serve_names_a_taken_http_port(tmp_path):
    """uvicorn alone logs "[Errno 98] Address already in use" without the port: serve names
    it and the flag, exits 2, and starts no DIMSE listener."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("serve", "--data-dir", str(tmp_path), "--port", str(port), "--dimse-port", "0", "--workers", "1")
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr
    assert "--port PORT" in r.stderr


def test_serve_with_a_taken_dimse_port_goes_on_without_dimse(tmp_path):
    """The first command starts DIMSE on 11112; when another program holds it, serve says so
    with the flag to use and HTTP serves, its landing page claiming no DIMSE port."""
    import signal
    import socket
    import time

    import httpx

    from tests.helpers import free_port

    http_port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        dport = s.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path), "--port",
             str(http_port), "--dimse-port", str(dport), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    page = httpx.get(f"http://127.0.0.1:{http_port}/").json()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            err = proc.communicate(timeout=20)[1]
    assert page["dimse_port"] is None or page["dimse_port"] == 0
    assert f"DIMSE listener cannot listen on 127.0.0.1:{dport}: Address already in use" in err
    assert "--dimse-port 0" in err and f"DIMSE DICOMWEB at 127.0.0.1:{dport}" not in err


def test_check_repair_with_the_blobs_folder_missing_drops_no_row(tmp_path, capsys):
    """An unmounted blobs share (or the wrong --data-dir with a PostgreSQL index): every
    row looked like a "missing file" and `check --repair` dropped the whole index."""
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(2):
        make_dataset().save_as(folder / f"{k}.dcm", enforce_file_format=True)
    data = tmp_path / "data"
    assert main(["import", "--quiet", "--data-dir", str(data), str(folder)]) == 0
    os.rename(data / "blobs", tmp_path / "blobs-elsewhere")  # the share is not mounted
    (data / "blobs").mkdir()
    capsys.readouterr()
    assert main(["check", "--repair", "--data-dir", str(data)]) == 1
    out = capsys.readouterr().out
    assert out.count("-> not repaired: the index and the storage share no instance") == 2
    assert "nothing repaired: none of the indexed instances is in this storage" in out
    archive = Archive.open(Settings(data_dir=data))
    try:
        assert archive.index.count() == 2
    finally:
        archive.close()

"""Downloads (issue 29): a study, series or QIDO-RS query as a ZIP of PS3.10 files with
a DICOMDIR, streamed; instance metadata as NDJSON. Known instances in; each member
read back with dcmread to the exact SOP Instance UID and bytes; the DICOMDIR read by
pydicom's FileSet lists every file and its File IDs resolve to the members."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import orjson
import pydicom
import pytest
from pydicom.fileset import FileSet
from starlette.testclient import TestClient

from dicomweb_server import export
from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes

_FILE_ID = re.compile(r"^[A-Z0-9_]{1,8}$")  # PS3.10 §8.2, §8.5


POSTGRESQL = True  # index_kind (tests/conftest.py): every index, and files in S3 too
S3 = True


@pytest.fixture
def client(tmp_path, request, index_kind):
    index, _, storage = index_kind.partition("+")
    extra = {"database_url": request.getfixturevalue("pg_url")} if index == "postgresql" else {}
    if storage == "s3":
        extra.update(request.getfixturevalue("s3_storage"))
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index=index, **extra))
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def _store(c: TestClient, datasets) -> dict[str, bytes]:
    files = {str(ds.SOPInstanceUID): to_bytes(ds) for ds in datasets}
    body, ctype = multipart(list(files.values()))
    r = c.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    return files


def _study(c: TestClient, patient: str = "P1", series: int = 2, per_series: int = 3, **attrs):
    first = make_dataset(PatientID=patient, StudyID="42", StudyTime="101500", SeriesNumber=1, InstanceNumber=1,
                         **attrs)
    datasets = [first]
    series_uids = [first.SeriesInstanceUID] + [pydicom.uid.generate_uid() for _ in range(series - 1)]
    for k, se in enumerate(series_uids):
        for i in range(per_series):
            if k == 0 and i == 0:
                continue
            datasets.append(make_dataset(study=first.StudyInstanceUID, series=se, PatientID=patient, StudyID="42",
                                         StudyTime="101500", SeriesNumber=k + 1, InstanceNumber=i + 1,
                                         rows=8 + i, **attrs))
    return first.StudyInstanceUID, series_uids, _store(c, datasets)


def _check_zip(content: bytes, expected: dict[str, bytes], tmp_path: Path) -> zipfile.ZipFile:
    """Every member a stored file (SOP Instance UID and SHA-256 as stored), the
    DICOMDIR last, listing every file under a File ID that names its member."""
    zf = zipfile.ZipFile(io.BytesIO(content))
    assert zf.testzip() is None  # every CRC-32 right
    names = zf.namelist()
    assert names[-1] == "DICOMDIR"
    members = names[:-1]
    assert len(members) == len(expected)
    by_sop = {}
    for name in members:
        assert all(_FILE_ID.match(part) for part in name.split("/")), name
        data = zf.read(name)
        ds = pydicom.dcmread(io.BytesIO(data))
        sop = str(ds.SOPInstanceUID)
        assert hashlib.sha256(data).hexdigest() == hashlib.sha256(expected[sop]).hexdigest()
        by_sop[sop] = name
    assert set(by_sop) == set(expected)
    zf.extractall(tmp_path / "x")
    fs = FileSet(pydicom.dcmread(tmp_path / "x" / "DICOMDIR"))
    listed = {str(inst.SOPInstanceUID): inst for inst in fs}
    assert set(listed) == set(expected)
    for sop, inst in listed.items():
        record = inst.node._record
        assert "/".join(record.ReferencedFileID) == by_sop[sop]
        on_disk = inst.load()  # the File ID resolves to the file
        assert str(on_disk.SOPInstanceUID) == sop
        assert record.ReferencedSOPClassUIDInFile == on_disk.SOPClassUID
        assert record.ReferencedTransferSyntaxUIDInFile == on_disk.file_meta.TransferSyntaxUID
    return zf


def test_study_archive_holds_every_file_and_a_dicomdir(client, tmp_path):
    study, series, files = _study(client)
    r = client.get(f"/studies/{study}/archive")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert r.headers["content-disposition"] == f'attachment; filename="study-{study}.zip"'
    _check_zip(r.content, files, tmp_path)
    fs = FileSet(pydicom.dcmread(tmp_path / "x" / "DICOMDIR"))
    [patient] = fs._tree.children
    assert patient._record.DirectoryRecordType == "PATIENT"
    assert patient._record.PatientID == "P1" and patient._record.PatientName == "Test^Patient"
    [st] = patient.children
    assert (st._record.StudyInstanceUID, st._record.StudyID, st._record.StudyDate, st._record.StudyTime) == (
        study, "42", "20240101", "101500")
    assert [s._record.SeriesInstanceUID for s in st.children] == series
    assert [s._record.SeriesNumber for s in st.children] == [1, 2]
    assert [[i._record.InstanceNumber for i in s.children] for s in st.children] == [[1, 2, 3], [1, 2, 3]]
    assert all(i._record.DirectoryRecordType == "IMAGE" for s in st.children for i in s.children)


def test_series_archive_holds_only_that_series(client, tmp_path):
    study, series, files = _study(client)
    r = client.get(f"/studies/{study}/series/{series[1]}/archive")
    assert r.status_code == 200
    assert r.headers["content-disposition"] == f'attachment; filename="series-{series[1]}.zip"'
    expected = {sop: data for sop, data in files.items()
                if pydicom.dcmread(io.BytesIO(data)).SeriesInstanceUID == series[1]}
    assert len(expected) == 3
    _check_zip(r.content, expected, tmp_path)


def test_unknown_study_or_series_is_404(client):
    study, _, _ = _study(client, series=1, per_series=1)
    assert client.get("/studies/1.2.3.4/archive").status_code == 404
    assert client.get(f"/studies/{study}/series/1.2.3.4/archive").status_code == 404
    assert client.get("/studies/not-a-uid/archive").status_code == 400
    assert client.get("/archive", params={"PatientID": "NOBODY"}).status_code == 404


def test_query_archive_packs_the_matching_studies_under_their_patients(client, tmp_path):
    _, _, a = _study(client, patient="A", series=1, per_series=2)
    _, _, b = _study(client, patient="B", series=1, per_series=1)
    _, _, a2 = _study(client, patient="A", series=1, per_series=1)
    r = client.get("/archive", params={"PatientID": "A"})
    assert r.status_code == 200
    assert r.headers["content-disposition"] == 'attachment; filename="studies.zip"'
    _check_zip(r.content, {**a, **a2}, tmp_path)
    fs = FileSet(pydicom.dcmread(tmp_path / "x" / "DICOMDIR"))
    [patient] = fs._tree.children  # both studies under the one PATIENT record
    assert len(patient.children) == 2
    assert client.get("/archive", params={"PatientID": "A", "limit": "1"}).status_code == 200


def test_query_archive_refuses_more_studies_than_its_bound(client, monkeypatch):
    from dicomweb_server.api import downloads

    monkeypatch.setattr(downloads, "ARCHIVE_MAX_STUDIES", 1)
    _study(client, patient="A", series=1, per_series=1)
    _study(client, patient="A", series=1, per_series=1)
    r = client.get("/archive", params={"PatientID": "A"})
    assert r.status_code == 400 and "more than 1 studies" in r.text
    assert client.get("/archive", params={"PatientID": "A", "limit": "1", "offset": "1"}).status_code == 200


def test_head_answers_like_get_without_a_body(client):
    study, _, _ = _study(client, series=1, per_series=1)
    r = client.head(f"/studies/{study}/archive")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"] == "application/zip"


def test_unknown_deidentify_profile_is_refused_and_a_registered_one_transforms(client, tmp_path, monkeypatch):
    study, _, files = _study(client, series=1, per_series=2)
    r = client.get(f"/studies/{study}/archive", params={"deidentify": "strict"})
    assert r.status_code == 400 and "'strict' is not available (available: basic" in r.text

    class Renamed:  # a stand-in profile: patient ID rewritten in the bytes and the JSON alike
        def apply(self, loc, item, chunks):
            ds = pydicom.dcmread(io.BytesIO(b"".join(chunks)))
            ds.PatientID = "ANON"
            return {**item, "00100020": {"vr": "LO", "Value": ["ANON"]}}, [to_bytes(ds)]

        def report(self):
            return None

    monkeypatch.setitem(export.TRANSFORMS, "test", lambda archive, spec, query: Renamed())
    r = client.get(f"/studies/{study}/archive", params={"deidentify": "test"})
    assert r.status_code == 200
    zf = zipfile.ZipFile(io.BytesIO(r.content))
    for name in zf.namelist()[:-1]:
        ds = pydicom.dcmread(io.BytesIO(zf.read(name)))
        assert ds.PatientID == "ANON" and str(ds.SOPInstanceUID) in files
    zf.extractall(tmp_path / "d")
    assert FileSet(pydicom.dcmread(tmp_path / "d" / "DICOMDIR"))._tree.children[0]._record.PatientID == "ANON"


def test_deidentified_download_on_every_index_and_s3(client, tmp_path):
    """The ``basic`` profile (deid/download.py) where the pseudonym table lives in each
    index's database (PostgreSQL: its schema) and the files in S3 (parsed from a local
    copy): no PatientID left, the DICOMDIR on the pseudonym, pixel data as stored.
    tests/deid/test_download.py holds the full checks."""
    study, _, files = _study(client, patient="MRN-5521", series=1, per_series=2)
    assert client.post("/admin/deid/p1/pseudonyms", content=b"").status_code == 200
    r = client.get(f"/studies/{study}/archive", params={"deidentify": "basic", "project": "p1"})
    assert r.status_code == 200, r.text
    assert b"MRN-5521" not in r.content and study.encode() not in r.content
    zf = zipfile.ZipFile(io.BytesIO(r.content))
    assert zf.namelist()[-2:] == ["DEIDENTIFICATION.json", "DICOMDIR"]
    members = [pydicom.dcmread(io.BytesIO(zf.read(n))) for n in zf.namelist()[:-2]]
    pixels = {pydicom.dcmread(io.BytesIO(b)).PixelData for b in files.values()}
    assert len(members) == 2 and {m.PixelData for m in members} == pixels
    [psn] = {str(m.PatientID) for m in members}
    assert psn.startswith("PSN-")
    zf.extractall(tmp_path / "d")
    fs = FileSet(pydicom.dcmread(tmp_path / "d" / "DICOMDIR"))
    assert fs._tree.children[0]._record.PatientID == psn
    assert {str(i.SOPInstanceUID) for i in fs} == {str(m.SOPInstanceUID) for m in members}


def test_a_member_past_zipfiles_limit_gets_zip64_sizes_from_the_start():
    limit = zipfile.ZIP64_LIMIT  # 2 GiB - 1: zipfile refuses a larger member not announced as ZIP64
    assert export.zip_member("I", limit + 1, 1e9)[1] is True
    assert export.zip_member("I", limit - 1, 1e9)[1] is False
    assert export.zip_member("I", None, 1e9)[1] is True


def _unzip_test(content: bytes, tmp_path: Path) -> str:
    """Info-ZIP's ``unzip -t`` (another implementation than the one that wrote it)."""
    path = tmp_path / "t.zip"
    path.write_bytes(content)
    done = subprocess.run(["unzip", "-t", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("unzip") is None, reason="Info-ZIP unzip not installed")
def test_zip64_records_read_by_another_implementation(client, tmp_path, monkeypatch):
    """Sizes and offsets past the limits take ZIP64 records (APPNOTE §4.5.3): with
    zipfile's limit lowered to 1,000 bytes every member and the central directory get
    them, as a study of more than 4 GiB does; unzip and zipfile read the result."""
    study, _, files = _study(client, series=1, per_series=3)
    plain = client.get(f"/studies/{study}/archive").content
    assert "No errors detected" in _unzip_test(plain, tmp_path)
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 1000)
    big = client.get(f"/studies/{study}/archive").content
    monkeypatch.undo()
    assert b"PK\x06\x06" in big and b"PK\x06\x06" not in plain  # the ZIP64 end of central directory record
    assert "No errors detected" in _unzip_test(big, tmp_path)
    _check_zip(big, files, tmp_path)


def test_export_metadata_streams_one_json_object_per_instance(client):
    study, series, files = _study(client, series=2, per_series=2)
    _study(client, patient="OTHER", series=1, per_series=1)
    r = client.get("/export/metadata", params={"StudyInstanceUID": study})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [orjson.loads(line) for line in r.content.splitlines()]
    assert sorted(o["00080018"]["Value"][0] for o in lines) == sorted(files)
    stored = client.get(f"/studies/{study}/metadata").json()
    assert sorted(lines, key=lambda o: o["00080018"]["Value"][0]) == sorted(
        stored, key=lambda o: o["00080018"]["Value"][0])

    r = client.get("/export/metadata", params={"StudyInstanceUID": study, "format": "flat"})
    rows = [orjson.loads(line) for line in r.content.splitlines()]
    assert sorted(o["SOPInstanceUID"] for o in rows) == sorted(files)
    one = next(o for o in rows if o["SeriesInstanceUID"] == series[1] and o["InstanceNumber"] == 2)
    assert one["PatientID"] == "P1" and one["PatientName"] == "Test^Patient" and one["Rows"] == 9
    assert one["StudyDate"] == "20240101" and "PixelData" not in one

    r = client.get("/export/metadata", params={"StudyInstanceUID": study, "limit": "1"})
    assert len(r.content.splitlines()) == 1
    assert client.get("/export/metadata", params={"format": "csv"}).status_code == 400
    assert client.get("/export/metadata", params={"NoSuchKeyword": "x"}).status_code == 400
    assert client.get("/export/metadata", params={"PatientID": "NOBODY"}).content == b""


def test_downloads_need_the_read_scope_like_wado_rs(tmp_path):
    keys = {"reader": ["read"], "writer": ["write"]}
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", api_keys=keys))
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            ds = make_dataset()
            body, ctype = multipart([to_bytes(ds)])
            auth = {"Authorization": "Bearer writer"}
            assert c.post("/studies", content=body, headers={"Content-Type": ctype, **auth}).status_code == 200
            for path in (f"/studies/{ds.StudyInstanceUID}/archive",
                         f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/archive",
                         f"/archive?StudyInstanceUID={ds.StudyInstanceUID}",
                         f"/export/metadata?StudyInstanceUID={ds.StudyInstanceUID}"):
                assert c.get(path).status_code == 401, path
                assert c.get(path, headers=auth).status_code == 403, path
                assert c.get(path, headers={"Authorization": "Bearer reader"}).status_code == 200, path
    finally:
        archive.close()


def test_missing_files_are_left_out_of_the_zip_and_the_dicomdir(client, tmp_path):
    """A file gone behind the index's back (damaged storage) before the answer starts:
    the others are sent, a Warning names it (as WADO-RS); one gone after the answer
    started is left out of both the members and the DICOMDIR."""
    from tests.helpers import remove_stored

    study, _, files = _study(client, series=1, per_series=3)
    archive = client.app.state.archive
    locs = archive.index.instances(study)
    remove_stored(archive.settings, locs[1].path)
    r = client.get(f"/studies/{study}/archive")
    assert r.status_code == 200
    assert "instance data missing" in r.headers["warning"] and locs[1].sop_uid in r.headers["warning"]
    _check_zip(r.content, {s: d for s, d in files.items() if s != locs[1].sop_uid}, tmp_path / "a")

    told = []
    items = {json_sop(raw): orjson.loads(raw) for raw in archive.index.metadata(study)}
    entries = [export.Entry(loc, items[loc.sop_uid]) for loc in locs]  # locs[1] gone since the look-up
    body = b"".join(export.zip_stream(archive.blobs, entries, on_missing=lambda loc, e: told.append(loc.sop_uid)))
    assert told == [locs[1].sop_uid]
    _check_zip(body, {s: d for s, d in files.items() if s != locs[1].sop_uid}, tmp_path / "b")


def json_sop(raw: bytes) -> str:
    return orjson.loads(raw)["00080018"]["Value"][0]


def test_dicomdir_stand_ins_for_missing_type_1_keys_and_character_set(client, tmp_path):
    ds = make_dataset(PatientName="Müller^Jörg", SpecificCharacterSet="ISO_IR 100")
    del ds.PatientID, ds.StudyDate, ds.Modality
    ds.PatientID = ""
    files = _store(client, [ds])
    r = client.get(f"/studies/{ds.StudyInstanceUID}/archive")
    assert r.status_code == 200
    _check_zip(r.content, files, tmp_path)
    fs = FileSet(pydicom.dcmread(tmp_path / "x" / "DICOMDIR"))
    patient = fs._tree.children[0]
    assert patient._record.PatientID == "UNKNOWN"
    assert patient._record.SpecificCharacterSet == "ISO_IR 100" and patient._record.PatientName == "Müller^Jörg"
    study = patient.children[0]._record
    assert (study.StudyDate, study.StudyTime, study.StudyID) == (
        "19000101", "000000", ds.StudyInstanceUID.replace(".", "")[-16:])
    series = patient.children[0].children[0]._record
    assert (series.Modality, series.SeriesNumber) == ("OT", 0)
    assert patient.children[0].children[0].children[0]._record.InstanceNumber == 0


def test_a_de_identified_download_needs_the_write_scope_too(tmp_path):
    """``?deidentify=``: a reader with ``read`` only (and so a share link) gets 403 — the
    download records pseudonyms and could pair them with the identities it reads; with
    ``read`` and ``write`` the request goes on (here to the 400 of a project that does not
    exist: nothing was created)."""
    keys = {"reader": ["read"], "both": ["read", "write"]}
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", api_keys=keys))
    try:
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            ds = make_dataset()
            body, ctype = multipart([to_bytes(ds)])
            both = {"Authorization": "Bearer both"}
            assert c.post("/studies", content=body, headers={"Content-Type": ctype, **both}).status_code == 200
            for path in (f"/studies/{ds.StudyInstanceUID}/archive",
                         f"/export/metadata?StudyInstanceUID={ds.StudyInstanceUID}&"):
                url = path + ("&" if "?" in path else "?") + "deidentify=basic&project=nope"
                r = c.get(url, headers={"Authorization": "Bearer reader"})
                assert r.status_code == 403 and "write" in r.text, url
                assert c.get(url, headers=both).status_code == 400, url
    finally:
        archive.close()

"""Rejection (lifecycle/reject.py) through the web front door, on every index: a
rejection note stored by STOW-RS hides what it names from QIDO-RS (every level, the
computed attributes) and WADO-RS (instance, series, study, metadata, frames, rendered,
thumbnail: 404 as if absent); dcm4chee's reject endpoint (OHIF's reject button) does the
same without a note; /admin/rejected lists them, $restore-rejected brings them back, the
purge removes them after keep_rejected days; the change feed says reject/restore/delete."""

from __future__ import annotations

import io
import time

import httpx
import pytest
from pydicom.uid import generate_uid

from dicomweb_server.lifecycle import reject as lifecycle
from tests.helpers import LiveServer, make_dataset, multipart, rejection_note, to_bytes

POSTGRESQL = True  # tests/conftest.py: the index_kind fixture covers PostgreSQL too


def stow(http, datasets) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = http.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text


def uids(http, path: str, tag: str, **params) -> list[str]:
    r = http.get(path, params=params)
    assert r.status_code in (200, 204), r.text
    return [x[tag]["Value"][0] for x in (r.json() if r.status_code == 200 else [])]


@pytest.fixture
def study(http):
    st, ct, mr = generate_uid(), generate_uid(), generate_uid()
    dss = [make_dataset(study=st, series=ct, InstanceNumber=n) for n in (1, 2)]
    dss.append(make_dataset(study=st, series=mr, modality="MR", sop_class="1.2.840.10008.5.1.4.1.1.4"))
    stow(http, dss)
    return dss


def url(ds, tail: str = "") -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}{tail}"


def test_a_rejection_note_by_stow_hides_what_it_names(http, study):
    a, b, mr = study
    st = str(a.StudyInstanceUID)
    note = rejection_note([a, mr])
    stow(http, [note])
    (found,) = http.get("/studies", params={"StudyInstanceUID": st, "includefield": "ModalitiesInStudy"}).json()
    # the note's own series (KO) stays: a record of the rejection
    assert found["00080061"]["Value"] == ["CT", "KO"]
    assert found["00201208"]["Value"] == [2]
    assert uids(http, f"/studies/{st}/series", "0020000E") == [a.SeriesInstanceUID, note.SeriesInstanceUID]
    assert uids(http, f"/studies/{st}/instances", "00080018") == [b.SOPInstanceUID, note.SOPInstanceUID]
    assert uids(http, "/instances", "00080018", PatientID="P1", limit="100").count(a.SOPInstanceUID) == 0
    for path in (url(a), url(a, "/metadata"), url(a, "/frames/1"), url(a, "/rendered"), url(a, "/thumbnail"),
                 f"/studies/{st}/series/{mr.SeriesInstanceUID}",
                 f"/studies/{st}/series/{mr.SeriesInstanceUID}/metadata"):
        assert http.get(path).status_code == 404, path
    assert http.get(url(b)).status_code == 200
    meta = http.get(f"/studies/{st}/metadata").json()
    assert sorted(m["00080018"]["Value"][0] for m in meta) == sorted([b.SOPInstanceUID, note.SOPInstanceUID])

    listed = http.get("/admin/rejected", params={"study": st}).json()
    assert sorted((x["SOPInstanceUID"], x["Reason"], x["Stored"]) for x in listed) == sorted(
        [(a.SOPInstanceUID, "113001^DCM", True), (mr.SOPInstanceUID, "113001^DCM", True)])

    r = http.post(f"/studies/{st}/$restore-rejected")
    assert r.status_code == 200 and r.json() == {"count": 2}
    assert http.get(url(a)).status_code == 200
    assert sorted(uids(http, f"/studies/{st}/instances", "00080018")) == sorted(
        x.SOPInstanceUID for x in (a, b, mr, note))
    assert http.post(f"/studies/{st}/$restore-rejected").status_code == 404
    feed = [(e["Action"], e["State"], e["SopInstanceUid"])
            for e in http.get("/changefeed", params={"limit": 100}).json()]
    assert feed[-4:-2] == [("reject", "rejected", a.SOPInstanceUID), ("reject", "rejected", mr.SOPInstanceUID)]
    assert sorted(feed[-2:]) == sorted([("restore", "current", a.SOPInstanceUID),
                                        ("restore", "current", mr.SOPInstanceUID)])


def test_the_dcm4chee_endpoint_rejects_a_series_and_a_study(http, study, server):
    a, b, mr = study
    st = str(a.StudyInstanceUID)
    # OHIF's DicomWebDataSource reject.series: POST {wadoRoot}/studies/{st}/series/{se}/reject/113001%5EDCM
    r = http.post(f"/studies/{st}/series/{a.SeriesInstanceUID}/reject/113001%5EDCM")
    assert r.status_code == 200 and r.json() == {"count": 2}
    assert uids(http, f"/studies/{st}/series", "0020000E") == [mr.SeriesInstanceUID]
    assert http.get(f"/studies/{st}/series/{a.SeriesInstanceUID}").status_code == 404
    assert http.post(f"/studies/{st}/series/{a.SeriesInstanceUID}/reject/113001%5EDCM").status_code == 404
    bad = http.post(f"/studies/{st}/reject/999999%5EDCM")
    assert bad.status_code == 400 and "CID 7011" in bad.text
    assert http.post(f"/studies/{st}/reject/113039%5EDCM").json() == {"count": 1}
    assert uids(http, "/studies", "0020000D", StudyInstanceUID=st) == []
    assert http.get(f"/studies/{st}").status_code == 404

    # purge: nothing before keep_rejected (30 days) is over, then all, files included
    archive = server.archive
    files = [r.path for r in archive.index.rejections(st)]
    assert lifecycle.purge(archive) == 0
    assert lifecycle.purge(archive, now=time.time() + 31 * 86400) == 3
    assert archive.index.rejections() == []
    left = {o.path for o in archive.blobs.listing()}
    assert len(files) == 3 and not left & set(files)
    assert http.post(f"/studies/{st}/$restore-rejected").status_code == 404
    feed = [(e["Action"], e["State"]) for e in http.get("/changefeed", params={"limit": 100}).json()]
    assert feed[-3:] == [("delete", "deleted")] * 3 and {s for _, s in feed} == {"deleted"}


def test_the_endpoints_need_the_write_scope(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text('{"reader": ["read"], "writer": ["write"]}')
    srv = LiveServer(tmp_path / "data", api_keys_file=keys).start()
    try:
        st, se = generate_uid(), generate_uid()
        for path, method in ((f"/studies/{st}/series/{se}/reject/113001%5EDCM", "POST"),
                             (f"/studies/{st}/$restore-rejected", "POST"), ("/admin/rejected", "GET")):
            r = httpx.request(method, srv.url + path, headers={"Authorization": "Bearer reader"})
            assert r.status_code == 403, path
            r = httpx.request(method, srv.url + path, headers={"Authorization": "Bearer writer"})
            assert r.status_code in (200, 404), path
    finally:
        srv.stop()


def test_import_of_a_note_and_the_purge_command(tmp_path, monkeypatch, capsys):
    """`dicomweb-server import` is a front door too; `dicomweb-server purge` removes what
    was rejected more than DICOMWEB_KEEP_REJECTED days ago (range-checked: exit 2)."""
    from dicomweb_server.archive import Archive
    from dicomweb_server.cli import main
    from dicomweb_server.settings import Settings

    folder, data = tmp_path / "in", str(tmp_path / "data")
    folder.mkdir()
    a, b = make_dataset(), make_dataset()
    for ds in (a, b, rejection_note([a])):
        ds.save_as(folder / f"{ds.SOPInstanceUID}.dcm", enforce_file_format=True)
    assert main(["import", "--quiet", "--data-dir", data, str(folder)]) == 0
    assert main(["check", "--data-dir", data]) == 0  # a rejected instance's file is the index's, not an orphan
    assert main(["purge", "--data-dir", data]) == 0
    assert "purged 0 " in capsys.readouterr().out
    monkeypatch.setenv("DICOMWEB_KEEP_REJECTED", "-1")
    with pytest.raises(SystemExit) as bad:
        main(["purge", "--data-dir", data])
    assert bad.value.code == 2
    assert "keep_rejected (DICOMWEB_KEEP_REJECTED): -1 is out of range" in capsys.readouterr().err
    monkeypatch.setenv("DICOMWEB_KEEP_REJECTED", "0")
    assert main(["purge", "--data-dir", data]) == 0
    assert "purged 1 " in capsys.readouterr().out
    archive = Archive.open(Settings(data_dir=data))
    try:
        assert archive.index.locate(str(a.SOPInstanceUID)) is None and archive.index.rejections() == []
        assert archive.index.locate(str(b.SOPInstanceUID)) is not None
        assert not any(o.path.endswith(f"{a.SOPInstanceUID}.dcm") for o in archive.blobs.listing())
    finally:
        archive.close()


def test_a_restore_that_no_longer_fits_its_study_stays_rejected(http, study):
    """The whole study rejected, then the same Study Instance UID stored for another
    patient: the rejected instances cannot come back into it (hierarchy_conflict) and
    stay rejected, listed, not lost."""
    a = study[0]
    st = str(a.StudyInstanceUID)
    assert http.post(f"/studies/{st}/reject/113038%5EDCM").json() == {"count": 3}
    stow(http, [make_dataset(study=st, PatientID="OTHER")])
    r = http.post(f"/studies/{st}/$restore-rejected")
    assert r.status_code == 409 and "belongs to patient" in r.text, r.text
    listed = http.get("/admin/rejected", params={"study": st}).json()
    assert sorted(x["SOPInstanceUID"] for x in listed) == sorted(str(d.SOPInstanceUID) for d in study)
    assert {x["Reason"] for x in listed} == {"113038^DCM"}
    assert {x["Stored"] for x in listed} == {True}  # their files still theirs
    assert len(uids(http, f"/studies/{st}/instances", "00080018")) == 1


def test_a_refused_restore_leaves_the_rejection_as_it_was(http, server):
    """A series rejected, then its study's PatientID changed by $update: its instance no
    longer fits the study (hierarchy_conflict), the restore is refused (409 naming the
    conflict) and the rejection stays exactly as it was: listed, stored (its file's path
    kept: not an orphan), in includerejected=true; once the patient is set back, it comes back."""
    st, se, se2 = generate_uid(), generate_uid(), generate_uid()
    a = make_dataset(study=st, series=se, PatientID="LP1")
    b = make_dataset(study=st, series=se2, PatientID="LP1")
    stow(http, [a, b])
    assert http.post(f"/studies/{st}/series/{se2}/reject/113001%5EDCM").json() == {"count": 1}
    before = http.get("/admin/rejected", params={"study": st}).json()
    assert [(x["SOPInstanceUID"], x["Stored"]) for x in before] == [(b.SOPInstanceUID, True)]
    r = http.post(f"/studies/{st}/$update", json={"00100020": {"vr": "LO", "Value": ["LP2"]}})
    assert r.status_code == 200, r.text
    for _ in range(2):  # refused twice: nothing changes
        r = http.post(f"/studies/{st}/$restore-rejected")
        assert r.status_code == 409, r.text
        assert b.SOPInstanceUID in r.text and "belongs to patient" in r.text
        assert http.get("/admin/rejected", params={"study": st}).json() == before
    assert server.archive.index.rejections(st)[0].path is not None
    assert uids(http, f"/studies/{st}/instances", "00080018", includerejected="true") == [
        a.SOPInstanceUID, b.SOPInstanceUID]
    assert b.SOPInstanceUID in {sop for sop, _ in server.archive.index.paths()}  # check: not an orphan
    r = http.post(f"/studies/{st}/$update", json={"00100020": {"vr": "LO", "Value": ["LP1"]}})
    assert r.status_code == 200, r.text
    assert http.post(f"/studies/{st}/$restore-rejected").json() == {"count": 1}
    assert http.get("/admin/rejected", params={"study": st}).json() == []
    assert http.get(url(b)).status_code == 200


def test_a_restore_of_a_study_does_not_apply_its_rejection_note_again(http):
    """A note rejects X; the operator restores X; the whole study (X, its sibling, the note)
    is rejected; restoring it gives back the three, and the note is not applied again
    (lifecycle/reject.py note_hook): X stays shown, the count is what became visible."""
    st, se = generate_uid(), generate_uid()
    x, y = (make_dataset(study=st, series=se, PatientID="KR1") for _ in range(2))
    stow(http, [x, y])
    note = rejection_note([x])
    stow(http, [note])
    visible = lambda: sorted(uids(http, f"/studies/{st}/instances", "00080018"))  # noqa: E731
    assert visible() == sorted([y.SOPInstanceUID, note.SOPInstanceUID])
    assert http.post(f"/studies/{st}/$restore-rejected").json() == {"count": 1}
    assert visible() == sorted([x.SOPInstanceUID, y.SOPInstanceUID, note.SOPInstanceUID])
    assert http.post(f"/studies/{st}/reject/113001%5EDCM").json() == {"count": 3}
    assert visible() == []
    assert http.post(f"/studies/{st}/$restore-rejected").json() == {"count": 3}
    assert visible() == sorted([x.SOPInstanceUID, y.SOPInstanceUID, note.SOPInstanceUID])
    assert http.get("/admin/rejected", params={"study": st}).json() == []
    assert http.get(url(x)).status_code == 200


def test_the_server_purges_at_start(tmp_path, index_kind, request):
    """A server started with keep_rejected 0 purges what was rejected (lifespan task)."""
    extra = {"database_url": request.getfixturevalue("pg_url")} if index_kind == "postgresql" else {}
    srv = LiveServer(tmp_path / "data", index_kind, **extra).start()
    try:
        a = make_dataset()
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            stow(http, [a])
            assert http.post(f"/studies/{a.StudyInstanceUID}/reject/113001%5EDCM").json() == {"count": 1}
        srv.stop()
        srv.settings = srv.settings.model_copy(update={"keep_rejected": 0.0})
        srv.start()
        deadline = time.monotonic() + 10
        while srv.archive.index.rejections() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.archive.index.rejections() == []
        assert [c.action for c in srv.archive.index.changes(limit=10)] == ["create", "reject", "delete"]
    finally:
        srv.stop()


def test_a_note_before_its_instances_hides_them_when_they_arrive(http):
    """IOCM: the note may arrive first; the instances it names are then stored (200) but
    never searchable, and restorable like the others."""
    a = make_dataset()
    st = str(a.StudyInstanceUID)
    note = rejection_note([a])
    stow(http, [note])
    assert http.get("/admin/rejected", params={"study": st}).json()[0]["Stored"] is False
    stow(http, [a])
    assert uids(http, f"/studies/{st}/instances", "00080018") == [note.SOPInstanceUID]
    assert http.get(url(a)).status_code == 404
    assert http.get("/admin/rejected", params={"study": st}).json()[0]["Stored"] is True
    assert http.post(f"/studies/{st}/$restore-rejected").json() == {"count": 1}
    assert http.get(url(a)).status_code == 200


def test_an_update_leaves_a_rejected_instance_as_it_was_rejected(http, study, server):
    """lifecycle-update x lifecycle-reject: a study $update while one of its instances is
    rejected does not touch (nor show) that instance; restoring the rejection brings it
    back as it was rejected: its version then (here version 2, an earlier update's), not
    the later update's values (docs/notes/lifecycle-update.md)."""
    import pydicom

    a, b, mr = study
    st, mr_se, mr_sop = str(a.StudyInstanceUID), str(mr.SeriesInstanceUID), str(mr.SOPInstanceUID)

    def update(value: str) -> int:
        r = http.post(f"/studies/{st}/$update", json={"00081030": {"vr": "LO", "Value": [value]}})
        assert r.status_code == 200, r.text
        return r.json()["instances"]

    assert update("after") == 3  # every instance at version 2
    assert http.post(f"/studies/{st}/series/{mr_se}/reject/113001%5EDCM").json() == {"count": 1}
    assert update("third") == 2  # the rejected instance is not part of it
    assert http.get(url(mr)).status_code == 404  # not resurrected by the update's switch
    assert http.post(f"/studies/{st}/$restore-rejected").json() == {"count": 1}
    meta = {m["00080018"]["Value"][0]: m["00081030"]["Value"][0] for m in http.get(f"/studies/{st}/metadata").json()}
    assert meta == {a.SOPInstanceUID: "third", b.SOPInstanceUID: "third", mr_sop: "after"}
    r = http.get(url(mr), headers={"Accept": "multipart/related; type=application/dicom"})
    assert r.status_code == 200
    got = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"\r\n\r\n") + 4:]), force=True)
    assert (got.SOPInstanceUID, got.StudyDescription, got.PixelData) == (mr_sop, "after", mr.PixelData)
    vs = http.get(url(mr, "/versions")).json()
    assert [(v["version"], v["action"], v["current"]) for v in vs] == [(1, "create", False), (2, "update", True)]
    feed = [(e["Action"], e["State"]) for e in http.get("/changefeed", params={"limit": 100}).json()
            if e["SopInstanceUid"] == mr_sop]
    assert feed == [("create", "replaced"), ("update", "rejected"), ("reject", "rejected"), ("restore", "current")]
    # rejected again and purged: its kept versions go with it (base file and version 2)
    assert http.post(f"/studies/{st}/series/{mr_se}/reject/113001%5EDCM").json() == {"count": 1}
    assert sum(mr_sop in o.path for o in server.archive.blobs.listing()) == 2
    assert lifecycle.purge(server.archive, now=time.time() + 31 * 86400) == 1
    assert not any(mr_sop in o.path for o in server.archive.blobs.listing())
    assert sum(a.SOPInstanceUID in o.path for o in server.archive.blobs.listing()) == 3  # v1, v2, v3 kept


def test_a_rejected_updated_instance_survives_a_restart_of_the_memory_index(tmp_path):
    """The in-memory index re-reads the files at start: a rejected instance whose current
    file is a version ({sop}.v2.dcm) is filed under its rejection with that file, and a
    restore after the restart brings back version 2 (not the first file)."""
    import pydicom

    srv = LiveServer(tmp_path / "data", "memory").start()
    try:
        a = make_dataset(StudyDescription="before")
        st, se, sop = str(a.StudyInstanceUID), str(a.SeriesInstanceUID), str(a.SOPInstanceUID)
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            stow(http, [a])
            r = http.post(f"/studies/{st}/$update", json={"00081030": {"vr": "LO", "Value": ["after"]}})
            assert r.status_code == 200, r.text
            assert http.post(f"/studies/{st}/reject/113001%5EDCM").json() == {"count": 1}
        srv.stop()
        srv.start()
        (row,) = srv.archive.index.rejections()
        assert row.path.endswith(f"{sop}.v2.dcm")
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.get(url(a)).status_code == 404
            assert http.post(f"/studies/{st}/$restore-rejected").json() == {"count": 1}
            r = http.get(f"/studies/{st}/series/{se}/instances/{sop}",
                         headers={"Accept": "multipart/related; type=application/dicom"})
            got = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"\r\n\r\n") + 4:]), force=True)
            assert got.StudyDescription == "after"
        srv.stop()
        srv.start()  # shown again: the change log's restore row names version 2 as current
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            meta = http.get(f"/studies/{st}/metadata").json()
            assert [m["00081030"]["Value"][0] for m in meta] == ["after"]
    finally:
        srv.stop()

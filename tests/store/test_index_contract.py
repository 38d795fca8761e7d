"""One contract for every Index implementation (store/base.py): the in-memory and
SQLite indexes must give the same answers to the same calls."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sqlite3
import threading
from pathlib import Path

import orjson
import pytest
from pydicom.uid import generate_uid

from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.dicom.status import FailureReason
from dicomweb_server.store.base import Refused
from dicomweb_server.store.commit import GroupCommitter
from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.helpers import BASIC_TEXT_SR, CT_IMAGE_STORAGE, MR_IMAGE_STORAGE, make_dataset


def open_index(kind: str, request, tmp_path):
    """A new, empty index of this kind (PostgreSQL: in a schema of the test server)."""
    if kind == "memory":
        return MemoryIndex()
    if kind == "sqlite":
        return SQLiteIndex(tmp_path / "index.sqlite")
    return PostgreSQLIndex(request.getfixturevalue("pg_url"))


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def index(request, tmp_path):
    idx = open_index(request.param, request, tmp_path)
    yield idx
    idx.close()


def record(tmp_path, **kw):
    ds = make_dataset(**kw)
    path = tmp_path / f"{ds.SOPInstanceUID}.dcm"
    ds.save_as(path, enforce_file_format=True)
    return describe_instance(path)


@pytest.fixture
def loaded(index, tmp_path):
    s1, s2, se1 = generate_uid(), generate_uid(), generate_uid()
    recs = [
        record(tmp_path, study=s1, series=se1, PatientName="Doe^John", PatientID="A", StudyDate="20200101",
               InstanceNumber=1),
        record(tmp_path, study=s1, series=se1, PatientName="Doe^John", PatientID="A", StudyDate="20200101",
               InstanceNumber=2),
        record(tmp_path, study=s1, modality="SR", sop_class=BASIC_TEXT_SR, pixels=False, PatientID="A"),
        record(tmp_path, study=s2, modality="MR", PatientName="Roe^Jane", PatientID="B", StudyDate="20210505"),
    ]
    assert index.add(recs) == [True, True, True, True]
    return index, recs, s1, s2, se1


def q(level, params, **kw):
    return parse_query(level, list(params.items()), **kw)


def test_add_duplicate_keeps_first(loaded, tmp_path):
    index, recs, *_ = loaded
    assert index.add([recs[0]]) == [False]
    assert index.count() == 4


def test_locate_and_instances(loaded):
    index, recs, s1, _s2, se1 = loaded
    loc = index.locate(recs[0].sop_uid)
    assert (loc.study_uid, loc.series_uid, loc.path) == (s1, se1, recs[0].path)
    assert loc.pixel["number_of_frames"] == 1 and loc.pixel["frame_length"] == 128
    assert index.locate("1.2.3") is None
    assert [x.sop_uid for x in index.instances(s1)] == [r.sop_uid for r in recs[:3]]
    assert [x.sop_uid for x in index.instances(s1, se1)] == [r.sop_uid for r in recs[:2]]
    assert index.instances("1.2.3") == []


def test_metadata(loaded):
    index, recs, s1, _s2, se1 = loaded
    metas = [orjson.loads(m) for m in index.metadata(s1)]
    assert [m["00080018"]["Value"][0] for m in metas] == [r.sop_uid for r in recs[:3]]
    assert len(index.metadata(s1, se1, recs[1].sop_uid)) == 1
    assert index.metadata(s1, se1, "1.2.3") == []


@pytest.mark.parametrize("level, params, want", [
    ("study", {}, {0, 3}),
    ("study", {"PatientName": "doe*"}, {0}),
    ("study", {"PatientName": "jane", "fuzzymatching": "true"}, {3}),
    ("study", {"StudyDate": "20201231-"}, {3}),
    ("study", {"ModalitiesInStudy": "SR"}, {0}),
    ("study", {"Modality": "MR"}, {3}),
    ("study", {"NumberOfStudyRelatedInstances": "3"}, {0}),
    ("series", {"Modality": "CT"}, {0}),
    ("series", {"PatientID": "A"}, {0, 2}),
    ("instance", {"InstanceNumber": "2"}, {1}),
    ("instance", {"PatientID": "A", "Modality": "SR"}, {2}),
    ("instance", {"SOPClassUID": BASIC_TEXT_SR}, {2}),
])
def test_search(loaded, level, params, want):
    index, recs, *_ = loaded
    hits = index.search(q(level, params))
    key = {"study": lambda r: r.study_uid, "series": lambda r: r.series_uid, "instance": lambda r: r.sop_uid}[level]
    got = [{"study": h.study_uid, "series": h.series_uid, "instance": h.sop_uid}[level] for h in hits]
    expected = list(dict.fromkeys(key(recs[i]) for i in sorted(want)))
    assert got == expected


def test_search_computed_and_scope(loaded):
    index, recs, s1, s2, se1 = loaded
    (h,) = index.search(q("study", {"StudyInstanceUID": s1}))
    assert h.computed == {"ModalitiesInStudy": ["CT", "SR"], "SOPClassesInStudy": sorted({r.sop_class_uid for r in recs[:3]}),
                          "NumberOfStudyRelatedSeries": 2, "NumberOfStudyRelatedInstances": 3}
    hits = index.search(q("series", {}, study_uid=s1))
    assert [x.computed["NumberOfSeriesRelatedInstances"] for x in hits] == [2, 1]
    hits = index.search(q("instance", {}, study_uid=s1, series_uid=se1))
    assert [x.sop_uid for x in hits] == [recs[0].sop_uid, recs[1].sop_uid]
    assert index.search(q("series", {}, study_uid="1.2.3")) == []


def test_limit_offset(loaded):
    index, recs, *_ = loaded
    all_ = [h.sop_uid for h in index.search(q("instance", {}))]
    assert all_ == [r.sop_uid for r in recs]
    assert [h.sop_uid for h in index.search(q("instance", {"limit": "2", "offset": "1"}))] == all_[1:3]
    assert index.search(q("instance", {"offset": "10"})) == []


def test_delete_recomputes(loaded):
    index, recs, s1, _s2, se1 = loaded
    assert index.delete(s1, se1, recs[0].sop_uid) == [recs[0].path]
    (h,) = index.search(q("study", {"StudyInstanceUID": s1}))
    assert h.computed["NumberOfStudyRelatedInstances"] == 2
    assert sorted(index.delete(s1, None, None)) == sorted([recs[1].path, recs[2].path])
    assert index.search(q("study", {"StudyInstanceUID": s1})) == []
    assert index.search(q("series", {}, study_uid=s1)) == []
    assert index.delete(s1) == []
    assert index.count() == 1
    assert [p for _u, p in index.paths()] == [recs[3].path]


def test_counts_sum_the_instances_bytes(loaded):
    """The landing page's figures (issue 26 item 6): the archive's own bytes are the
    stored instances' sizes, kept current by add and delete."""
    from dicomweb_server.store.base import IndexCounts

    index, recs, s1, s2, se1 = loaded
    assert index.counts() == IndexCounts(2, 3, 4, sum(r.size for r in recs))
    index.delete(s1, se1)
    assert index.counts() == IndexCounts(2, 2, 2, recs[2].size + recs[3].size)
    index.delete(s2)
    index.delete(s1)
    assert index.counts() == IndexCounts(0, 0, 0, 0)


def test_refile_switches_one_row_to_another_file_if_unchanged(loaded):
    """Index.refile (policy/recompress.py): the row's file, size, syntax and pixel layout
    switch in one commit when it still names the old file; no change-log row; the counts
    follow the new size; a stale or absent row is left alone (False)."""
    index, recs, s1, _s2, se1 = loaded
    old = recs[0]
    before = index.counts().stored_bytes
    logged = len(index.changes(limit=100))
    new = dataclasses.replace(old, path=old.path[:-4] + ".recompressed.dcm", size=old.size - 100,
                              transfer_syntax_uid="1.2.840.10008.1.2.4.80",
                              pixel={**old.pixel, "frame_length": 77})
    assert index.refile(new, "elsewhere.dcm") is False  # stale: another file is indexed
    assert index.locate(old.sop_uid).path == old.path
    assert index.refile(new, old.path) is True
    loc = index.locate(old.sop_uid)
    assert (loc.path, loc.size, loc.transfer_syntax_uid, loc.pixel["frame_length"]) == \
        (new.path, old.size - 100, "1.2.840.10008.1.2.4.80", 77)
    assert (loc.study_uid, loc.series_uid) == (s1, se1)
    assert index.counts().stored_bytes == before - 100
    assert dict(index.paths())[old.sop_uid] == new.path
    assert [x.sop_uid for x in index.instances(s1)] == [r.sop_uid for r in recs[:3]]  # order kept
    assert len(index.changes(limit=100)) == logged
    assert index.refile(new, old.path) is False  # already switched
    index.delete(s1, se1, old.sop_uid)
    assert index.refile(dataclasses.replace(old), new.path) is False  # gone


def test_sqlite_counts_read_no_instance_rows(tmp_path):
    """count and sum(_size) of the instances come from the index instance_size alone (a
    table scan would read every row's JSON: gigabytes for a large archive)."""
    idx = SQLiteIndex(tmp_path / "i.sqlite")
    try:
        from dicomweb_server.store.sql import COUNTS

        plan = " ".join(str(row[-1]) for row in idx._con().execute("EXPLAIN QUERY PLAN " + COUNTS))
        assert "COVERING INDEX instance_size" in plan, plan
    finally:
        idx.close()


def test_sqlite_survives_reopen(tmp_path):
    idx = SQLiteIndex(tmp_path / "i.sqlite")
    rec = record(tmp_path)
    idx.add([rec])
    idx.close()
    idx = SQLiteIndex(tmp_path / "i.sqlite")
    assert idx.locate(rec.sop_uid).path == rec.path
    con = idx._con()
    assert con.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: a commit survives power loss
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    idx.close()


# --- case P3: the study and series records come from instances still stored -----------------


def study_hit(index, study_uid, **params):
    hits = index.search(q("study", {"StudyInstanceUID": study_uid, **params}))
    return hits[0] if hits else None


def json_value(blob: bytes, tag: str):
    element = orjson.loads(blob).get(tag)
    return element.get("Value") if element else None


def test_p3_deleted_series_leaves_nothing_visible_or_matchable(index, tmp_path):
    """CT series stored first says WRONG, MR series says RIGHT; DELETE the CT series.
    (One patient: a study of another patient's instances is refused, see below; the
    name may differ.)"""
    st, ct, mr = generate_uid(), generate_uid(), generate_uid()
    common = {"study": st, "StudyTime": "101010", "AccessionNumber": "ACC"}
    wrong = [record(tmp_path, **common, series=ct, modality="CT", StudyDescription="WRONG", PatientName="Wrong^Name",
                    PatientID="P3", SeriesDescription="CT series", StudyDate="20010101") for _ in range(2)]
    right = [record(tmp_path, **common, series=mr, modality="MR", sop_class=MR_IMAGE_STORAGE,
                    StudyDescription="RIGHT", PatientName="Right^Name", PatientID="P3",
                    SeriesDescription="MR series", StudyDate="20220202")]
    assert index.add(wrong + right) == [True] * 3
    # the earliest instance received speaks for the study (documented in docs/dicomweb.md)
    h = study_hit(index, st)
    assert json_value(h.study_json, "00081030") == ["WRONG"]
    assert study_hit(index, st, StudyDescription="RIGHT") is None

    assert sorted(index.delete(st, ct)) == sorted(r.path for r in wrong)
    h = study_hit(index, st)
    assert json_value(h.study_json, "00081030") == ["RIGHT"]
    assert json_value(h.study_json, "00100010") == [{"Alphabetic": "Right^Name"}]
    assert json_value(h.study_json, "00100020") == ["P3"]
    assert h.computed == {"ModalitiesInStudy": ["MR"], "SOPClassesInStudy": [MR_IMAGE_STORAGE],
                          "NumberOfStudyRelatedSeries": 1, "NumberOfStudyRelatedInstances": 1}
    for params in ({"StudyDescription": "WRONG"}, {"StudyDescription": "W*"}, {"PatientName": "wrong*"},
                   {"PatientName": "wrong", "fuzzymatching": "true"},
                   {"StudyDate": "20010101"}, {"StudyDate": "-20100101"}, {"ModalitiesInStudy": "CT"},
                   {"SOPClassesInStudy": CT_IMAGE_STORAGE}, {"NumberOfStudyRelatedSeries": "2"},
                   {"NumberOfStudyRelatedInstances": "3"}):
        assert study_hit(index, st, **params) is None, params
    for params in ({"StudyDescription": "RIGHT"}, {"PatientName": "right^name"}, {"PatientID": "P3"},
                   {"StudyDate": "20220202"}, {"ModalitiesInStudy": "MR"}, {"NumberOfStudyRelatedInstances": "1"}):
        assert study_hit(index, st, **params) is not None, params
    # series and instance searches see the MR record only, with the new study record
    for level in ("series", "instance"):
        hits = index.search(q(level, {"StudyInstanceUID": st}))
        assert [h.series_uid for h in hits] == [mr]
        assert json_value(hits[0].study_json, "00081030") == ["RIGHT"]
        assert index.search(q(level, {"StudyDescription": "WRONG"})) == []
        assert index.search(q(level, {"PatientName": "Wrong^Name"})) == []
    assert index.search(q("series", {"Modality": "CT"})) == []
    assert index.search(q("series", {"SeriesDescription": "CT series"})) == []


def test_p3_later_instance_with_other_study_and_series_attributes(index, tmp_path):
    st, se = generate_uid(), generate_uid()
    first = record(tmp_path, study=st, series=se, StudyDescription="FIRST", SeriesDescription="S1", SeriesNumber=1,
                   modality="CT")
    later = record(tmp_path, study=st, series=se, StudyDescription="LATER", SeriesDescription="S2", SeriesNumber=2,
                   modality="CT\\PT")
    assert index.add([first]) == [True]
    assert index.add([later]) == [True]
    h = study_hit(index, st)
    assert json_value(h.study_json, "00081030") == ["FIRST"]  # adding never changes what a study says
    assert study_hit(index, st, StudyDescription="LATER") is None
    (s,) = index.search(q("series", {}, study_uid=st))
    assert json_value(s.series_json, "0008103E") == ["S1"]
    assert index.search(q("series", {"SeriesNumber": "2"}, study_uid=st)) == []

    assert index.delete(st, se, first.sop_uid) == [first.path]
    h = study_hit(index, st, StudyDescription="LATER")
    assert json_value(h.study_json, "00081030") == ["LATER"]
    (s,) = index.search(q("series", {"SeriesNumber": "2", "SeriesDescription": "S?"}, study_uid=st))
    assert json_value(s.series_json, "0008103E") == ["S2"]
    assert s.computed["NumberOfSeriesRelatedInstances"] == 1
    # a multi-valued Modality gives each of its values to ModalitiesInStudy
    assert h.computed["ModalitiesInStudy"] == ["CT", "PT"]
    assert study_hit(index, st, ModalitiesInStudy="PT") is not None
    assert index.search(q("series", {"SeriesDescription": "S1"})) == []


def test_instances_of_a_study_come_in_arrival_order(index, tmp_path):
    st, a, b = generate_uid(), generate_uid(), generate_uid()
    recs = [record(tmp_path, study=st, series=s) for s in (a, b, a)]
    assert index.add(recs) == [True] * 3
    want = [r.sop_uid for r in recs]
    assert [h.sop_uid for h in index.search(q("instance", {}, study_uid=st))] == want
    assert [h.sop_uid for h in index.search(q("instance", {}))] == want


def test_counts_of_a_batch_over_several_studies_and_series(index, tmp_path):
    """One add of instances of two studies and three series, interleaved, with a duplicate
    and a refused record among them, then a second add into the same rows: the study and
    series counts, ModalitiesInStudy and SOPClassesInStudy are those of the instances
    indexed (the SQL indexes write each study's and series' row once per add)."""
    a, b, se1, se2, se3 = (generate_uid() for _ in range(5))
    first = [
        record(tmp_path, study=a, series=se1, modality="MR", sop_class=MR_IMAGE_STORAGE, PatientID="A"),
        record(tmp_path, study=b, series=se3, modality="CT", PatientID="B"),
        record(tmp_path, study=a, series=se2, modality="SR", sop_class=BASIC_TEXT_SR, pixels=False, PatientID="A"),
        record(tmp_path, study=b, series=se1, modality="CT", PatientID="B"),  # se1 is study a's: refused
        record(tmp_path, study=a, series=se1, modality="MR", sop_class=MR_IMAGE_STORAGE, PatientID="A"),
    ]
    got = index.add([*first, first[0]])  # and the first again: already indexed by this add
    assert got[:3] == [True, True, True] and got[4:] == [True, False]
    assert isinstance(got[3], Refused) and got[3].reason == FailureReason.DATASET_MISMATCH
    second = [record(tmp_path, study=b, series=se3, modality="CT", PatientID="B"),
              record(tmp_path, study=a, series=se2, modality="SR", sop_class=BASIC_TEXT_SR, pixels=False,
                     PatientID="A")]
    assert index.add(second) == [True, True]
    studies = {h.study_uid: h.computed for h in index.search(q("study", {}))}
    assert studies == {
        a: {"ModalitiesInStudy": ["MR", "SR"], "SOPClassesInStudy": sorted([MR_IMAGE_STORAGE, BASIC_TEXT_SR]),
            "NumberOfStudyRelatedSeries": 2, "NumberOfStudyRelatedInstances": 4},
        b: {"ModalitiesInStudy": ["CT"], "SOPClassesInStudy": [CT_IMAGE_STORAGE],
            "NumberOfStudyRelatedSeries": 1, "NumberOfStudyRelatedInstances": 2},
    }
    series = {h.series_uid: h.computed["NumberOfSeriesRelatedInstances"] for h in index.search(q("series", {}))}
    assert series == {se1: 2, se2: 2, se3: 2}
    assert [x.sop_uid for x in index.instances(a, se1)] == [first[0].sop_uid, first[4].sop_uid]
    assert index.count() == 6


# --- the hierarchy: a series belongs to one study, an instance to one series --------------


def test_series_of_another_study_is_refused(index, tmp_path):
    a, b, se = generate_uid(), generate_uid(), generate_uid()
    rec_a = record(tmp_path, study=a, series=se, PatientID="A")
    rec_b = record(tmp_path, study=b, series=se, PatientID="B")
    rec_b2 = record(tmp_path, study=b, series=se, PatientID="B")
    in_batch = index.add([rec_a, rec_b])  # refused also against a record of the same batch
    assert in_batch[0] is True
    (later,) = index.add([rec_b2])
    for res in (in_batch[1], later):
        assert isinstance(res, Refused) and not res
        assert res.reason == FailureReason.DATASET_MISMATCH == 0xA900
        assert se in res.message and a in res.message
    assert index.count() == 1
    assert [x.sop_uid for x in index.instances(a)] == [rec_a.sop_uid]
    assert index.instances(b) == [] and index.metadata(b) == []
    assert index.search(q("study", {"PatientID": "B"})) == []
    (h,) = index.search(q("study", {"StudyInstanceUID": a}))
    assert h.computed["NumberOfStudyRelatedInstances"] == 1


def test_sop_instance_of_another_series_is_refused(index, tmp_path):
    sop, st = generate_uid(), generate_uid()
    first = record(tmp_path, study=st, sop=sop)
    other_series = record(tmp_path, study=st, sop=sop)
    other_study = record(tmp_path, sop=sop)
    assert index.add([first]) == [True]
    assert index.add([first]) == [False]  # same place: already indexed, not a conflict
    for rec in (other_series, other_study):
        (res,) = index.add([rec])
        assert isinstance(res, Refused) and res.reason == FailureReason.DUPLICATE_SOP_INSTANCE == 0x0111
        assert first.series_uid in res.message
    assert index.locate(sop).path == first.path
    assert index.count() == 1


# --- a study belongs to one patient: Patient ID within its Issuer (dicom/patient.py) -------


def test_study_of_another_patient_is_refused(index, tmp_path):
    st, other = generate_uid(), generate_uid()
    first = record(tmp_path, study=st, PatientID="PID-1", IssuerOfPatientID="HOSP-A", PatientName="Doe^John")
    same = [  # one patient: a corrected name, another series, the issuer's padding
        record(tmp_path, study=st, series=first.series_uid, PatientID="PID-1", IssuerOfPatientID="HOSP-A",
               PatientName="Doe^Jon"),
        record(tmp_path, study=st, PatientID=" PID-1 ", IssuerOfPatientID="HOSP-A "),
    ]
    others = [  # another ID, the same ID from another issuer or from none, a case change
        record(tmp_path, study=st, series=first.series_uid, PatientID="PID-2", IssuerOfPatientID="HOSP-A"),
        record(tmp_path, study=st, PatientID="PID-1", IssuerOfPatientID="HOSP-B"),
        record(tmp_path, study=st, PatientID="PID-1"),
        record(tmp_path, study=st, PatientID="pid-1", IssuerOfPatientID="HOSP-A"),
    ]
    in_batch = index.add([first, others[0], *same])  # refused also against a record of the same batch
    assert in_batch[0] is True and in_batch[2:] == [True, True]
    later = index.add(others[1:])
    for res, rec in zip([in_batch[1], *later], others):
        assert isinstance(res, Refused) and not res
        assert res.reason == FailureReason.DATASET_MISMATCH == 0xA900
        assert res.message == (f"Study {st} belongs to patient 'PID-1' (issuer 'HOSP-A'), not to this "
                               f"instance's patient {rec.patient}")
    assert "'PID-1' (no issuer)" in later[1].message
    assert index.add([first, same[0]]) == [False, False]  # the same instances again: already indexed
    assert [x.sop_uid for x in index.instances(st)] == [first.sop_uid, same[0].sop_uid, same[1].sop_uid]
    assert index.count() == 3
    for rec in others:
        assert index.locate(rec.sop_uid) is None
    (h,) = index.search(q("study", {"StudyInstanceUID": st}))
    assert h.computed["NumberOfStudyRelatedInstances"] == 3
    assert index.search(q("study", {"PatientID": "PID-2"})) == []
    # another study of another patient is no conflict
    assert index.add([record(tmp_path, study=other, PatientID="PID-2")]) == [True]
    # the study's patient stays what its record says after the first instance is deleted;
    # once the study is gone, its UID is free again
    assert index.delete(st, first.series_uid, first.sop_uid) == [first.path]
    (res,) = index.add([others[0]])
    assert isinstance(res, Refused) and "belongs to patient 'PID-1'" in res.message
    index.delete(st)
    assert index.add([others[0]]) == [True]


def test_empty_and_absent_issuer_are_one_patient(index, tmp_path):
    st = generate_uid()
    absent = record(tmp_path, study=st, PatientID="PID-9")
    empty = record(tmp_path, study=st, PatientID="PID-9", IssuerOfPatientID="")
    assert "00100021" not in orjson.loads(absent.metadata) and "00100021" in orjson.loads(empty.metadata)
    assert index.add([absent, empty]) == [True, True]
    no_id = [record(tmp_path, study=generate_uid(), PatientID="") for _ in range(2)]
    assert index.add(no_id) == [True, True]  # an empty Patient ID is a value like another
    (res,) = index.add([record(tmp_path, study=no_id[0].study_uid, PatientID="PID-9")])
    assert isinstance(res, Refused) and "patient '' (no issuer)" in res.message


def test_sqlite_cannot_hold_an_instance_under_another_study(tmp_path):
    idx = SQLiteIndex(tmp_path / "i.sqlite")
    a, se = generate_uid(), generate_uid()
    assert idx.add([record(tmp_path, study=a, series=se)]) == [True]
    stray = record(tmp_path, study=generate_uid(), series=se)
    con = idx._con()
    (series_pk,) = con.execute("SELECT pk FROM series").fetchone()
    with pytest.raises(sqlite3.IntegrityError, match="another series or study"):
        con.execute("INSERT INTO instance (series_pk, SOPInstanceUID, _transfer_syntax, _path, _size, _metadata) "
                    "VALUES (?, ?, '', ?, 0, x'')", (series_pk, stray.sop_uid, stray.path))
    with pytest.raises(sqlite3.IntegrityError, match="cannot move"):
        con.execute("UPDATE series SET study_pk = study_pk + 1")
    idx.close()


def race(writers: list[GroupCommitter], recs: list, directory: Path) -> list:
    """Commit recs[i] through writers[i], all released at the same moment."""
    barrier = threading.Barrier(len(writers))
    results: list = [None] * len(writers)

    def store(i):
        barrier.wait()
        results[i] = writers[i].commit([recs[i]], {directory})[0]

    threads = [threading.Thread(target=store, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def conflicting(tmp_path, conflict: str) -> list:
    """Two records of which only one can be stored: one series in two studies, or one
    study for two patients."""
    if conflict == "series":
        se = generate_uid()
        return [record(tmp_path, study=generate_uid(), series=se) for _ in range(2)]
    st = generate_uid()
    return [record(tmp_path, study=st, PatientID=pid, IssuerOfPatientID="HOSP") for pid in ("PA", "PB")]


def only_the_winner_is_stored(index, recs: list, winner) -> None:
    """The winner's study holds what it stored, the loser left nothing."""
    loser = next(r for r in recs if r is not winner)
    assert index.locate(loser.sop_uid) is None and index.count() == 1
    assert [x.sop_uid for x in index.instances(winner.study_uid)] == [winner.sop_uid]
    (h,) = index.search(q("series", {"SeriesInstanceUID": winner.series_uid}))
    assert h.study_uid == winner.study_uid
    assert json_value(h.study_json, "00100020") == [winner.patient.patient_id]


@pytest.mark.parametrize("conflict", ["series", "patient"])
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
def test_two_concurrent_stores_cannot_both_win(kind, conflict, tmp_path, request):
    """Two writers (for SQLite: two index connections with their own group committers,
    as two worker processes have; for PostgreSQL: two nodes, each with its own pool
    and its own lock file, so no flock serialises them) store at the same moment
    instances of two studies reusing one series, or of one study for two patients:
    exactly one gets in."""
    for n_round in range(5):
        recs = conflicting(tmp_path, conflict)
        if kind == "memory":
            writers = [GroupCommitter(MemoryIndex(), tmp_path / "index.lock")] * 2
        elif kind == "sqlite":
            path = tmp_path / f"{n_round}.sqlite"
            writers = [GroupCommitter(SQLiteIndex(path), tmp_path / "index.lock") for _ in range(2)]
        else:
            url = request.getfixturevalue("postgres").fresh_url()
            writers = [GroupCommitter(PostgreSQLIndex(url), tmp_path / f"node{n}.lock") for n in range(2)]
        results = race(writers, recs, tmp_path)
        assert sum(r is True for r in results) == 1, results
        assert sum(isinstance(r, Refused) and r.reason == 0xA900 for r in results) == 1, results
        winner = recs[results.index(True)]
        for w in writers:
            only_the_winner_is_stored(w.index, recs, winner)
        for w in writers:
            w.index.close()


def _commit_in_process(db: Path, lock: Path, rec, barrier, out) -> None:
    index = SQLiteIndex(db)
    committer = GroupCommitter(index, lock)
    barrier.wait()
    res = committer.commit([rec], {db.parent})[0]
    out.put((rec.sop_uid, res if isinstance(res, bool) else int(res.reason)))
    index.close()


@pytest.mark.parametrize("conflict", ["series", "patient"])
def test_two_worker_processes_cannot_both_win(conflict, tmp_path):
    """As two uvicorn workers do: separate processes, one SQLite file, one lock file."""
    ctx = multiprocessing.get_context("fork")
    for n_round in range(4):
        db, lock = tmp_path / f"{n_round}.sqlite", tmp_path / "index.lock"
        SQLiteIndex(db).close()
        recs = conflicting(tmp_path, conflict)
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_commit_in_process, args=(db, lock, r, barrier, out)) for r in recs]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert sorted(results.values(), key=str) == [0xA900, True], results
        winner = next(r for r in recs if results[r.sop_uid] is True)
        idx = SQLiteIndex(db)
        only_the_winner_is_stored(idx, recs, winner)
        idx.close()


# --- sequence matching (PS3.4 C.2.2.2.6) -----------------------------------------------------


def _items(*items: dict) -> list:
    from pydicom.dataset import Dataset

    out = []
    for kw in items:
        ds = Dataset()
        for k, v in kw.items():
            setattr(ds, k, v)
        out.append(ds)
    return out


@pytest.fixture
def with_sequences(index, tmp_path):
    s1, s2, se1, se2, se3 = (generate_uid() for _ in range(5))
    ref = generate_uid()
    recs = [
        record(tmp_path, study=s1, series=se1, ProcedureCodeSequence=_items(
                   {"CodeValue": "CTCHEST", "CodingSchemeDesignator": "LOCAL", "CodeMeaning": "CT chest"}),
               ReferencedStudySequence=_items({"ReferencedSOPClassUID": "1.2.840.10008.3.1.2.3.1",
                                               "ReferencedSOPInstanceUID": ref}),
               RequestAttributesSequence=_items({"RequestedProcedureID": "XYZ", "ScheduledProcedureStepID": "S1"},
                                                {"RequestedProcedureID": "ABC", "ScheduledProcedureStepID": "S2"})),
        record(tmp_path, study=s1, series=se1, RequestAttributesSequence=_items({"RequestedProcedureID": "QQQ"}),
               ReferencedImageSequence=_items({"ReferencedSOPClassUID": CT_IMAGE_STORAGE,
                                               "ReferencedSOPInstanceUID": "1.2.3.4"})),
        record(tmp_path, study=s1, series=se2, RequestAttributesSequence=_items({"RequestedProcedureID": "XYZ2"})),
        record(tmp_path, study=s2, series=se3, PatientID="B"),
    ]
    assert index.add(recs) == [True] * 4
    return index, recs, ref


@pytest.mark.parametrize("level, params, want", [
    ("series", {"RequestAttributesSequence.RequestedProcedureID": "XYZ"}, {0}),
    ("series", {"00400275.00401001": "XY*"}, {0, 2}),
    # keys of one request item must hold in one stored item (XYZ and S2 are in two items)
    ("series", {"RequestAttributesSequence.RequestedProcedureID": "XYZ",
                "RequestAttributesSequence.ScheduledProcedureStepID": "S2"}, set()),
    ("series", {"RequestAttributesSequence.RequestedProcedureID": "XYZ",
                "RequestAttributesSequence.ScheduledProcedureStepID": "S1"}, {0}),
    ("series", {"RequestAttributesSequence.RequestedProcedureID": "QQQ"}, set()),  # not the series' record
    ("series", {"RequestAttributesSequence": ""}, {0, 2, 3}),  # universal: every series
    ("series", {"RequestAttributesSequence.RequestedProcedureID": ""}, {0, 2, 3}),
    ("instance", {"RequestAttributesSequence.ScheduledProcedureStepID": "S2"}, {0, 1}),
    ("study", {"ProcedureCodeSequence.CodeValue": "CTCHEST", "ProcedureCodeSequence.CodingSchemeDesignator": "LOCAL"},
     {0}),
    ("study", {"ProcedureCodeSequence.CodeMeaning": "CT*", "PatientID": "B"}, set()),
    ("series", {"ProcedureCodeSequence.CodeMeaning": "*chest", "Modality": "CT"}, {0, 2}),
    ("instance", {"ReferencedImageSequence.ReferencedSOPInstanceUID": "1.2.3.4"}, {1}),  # an instance-level sequence
    ("instance", {"ReferencedImageSequence.ReferencedSOPInstanceUID": "1.2.3.4,1.2.3.5",
                  "RequestAttributesSequence.RequestedProcedureID": "XYZ"}, {1}),
])
def test_sequence_matching(with_sequences, level, params, want):
    index, recs, _ = with_sequences
    key = {"study": lambda r: r.study_uid, "series": lambda r: r.series_uid, "instance": lambda r: r.sop_uid}[level]
    got = [{"study": h.study_uid, "series": h.series_uid, "instance": h.sop_uid}[level]
           for h in index.search(q(level, params))]
    assert got == list(dict.fromkeys(key(recs[i]) for i in sorted(want)))


def test_sequence_uid_list_matching(with_sequences):
    index, recs, ref = with_sequences
    hits = index.search(q("study", {"ReferencedStudySequence.ReferencedSOPInstanceUID": f"1.2.3,{ref}"}))
    assert [h.study_uid for h in hits] == [recs[0].study_uid]
    assert index.search(q("study", {"00081110.00081155": "1.2.3"})) == []


def test_sequence_matching_follows_the_record_after_a_delete(with_sequences):
    """The series record is that of its earliest instance still stored: deleting it makes
    the next one's items the series' (QQQ), and the deleted items match nothing."""
    index, recs, _ = with_sequences
    index.delete(recs[0].study_uid, recs[0].series_uid, recs[0].sop_uid)
    assert index.search(q("series", {"RequestAttributesSequence.RequestedProcedureID": "XYZ"})) == []
    hits = index.search(q("series", {"RequestAttributesSequence.RequestedProcedureID": "QQQ"}))
    assert [h.series_uid for h in hits] == [recs[0].series_uid]
    hits = index.search(q("instance", {"ReferencedImageSequence.ReferencedSOPInstanceUID": "1.2.3.4"}))
    assert [h.sop_uid for h in hits] == [recs[1].sop_uid]
    index.delete(recs[0].study_uid, recs[0].series_uid, recs[1].sop_uid)
    assert index.search(q("instance", {"ReferencedImageSequence.ReferencedSOPInstanceUID": "1.2.3.4"})) == []
    index.delete(recs[0].study_uid)
    assert index.search(q("series", {"RequestAttributesSequence.RequestedProcedureID": "?*"})) == []
    assert index.search(q("study", {"ProcedureCodeSequence.CodeValue": "CTCHEST"})) == []


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_an_index_without_sequence_items_is_migrated(kind, request, tmp_path):
    """An index made before sequence matching (no sequence_item table) and time-zone matching
    (no derived date-time columns) gets them, for its rows, when opened (SQLite: on open;
    PostgreSQL: schema versions 4 and 5)."""
    idx = open_index(kind, request, tmp_path)
    s1 = generate_uid()
    recs = [record(tmp_path, study=s1, ProcedureCodeSequence=_items({"CodeValue": "C1"}),
                   RequestAttributesSequence=_items({"RequestedProcedureID": "R1"}), StudyDate="20200102",
                   StudyTime="003000", TimezoneOffsetFromUTC="+0100", AcquisitionDateTime="20200101120000-0500"),
            record(tmp_path, study=s1, RequestAttributesSequence=_items({"RequestedProcedureID": "R2"}),
                   ReferencedImageSequence=_items({"ReferencedSOPInstanceUID": "1.2.3.4"}))]
    assert idx.add(recs) == [True, True]
    idx.close()
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "index.sqlite") as con:
            con.execute("DROP TABLE sequence_item")
            _drop_derived(con)
    else:
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as con:
            con.execute("DROP TABLE sequence_item")
            _drop_derived(con)
            con.execute("DELETE FROM schema_version WHERE version >= 6")
    idx = open_index(kind, request, tmp_path)
    try:
        assert [h.series_uid for h in idx.search(q("series", {"RequestAttributesSequence.RequestedProcedureID":
                                                              "R*"}))] == [recs[0].series_uid, recs[1].series_uid]
        assert [h.study_uid for h in idx.search(q("study", {"ProcedureCodeSequence.CodeValue": "C1"}))] == [s1]
        assert [h.sop_uid for h in idx.search(q("instance", {"00081140.00081155": "1.2.3.4"}))] == [recs[1].sop_uid]
        assert [h.study_uid for h in idx.search(q("study", {"StudyDate": "20200101-", "StudyTime": "2300-",
                                                            "TimezoneOffsetFromUTC": "+0000"}))] == [s1]
        assert [h.sop_uid for h in idx.search(q("instance", {"AcquisitionDateTime": "20200101170000+0000"}))] \
            == [recs[0].sop_uid]
        assert [h.study_uid for h in idx.search(q("study", {"StudyDate": "20200101-20200102",
                                                            "StudyTime": "2300-0100"}))] == [s1]
    finally:
        idx.close()


def _drop_derived(con) -> None:
    """What an index made before the derived date-time columns lacks."""
    from dicomweb_server.store.sql import derived_columns

    con.execute("DROP INDEX study_datetime")
    con.execute("DROP INDEX study_datetime_utc")
    for level, attributes in derived_columns().items():
        for a in attributes:
            con.execute(f"ALTER TABLE {level} DROP COLUMN {a.keyword}")


# --- combined date-time and time-zone matching (PS3.4 C.2.2.2.5.1, C.4.1.1.3.1) ---------------


@pytest.fixture
def timed(index, tmp_path):
    recs = [
        record(tmp_path, PatientID="T", StudyDate="20200101", StudyTime="230000"),  # no offset: as stored
        record(tmp_path, PatientID="T", StudyDate="20200102", StudyTime="010000"),
        record(tmp_path, PatientID="T", StudyDate="20200102", StudyTime="120000"),
        record(tmp_path, PatientID="T", StudyDate="20200102", StudyTime="003000", TimezoneOffsetFromUTC="+0100"),
        record(tmp_path, PatientID="T", StudyDate="20200103", AcquisitionDateTime="20200101120000-0500",
               TimezoneOffsetFromUTC="+0900"),  # the DT's own offset wins: 17:00 UTC
    ]
    assert index.add(recs) == [True] * 5
    return index, recs


@pytest.mark.parametrize("level, params, want", [
    # across midnight: 2020-01-01 22:00 to 2020-01-02 02:00, not "22:00 to 02:00 of either day"
    ("study", {"StudyDate": "20200101-20200102", "StudyTime": "2200-0200"}, {0, 1, 3}),
    ("study", {"StudyDate": "20200102-", "StudyTime": "0100-"}, {1, 2, 4}),  # a date without time: 00:00
    ("study", {"StudyDate": "20200101"}, {0}),  # no offset in the query: the values as stored
    # the day 2020-01-01 at -0100 is 01:00 UTC that day to 00:59:59 UTC the next
    ("study", {"StudyDate": "20200101", "TimezoneOffsetFromUTC": "-0100"}, {0, 3}),
    ("study", {"StudyDate": "20200101", "StudyTime": "2300-2359", "TimezoneOffsetFromUTC": "+0000"}, {0, 3}),
    ("study", {"StudyDate": "20200102", "StudyTime": "0000-0100", "00080201": "+0100"}, {0, 3}),
    ("instance", {"AcquisitionDateTime": "20200101170000+0000"}, {4}),
    ("instance", {"AcquisitionDateTime": "20200101180000", "TimezoneOffsetFromUTC": "+0100"}, {4}),
    ("instance", {"AcquisitionDateTime": "20200101170000"}, set()),  # no offset: as stored (12:00)
    ("instance", {"AcquisitionDateTime": "20200101120000"}, {4}),
    ("instance", {"AcquisitionDateTime": "20200101110000-0600-20200101113000-0600"}, {4}),
])
def test_date_time_ranges_across_midnight_and_offsets(timed, level, params, want):
    index, recs = timed
    key = {"study": lambda r: r.study_uid, "instance": lambda r: r.sop_uid}[level]
    got = [h.study_uid if level == "study" else h.sop_uid
           for h in index.search(q(level, {**params, "PatientID": "T"}))]
    assert got == [key(recs[i]) for i in sorted(want)]


def test_worklist_entries(index):
    """The worklist table (store/worklist.py): put (replacing by Scheduled Procedure Step ID),
    the SQL prefilter passing entries whose column has no single value, get, delete."""
    from dicomweb_server.dicom import worklist as W

    def entry(sps_id, stations, date, pid):
        return W.prepare({"00100020": {"vr": "LO", "Value": [pid]}, "00400100": {"vr": "SQ", "Value": [{
            "00400009": {"vr": "SH", "Value": [sps_id]}, "00400001": {"vr": "AE", "Value": stations},
            "00400002": {"vr": "DA", "Value": [date]}}]}})

    index.put_worklist([entry("S1", ["CT1"], "20260105", "P1"), entry("S2", ["CT1", "CT2"], "20260107", "P2"),
                        entry("S3", ["MR1"], "20260201", "P3")])
    ids = lambda rows: [r["00400100"]["Value"][0]["00400009"]["Value"][0] for r in rows]  # noqa: E731
    assert ids(index.worklist({})) == ["S1", "S2", "S3"]
    # S2 has two station AE titles (no column value): it passes the prefilter, the caller matches it
    assert ids(index.worklist({"ScheduledStationAETitle": ("eq", "CT2")})) == ["S2"]
    assert ids(index.worklist({"ScheduledStationAETitle": ("eq", "CT1"),
                               "StartDate": ("range", "20260106", None)})) == ["S2"]
    assert ids(index.worklist({"PatientID": ("eq", "P3")})) == ["S3"]
    index.put_worklist([entry("S1", ["CT1"], "20260301", "P1")])  # replaces
    assert ids(index.worklist({"StartDate": ("range", None, "20260131")})) == ["S2"]
    assert index.worklist_entry("S1")["00400100"]["Value"][0]["00400002"]["Value"] == ["20260301"]
    assert index.delete_worklist("S1") is True and index.delete_worklist("S1") is False
    assert index.worklist_entry("S1") is None
    assert ids(index.worklist({})) == ["S2", "S3"]

"""One contract for every Index implementation (store/base.py): the in-memory and
SQLite indexes must give the same answers to the same calls."""

from __future__ import annotations

import orjson
import pytest
from pydicom.uid import generate_uid

from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.helpers import BASIC_TEXT_SR, make_dataset


@pytest.fixture(params=["memory", "sqlite"])
def index(request, tmp_path):
    idx = MemoryIndex() if request.param == "memory" else SQLiteIndex(tmp_path / "index.sqlite")
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

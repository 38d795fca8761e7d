"""Study labels and the access filter, on every index (memory, SQLite, PostgreSQL): the
filter is applied in the query, so a search's results, counts and paging, a retrieve's
instances, a metadata answer and a look-up see only the allowed studies."""

from __future__ import annotations

import pytest
from pydicom.uid import generate_uid

from dicomweb_server.access.filter import UNRESTRICTED, Filter, only, validate_label
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.sql import compile_search
from dicomweb_server.store.sql import SQLITE
from tests.store.test_index_contract import index, open_index, record  # noqa: F401 - the parametrised fixture

A, B = only({"a"}), only({"b"})


def q(level, params=None, **kw):
    return parse_query(level, list((params or {}).items()), **kw)


@pytest.fixture
def two(index, tmp_path):  # noqa: F811
    """Study a (label a: 3 instances in 2 series), study b (label b: 2 instances), study n (none)."""
    sa, sb, sn, sea = generate_uid(), generate_uid(), generate_uid(), generate_uid()
    recs = [record(tmp_path, study=sa, series=sea, PatientID="P1", InstanceNumber=1),
            record(tmp_path, study=sb, PatientID="P2", InstanceNumber=1),
            record(tmp_path, study=sa, series=sea, PatientID="P1", InstanceNumber=2),
            record(tmp_path, study=sb, PatientID="P2", InstanceNumber=2),
            record(tmp_path, study=sa, PatientID="P1", modality="MR"),
            record(tmp_path, study=sn, PatientID="P3")]
    assert all(index.add(recs))
    assert index.set_label(sa, "a") is True
    assert index.set_label(sb, "b") is True
    return index, recs, sa, sb, sn


def test_label_names_are_validated():
    assert validate_label("trial-42.v2_x") == "trial-42.v2_x"
    for bad in ("", "Cardio", "-x", "a b", "x" * 65, "é"):
        with pytest.raises(ValueError):
            validate_label(bad)


def test_labels_put_list_remove(two):
    index, _recs, sa, sb, sn = two
    assert index.set_label(sa, "a") is False  # already there: nothing changed
    assert index.set_label(sa, "shared") is True
    assert index.labels(sa) == ["a", "shared"]
    assert index.labels(sn) == []
    assert index.labels("1.2.3") is None
    assert index.set_label("1.2.3", "a") is None
    assert index.all_labels() == {"a": 1, "b": 1, "shared": 1}
    assert index.all_labels(B) == {"b": 1}
    assert index.set_label(sa, "shared", present=False) is True
    assert index.set_label(sa, "shared", present=False) is False
    assert index.labels(sa) == ["a"]
    # a study not allowed is a study that does not exist, to label reads and writes too
    assert index.labels(sa, B) is None
    assert index.set_label(sa, "b", allowed=B) is None
    assert index.labels(sa) == ["a"]


def test_search_sees_only_allowed_studies(two):
    index, recs, sa, sb, sn = two
    assert [h.study_uid for h in index.search(q("study"))] == [sa, sb, sn]
    assert [h.study_uid for h in index.search(q("study"), A)] == [sa]
    assert [h.study_uid for h in index.search(q("study"), B)] == [sb]
    assert [h.study_uid for h in index.search(q("study"), only({"a", "b"}))] == [sa, sb]
    assert index.search(q("study"), only(set())) == []
    assert index.search(q("study"), A.narrow({"b"})) == []  # both clauses must hold
    # series and instance levels, all studies or one
    assert {h.study_uid for h in index.search(q("series"), B)} == {sb}
    assert [h.sop_uid for h in index.search(q("instance"), B)] == [recs[1].sop_uid, recs[3].sop_uid]
    assert index.search(q("instance", study_uid=sa), B) == []
    assert index.search(q("series", study_uid=sb), A) == []
    # paging counts allowed matches only: the offset skips allowed instances, the limit cuts them
    page = index.search(q("instance", {"limit": "1", "offset": "1"}), B)
    assert [h.sop_uid for h in page] == [recs[3].sop_uid]
    assert index.search(q("instance", {"offset": "2"}), B) == []
    # the computed attributes of an allowed study are its own (nothing of another study in them)
    hit = index.search(q("study"), A)[0]
    assert hit.computed["NumberOfStudyRelatedInstances"] == 3
    assert hit.computed["NumberOfStudyRelatedSeries"] == 2


def test_reads_of_a_study_not_allowed_find_nothing(two):
    index, recs, sa, sb, _sn = two
    assert [i.sop_uid for i in index.instances(sb, allowed=B)] == [recs[1].sop_uid, recs[3].sop_uid]
    assert index.instances(sb, allowed=A) == []
    assert index.instances(sb, recs[1].series_uid, allowed=A) == []
    assert len(index.metadata(sb, allowed=B)) == 2
    assert index.metadata(sb, allowed=A) == []
    assert index.metadata(sb, recs[1].series_uid, recs[1].sop_uid, allowed=A) == []
    assert index.locate(recs[1].sop_uid, A) is None
    assert index.locate(recs[1].sop_uid, B).study_uid == sb
    assert index.locate(recs[1].sop_uid).study_uid == sb


def test_delete_of_the_study_drops_its_labels(two, tmp_path):
    index, recs, sa, _sb, _sn = two
    index.delete(sa, recs[4].series_uid)  # part of the study: the labels stay
    assert index.labels(sa) == ["a"]
    index.delete(sa)
    assert index.labels(sa) is None
    # the same study stored again starts without labels
    assert index.add([record(tmp_path, study=sa, PatientID="P1")]) == [True]
    assert index.labels(sa) == []
    assert index.search(q("study"), A) == []


def test_an_unrestricted_filter_adds_nothing_to_the_query():
    plain = compile_search(SQLITE, q("study", {"PatientID": "X"}))
    assert compile_search(SQLITE, q("study", {"PatientID": "X"}), UNRESTRICTED) == plain
    assert "study_label" not in plain[0]
    sql, params = compile_search(SQLITE, q("study", {"PatientID": "X"}), Filter((frozenset({"b", "a"}),)))
    # (the study row's copy of its labels: tests/access/test_label_column.py)
    assert "(instr(s.labels, ?) > 0 OR instr(s.labels, ?) > 0)" in sql and params[:3] == ["X", "\\a\\", "\\b\\"]


def test_memory_labels_survive_a_restart(tmp_path):
    journal = tmp_path / "outbox.sqlite"
    idx = MemoryIndex(journal)
    rec = record(tmp_path, PatientID="P")
    idx.add([rec])
    idx.set_label(rec.study_uid, "cardio")
    idx.close()
    again = MemoryIndex(journal)  # (the archive re-adds every file at start-up)
    again.add([rec])
    assert again.labels(rec.study_uid) == ["cardio"]
    assert [h.study_uid for h in again.search(q("study"), only({"cardio"}))] == [rec.study_uid]
    again.close()


def test_label_changes_are_in_the_change_log(two):
    index, recs, sa, sb, _sn = two
    before = index.latest_change().sequence
    index.set_label(sb, "x")
    index.set_label(sb, "x")  # nothing changed: nothing logged
    index.set_label(sb, "x", present=False)
    rows = index.changes(after=before, limit=100)
    assert [(c.action, c.state, c.version, c.study_uid, c.sop_uid) for c in rows] == \
        [("label", "current", 1, sb, recs[1].sop_uid), ("label", "current", 1, sb, recs[3].sop_uid)] * 2
    # the instance's life goes on: a delete after labels marks every row deleted, once
    index.delete(sb)
    assert [c.action for c in index.history(recs[1].sop_uid)] == ["create", "label", "label", "label", "delete"]
    assert {c.state for c in index.history(recs[1].sop_uid)} == {"deleted"}


def test_counts_of_the_allowed_studies(two):
    index, recs, sa, sb, _sn = two
    assert index.counts().instances == 6
    a, b = index.counts(A), index.counts(B)
    assert (a.studies, a.series, a.instances, a.stored_bytes) == (1, 2, 3, sum(r.size for r in recs[0::2][:3]))
    assert (b.studies, b.series, b.instances, b.stored_bytes) == (1, 2, 2, recs[1].size + recs[3].size)
    assert index.counts(only(set())) == type(a)(0, 0, 0, 0)

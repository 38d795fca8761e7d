"""The copy of each study's labels on its row (``study.labels``, store/labels.py), on
SQLite and PostgreSQL: after every path that changes labels or (re)creates a study row,
the column holds exactly the study's study_label rows, kept by the database's triggers;
an index made before the column gets it filled from study_label when it is opened
(SQLite) or migrated (PostgreSQL schema version 16); the filter reads the column."""

from __future__ import annotations

import sqlite3

import pytest
from pydicom.uid import generate_uid

from dicomweb_server.access.filter import Filter, only
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.store import labels as study_labels
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sql import POSTGRESQL, SQLITE, compile_search
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.store.test_index_contract import open_index, record


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_index(request, tmp_path):
    idx = open_index(request.param, request, tmp_path)
    yield idx
    idx.close()


def columns(index) -> dict[str, str]:
    """StudyInstanceUID -> study.labels, of every study row."""
    return dict(index._rows("SELECT StudyInstanceUID, labels FROM study"))


def kept(index) -> dict[str, str]:
    """What the column must hold for every study row: its study_label rows as ``\\a\\b\\``."""
    out = {uid: "" for uid in columns(index)}
    for uid, label in sorted(index._rows("SELECT StudyInstanceUID, label FROM study_label"), key=lambda r: r[1]):
        if uid in out:
            out[uid] = (out[uid] or "\\") + label + "\\"
    return out


def same(index) -> dict[str, list[str]]:
    """The column equals the study_label rows (as sets: a trigger appends, a backfill sorts);
    returns study -> labels from the column."""
    got = {uid: sorted(x for x in v.split("\\") if x) for uid, v in columns(index).items()}
    want = {uid: sorted(x for x in v.split("\\") if x) for uid, v in kept(index).items()}
    assert got == want
    for v in columns(index).values():  # the form instr/strpos rely on
        assert v == "" or (v.startswith("\\") and v.endswith("\\") and "\\\\" not in v)
    return got


def study_q():
    return parse_query("study", [])


def test_set_label_put_and_delete_keep_the_column(sql_index, tmp_path):
    index = sql_index
    sa, sb = generate_uid(), generate_uid()
    assert all(index.add([record(tmp_path, study=sa, PatientID="P1"), record(tmp_path, study=sb, PatientID="P2")]))
    assert same(index) == {sa: [], sb: []}
    for label in ("b-2", "a.1", "c_3"):
        assert index.set_label(sa, label) is True
    assert index.set_label(sa, "a.1") is False
    index.set_label(sb, "a.1")
    assert same(index) == {sa: ["a.1", "b-2", "c_3"], sb: ["a.1"]}
    assert columns(index)[sa] == "\\b-2\\a.1\\c_3\\"  # appended in order of arrival
    # a label that is a suffix or prefix of another is removed alone
    index.set_label(sa, "a")
    index.set_label(sa, "a.1", present=False)
    assert same(index) == {sa: ["a", "b-2", "c_3"], sb: ["a.1"]}
    for label in ("a", "b-2", "c_3"):
        index.set_label(sa, label, present=False)
    assert columns(index) == {sa: "", sb: "\\a.1\\"}
    # the filter reads the column: the same answers as the labels say
    assert [h.study_uid for h in index.search(study_q(), only({"a.1"}))] == [sb]
    assert index.search(study_q(), only({"a"})) == []
    assert index.search(study_q(), only({"a.1"}).narrow({"x"})) == []


def test_labels_on_arrival_are_on_the_row_in_the_instances_commit(sql_index, tmp_path):
    index = sql_index
    st = generate_uid()
    first = record(tmp_path, study=st, InstanceNumber=1)
    first.labels = ("cardio", "trial-1")
    assert index.add([first]) == [True]
    assert same(index) == {st: ["cardio", "trial-1"]}
    second = record(tmp_path, study=st, InstanceNumber=2)
    second.labels = ("research", "cardio")  # into the existing study: the new one added
    assert index.add([second]) == [True]
    assert same(index) == {st: ["cardio", "research", "trial-1"]}
    assert [h.study_uid for h in index.search(study_q(), only({"research"}))] == [st]


def test_a_study_row_made_after_its_labels_takes_them(sql_index, tmp_path):
    """Delete and store again (labels dropped), reject the whole study and restore it
    (labels kept: the study row is made again), $update/$merge (Index.replace: the rows
    rewritten)."""
    index = sql_index
    st, keep = generate_uid(), generate_uid()
    a = record(tmp_path, study=st, PatientID="P1", InstanceNumber=1)
    b = record(tmp_path, study=keep, PatientID="P2")
    assert index.add([a, b]) == [True, True]
    index.set_label(st, "cardio")
    index.set_label(keep, "other")
    # DELETE of the whole study drops its labels; stored again it has none
    index.delete(st)
    assert same(index) == {keep: ["other"]}
    again = record(tmp_path, study=st, PatientID="P1")
    assert index.add([again]) == [True]
    assert same(index) == {st: [], keep: ["other"]}
    index.set_label(st, "cardio")
    index.set_label(st, "research")
    # rejection of every instance: the study row goes, its labels stay; restored, it takes them
    assert index.reject([(st, again.series_uid, again.sop_uid)], "113001^DCM", 1000.0) == 1
    assert st not in columns(index)
    assert index.labels(st) is None and index.all_labels() == {"other": 1}
    index.unreject(index.rejections(st))
    assert index.add([again], action="restore") == [True]
    assert same(index) == {st: ["cardio", "research"], keep: ["other"]}
    # $update / $merge: Index.replace deletes the study's rows and adds the new versions
    new = record(tmp_path, study=st, series=again.series_uid, sop=again.sop_uid, PatientID="P9")
    new.path = new.path.replace(".dcm", ".v2.dcm")
    index.replace([new], st)
    assert same(index) == {st: ["cardio", "research"], keep: ["other"]}
    assert [h.study_uid for h in index.search(parse_query("study", [("PatientID", "P9")]), only({"research"}))] \
        == [st]
    assert [h.study_uid for h in index.search(study_q(), only({"other"}))] == [keep]


def test_the_filter_tests_the_row_not_study_label():
    clause = Filter((frozenset({"b", "a"}),))
    for dialect, fn in ((SQLITE, "instr"), (POSTGRESQL, "strpos")):
        sql, params = compile_search(dialect, parse_query("study", [("PatientID", "X")]), clause)
        assert f"({fn}(s.labels, {dialect.placeholder}) > 0 OR {fn}(s.labels, {dialect.placeholder}) > 0)" in sql
        assert "study_label" not in sql and params[:3] == ["X", "\\a\\", "\\b\\"]
    # the change log has no such column: it keeps the look-up in study_label
    conds, params = study_labels.label_condition(clause, "changelog")
    assert conds == ["EXISTS (SELECT 1 FROM study_label l0 WHERE l0.label IN (?,?) "
                     "AND l0.StudyInstanceUID = changelog.StudyInstanceUID)"] and params == ["a", "b"]
    # a name that is no valid label (no backslash: it could not be found in the copy) keeps it too
    conds, params = study_labels.label_condition(Filter((frozenset({"a\\b"}),)), contains="instr")
    assert conds[0].startswith("EXISTS") and params == ["a\\b"]


def _labelled(index, tmp_path) -> tuple[str, str, str]:
    sa, sb, sn = generate_uid(), generate_uid(), generate_uid()
    assert all(index.add([record(tmp_path, study=u) for u in (sa, sb, sn)]))
    index.set_label(sa, "a")
    index.set_label(sa, "z")
    index.set_label(sb, "b")
    return sa, sb, sn


def test_sqlite_index_made_before_the_column_gets_it_filled(tmp_path):
    path = tmp_path / "index.sqlite"
    index = SQLiteIndex(path)
    sa, sb, sn = _labelled(index, tmp_path)
    index.close()
    # as an archive before the column left it: no column, no triggers
    con = sqlite3.connect(path)
    for name in ("study_label_added", "study_label_removed", "study_label_changed", "study_takes_labels"):
        con.execute(f"DROP TRIGGER {name}")
    con.execute("ALTER TABLE study DROP COLUMN labels")
    con.commit()
    con.close()
    index = SQLiteIndex(path)
    try:
        assert columns(index) == {sa: "\\a\\z\\", sb: "\\b\\", sn: ""}
        index.set_label(sn, "n")  # and the triggers are there
        assert same(index) == {sa: ["a", "z"], sb: ["b"], sn: ["n"]}
        assert [h.study_uid for h in index.search(study_q(), only({"z", "n"}))] == [sa, sn]
    finally:
        index.close()


def test_postgresql_schema_15_with_labels_migrates_to_16(pg_url, tmp_path):
    index = PostgreSQLIndex(pg_url)
    sa, sb, sn = _labelled(index, tmp_path)
    index.close()
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as con:  # back to version 15, as it was
        for name, table in (("study_label_added", "study_label"), ("study_label_removed", "study_label"),
                            ("study_label_changed", "study_label"), ("study_takes_labels", "study")):
            con.execute(f"DROP TRIGGER {name} ON {table}")
            con.execute(f"DROP FUNCTION {name}()")
        con.execute("ALTER TABLE study DROP COLUMN labels")
        con.execute("DELETE FROM schema_version WHERE version = 16")
    index = PostgreSQLIndex(pg_url)
    try:
        assert index._rows("SELECT max(version) FROM schema_version")[0][0] == 16
        assert columns(index) == {sa: "\\a\\z\\", sb: "\\b\\", sn: ""}
        index.set_label(sn, "n")
        assert same(index) == {sa: ["a", "z"], sb: ["b"], sn: ["n"]}
        assert [h.study_uid for h in index.search(study_q(), only({"z", "n"}))] == [sa, sn]
    finally:
        index.close()

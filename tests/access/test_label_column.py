"""The copy of each study's labels on its row (``study.labels``, store/labels.py), on
SQLite and PostgreSQL: after every path that changes labels or (re)creates a study row,
the column holds exactly the study's study_label rows, kept by the database's triggers;
an index made before the column gets it filled from study_label when it is opened
(SQLite) or migrated (PostgreSQL schema version 16); the filter reads the column."""

from __future__ import annotations

import sqlite3
import time

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
    """StudyInstanceUID -> study.labels, of every study row, as SQLite's text ``\\a\\b\\``
    (PostgreSQL's array, in its order, written so)."""
    out = {}
    for uid, v in index._rows("SELECT StudyInstanceUID, labels FROM study"):
        assert isinstance(v, list if index.dialect.name == "postgresql" else str)
        out[uid] = ("\\" + "\\".join(v) + "\\" if v else "") if isinstance(v, list) else v
    return out


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
    for v in columns(index).values():  # the form instr relies on (SQLite)
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
    sql, params = compile_search(SQLITE, parse_query("study", [("PatientID", "X")]), clause)
    assert "(instr(s.labels, ?) > 0 OR instr(s.labels, ?) > 0)" in sql
    assert "study_label" not in sql and params[:3] == ["X", "\\a\\", "\\b\\"]
    # PostgreSQL: the overlap of the row's array with the clause's (its GIN index serves a rare label)
    sql, params = compile_search(POSTGRESQL, parse_query("study", [("PatientID", "X")]), clause)
    # the labels written in (valid names only: [a-z0-9._-]), so that a prepared statement's
    # generic plan is made for them; anything else is bound, never written in
    assert "s.labels && '{a,b}'::text[]" in sql
    assert "study_label" not in sql and params[0] == "X" and "a" not in params and "b" not in params
    conds, params = study_labels.label_condition(Filter((frozenset({"a'); DROP TABLE study; --"}),)),
                                                 engine="postgresql")
    assert conds == ["s.labels && ARRAY[?]::text[]"] and params == ["a'); DROP TABLE study; --"]
    # the change log has no such column: it keeps the look-up in study_label
    conds, params = study_labels.label_condition(clause, "changelog")
    assert conds == ["EXISTS (SELECT 1 FROM study_label l0 WHERE l0.label IN (?,?) "
                     "AND l0.StudyInstanceUID = changelog.StudyInstanceUID)"] and params == ["a", "b"]
    # a name that is no valid label (no backslash: it could not be found in SQLite's text) keeps it too
    conds, params = study_labels.label_condition(Filter((frozenset({"a\\b"}),)), engine="sqlite")
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


def _back_to_15(pg_url) -> None:
    """The database as schema version 15 left it: no column, no triggers."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as con:
        for name, table in (("study_label_added", "study_label"), ("study_label_removed", "study_label"),
                            ("study_label_changed", "study_label"), ("study_takes_labels", "study")):
            con.execute(f"DROP TRIGGER {name} ON {table}")
            con.execute(f"DROP FUNCTION {name}()")
        con.execute("ALTER TABLE study DROP COLUMN labels")  # (and its index)
        con.execute("DELETE FROM schema_version WHERE version = 16")


def test_postgresql_schema_15_with_labels_migrates_to_16(pg_url, tmp_path):
    index = PostgreSQLIndex(pg_url)
    sa, sb, sn = _labelled(index, tmp_path)
    index.close()
    _back_to_15(pg_url)
    index = PostgreSQLIndex(pg_url)
    try:
        assert index._rows("SELECT max(version) FROM schema_version")[0][0] == 16
        assert columns(index) == {sa: "\\a\\z\\", sb: "\\b\\", sn: ""}
        index.set_label(sn, "n")
        assert same(index) == {sa: ["a", "z"], sb: ["b"], sn: ["n"]}
        assert [h.study_uid for h in index.search(study_q(), only({"z", "n"}))] == [sa, sn]
    finally:
        index.close()


def test_postgresql_migration_16_gives_up_on_a_held_lock(pg_url, tmp_path, monkeypatch):
    """An ALTER TABLE waiting behind a long transaction would queue every later reader of
    study behind it: migration 16 waits ``lock_timeout`` at most, then fails with a clear
    error and changes nothing; once the transaction ends it migrates."""
    import psycopg

    from dicomweb_server.store import postgresql

    index = PostgreSQLIndex(pg_url)
    sa, sb, sn = _labelled(index, tmp_path)
    index.close()
    _back_to_15(pg_url)
    monkeypatch.setattr(postgresql, "MIGRATION_LOCK_TIMEOUT", "300ms")  # (10s in production)
    with psycopg.connect(pg_url) as reader:  # a long read transaction on study
        reader.execute("SELECT count(*) FROM study").fetchone()
        t0 = time.monotonic()
        with pytest.raises(postgresql.DatabaseRefused, match="could not lock the study and study_label tables "
                                                              "within 300ms"):
            PostgreSQLIndex(pg_url)
        assert time.monotonic() - t0 < 10
        with psycopg.connect(pg_url, autocommit=True) as con:  # nothing changed
            assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == 15
            assert con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'study' "
                               "AND column_name = 'labels' AND table_schema = current_schema()").fetchone()[0] == 0
            assert con.execute("SHOW lock_timeout").fetchone()[0] == "0"
        reader.rollback()
    index = PostgreSQLIndex(pg_url)
    try:
        assert columns(index) == {sa: "\\a\\z\\", sb: "\\b\\", sn: ""}
        # SET LOCAL for the locking statements alone: the session's value after them
        assert index._rows("SELECT setting FROM pg_settings WHERE name = 'lock_timeout'")[0][0] == "0"
    finally:
        index.close()


def test_postgresql_rare_label_is_an_index_scan_common_label_a_filter(pg_url):
    """A research cohort of a few studies in a big archive: the filter's plan reads the
    GIN index on study.labels (the array's most-common-element statistics: a rare label),
    not every study row; a label on every study stays a filter on the rows the unfiltered
    plan reads (the primary key, in order, LIMIT)."""
    import psycopg

    PostgreSQLIndex(pg_url).close()
    n, cohort = 3000, [f"1.2.826.0.1.3680043.8.498.9.{k}" for k in range(7, 3000, 300)]
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("INSERT INTO study (StudyInstanceUID, _json) SELECT '1.2.826.0.1.3680043.8.498.9.' || g, "
                    "'\\x7b7d' FROM generate_series(0, %s) g", (n - 1,))
        con.execute("INSERT INTO study_label (label, StudyInstanceUID) SELECT 'site', StudyInstanceUID FROM study")
        con.execute("INSERT INTO study_label (label, StudyInstanceUID) SELECT 'cohort', unnest(%s::text[])",
                    (cohort,))
        con.execute("ANALYZE")
        con.execute("SET enable_seqscan = on")

        def plan(label: str) -> str:
            sql, params = compile_search(POSTGRESQL, parse_query("study", [("limit", "100")]), only({label}))
            got = [r[0] for r in con.execute(POSTGRESQL.sql(sql), params)]
            assert len(got) == (len(cohort) if label == "cohort" else 100)
            return "\n".join(r[0] for r in con.execute("EXPLAIN " + POSTGRESQL.sql(sql), params))

        rare = plan("cohort")
        assert "Index Scan on study_labels" in rare or "Index Cond: (labels &&" in rare, rare
        assert "Seq Scan on study" not in rare and "study_pkey" not in rare, rare
        common = plan("site")
        assert "study_labels" not in common and "Index Scan using study_pkey on study" in common, common


def test_postgresql_generic_plan_knows_the_labels(pg_url):
    """psycopg prepares a query after 5 executions and PostgreSQL may then plan it once,
    without its parameters (a generic plan). With the labels bound, that plan could not see
    which labels a clause names and guessed a label on every study rare: it read the GIN index
    of study.labels for a StudyDate range (at 100k instances 0.73 -> 1.24 ms per search,
    benchmarks/results/label_filter.md). The labels are written into the statement, so even
    the generic plan is made for them: a label on every study stays a filter on the rows the
    date index finds."""
    import psycopg

    PostgreSQLIndex(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("INSERT INTO study (StudyInstanceUID, StudyDate, _json) SELECT '1.2.826.0.1.3680043.8.498.8.' || g, "
                    "to_char(date '2000-01-01' + (g % 3650), 'YYYYMMDD'), '\\x7b7d' FROM generate_series(0, 9999) g")
        con.execute("INSERT INTO study_label (label, StudyInstanceUID) SELECT 'site', StudyInstanceUID FROM study")
        con.execute("VACUUM ANALYZE study")
        con.execute("SET plan_cache_mode = force_generic_plan")
        sql, params = compile_search(POSTGRESQL, parse_query("study", [("StudyDate", "20051201-20051231"),
                                                                       ("limit", "100")]), only({"site"}))
        n = len(params)
        text = POSTGRESQL.sql(sql)
        for k in range(n):  # %s -> $1.. (a server-side prepared statement, as psycopg makes)
            text = text.replace("%s", f"${k + 1}", 1)
        con.execute(f"PREPARE q AS {text}")
        args = ", ".join("'" + str(p).replace("'", "''") + "'" for p in params)
        plan = "\n".join(r[0] for r in con.execute(f"EXPLAIN EXECUTE q({args})"))
        assert len(con.execute(f"EXECUTE q({args})").fetchall()) == 93  # 31 days, 3 studies a day
        # (with the labels bound: a BitmapAnd of study_date and study_labels, the GIN index read
        # for all 10,000 studies: 0.8 ms against 0.11 ms)
        assert "study_labels" not in plan and "study_date" in plan, plan

"""The scale benchmark's bulk-built indexes (benchmarks/scale_rows.py) hold what
``Index.add`` would have written: for a study whose instances have real files, every
column of its study, series and instance rows equals the rows ``Index.add`` writes for
the same files, on SQLite and PostgreSQL; and the searches and look-ups of the
benchmark find it."""

from __future__ import annotations

import pytest

from benchmarks import scale_rows as sr
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sqlite import SQLiteIndex


@pytest.fixture(params=["sqlite", "postgresql"])
def built(request, tmp_path):
    rows = sr.Rows(sr.template_record(tmp_path / "template"), run=1)
    st = sr.study(7, rows.run)
    real = [sr.make_file(tmp_path / "blobs", st, k, i) for k in range(2) for i in range(5)]  # all of study 7
    rows.real.update((r.sop_uid, r) for r in real)
    if request.param == "sqlite":
        sr.load_sqlite(tmp_path / "big.sqlite", rows, 20)
        big, ref = SQLiteIndex(tmp_path / "big.sqlite"), SQLiteIndex(tmp_path / "ref.sqlite")
    else:
        sr.load_postgresql(request.getfixturevalue("pg_url"), rows, 20)
        big = PostgreSQLIndex(request.getfixturevalue("pg_url"))
        ref = PostgreSQLIndex(request.getfixturevalue("postgres").fresh_url())
    assert ref.add(real) == [True] * 10
    yield big, ref, st, real
    big.close()
    ref.close()


def _rows(index, table: str, key: str, uid: str) -> dict:
    with index._reading() as con:
        cur = con.execute(index.dialect.sql(f"SELECT * FROM {table} WHERE {key} = ?"), (uid,))
        names = [c[0].lower() for c in cur.description]
        return {n: (bytes(v) if isinstance(v, memoryview) else v)
                for n, v in zip(names, cur.fetchone()) if n not in ("pk", "study_pk", "series_pk")}


def test_bulk_rows_equal_what_index_add_writes(built):
    big, ref, st, real = built
    assert big.count() == 200
    assert _rows(big, "study", "StudyInstanceUID", st.uid) == _rows(ref, "study", "StudyInstanceUID", st.uid)
    for k in range(2):
        uid = st.series_uid(k)
        assert _rows(big, "series", "SeriesInstanceUID", uid) == _rows(ref, "series", "SeriesInstanceUID", uid)
    for r in real:
        assert _rows(big, "instance", "SOPInstanceUID", r.sop_uid) == _rows(ref, "instance", "SOPInstanceUID", r.sop_uid)
        assert big.locate(r.sop_uid) == ref.locate(r.sop_uid)
    for params in ([("PatientID", st.patient_id)], [("PatientName", st.patient_name.split("^")[0] + "*")],
                   [("StudyDate", f"{st.study_date[:6]}01-{st.study_date[:6]}31")],
                   [("ModalitiesInStudy", st.modalities[0])]):
        hits = big.search(parse_query("study", params + [("limit", "100")]))
        assert st.uid in [h.study_uid for h in hits], params

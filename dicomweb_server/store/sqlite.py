"""SQLite metadata index: WAL journal, ``synchronous=FULL`` (a commit survives
power loss), one table per query/retrieve level with a column per matching key,
computed study/series attributes kept current in the same transaction.

Safe with several worker processes: each thread of each process has its own
connection; writers serialise on ``BEGIN IMMEDIATE`` (busy timeout 30 s).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson

from ..dicom.attributes import STORED, Attribute, Kind
from ..dicom.instance import InstanceRecord, dumps
from ..dicom.matching import PN_WORD_SEPARATORS, Match, Query, fuzzy_tokens, level_record
from .base import Index, IndexCounts, InstanceLocation, Refused, SearchHit, hierarchy_conflict

_ALIAS = {"study": "s", "series": "se", "instance": "i"}
_COLTYPE = {Kind.INT: "INTEGER"}


def _cols(level: str) -> list[str]:
    return [a.keyword for a in STORED[level]]  # type: ignore[index]


def _schema() -> str:
    def coldefs(level: str, skip: str) -> str:
        return ",\n  ".join(f"{a.keyword} {_COLTYPE.get(a.kind, 'TEXT')}" for a in STORED[level] if a.keyword != skip)  # type: ignore[index]

    return f"""
CREATE TABLE IF NOT EXISTS study (
  pk INTEGER PRIMARY KEY,
  StudyInstanceUID TEXT NOT NULL UNIQUE,
  {coldefs("study", "StudyInstanceUID")},
  ModalitiesInStudy TEXT, SOPClassesInStudy TEXT,
  NumberOfStudyRelatedSeries INTEGER NOT NULL DEFAULT 0,
  NumberOfStudyRelatedInstances INTEGER NOT NULL DEFAULT 0,
  _json BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS series (
  pk INTEGER PRIMARY KEY,
  study_pk INTEGER NOT NULL REFERENCES study(pk),
  SeriesInstanceUID TEXT NOT NULL UNIQUE,
  {coldefs("series", "SeriesInstanceUID")},
  NumberOfSeriesRelatedInstances INTEGER NOT NULL DEFAULT 0,
  _json BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS instance (
  pk INTEGER PRIMARY KEY,
  series_pk INTEGER NOT NULL REFERENCES series(pk),
  SOPInstanceUID TEXT NOT NULL UNIQUE,
  {coldefs("instance", "SOPInstanceUID")},
  _transfer_syntax TEXT NOT NULL,
  _path TEXT NOT NULL,
  _size INTEGER NOT NULL,
  _pixel BLOB,
  _metadata BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS study_patient_id ON study(PatientID);
CREATE INDEX IF NOT EXISTS study_patient_name ON study(PatientName);
CREATE INDEX IF NOT EXISTS study_date ON study(StudyDate);
CREATE INDEX IF NOT EXISTS study_accession ON study(AccessionNumber);
CREATE INDEX IF NOT EXISTS series_study ON series(study_pk);
CREATE INDEX IF NOT EXISTS series_modality ON series(Modality);
CREATE INDEX IF NOT EXISTS instance_series ON instance(series_pk);
-- The hierarchy is a constraint (store/base.py hierarchy_conflict): an instance's file
-- name is study/series/sop.dcm of its own UIDs, so a row whose series belongs to
-- another study (or that names another series) cannot be written.
CREATE TRIGGER IF NOT EXISTS instance_in_own_series BEFORE INSERT ON instance
WHEN NEW._path IS NOT (SELECT s.StudyInstanceUID || '/' || se.SeriesInstanceUID || '/' || NEW.SOPInstanceUID
                       || '.dcm' FROM series se JOIN study s ON s.pk = se.study_pk WHERE se.pk = NEW.series_pk)
BEGIN SELECT RAISE(ABORT, 'instance filed under another series or study'); END;
CREATE TRIGGER IF NOT EXISTS instance_stays_in_series BEFORE UPDATE OF series_pk, _path, SOPInstanceUID ON instance
BEGIN SELECT RAISE(ABORT, 'an instance cannot move to another series or study'); END;
CREATE TRIGGER IF NOT EXISTS series_stays_in_study BEFORE UPDATE OF study_pk, SeriesInstanceUID ON series
BEGIN SELECT RAISE(ABORT, 'a series cannot move to another study'); END;
"""


def _glob_escape(text: str) -> str:
    """Escape GLOB's own metacharacters; DICOM's ``*``/``?`` keep their meaning."""
    return text.replace("[", "[[]")


def _compile(m: Match, fuzzy: bool) -> tuple[str, list]:
    a: Attribute = m.attribute
    col = f"{_ALIAS[a.level]}.{a.keyword}"
    t = m.type
    if t == "universal":
        return "", []
    if a.kind is Kind.MULTI:
        return "(" + " OR ".join(f"instr({col}, ?) > 0" for _ in m.values) + ")", [f"\\{v}\\" for v in m.values]
    if a.kind is Kind.PN and fuzzy and t in ("single", "wildcard"):
        words = col
        for sep in PN_WORD_SEPARATORS.strip():
            words = f"replace({words}, '{sep}', ' ')"
        words = f"(' ' || {words})"
        toks = fuzzy_tokens(m.values[0])
        if not toks:
            return f"{col} IS NOT NULL", []
        return "(" + " AND ".join(f"{words} GLOB ?" for _ in toks) + ")", [f"* {_glob_escape(t)}*" for t in toks]
    if t == "single":
        return f"{col} = ?", [m.values[0]]
    if t == "list":
        return f"{col} IN ({','.join('?' * len(m.values))})", list(m.values)
    if t == "wildcard":
        return f"{col} GLOB ?", [_glob_escape(m.values[0])]
    if t == "range":
        lo, hi = m.values
        parts, params = [f"substr({col}, 1, 1) BETWEEN '0' AND '9'"], []
        if lo is not None:
            parts.append(f"{col} >= ?")
            params.append(lo)
        if hi is not None:
            parts.append(f"{col} <= ?")
            params.append(hi)
        return "(" + " AND ".join(parts) + ")", params
    raise AssertionError(t)


def _modality_values(modality: str | None) -> set[str]:
    """The values of a (possibly multi-valued) Modality column."""
    return {m for m in (modality or "").split("\\") if m}


def _split_multi(v: str | None) -> list[str]:
    return [x for x in (v or "").split("\\") if x]


def _join_multi(values: set[str]) -> str | None:
    """Multi-valued columns are stored as ``\\A\\B\\`` so that ``instr`` finds ``\\A\\``."""
    return "\\" + "\\".join(sorted(values)) + "\\" if values else None


class SQLiteIndex(Index):
    """The default, embedded index (``--index sqlite``): ``data_dir/index.sqlite``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        con = self._con()
        with con:
            con.executescript(_schema())

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("PRAGMA foreign_keys=ON")
            con.execute("PRAGMA cache_size=-32000")
            self._local.con = con
            with self._lock:
                self._all.append(con)
        return con

    def close(self) -> None:
        with self._lock:
            for con in self._all:
                try:
                    con.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()

    # --- writes -----------------------------------------------------------------------

    def add(self, records: list[InstanceRecord]) -> list[bool | Refused]:
        """Insert instances and update the computed study/series attributes
        incrementally (constant work per instance, whatever the study's size).
        The hierarchy check runs inside the write transaction, so two workers
        cannot both file one series under two studies."""
        con = self._con()
        added: list[bool | Refused] = []
        scols, secols, icols = _cols("study"), _cols("series"), _cols("instance")
        con.execute("BEGIN IMMEDIATE")
        try:
            for r in records:
                old = con.execute(
                    "SELECT s.StudyInstanceUID, se.SeriesInstanceUID FROM instance i JOIN series se "
                    "ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk WHERE i.SOPInstanceUID = ?",
                    (r.sop_uid,)).fetchone()
                old_series = con.execute(
                    "SELECT s.StudyInstanceUID FROM series se JOIN study s ON s.pk = se.study_pk "
                    "WHERE se.SeriesInstanceUID = ?", (r.series_uid,)).fetchone()
                refused = hierarchy_conflict(r, tuple(old) if old else None, old_series[0] if old_series else None)
                if refused is not None or old is not None:
                    added.append(refused if refused is not None else False)
                    continue
                con.execute(
                    f"INSERT OR IGNORE INTO study ({','.join(scols)}, _json) VALUES ({','.join('?' * (len(scols) + 1))})",
                    [r.study[c] for c in scols] + [r.study_json],
                )
                study_pk, modalities, classes = con.execute(
                    "SELECT pk, ModalitiesInStudy, SOPClassesInStudy FROM study WHERE StudyInstanceUID = ?",
                    (r.study_uid,)).fetchone()
                new_series = con.execute(
                    f"INSERT OR IGNORE INTO series (study_pk, {','.join(secols)}, _json) "
                    f"VALUES (?, {','.join('?' * (len(secols) + 1))})",
                    [study_pk] + [r.series[c] for c in secols] + [r.series_json],
                ).rowcount == 1
                series_pk, modality = con.execute(
                    "SELECT pk, Modality FROM series WHERE SeriesInstanceUID = ?", (r.series_uid,)).fetchone()
                con.execute(
                    f"INSERT INTO instance (series_pk, {','.join(icols)}, _transfer_syntax, _path, _size, _pixel, _metadata) "
                    f"VALUES (?, {','.join('?' * (len(icols) + 5))})",
                    [series_pk] + [r.instance[c] for c in icols]
                    + [r.transfer_syntax_uid, r.path, r.size,
                       orjson.dumps(r.pixel) if r.pixel is not None else None, r.metadata],
                )
                con.execute("UPDATE series SET NumberOfSeriesRelatedInstances = NumberOfSeriesRelatedInstances + 1 "
                            "WHERE pk = ?", (series_pk,))
                mods = set(_split_multi(modalities)) | _modality_values(modality)
                sops = set(_split_multi(classes)) | {r.sop_class_uid}
                con.execute(
                    "UPDATE study SET NumberOfStudyRelatedInstances = NumberOfStudyRelatedInstances + 1, "
                    "NumberOfStudyRelatedSeries = NumberOfStudyRelatedSeries + ?, ModalitiesInStudy = ?, "
                    "SOPClassesInStudy = ? WHERE pk = ?",
                    (1 if new_series else 0, _join_multi(mods), _join_multi(sops),
                     study_pk),
                )
                added.append(True)
            self._run_write_hooks(con, records, added)  # routing's outbox rows: same transaction
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return added

    @staticmethod
    def _speak(con: sqlite3.Connection, level: str, pk: int, where: str) -> None:
        """Set the study/series record to what its earliest instance still stored says."""
        row = con.execute("SELECT i._metadata FROM instance i JOIN series se ON se.pk = i.series_pk "
                          f"WHERE {where} = ? ORDER BY i.pk LIMIT 1", (pk,)).fetchone()
        if row is None:
            return  # empty: the row is about to be deleted
        cols, json = level_record(orjson.loads(row[0]), level)  # type: ignore[arg-type]
        names = [c for c in _cols(level) if c not in ("StudyInstanceUID", "SeriesInstanceUID")]
        con.execute(f"UPDATE {level} SET {', '.join(f'{c} = ?' for c in names)}, _json = ? WHERE pk = ?",
                    [cols[c] for c in names] + [dumps(json), pk])

    @classmethod
    def _recompute(cls, con: sqlite3.Connection, series_pks: set[int], study_pks: set[int]) -> None:
        for pk in series_pks:
            con.execute(
                "UPDATE series SET NumberOfSeriesRelatedInstances = "
                "(SELECT count(*) FROM instance WHERE series_pk = ?) WHERE pk = ?", (pk, pk))
            cls._speak(con, "series", pk, "i.series_pk")
        for pk in study_pks:
            cls._speak(con, "study", pk, "se.study_pk")
            mods = sorted({v for (m,) in con.execute(
                "SELECT DISTINCT Modality FROM series WHERE study_pk = ? AND Modality IS NOT NULL", (pk,))
                for v in _modality_values(m)})
            classes = sorted({c for (c,) in con.execute(
                "SELECT DISTINCT i.SOPClassUID FROM instance i JOIN series se ON se.pk = i.series_pk "
                "WHERE se.study_pk = ?", (pk,))})
            con.execute(
                "UPDATE study SET ModalitiesInStudy = ?, SOPClassesInStudy = ?, "
                "NumberOfStudyRelatedSeries = (SELECT count(*) FROM series WHERE study_pk = ?), "
                "NumberOfStudyRelatedInstances = (SELECT coalesce(sum(NumberOfSeriesRelatedInstances), 0) "
                "FROM series WHERE study_pk = ?) WHERE pk = ?",
                (_join_multi(set(mods)), _join_multi(set(classes)), pk, pk, pk),
            )

    @staticmethod
    def _emptied(con: sqlite3.Connection, table: str, pks: set[int], child: str) -> set[int]:
        """Those of ``pks`` (rows of ``table``) that no ``child`` row names any more."""
        return {pk for pk in pks if con.execute(child + " LIMIT 1", (pk,)).fetchone() is None}

    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> list[str]:
        con = self._con()
        where, params = ["s.StudyInstanceUID = ?"], [study_uid]
        if series_uid is not None:
            where.append("se.SeriesInstanceUID = ?")
            params.append(series_uid)
        if sop_uid is not None:
            where.append("i.SOPInstanceUID = ?")
            params.append(sop_uid)
        con.execute("BEGIN IMMEDIATE")
        try:
            rows = con.execute(
                "SELECT i.pk, i._path, se.pk, s.pk FROM instance i JOIN series se ON se.pk = i.series_pk "
                f"JOIN study s ON s.pk = se.study_pk WHERE {' AND '.join(where)}", params).fetchall()
            con.executemany("DELETE FROM instance WHERE pk = ?", [(r[0],) for r in rows])
            series_pks = {r[2] for r in rows}
            study_pks = {r[3] for r in rows}
            # series and studies left empty are removed as they are; only those that keep
            # instances are recomputed (fewer pages written: a DELETE must also work on a
            # nearly full disk, where it is how space is freed)
            emptied = self._emptied(con, "series", series_pks, "SELECT 1 FROM instance WHERE series_pk = ?")
            con.executemany("DELETE FROM series WHERE pk = ?", [(pk,) for pk in emptied])
            self._recompute(con, series_pks - emptied, set())
            gone = self._emptied(con, "study", study_pks, "SELECT 1 FROM series WHERE study_pk = ?")
            con.executemany("DELETE FROM study WHERE pk = ?", [(pk,) for pk in gone])
            self._recompute(con, set(), study_pks - gone)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:  # SQLite may have rolled back itself (e.g. SQLITE_FULL)
                con.execute("ROLLBACK")
            raise
        return [r[1] for r in rows]

    # --- reads ------------------------------------------------------------------------

    _LOC = ("SELECT s.StudyInstanceUID, se.SeriesInstanceUID, i.SOPInstanceUID, i.SOPClassUID, "
            "i._transfer_syntax, i._path, i._size, i._pixel FROM instance i "
            "JOIN series se ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk ")

    @staticmethod
    def _loc(row: tuple) -> InstanceLocation:
        return InstanceLocation(row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                                orjson.loads(row[7]) if row[7] is not None else None)

    def locate(self, sop_uid: str) -> InstanceLocation | None:
        row = self._con().execute(self._LOC + "WHERE i.SOPInstanceUID = ?", (sop_uid,)).fetchone()
        return self._loc(row) if row else None

    def _scope(self, study_uid: str, series_uid: str | None, sop_uid: str | None = None) -> tuple[str, list]:
        where, params = ["s.StudyInstanceUID = ?"], [study_uid]
        if series_uid is not None:
            where.append("se.SeriesInstanceUID = ?")
            params.append(series_uid)
        if sop_uid is not None:
            where.append("i.SOPInstanceUID = ?")
            params.append(sop_uid)
        return "WHERE " + " AND ".join(where) + " ORDER BY se.pk, i.pk", params

    def instances(self, study_uid: str, series_uid: str | None = None) -> list[InstanceLocation]:
        where, params = self._scope(study_uid, series_uid)
        return [self._loc(r) for r in self._con().execute(self._LOC + where, params)]

    def metadata(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None) -> list[bytes]:
        where, params = self._scope(study_uid, series_uid, sop_uid)
        return [r[0] for r in self._con().execute(
            "SELECT i._metadata FROM instance i JOIN series se ON se.pk = i.series_pk "
            "JOIN study s ON s.pk = se.study_pk " + where, params)]

    def search(self, query: Query) -> list[SearchHit]:
        level = query.level
        select = ["s.StudyInstanceUID", "s._json", "s.ModalitiesInStudy", "s.SOPClassesInStudy",
                  "s.NumberOfStudyRelatedSeries", "s.NumberOfStudyRelatedInstances"]
        frm = "study s"
        order = "s.pk"
        if level in ("series", "instance"):
            select += ["se.SeriesInstanceUID", "se._json", "se.NumberOfSeriesRelatedInstances"]
            frm = "series se JOIN study s ON s.pk = se.study_pk"
            order = "se.pk"
        if level == "instance":
            select += ["i.SOPInstanceUID", "i._metadata"]
            frm = "instance i JOIN series se ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk"
            order = "i.pk"
        where: list[str] = []
        params: list = []
        if query.study_uid is not None:
            where.append("s.StudyInstanceUID = ?")
            params.append(query.study_uid)
        if query.series_uid is not None:
            where.append("se.SeriesInstanceUID = ?")
            params.append(query.series_uid)
        for m in query.matches:
            sql, p = _compile(m, query.fuzzy)
            if sql:
                where.append(sql)
                params += p
        sql = f"SELECT {', '.join(select)} FROM {frm}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order} LIMIT ? OFFSET ?"
        params += [query.limit, query.offset]
        hits = []
        for row in self._con().execute(sql, params):
            computed: dict[str, object] = {
                "ModalitiesInStudy": _split_multi(row[2]),
                "SOPClassesInStudy": _split_multi(row[3]),
                "NumberOfStudyRelatedSeries": row[4],
                "NumberOfStudyRelatedInstances": row[5],
            }
            series_uid = series_json = sop_uid = instance_json = None
            if level != "study":
                series_uid, series_json = row[6], row[7]
                computed["NumberOfSeriesRelatedInstances"] = row[8]
            if level == "instance":
                sop_uid, instance_json = row[9], row[10]
            hits.append(SearchHit(row[0], series_uid, sop_uid, row[1], series_json, instance_json, computed))
        return hits

    def count(self) -> int:
        return self._con().execute("SELECT count(*) FROM instance").fetchone()[0]

    def counts(self) -> IndexCounts:
        return IndexCounts(*self._con().execute(
            "SELECT (SELECT count(*) FROM study), (SELECT count(*) FROM series), (SELECT count(*) FROM instance)"
        ).fetchone())

    def paths(self) -> Iterator[tuple[str, str]]:
        yield from self._con().execute("SELECT SOPInstanceUID, _path FROM instance ORDER BY pk").fetchall()

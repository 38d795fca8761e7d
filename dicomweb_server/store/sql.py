"""What the two SQL indexes (store/sqlite.py, store/postgresql.py) share: the
QIDO-RS query model (dicom/matching.py) compiled to SQL, the table columns, and
the read queries. A :class:`Dialect` says what differs between SQLite and
PostgreSQL: placeholders, column types, wildcard matching, upserts.

Both dialects compare text byte for byte (SQLite's BINARY collation; PostgreSQL
columns are ``COLLATE "C"`` in a UTF-8 database), so wildcard, range and single
value matching give the same answers (tests/store/test_index_agreement.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import orjson

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.attributes import SEQUENCES_OF, STORED, Attribute, Kind
from ..dicom.instance import InstanceRecord, dumps
from ..dicom.matching import PN_WORD_SEPARATORS, Match, Query, fuzzy_tokens, level_record, level_values
from ..dicom.patient import PatientIdentity, patient_identity
from . import changes as changelog
from ..dicom.status import FailureReason
from . import labels as study_labels
from .labels import label_condition
from . import rejections
from .arrivals import Arrived
from .base import Index, IndexCounts, InstanceLocation, Refused, ReplaceRefused, SearchHit, hierarchy_conflict

ALIAS = {"study": "s", "series": "se", "instance": "i"}


def _glob_escape(text: str) -> str:
    """Escape GLOB's own metacharacters; DICOM's ``*``/``?`` keep their meaning."""
    return text.replace("[", "[[]")


def _like_escape(text: str) -> str:
    """Escape LIKE's own metacharacters (``%``, ``_`` and the escape ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the SQL engines, for the statements written once here."""

    name: str
    placeholder: str  # "?" (sqlite3) or "%s" (psycopg)
    text: str  # column type of matching keys
    integer: str  # column type of IS/US matching keys
    blob: str  # column type of stored JSON
    contains: str  # SQL function: position of a substring, 0 when absent

    def sql(self, text: str) -> str:
        """Statements are written with ``?``; psycopg wants ``%s``."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def wildcard(self, expr: str, pattern: str) -> tuple[str, str]:
        """``expr`` matches the DICOM wildcard ``pattern`` (``*`` any run, ``?`` one
        character; everything else literal, case-sensitive)."""
        if self.name == "sqlite":
            return f"{expr} GLOB ?", _glob_escape(pattern)
        return f"{expr} LIKE ? ESCAPE '\\'", _like_escape(pattern).replace("*", "%").replace("?", "_")

    def column(self, value: object) -> object:
        """A matching key's value as its column holds it. PostgreSQL text cannot hold
        NUL: it becomes U+FFFF, a noncharacter, so that the value is still stored (an
        error would fail every instance of the group commit), wildcards still count it
        as one character, and no query can name it (queries refuse NUL, and U+FFFF is
        not a character a sender means)."""
        if self.name == "postgresql" and isinstance(value, str) and "\x00" in value:
            return value.replace("\x00", "\uffff")
        return value

    def insert_ignore(self, table: str, columns: list[str]) -> str:
        """INSERT of one row that does nothing when a unique key already holds it."""
        values = ",".join("?" * len(columns))
        if self.name == "sqlite":
            return f"INSERT OR IGNORE INTO {table} ({','.join(columns)}) VALUES ({values})"
        return f"INSERT INTO {table} ({','.join(columns)}) VALUES ({values}) ON CONFLICT DO NOTHING"


SQLITE = Dialect("sqlite", "?", "TEXT", "INTEGER", "BLOB", "instr")
POSTGRESQL = Dialect("postgresql", "%s", 'TEXT COLLATE "C"', "BIGINT", "BYTEA", "strpos")


#: IndexCounts: both instance figures from one pass over the index instance_size, not the
#: rows (PostgreSQL's sum of a BIGINT is NUMERIC: cast back)
COUNTS = ("SELECT (SELECT count(*) FROM study), (SELECT count(*) FROM series), i.n, CAST(i.bytes AS BIGINT) "
          "FROM (SELECT count(*) AS n, coalesce(sum(_size), 0) AS bytes FROM instance) i")


def cols(level: str) -> list[str]:
    return [a.keyword for a in STORED[level]]  # type: ignore[index]


def coldefs(dialect: Dialect, level: str, skip: str) -> str:
    """Column definitions of a level's matching keys (all but its UID)."""
    return ",\n  ".join(f"{a.keyword} {dialect.integer if a.kind is Kind.INT else dialect.text}"
                        for a in STORED[level] if a.keyword != skip)  # type: ignore[index]


def sequence_item_schema(dialect: Dialect) -> list[str]:
    """The items of the matchable sequences (attributes.SEQUENCES), one row per item
    attribute with a value: ``level`` and ``owner_pk`` name the study/series/instance row
    whose record holds the sequence, ``item`` the item's position. A sequence key is an
    index lookup on (sequence, attribute, value), the other keys of the same item are
    found by (level, owner_pk, sequence, item, attribute) (PS3.4 C.2.2.2.6)."""
    return [f"""CREATE TABLE IF NOT EXISTS sequence_item (
  level TEXT NOT NULL,
  owner_pk {dialect.integer} NOT NULL,
  sequence TEXT NOT NULL,
  item INTEGER NOT NULL,
  attribute TEXT NOT NULL,
  value {dialect.text} NOT NULL
)""",
            "CREATE INDEX IF NOT EXISTS sequence_item_value ON sequence_item(sequence, attribute, value)",
            "CREATE INDEX IF NOT EXISTS sequence_item_owner ON sequence_item(level, owner_pk, sequence, item, attribute)"]


def item_rows(level: str, pk: int, values: dict[str, object]) -> list[tuple]:
    """The sequence_item rows of a study/series/instance record (matching.level_values)."""
    rows = []
    for a in SEQUENCES_OF[level]:  # type: ignore[index]
        for n, item in enumerate(values.get(a.keyword) or ()):  # type: ignore[arg-type]
            rows += [(level, pk, a.tag, n, k.tag, item[k.keyword]) for k in a.items if item.get(k.keyword) is not None]
    return rows


def put_items(dialect: Dialect, con, rows: list[tuple]) -> None:
    if rows:
        con.cursor().executemany(dialect.sql(
            "INSERT INTO sequence_item (level, owner_pk, sequence, item, attribute, value) VALUES (?,?,?,?,?,?)"),
            [(*r[:5], dialect.column(r[5])) for r in rows])


def _records(dialect: Dialect, con, level: str) -> Iterator[list[tuple[int, dict[str, object]]]]:
    """(pk, matching.level_values) of every study, series or instance row, from the stored
    DICOM JSON of the instance that speaks for it (the earliest still stored), in batches."""
    owner = {"study": "se.study_pk", "series": "i.series_pk", "instance": "i.pk"}[level]
    pairs = con.execute(dialect.sql(
        f"SELECT {owner}, min(i.pk) FROM instance i JOIN series se ON se.pk = i.series_pk GROUP BY {owner}")).fetchall()
    for n in range(0, len(pairs), 500):
        chunk = pairs[n:n + 500]
        metas = dict(con.execute(dialect.sql(
            f"SELECT pk, _metadata FROM instance WHERE pk IN ({','.join('?' * len(chunk))})"), [p for _, p in chunk]))
        yield [(pk, level_values(orjson.loads(metas[ipk]), level)) for pk, ipk in chunk]  # type: ignore[arg-type]


def backfill_items(dialect: Dialect, con) -> int:
    """Fill sequence_item for the studies and series already indexed (the migration to a
    schema with that table). Returns the rows written."""
    n = 0
    for level in ("study", "series", "instance"):
        if SEQUENCES_OF[level]:  # type: ignore[index]
            for batch in _records(dialect, con, level):
                rows = [r for pk, values in batch for r in item_rows(level, pk, values)]
                put_items(dialect, con, rows)
                n += len(rows)
    return n


def derived_columns() -> dict[str, list[Attribute]]:
    """The derived date-time columns (attributes.DERIVED) of each level's table."""
    return {lv: [a for a in STORED[lv] if a.sources] for lv in STORED}  # type: ignore[index]


def derived_indexes() -> list[str]:
    """Indexes of the derived columns: a combined or UTC study date-time range is an index
    lookup, as a StudyDate range is (study_date)."""
    return ["CREATE INDEX IF NOT EXISTS study_datetime ON study(_StudyDateTime)",
            "CREATE INDEX IF NOT EXISTS study_datetime_utc ON study(_StudyDateTimeUTC)"]


def backfill_derived(dialect: Dialect, con, levels: list[str]) -> None:
    """Compute the derived date-time columns of the rows already indexed (the migration to
    a schema with these columns), from each row's speaking instance."""
    for level in levels:
        names = [a.keyword for a in derived_columns()[level]]
        if not names:
            continue
        update = dialect.sql(f"UPDATE {level} SET {', '.join(f'{c} = ?' for c in names)} WHERE pk = ?")
        for batch in _records(dialect, con, level):
            con.cursor().executemany(update, [[values[c] for c in names] + [pk] for pk, values in batch])


def compile_sequence(dialect: Dialect, m: Match, n: int) -> tuple[str, list]:
    """A sequence key: the level's row has an item matching every item key (PS3.4
    C.2.2.2.6), as ``pk IN (...)`` over sequence_item (aliases ``q{n}_{i}``)."""
    a = m.attribute
    first = f"q{n}_0"
    frm, where, params = [f"sequence_item {first}"], [f"{first}.level = ?", f"{first}.sequence = ?"], [a.level, a.tag]
    for i, key in enumerate(m.values):
        q = f"q{n}_{i}"
        if i:
            frm.append(f"JOIN sequence_item {q} ON {q}.level = {first}.level AND {q}.owner_pk = {first}.owner_pk "
                       f"AND {q}.sequence = {first}.sequence AND {q}.item = {first}.item")
        cond, p = compile_match(dialect, key, False, f"{q}.value")
        where += [f"{q}.attribute = ?", cond]
        params += [key.attribute.tag, *p]
    return (f"{ALIAS[a.level]}.pk IN (SELECT {first}.owner_pk FROM {' '.join(frm)} WHERE {' AND '.join(where)})",
            params)


def compile_match(dialect: Dialect, m: Match, fuzzy: bool, col: str | None = None) -> tuple[str, list]:
    """One matching key (PS3.4 C.2.2.2) as an SQL condition and its parameters (on
    ``col``, by default the attribute's column)."""
    a: Attribute = m.attribute
    col = col or f"{ALIAS[a.level]}.{a.keyword}"
    t = m.type
    if t == "universal":
        return "", []
    if a.kind is Kind.MULTI:
        return ("(" + " OR ".join(f"{dialect.contains}({col}, ?) > 0" for _ in m.values) + ")",
                [f"\\{v}\\" for v in m.values])
    if a.kind is Kind.PN and fuzzy and t in ("single", "wildcard"):
        words = col
        for sep in PN_WORD_SEPARATORS.strip():
            words = f"replace({words}, '{sep}', ' ')"
        words = f"(' ' || {words})"
        toks = fuzzy_tokens(m.values[0])
        if not toks:
            return f"{col} IS NOT NULL", []
        conds = [dialect.wildcard(words, f"* {tok}*") for tok in toks]
        return "(" + " AND ".join(c for c, _ in conds) + ")", [p for _, p in conds]
    if t == "single":
        return f"{col} = ?", [m.values[0]]
    if t == "list":
        return f"{col} IN ({','.join('?' * len(m.values))})", list(m.values)
    if t == "wildcard":
        cond, param = dialect.wildcard(col, m.values[0])
        return cond, [param]
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


def compile_search(dialect: Dialect, query: Query, allowed: Filter = UNRESTRICTED) -> tuple[str, list]:
    """The QIDO-RS query as one SELECT (columns as :func:`hit` reads them), among the
    studies ``allowed`` lets through."""
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
    for n, m in enumerate(query.matches):
        cond, p = compile_sequence(dialect, m, n) if m.type == "sequence" else compile_match(dialect, m, query.fuzzy)
        if cond:
            where.append(cond)
            params += p
    if not allowed.unrestricted:
        conds, p = label_condition(allowed, engine=dialect.name)
        where += conds
        params += p
    sql = f"SELECT {', '.join(select)} FROM {frm}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {order} LIMIT ? OFFSET ?"
    params += [query.limit, query.offset]
    return dialect.sql(sql), params


def hit(level: str, row: tuple) -> SearchHit:
    computed: dict[str, object] = {
        "ModalitiesInStudy": split_multi(row[2]),
        "SOPClassesInStudy": split_multi(row[3]),
        "NumberOfStudyRelatedSeries": row[4],
        "NumberOfStudyRelatedInstances": row[5],
    }
    series_uid = series_json = sop_uid = instance_json = None
    if level != "study":
        series_uid, series_json = row[6], row[7]
        computed["NumberOfSeriesRelatedInstances"] = row[8]
    if level == "instance":
        sop_uid, instance_json = row[9], row[10]
    return SearchHit(row[0], series_uid, sop_uid, row[1], series_json, instance_json, computed)


def modality_values(modality: str | None) -> set[str]:
    """The values of a (possibly multi-valued) Modality column."""
    return {m for m in (modality or "").split("\\") if m}


def split_multi(v: str | None) -> list[str]:
    return [x for x in (v or "").split("\\") if x]


def join_multi(values: set[str]) -> str | None:
    """Multi-valued columns are stored as ``\\A\\B\\`` so that ``instr`` finds ``\\A\\``."""
    return "\\" + "\\".join(sorted(values)) + "\\" if values else None


def scope(dialect: Dialect, study_uid: str, series_uid: str | None, sop_uid: str | None = None,
          allowed: Filter = UNRESTRICTED) -> tuple[str, list]:
    """WHERE clause (with ``?``) selecting a study, series or instance by its UIDs (of a
    study ``allowed`` lets through)."""
    where, params = ["s.StudyInstanceUID = ?"], [study_uid]
    if not allowed.unrestricted:
        conds, p = label_condition(allowed, engine=dialect.name)
        where += conds
        params += p
    if series_uid is not None:
        where.append("se.SeriesInstanceUID = ?")
        params.append(series_uid)
    if sop_uid is not None:
        where.append("i.SOPInstanceUID = ?")
        params.append(sop_uid)
    return "WHERE " + " AND ".join(where), params


_LOC = ("SELECT s.StudyInstanceUID, se.SeriesInstanceUID, i.SOPInstanceUID, i.SOPClassUID, "
        "i._transfer_syntax, i._path, i._size, i._pixel FROM instance i "
        "JOIN series se ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk ")


def _loc(row: tuple) -> InstanceLocation:
    return InstanceLocation(row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                            orjson.loads(row[7]) if row[7] is not None else None)


class _Touched:
    """A study or series row that :meth:`SQLIndex._add_rows` looked up or inserted, and
    what the instances it adds change in it (written once, at the end of the call)."""

    __slots__ = ("classes", "instances", "modalities", "modality", "patient", "pk", "series", "study_uid")

    def __init__(self, pk: int, study_uid: str, patient: PatientIdentity | None = None,
                 modalities: set[str] | None = None, classes: set[str] | None = None,
                 modality: str | None = None) -> None:
        self.pk = pk
        self.study_uid = study_uid  # a series: the study it is filed under
        self.patient = patient  # a study: whose it is
        self.modality = modality  # a series: its Modality column
        self.modalities = modalities if modalities is not None else set()  # a study: ModalitiesInStudy
        self.classes = classes if classes is not None else set()  # a study: SOPClassesInStudy
        self.instances = 0  # instances added by this call
        self.series = 0  # a study: series added by this call


#: the columns of a study's row that :class:`_Touched` keeps (alias ``s``)
_STUDY_ROW = "s.pk, s._json, s.ModalitiesInStudy, s.SOPClassesInStudy"


def _study_touched(study_uid: str, row) -> _Touched:
    """A study's :class:`_Touched` from its :data:`_STUDY_ROW` columns."""
    return _Touched(row[0], study_uid, patient_identity(orjson.loads(row[1])), set(split_multi(row[2])),
                    set(split_multi(row[3])))


class SQLIndex(Index):
    """An SQL index, written once for both engines. A subclass sets ``dialect``,
    gives :meth:`_reading` (a connection for one read: ``execute`` returns a cursor
    with ``fetchone``/``fetchall``, iterable), and wraps :meth:`_add_rows` and
    :meth:`_delete_rows` in its engine's write transaction."""

    dialect: Dialect

    def _x(self, con, sql: str, params: list | tuple = ()):
        return con.execute(self.dialect.sql(sql), params)

    # --- writes, inside the caller's transaction ----------------------------------------

    def _add_rows(self, con, records: list[InstanceRecord], action: str = "create",
                  log: bool = True) -> list[bool | Refused]:
        """Insert instances and update the computed study/series attributes
        incrementally (constant work per instance, whatever the study's size).
        The caller's transaction keeps other writers of these UIDs out, so the
        hierarchy check (store/base.py: a study's patient is what its record says,
        the ``_json`` of its earliest instance still stored) and the inserts are atomic.

        Each study and series the records name is looked up (a stored series with its
        study, in one statement) or inserted once per call, and its counts,
        ModalitiesInStudy and SOPClassesInStudy written once at the end (:class:`_Touched`);
        an instance's rejection and its place, if indexed, are one statement: a group
        commit of n new instances of a stored series runs 3 + 2n statements here instead of
        ~10n (issue 33)."""
        d, x = self.dialect, self._x
        added: list[bool | Refused] = []
        studies: dict[str, _Touched | None] = {}  # study UID -> its row (None: not stored)
        series: dict[str, _Touched | None] = {}  # series UID -> its row (None: not stored)
        scols, secols, icols = cols("study"), cols("series"), cols("instance")
        study_insert = d.insert_ignore("study", [*scols, "_json"]) + " RETURNING pk"
        series_insert = d.insert_ignore("series", ["study_pk", *secols, "_json"]) + " RETURNING pk"
        instance_insert = (f"INSERT INTO instance (series_pk, {','.join(icols)}, _transfer_syntax, _path, _size, "
                           f"_pixel, _metadata, _source) VALUES (?, {','.join('?' * (len(icols) + 6))})")
        rx = self._execute(con)
        for r in records:
            # whether it is rejected, and where its SOP Instance UID is indexed: one statement
            rejected, *place = x(con, f"SELECT {rejections.REJECTED}, s.StudyInstanceUID, se.SeriesInstanceUID "
                                 "FROM (SELECT 1 AS one) q LEFT JOIN instance i ON i.SOPInstanceUID = ? "
                                 "LEFT JOIN series se ON se.pk = i.series_pk LEFT JOIN study s ON s.pk = se.study_pk",
                                 (r.sop_uid, r.sop_uid)).fetchone()
            if action == "create" and rejected:
                # rejected before it arrived (IOCM): filed with its rejection, not searchable
                rejections.arrived(rx, r.sop_uid, r.path)
                added.append(False)
                continue
            old = tuple(place) if place[0] is not None else None
            if r.series_uid not in series:
                self._series_row(con, r.series_uid, series, studies)
            se = series[r.series_uid]
            study = studies[r.study_uid] if r.study_uid in studies else self._study_row(con, r.study_uid, studies)
            refused = hierarchy_conflict(r, old, se.study_uid if se is not None else None,
                                         study.patient if study is not None else None)
            if refused is not None or old is not None:
                added.append(refused if refused is not None else False)
                continue
            new_study = new_series = False
            if study is None:  # (no row returned: another writer's, inserted since the look-up)
                rows = x(con, study_insert, [d.column(r.study[c]) for c in scols] + [r.study_json]).fetchall()
                new_study = bool(rows)
                study = studies[r.study_uid] = (_Touched(rows[0][0], r.study_uid, r.patient) if rows
                                                else self._study_row(con, r.study_uid, studies))
            if se is None:
                rows = x(con, series_insert,
                         [study.pk] + [d.column(r.series[c]) for c in secols] + [r.series_json]).fetchall()
                new_series = bool(rows)
                se = series[r.series_uid] = (_Touched(rows[0][0], r.study_uid,
                                                      modality=d.column(r.series.get("Modality"))) if rows
                                             else self._series_row(con, r.series_uid, series, studies))
            if study is None or se is None:  # (the writer lock keeps other writers out)
                raise RuntimeError(f"study {r.study_uid} or series {r.series_uid} neither inserted nor found")
            x(con, instance_insert,
              [se.pk] + [d.column(r.instance[c]) for c in icols]
              + [r.transfer_syntax_uid, r.path, r.size,
                 orjson.dumps(r.pixel) if r.pixel is not None else None, r.metadata, r.source])
            items = (item_rows("study", study.pk, r.study) if new_study else []) \
                + (item_rows("series", se.pk, r.series) if new_series else [])
            if any(r.instance.get(a.keyword) for a in SEQUENCES_OF["instance"]):  # (most instances: none)
                (pk,) = x(con, "SELECT pk FROM instance WHERE SOPInstanceUID = ?", (r.sop_uid,)).fetchone()
                items += item_rows("instance", pk, r.instance)
            self._put_items(con, items)
            se.instances += 1
            study.instances += 1
            study.series += new_series
            study.modalities |= modality_values(se.modality)  # type: ignore[arg-type]
            study.classes.add(r.sop_class_uid)
            added.append(True)
        for se in series.values():
            if se is not None and se.instances:
                x(con, "UPDATE series SET NumberOfSeriesRelatedInstances = NumberOfSeriesRelatedInstances + ? "
                  "WHERE pk = ?", (se.instances, se.pk))
        for study in studies.values():
            if study is not None and study.instances:
                x(con, "UPDATE study SET NumberOfStudyRelatedInstances = NumberOfStudyRelatedInstances + ?, "
                  "NumberOfStudyRelatedSeries = NumberOfStudyRelatedSeries + ?, ModalitiesInStudy = ?, "
                  "SOPClassesInStudy = ? WHERE pk = ?",
                  (study.instances, study.series, join_multi(study.modalities), join_multi(study.classes), study.pk))
        if action == "restore":  # shown again: its rejection row goes in this transaction; a refused
            # one keeps its row as it was (path, reason, time: still listed, restorable later)
            rejections.forget(rx, [r.sop_uid for r, new in zip(records, added) if not isinstance(new, Refused)])
        if log:
            self._log(con, action, [(r.study_uid, r.series_uid, r.sop_uid) for r, new in zip(records, added)
                                    if new is True])
        self._arrival_labels(con, records, added)
        return added

    def _study_row(self, con, study_uid: str, known: dict[str, _Touched | None]) -> _Touched | None:
        """A stored study's row (its patient is what its record says), None when new."""
        row = self._x(con, f"SELECT {_STUDY_ROW} FROM study s WHERE s.StudyInstanceUID = ?", (study_uid,)).fetchone()
        known[study_uid] = None if row is None else _study_touched(study_uid, row)
        return known[study_uid]

    def _series_row(self, con, series_uid: str, known: dict[str, _Touched | None],
                    studies: dict[str, _Touched | None]) -> _Touched | None:
        """A stored series' row (with the study it is filed under), None when new; its
        study's row in ``studies`` too when not there yet (the same statement reads it)."""
        row = self._x(con, f"SELECT se.pk, s.StudyInstanceUID, se.Modality, {_STUDY_ROW} FROM series se "
                      "JOIN study s ON s.pk = se.study_pk WHERE se.SeriesInstanceUID = ?", (series_uid,)).fetchone()
        known[series_uid] = None if row is None else _Touched(row[0], row[1], modality=row[2])
        if row is not None and row[1] not in studies:
            studies[row[1]] = _study_touched(row[1], row[3:])
        return known[series_uid]

    def _arrival_labels(self, con, records: list[InstanceRecord], added: list[bool | Refused]) -> None:
        """Labels on arrival (``InstanceRecord.labels``, access/labels_in.py) put on the
        studies of the newly added records in this transaction: the instances and their
        labels commit together. A label new to its study logs a ``label`` row per
        instance of the study, as :meth:`Index.set_label` does."""
        for study_uid, label in sorted({(r.study_uid, label) for r, new in zip(records, added) if new is True
                                        for label in r.labels}):
            if study_labels.put(self._execute(con), study_uid, label, True,
                                postgresql=self.dialect.name == "postgresql"):
                self._log(con, "label", self._study_instances(con, study_uid))

    def _study_instances(self, con, study_uid: str) -> list[tuple[str, str, str]]:
        """(study, series, SOP Instance UID) of the study's instances, in arrival order."""
        return [tuple(r) for r in self._x(
            con, "SELECT s.StudyInstanceUID, se.SeriesInstanceUID, i.SOPInstanceUID FROM instance i JOIN series se "
            "ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk WHERE s.StudyInstanceUID = ? ORDER BY i.pk",
            (study_uid,)).fetchall()]

    def _execute(self, con) -> changelog.Execute:
        return lambda sql, params: self._x(con, sql, params)

    def reject_in(self, con, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        return self._reject_rows(con, refs, code, now)

    def _reject_rows(self, con, refs: list[tuple[str, str, str]], code: str, now: float) -> int:
        """Index.reject inside the caller's transaction: the rejection rows, then the
        stored ones leave the searchable tables as a DELETE would have them (action
        ``reject``, files kept)."""
        rx, hidden = self._execute(con), 0
        rows, by_study = [], {}
        for study, series, sop in refs:  # a stored one is filed under the UIDs it has (not the note's)
            row = self._x(con, "SELECT s.StudyInstanceUID, se.SeriesInstanceUID, i._path FROM instance i "
                          "JOIN series se ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk "
                          "WHERE i.SOPInstanceUID = ?", (sop,)).fetchone()
            rows.append((row[0], row[1], sop, row[2]) if row else (study, series, sop, None))
            if row:
                by_study.setdefault(row[0], set()).add(sop)
        rejections.record(rx, rows, code, now)
        for study, sops in by_study.items():
            hidden += len(self._delete_rows(con, study, None, None, action="reject", only=sops))
        return hidden

    def _purge_rows(self, con, rows: list[rejections.Rejection]) -> list[rejections.Rejection]:
        rx = self._execute(con)
        rows = [r for r in rows if rejections.is_rejected(rx, r.sop_uid)]  # (not purged by another process)
        rejections.drop(rx, rows)
        self._log(con, "delete", [(r.study_uid, r.series_uid, r.sop_uid) for r in rows if r.path is not None])
        return rows

    @contextmanager
    def _table_reading(self) -> Iterator:
        with self._reading() as con:
            yield self._execute(con)

    def rejections(self, study_uid: str | None = None, series_uid: str | None = None,
                   before: float | None = None) -> list[rejections.Rejection]:
        with self._reading() as con:
            return rejections.select(self._execute(con), study_uid, series_uid, before)

    def _replace_rows(self, con, records: list[InstanceRecord], study_uid: str, series_uid: str | None,
                      sop_uid: str | None, action: str) -> None:
        """Index.replace inside the caller's transaction: the scope's rows removed, the new
        versions' rows added (the study's patient is then what the new records say), one
        ``action`` row each in the change log. A rejected instance (rejected after the
        update read the study) stays rejected: its new file is left as a kept version."""
        rx = self._execute(con)
        records = [r for r in records if not rejections.is_rejected(rx, r.sop_uid)]
        where, params = scope(self.dialect, study_uid, series_uid, sop_uid)
        sources = dict(self._x(con, "SELECT i.SOPInstanceUID, i._source FROM instance i JOIN series se ON se.pk = "
                                    "i.series_pk JOIN study s ON s.pk = se.study_pk " + where, params).fetchall())
        for r in records:  # a new version came from where the instance came from
            r.source = r.source or sources.get(r.sop_uid, "")
        self._delete_rows(con, study_uid, series_uid, sop_uid, log=False)
        for new in self._add_rows(con, records, action=action, log=False):
            if new is not True:
                raise ReplaceRefused(new if isinstance(new, Refused)
                                     else Refused(FailureReason.PROCESSING_FAILURE, "instance indexed twice"))
        self._log(con, action, [(r.study_uid, r.series_uid, r.sop_uid) for r in records])
        self._run_replace_hooks(con, records, action)  # routing's forwards of the new versions

    def _refile_row(self, con, record: InstanceRecord, old_path: str) -> bool:
        """Index.refile inside the caller's transaction."""
        return self._x(con, "UPDATE instance SET _transfer_syntax = ?, _path = ?, _size = ?, _pixel = ?, "
                       "_metadata = ? WHERE SOPInstanceUID = ? AND _path = ?",
                       (record.transfer_syntax_uid, record.path, record.size,
                        orjson.dumps(record.pixel) if record.pixel is not None else None, record.metadata,
                        record.sop_uid, old_path)).rowcount == 1

    def history(self, sop_uid: str) -> list[changelog.Change]:
        with self._reading() as con:
            return changelog.history(lambda sql, p: self._x(con, sql, p), sop_uid)

    def _log(self, con, action: str, instances: list[tuple[str, str, str]]) -> None:
        """Append the change-log rows of this transaction (store/changes.py) and run the
        change hooks (routing's webhooks) on ``con``."""
        pg = self.dialect.name == "postgresql"
        logged = changelog.append(lambda sql, params: self._x(con, sql, params), None if pg else changelog.now(),
                                  action, instances, postgresql=pg)
        self._run_change_hooks(con, logged)

    def _put_items(self, con, rows: list[tuple]) -> None:
        put_items(self.dialect, con, rows)

    def _drop_items(self, con, level: str, pks) -> None:
        if SEQUENCES_OF[level]:  # type: ignore[index]
            con.cursor().executemany(self.dialect.sql("DELETE FROM sequence_item WHERE level = ? AND owner_pk = ?"),
                                     [(level, pk) for pk in pks])

    def _speak(self, con, level: str, pk: int, where: str) -> None:
        """Set the study/series record to what its earliest instance still stored says."""
        row = self._x(con, "SELECT i._metadata FROM instance i JOIN series se ON se.pk = i.series_pk "
                      f"WHERE {where} = ? ORDER BY i.pk LIMIT 1", (pk,)).fetchone()
        if row is None:
            return  # empty: the row is about to be deleted
        values, json = level_record(orjson.loads(row[0]), level)  # type: ignore[arg-type]
        names = [c for c in cols(level) if c not in ("StudyInstanceUID", "SeriesInstanceUID")]
        self._x(con, f"UPDATE {level} SET {', '.join(f'{c} = ?' for c in names)}, _json = ? WHERE pk = ?",
                [self.dialect.column(values[c]) for c in names] + [dumps(json), pk])
        self._drop_items(con, level, [pk])
        self._put_items(con, item_rows(level, pk, values))

    def _recompute(self, con, series_pks: set[int], study_pks: set[int]) -> None:
        x = self._x
        for pk in series_pks:
            x(con, "UPDATE series SET NumberOfSeriesRelatedInstances = "
              "(SELECT count(*) FROM instance WHERE series_pk = ?) WHERE pk = ?", (pk, pk))
            self._speak(con, "series", pk, "i.series_pk")
        for pk in study_pks:
            self._speak(con, "study", pk, "se.study_pk")
            mods = {v for (m,) in x(
                con, "SELECT DISTINCT Modality FROM series WHERE study_pk = ? AND Modality IS NOT NULL", (pk,))
                for v in modality_values(m)}
            classes = {c for (c,) in x(
                con, "SELECT DISTINCT i.SOPClassUID FROM instance i JOIN series se ON se.pk = i.series_pk "
                "WHERE se.study_pk = ?", (pk,))}
            x(con, "UPDATE study SET ModalitiesInStudy = ?, SOPClassesInStudy = ?, "
              "NumberOfStudyRelatedSeries = (SELECT count(*) FROM series WHERE study_pk = ?), "
              "NumberOfStudyRelatedInstances = (SELECT coalesce(sum(NumberOfSeriesRelatedInstances), 0) "
              "FROM series WHERE study_pk = ?) WHERE pk = ?",
              (join_multi(mods), join_multi(classes), pk, pk, pk))

    def _delete_rows(self, con, study_uid: str, series_uid: str | None, sop_uid: str | None,
                     action: str = "delete", only: set[str] | None = None, log: bool = True) -> list[str]:
        """Remove a study, series or instance (those of ``only``, when given) and
        recompute what is left; returns the paths."""
        where, params = scope(self.dialect, study_uid, series_uid, sop_uid)
        rows = self._x(con, "SELECT i.pk, i._path, se.pk, s.pk, s.StudyInstanceUID, se.SeriesInstanceUID, "
                       "i.SOPInstanceUID FROM instance i JOIN series se ON se.pk = i.series_pk "
                       "JOIN study s ON s.pk = se.study_pk " + where + " ORDER BY i.pk", params).fetchall()
        if only is not None:
            rows = [r for r in rows if r[6] in only]
        con.cursor().executemany(self.dialect.sql("DELETE FROM instance WHERE pk = ?"), [(r[0],) for r in rows])
        self._drop_items(con, "instance", [r[0] for r in rows])
        series_pks = {r[2] for r in rows}
        study_pks = {r[3] for r in rows}
        # series and studies left empty are removed as they are; only those that keep
        # instances are recomputed (fewer pages written: a DELETE must also work on a
        # nearly full disk, where it is how space is freed)
        emptied = self._emptied(con, series_pks, "SELECT 1 FROM instance WHERE series_pk = ? LIMIT 1")
        con.cursor().executemany(self.dialect.sql("DELETE FROM series WHERE pk = ?"), [(pk,) for pk in emptied])
        self._drop_items(con, "series", emptied)
        self._recompute(con, series_pks - emptied, set())
        gone = self._emptied(con, study_pks, "SELECT 1 FROM series WHERE study_pk = ? LIMIT 1")
        con.cursor().executemany(self.dialect.sql("DELETE FROM study WHERE pk = ?"), [(pk,) for pk in gone])
        self._drop_items(con, "study", gone)
        self._recompute(con, set(), study_pks - gone)
        if log:
            self._log(con, action, [(r[4], r[5], r[6]) for r in rows])
            if action == "delete":  # a DELETE of a whole study drops its labels (store/labels.py)
                for uid in {r[4] for r in rows if r[3] in gone}:
                    study_labels.drop_study(self._execute(con), uid)
        return [r[1] for r in rows]

    def _emptied(self, con, pks: set[int], child: str) -> set[int]:
        """Those of ``pks`` that the ``child`` query (one ``?``: the pk) finds nothing for."""
        return {pk for pk in pks if self._x(con, child, (pk,)).fetchone() is None}

    # --- reads ------------------------------------------------------------------------

    def _reading(self) -> AbstractContextManager:
        raise NotImplementedError

    def _rows(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        with self._reading() as con:
            return con.execute(self.dialect.sql(sql), params).fetchall()

    def locate(self, sop_uid: str, allowed: Filter = UNRESTRICTED) -> InstanceLocation | None:
        conds, params = label_condition(allowed, engine=self.dialect.name)
        rows = self._rows(_LOC + "WHERE " + " AND ".join(["i.SOPInstanceUID = ?", *conds]), (sop_uid, *params))
        return _loc(rows[0]) if rows else None

    def instances(self, study_uid: str, series_uid: str | None = None,
                  allowed: Filter = UNRESTRICTED) -> list[InstanceLocation]:
        where, params = scope(self.dialect, study_uid, series_uid, allowed=allowed)
        return [_loc(r) for r in self._rows(_LOC + where + " ORDER BY se.pk, i.pk", params)]

    def metadata(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None,
                 allowed: Filter = UNRESTRICTED) -> list[bytes]:
        where, params = scope(self.dialect, study_uid, series_uid, sop_uid, allowed)
        return [bytes(r[0]) for r in self._rows(
            "SELECT i._metadata FROM instance i JOIN series se ON se.pk = i.series_pk "
            "JOIN study s ON s.pk = se.study_pk " + where + " ORDER BY se.pk, i.pk", params)]

    def search(self, query: Query, allowed: Filter = UNRESTRICTED) -> list[SearchHit]:
        sql, params = compile_search(self.dialect, query, allowed)
        with self._reading() as con:
            return [hit(query.level, row) for row in con.execute(sql, params)]

    def count(self) -> int:
        return self._rows("SELECT count(*) FROM instance")[0][0]

    def arrived(self, study_uid: str, allowed: Filter = UNRESTRICTED) -> list[Arrived] | None:
        where, params = scope(self.dialect, study_uid, None, allowed=allowed)
        rows = self._rows("SELECT se.SeriesInstanceUID, i._source, count(*), CAST(sum(i._size) AS BIGINT), "
                          "min(se.pk) FROM instance i JOIN series se ON se.pk = i.series_pk "
                          "JOIN study s ON s.pk = se.study_pk " + where
                          + " GROUP BY se.SeriesInstanceUID, i._source", params)
        if not rows:  # (a study is indexed while it has an instance)
            return None
        # series in arrival order, sources by code point (as in the in-memory index, whatever the collation)
        return [Arrived(r[0], r[1], int(r[2]), int(r[3])) for r in sorted(rows, key=lambda r: (r[4], r[1]))]

    # --- study labels (store/labels.py) -----------------------------------------------

    def _visible(self, study_uid: str, allowed: Filter) -> bool:
        conds, params = label_condition(allowed, engine=self.dialect.name)
        return bool(self._rows("SELECT 1 FROM study s WHERE " + " AND ".join(["s.StudyInstanceUID = ?", *conds]),
                               (study_uid, *params)))

    def labels(self, study_uid: str, allowed: Filter = UNRESTRICTED) -> list[str] | None:
        if not self._visible(study_uid, allowed):
            return None
        with self._reading() as con:
            return study_labels.of_study(self._execute(con), study_uid)

    def _label_rows(self, con, study_uid: str, label: str, present: bool, allowed: Filter) -> bool | None:
        """Index.set_label inside the caller's write transaction."""
        conds, params = label_condition(allowed, engine=self.dialect.name)
        if self._x(con, "SELECT 1 FROM study s WHERE " + " AND ".join(["s.StudyInstanceUID = ?", *conds]),
                   (study_uid, *params)).fetchone() is None:
            return None
        changed = study_labels.put(self._execute(con), study_uid, label, present,
                                   postgresql=self.dialect.name == "postgresql")
        if changed:  # the change feed shows it: a label row per instance of the study
            self._log(con, "label", self._study_instances(con, study_uid))
        return changed

    def all_labels(self, allowed: Filter = UNRESTRICTED) -> dict[str, int]:
        conds, params = label_condition(allowed, engine=self.dialect.name)
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        return dict(self._rows("SELECT l.label, count(*) FROM study_label l JOIN study s ON s.StudyInstanceUID = "
                               f"l.StudyInstanceUID{where} GROUP BY l.label ORDER BY l.label", params))

    def counts(self, allowed: Filter = UNRESTRICTED) -> IndexCounts:
        if allowed.unrestricted:
            return IndexCounts(*self._rows(COUNTS)[0])
        conds, params = label_condition(allowed, engine=self.dialect.name)
        where = " WHERE " + " AND ".join(conds)
        studies, series, instances = self._rows(
            "SELECT count(*), coalesce(sum(NumberOfStudyRelatedSeries), 0), "
            f"coalesce(sum(NumberOfStudyRelatedInstances), 0) FROM study s{where}", params)[0]
        (size,) = self._rows("SELECT CAST(coalesce(sum(i._size), 0) AS BIGINT) FROM instance i JOIN series se "
                             f"ON se.pk = i.series_pk JOIN study s ON s.pk = se.study_pk{where}", params)[0]
        return IndexCounts(studies, int(series), int(instances), size)

    def paths(self) -> Iterator[tuple[str, str]]:
        """(the files of rejected instances are the index's too: kept until purged)"""
        yield from self._rows("SELECT SOPInstanceUID, _path FROM instance ORDER BY pk")
        yield from self._rows("SELECT SOPInstanceUID, _path FROM rejection WHERE _path IS NOT NULL")

    def changes(self, after: int = 0, limit: int = 10, start: float | None = None, end: float | None = None,
                skip: int = 0, allowed: Filter = UNRESTRICTED) -> list[changelog.Change]:
        with self._reading() as con:
            return changelog.read(lambda sql, p: self._x(con, sql, p), after, limit, start, end, skip, allowed)

    def latest_change(self, allowed: Filter = UNRESTRICTED) -> changelog.Change | None:
        with self._reading() as con:
            return changelog.latest(lambda sql, p: self._x(con, sql, p), allowed)

    def received(self, study_uid: str | None = None) -> dict[str, tuple[float, float]]:
        with self._reading() as con:
            return changelog.received(lambda sql, p: self._x(con, sql, p), study_uid)

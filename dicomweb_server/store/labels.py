"""Study labels (access/filter.py): one row per (StudyInstanceUID, label), in the
index's database (the in-memory index's journal). Keyed by the study's UID, not by its
row: an update (which rewrites the study's rows) or a rejection keeps a study's labels;
a DELETE that removes the whole study drops them.

The table is the source of truth: its primary key (label, StudyInstanceUID) serves
``GET /labels`` counts and the change log's filter (an index look-up per label),
``study_label_study`` a study's own labels. The SQL indexes also keep a copy on the
study row, ``study.labels``, so that a read's filter is a test on the row it already
reads instead of a probe of study_label per candidate study: on SQLite the text
``\\a\\b\\`` (as ModalitiesInStudy: labels hold no backslash, access/filter.py; the
test is ``instr``), on PostgreSQL a ``text[]`` with a GIN index (the test is ``&&``: the
planner's most-common-element statistics make a rare label a bitmap scan of that index
and a common one a cheap filter, where a substring test could only scan the table).
Database triggers keep the copy (:func:`sqlite_triggers`, :func:`postgresql_column`): a
study_label insert or delete updates its study's row, a study row inserted (its first
instance, or stored again after a delete, an update or a rejection) takes the labels
already kept for its UID; no code path can forget it, whatever writes the rows.

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

from collections.abc import Callable

from ..access.filter import LABEL_RE, Filter

Execute = Callable[[str, "list | tuple"], object]  # (as store/changes.py's)


def sqlite_schema() -> str:
    return """
CREATE TABLE IF NOT EXISTS study_label (
  label TEXT NOT NULL,
  StudyInstanceUID TEXT NOT NULL,
  PRIMARY KEY (label, StudyInstanceUID)
);
CREATE INDEX IF NOT EXISTS study_label_study ON study_label(StudyInstanceUID);
"""


def postgresql_schema() -> list[str]:
    """The table in PostgreSQL (schema version 11, store/postgresql.py)."""
    text = 'TEXT COLLATE "C"'
    return [f"""
CREATE TABLE IF NOT EXISTS study_label (
  label {text} NOT NULL,
  StudyInstanceUID {text} NOT NULL,
  PRIMARY KEY (label, StudyInstanceUID)
)""", "CREATE INDEX IF NOT EXISTS study_label_study ON study_label(StudyInstanceUID)"]


#: the copy on the study row in SQLite (``\\a\\b\\``; '' without labels); added by SQLite's
#: opening of an index made before it (store/sqlite.py)
COLUMN = "labels TEXT NOT NULL DEFAULT ''"
#: PostgreSQL's (schema version 16): the labels as an array ('{}' without labels), and
#: its GIN index (the array's default operator class: ``&&``, ``@>``)
PG_COLUMN = "labels TEXT[] COLLATE \"C\" NOT NULL DEFAULT '{}'"
PG_INDEX = "CREATE INDEX IF NOT EXISTS study_labels ON study USING gin (labels)"

# The triggers' statements. SQLite's text ('\' is one backslash: no escapes in its literals)
_ADDED = {
    "sqlite": (r"UPDATE study SET labels = CASE WHEN labels = '' THEN '\' ELSE labels END || NEW.label || '\' "
               "WHERE StudyInstanceUID = NEW.StudyInstanceUID"),
    "postgresql": ("UPDATE study SET labels = array_append(labels, NEW.label) "
                   "WHERE StudyInstanceUID = NEW.StudyInstanceUID"),
}
_REMOVED = {
    "sqlite": (r"UPDATE study SET labels = CASE WHEN labels = '\' || OLD.label || '\' THEN '' "
               r"ELSE replace(labels, '\' || OLD.label || '\', '\') END "
               "WHERE StudyInstanceUID = OLD.StudyInstanceUID"),
    "postgresql": ("UPDATE study SET labels = array_remove(labels, OLD.label) "
                   "WHERE StudyInstanceUID = OLD.StudyInstanceUID"),
}
#: a study's labels from study_label, as ``study.labels`` holds them ({uid}: the UID expression)
_OF_STUDY = {
    "sqlite": (r"coalesce((SELECT '\' || group_concat(label, '\') || '\' FROM (SELECT label FROM study_label "
               "WHERE StudyInstanceUID = {uid} ORDER BY label)), '')"),
    "postgresql": ("coalesce((SELECT array_agg(label ORDER BY label) FROM study_label "
                   "WHERE StudyInstanceUID = {uid}), '{}')"),
}
_TAKE = "UPDATE study SET labels = {of} WHERE pk = NEW.pk"
_CHANGED = "UPDATE study SET labels = {of} WHERE StudyInstanceUID IN (OLD.StudyInstanceUID, NEW.StudyInstanceUID)"
_HAS = "EXISTS (SELECT 1 FROM study_label WHERE StudyInstanceUID = NEW.StudyInstanceUID)"


def _of(engine: str, uid: str) -> str:
    return _OF_STUDY[engine].replace("{uid}", uid)


def _triggers(engine: str) -> dict[str, tuple[str, str, str | None, str]]:
    """name -> (event, table, condition or None, statement): what keeps ``study.labels``."""
    return {
        "study_label_added": ("INSERT", "study_label", None, _ADDED[engine]),
        "study_label_removed": ("DELETE", "study_label", None, _REMOVED[engine]),
        "study_label_changed": ("UPDATE", "study_label", None,
                                _CHANGED.format(of=_of(engine, "study.StudyInstanceUID"))),
        "study_takes_labels": ("INSERT", "study", _HAS, _TAKE.format(of=_of(engine, "NEW.StudyInstanceUID"))),
    }


def sqlite_triggers() -> str:
    """The triggers that keep ``study.labels`` equal to the study's study_label rows, made
    again at every start (as store/sqlite.py's others: a later archive may change them).
    Not in :func:`sqlite_schema`: the in-memory index's journal has study_label but no
    study table."""
    return "".join(f"DROP TRIGGER IF EXISTS {name};\nCREATE TRIGGER {name} AFTER {event} ON {table}"
                   f"{f' WHEN {when}' if when else ''} BEGIN {body}; END;\n"
                   for name, (event, table, when, body) in _triggers("sqlite").items())


def backfill(engine: str) -> str:
    """``study.labels`` of every labelled study from study_label (an index older than the
    column; the others keep the default)."""
    return (f"UPDATE study SET labels = {_of(engine, 'study.StudyInstanceUID')} "
            "WHERE StudyInstanceUID IN (SELECT StudyInstanceUID FROM study_label)")


def postgresql_column() -> tuple[list[str], list[str], list[str]]:
    """Schema version 16 (store/postgresql.py): the column and its GIN index, its
    triggers (a plpgsql function each) and its values for the labels already kept (the
    backfill rewrites each labelled study row once), in the migration's transaction. As
    (before, locking, after): the statements that lock study or study_label are the
    middle ones (the migration bounds their wait)."""
    functions, ddl = [], [f"ALTER TABLE study ADD COLUMN IF NOT EXISTS {PG_COLUMN}", PG_INDEX]
    for name, (event, table, when, body) in _triggers("postgresql").items():
        body = f"IF {when} THEN {body}; END IF" if when else body
        functions.append(f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                         f"BEGIN {body}; RETURN NULL; END $$")
        ddl += [f"DROP TRIGGER IF EXISTS {name} ON {table}",
                f"CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()"]
    return functions, ddl, [backfill("postgresql")]


def of_study(x: Execute, study_uid: str) -> list[str]:
    return [r[0] for r in x("SELECT label FROM study_label WHERE StudyInstanceUID = ? ORDER BY label",
                            (study_uid,)).fetchall()]


def put(x: Execute, study_uid: str, label: str, present: bool, postgresql: bool = False) -> bool:
    """Add or remove one label of a study in the caller's transaction; whether it changed."""
    if present:
        sql = ("INSERT INTO study_label (label, StudyInstanceUID) VALUES (?, ?) ON CONFLICT DO NOTHING"
               if postgresql else "INSERT OR IGNORE INTO study_label (label, StudyInstanceUID) VALUES (?, ?)")
        return x(sql, (label, study_uid)).rowcount == 1
    return x("DELETE FROM study_label WHERE label = ? AND StudyInstanceUID = ?", (label, study_uid)).rowcount == 1


def drop_study(x: Execute, study_uid: str) -> None:
    x("DELETE FROM study_label WHERE StudyInstanceUID = ?", (study_uid,))


def every(x: Execute) -> list[tuple[str, str]]:
    """(StudyInstanceUID, label) of every row (the in-memory index loads them at start)."""
    return [tuple(r) for r in x("SELECT StudyInstanceUID, label FROM study_label", ()).fetchall()]


def label_condition(allowed: Filter, study: str = "s", engine: str | None = None) -> tuple[list[str], list]:
    """The conditions (and their parameters) that let through only the studies ``allowed``
    does (access/filter.py), on the table or alias ``study`` (one with a StudyInstanceUID
    column: the study table, the change log); with the filter's ``studies`` (a share
    link), the study is one of them. Nothing at all for an unrestricted filter.

    Per clause, the study carries one of its labels: with ``engine`` (``study`` is then the
    study table) a test of ``study.labels``, the row's own copy: SQLite ``instr`` of
    ``\\a\\`` in its text, PostgreSQL ``&&`` (overlap) of its array with the clause's (a
    GIN index scan for a rare label); without (the change log), an index look-up in
    study_label's primary key."""
    where: list[str] = []
    params: list = []
    if allowed.studies is not None:
        if allowed.studies:
            where.append(f"{study}.StudyInstanceUID IN ({','.join('?' * len(allowed.studies))})")
            params += sorted(allowed.studies)
        else:
            where.append("1 = 0")
    for n, clause in enumerate(allowed.clauses):
        if not clause:
            where.append("1 = 0")
            continue
        labels = sorted(clause)
        if engine == "postgresql":
            if all(LABEL_RE.fullmatch(label) for label in labels):
                # the labels written into the statement, not bound: a prepared statement's generic
                # plan (psycopg prepares a query after 5 executions; PostgreSQL then plans it once
                # without its parameters) cannot see which labels a clause names, so it guessed a
                # label rare and read the GIN index for one on every study (StudyDate month at
                # 100k instances: 0.73 -> 1.24 ms per search). Written in, the plan is made for
                # them, and cached per set of labels (one per access rule). Safe: a valid label
                # is [a-z0-9._-] (access/filter.py), nothing an array literal or SQL quotes.
                where.append(f"{study}.labels && '{{{','.join(labels)}}}'::text[]")
            else:  # (no valid label fails the pattern: bound, never written in)
                where.append(f"{study}.labels && ARRAY[{','.join('?' * len(labels))}]::text[]")
                params += labels
            continue
        if engine == "sqlite" and not any("\\" in label for label in labels):  # (valid labels have none)
            where.append("(" + " OR ".join([f"instr({study}.labels, ?) > 0"] * len(labels)) + ")")
            params += [f"\\{label}\\" for label in labels]
            continue
        where.append(f"EXISTS (SELECT 1 FROM study_label l{n} WHERE l{n}.label IN ({','.join('?' * len(clause))}) "
                     f"AND l{n}.StudyInstanceUID = {study}.StudyInstanceUID)")
        params += labels
    return where, params

"""Study labels (access/filter.py): one row per (StudyInstanceUID, label), in the
index's database (the in-memory index's journal). Keyed by the study's UID, not by its
row: an update (which rewrites the study's rows) or a rejection keeps a study's labels;
a DELETE that removes the whole study drops them.

The primary key (label, StudyInstanceUID) is what a label filter needs: "does this
study carry one of these labels" is an index look-up per label (store/sql.py
:func:`label_condition`); ``study_label_study`` serves a study's own labels.

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

from collections.abc import Callable

from ..access.filter import Filter

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


def label_condition(allowed: Filter, study: str = "s") -> tuple[list[str], list]:
    """The conditions (and their parameters) that let through only the studies ``allowed``
    does (access/filter.py), on the table or alias ``study`` (one with a StudyInstanceUID
    column: the study table, the change log): per clause, the study carries one of its
    labels (an index look-up in study_label's primary key); with the filter's ``studies``
    (a share link), the study is one of them. Nothing at all for an unrestricted filter."""
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
        where.append(f"EXISTS (SELECT 1 FROM study_label l{n} WHERE l{n}.label IN ({','.join('?' * len(clause))}) "
                     f"AND l{n}.StudyInstanceUID = {study}.StudyInstanceUID)")
        params += sorted(clause)
    return where, params

"""Per-project de-identification state kept in the index's database: the project's
secret (UIDs, date offsets and generated pseudonyms derive from it: deid/uids.py,
deid/apply.py) and the pseudonym table PatientID -> pseudonym.

Where: the PostgreSQL index's database (schema version 9, store/postgresql.py: every
node shares it), the SQLite index's file (``index.sqlite``), or, for the in-memory
index, ``outbox.sqlite`` beside the files, as routing's outbox and the change log do
(routing.outbox_path): a pseudonym handed out must survive a restart.

Pseudonyms are **deterministic**: ``PSN-`` + 16 base32 characters of
HMAC-SHA256(project secret, PatientID), so the same patient gets the same pseudonym in
every export of the project, even one made by another node before the row was written,
and no one without the secret can go back; each handed out is recorded (``generated``)
for re-identification by the admin scope (``GET /admin/deid/{project}/pseudonyms``).
A trial's own pseudonyms are loaded from a CSV (``PatientID,pseudonym`` per line; a
header line ``PatientID,...`` is skipped) and win over generated ones; a CSV that gives a
patient a second pseudonym, or one pseudonym to two patients, is refused whole (nothing
written).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import io
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS deid_project (
  project TEXT PRIMARY KEY,
  secret BLOB NOT NULL,
  created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS deid_pseudonym (
  project TEXT NOT NULL,
  PatientID TEXT NOT NULL,
  pseudonym TEXT NOT NULL,
  source TEXT NOT NULL,
  created REAL NOT NULL,
  PRIMARY KEY (project, PatientID),
  UNIQUE (project, pseudonym)
);
"""


def postgresql_schema() -> list[str]:
    """The tables in PostgreSQL (schema version 9, store/postgresql.py)."""
    return ["""
CREATE TABLE IF NOT EXISTS deid_project (
  project TEXT PRIMARY KEY,
  secret BYTEA NOT NULL,
  created DOUBLE PRECISION NOT NULL
)""", """
CREATE TABLE IF NOT EXISTS deid_pseudonym (
  project TEXT NOT NULL,
  PatientID TEXT NOT NULL,
  pseudonym TEXT NOT NULL,
  source TEXT NOT NULL,
  created DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (project, PatientID),
  UNIQUE (project, pseudonym)
)"""]


class PseudonymError(ValueError):
    """A CSV or a project name that cannot be taken; nothing was written."""


@dataclass(frozen=True, slots=True)
class Mapping:
    patient_id: str
    pseudonym: str
    source: str  # generated | csv


def generated_pseudonym(secret: bytes, patient_id: str) -> str:
    d = hmac.new(secret, b"pseudonym\0" + patient_id.encode("utf-8", "replace"), hashlib.sha256).digest()
    return "PSN-" + base64.b32encode(d[:10]).decode()  # 16 characters: fits LO and PN


def parse_csv(text: str) -> list[tuple[str, str]]:
    """``PatientID,pseudonym`` rows (a header starting ``PatientID`` skipped); PseudonymError
    naming the line of a bad row."""
    rows = []
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or all(not c.strip() for c in row):
            continue
        if n == 1 and row[0].strip().lower() == "patientid":
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise PseudonymError(f"line {n}: expected PatientID,pseudonym, got {row!r}")
        pid, psn = row[0].strip(), row[1].strip()
        if len(psn) > 64 or "\\" in psn:
            raise PseudonymError(f"line {n}: pseudonym {psn!r} is not a valid LO value (64 characters, no \\)")
        rows.append((pid, psn))
    return rows


class Pseudonyms:
    """The project secrets and pseudonym table of one database (SQLite or PostgreSQL)."""

    def __init__(self, connect, placeholder: str) -> None:
        self._connect = connect  # () -> context manager yielding a connection in a transaction
        self._p = placeholder
        # a project's secret and a patient's pseudonym never change once written: remembered
        self._secrets: dict[str, bytes] = {}
        self._known: dict[tuple[str, str], str] = {}

    @classmethod
    def sqlite(cls, path: Path | str) -> Pseudonyms:
        lock = threading.Lock()
        con = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        if str(path) != ":memory:":
            con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        con.executescript(SQLITE_SCHEMA)

        @contextmanager
        def transaction() -> Iterator:
            with lock:
                con.execute("BEGIN IMMEDIATE")
                try:
                    yield con
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
                con.execute("COMMIT")

        out = cls(transaction, "?")
        out.close = con.close  # type: ignore[method-assign]
        return out

    @classmethod
    def postgresql(cls, url: str) -> Pseudonyms:
        import psycopg

        from ..store.postgresql import _configure, migrate

        with psycopg.connect(url, autocommit=True) as con:
            _configure(con)
            migrate(con)

        @contextmanager
        def transaction() -> Iterator:
            with psycopg.connect(url, autocommit=True) as con:
                _configure(con)
                with con.transaction():
                    yield con

        return cls(transaction, "%s")

    def close(self) -> None:
        return None

    def _q(self, sql: str) -> str:
        return sql.replace("?", self._p)

    def secret(self, project: str) -> bytes:
        """The project's secret, made (32 random bytes) the first time a project is named."""
        if not project or len(project) > 64:
            raise PseudonymError("a project name of 1 to 64 characters is required")
        if project in self._secrets:
            return self._secrets[project]
        with self._connect() as con:  # two nodes naming a new project at once: one secret wins
            con.execute(self._q("INSERT INTO deid_project (project, secret, created) VALUES (?, ?, ?) "
                                "ON CONFLICT DO NOTHING"), (project, secrets.token_bytes(32), time.time()))
        with self._connect() as con:
            row = con.execute(self._q("SELECT secret FROM deid_project WHERE project = ?"), (project,)).fetchone()
        self._secrets[project] = bytes(row[0])
        return self._secrets[project]

    def pseudonym(self, project: str, patient_id: str) -> str:
        """The patient's pseudonym in the project: the table's, or a generated one recorded now."""
        if (project, patient_id) in self._known:
            return self._known[(project, patient_id)]
        secret = self.secret(project)
        value = generated_pseudonym(secret, patient_id)
        with self._connect() as con:  # a row already there (a CSV's, another node's) wins
            con.execute(self._q("INSERT INTO deid_pseudonym (project, PatientID, pseudonym, source, created) "
                                "VALUES (?, ?, ?, 'generated', ?) ON CONFLICT DO NOTHING"),
                        (project, patient_id, value, time.time()))
            row = con.execute(self._q("SELECT pseudonym FROM deid_pseudonym WHERE project = ? AND PatientID = ?"),
                              (project, patient_id)).fetchone()
        if row is None:  # the generated string is a CSV pseudonym of another patient
            raise PseudonymError(f"the generated pseudonym {value} is a CSV pseudonym of another patient "
                                 f"in project {project!r}")
        self._known[(project, patient_id)] = row[0]
        return row[0]

    def load_csv(self, project: str, text: str) -> int:
        """Take a caller's ``PatientID,pseudonym`` table; returns the rows added (rows already
        there with the same pseudonym count as nothing). All or nothing."""
        rows = parse_csv(text)
        seen_pid: dict[str, str] = {}
        seen_psn: dict[str, str] = {}
        for pid, psn in rows:
            if seen_pid.setdefault(pid, psn) != psn:
                raise PseudonymError(f"PatientID {pid!r} is given two pseudonyms: {seen_pid[pid]!r} and {psn!r}")
            if seen_psn.setdefault(psn, pid) != pid:
                raise PseudonymError(f"pseudonym {psn!r} is given to two patients: {seen_psn[psn]!r} and {pid!r}")
        self.secret(project)
        added = 0
        with self._connect() as con:
            for pid, psn in rows:
                row = con.execute(self._q("SELECT pseudonym FROM deid_pseudonym WHERE project = ? AND PatientID = ?"),
                                  (project, pid)).fetchone()
                if row is not None:
                    if row[0] != psn:
                        raise PseudonymError(f"PatientID {pid!r} already has pseudonym {row[0]!r} in project "
                                             f"{project!r} (the CSV says {psn!r})")
                    continue
                other = con.execute(self._q("SELECT PatientID FROM deid_pseudonym WHERE project = ? AND "
                                            "pseudonym = ?"), (project, psn)).fetchone()
                if other is not None:
                    raise PseudonymError(f"pseudonym {psn!r} already belongs to another patient in project "
                                         f"{project!r}")
                con.execute(self._q("INSERT INTO deid_pseudonym (project, PatientID, pseudonym, source, created) "
                                    "VALUES (?, ?, ?, 'csv', ?)"), (project, pid, psn, time.time()))
                added += 1
        return added

    def mapping(self, project: str) -> list[Mapping]:
        """The project's table (re-identification: the admin scope only)."""
        with self._connect() as con:
            rows = con.execute(self._q("SELECT PatientID, pseudonym, source FROM deid_pseudonym WHERE project = ? "
                                       "ORDER BY created, PatientID"), (project,)).fetchall()
        return [Mapping(*r) for r in rows]

    def projects(self) -> list[str]:
        with self._connect() as con:
            return [r[0] for r in con.execute("SELECT project FROM deid_project ORDER BY project").fetchall()]


def open_pseudonyms(settings) -> Pseudonyms:
    """The table where the index keeps its transactions (module docstring)."""
    if settings.index == "postgresql":
        return Pseudonyms.postgresql(settings.database_url)
    from ..routing import outbox_path

    return Pseudonyms.sqlite(outbox_path(Path(settings.data_dir), settings.index))

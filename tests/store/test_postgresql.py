"""What only the PostgreSQL index has: durable sessions whatever the URL asks,
the refusal of a server that may lose commits, the schema version table and
``dicomweb-server migrate``."""

from __future__ import annotations

import psycopg
import pytest

from dicomweb_server.cli import main
from dicomweb_server.settings import Settings
from dicomweb_server.store.postgresql import SCHEMA_VERSION, DatabaseRefused, PostgreSQLIndex, check_durable


def test_sessions_commit_synchronously_even_when_the_url_turns_it_off(pg_url):
    idx = PostgreSQLIndex(pg_url + "%20-csynchronous_commit%3Doff")
    try:
        for pool in (idx._pool, idx._placing, idx._writer):
            with pool.connection() as con:
                assert con.execute("SHOW synchronous_commit").fetchone()[0] == "on"
                assert con.execute("SHOW search_path").fetchone()[0].startswith("t_")  # the URL's other option kept
    finally:
        idx.close()


class _Shows:
    """A connection whose SHOW answers are given (fsync cannot be switched off per session)."""

    def __init__(self, **values: str) -> None:
        self.values = {"fsync": "on", "synchronous_commit": "on", "server_encoding": "UTF8", **values}

    def execute(self, sql: str):
        name = sql.split()[-1]
        return type("Cur", (), {"fetchone": lambda _self: (self.values[name],)})()


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("fsync", "off", "fsync = off"),
    ("synchronous_commit", "off", "synchronous_commit is off"),
    ("server_encoding", "SQL_ASCII", "UTF8"),
])
def test_a_server_that_may_lose_commits_is_refused(setting, value, message):
    check_durable(_Shows())
    with pytest.raises(DatabaseRefused, match=message):
        check_durable(_Shows(**{setting: value}))


def test_migrate_creates_then_finds_the_schema_current(pg_url, capsys):
    assert main(["migrate", "--database-url", pg_url]) == 0
    assert capsys.readouterr().out == f"schema version {SCHEMA_VERSION} (was 0)\n"
    assert main(["migrate", "--database-url", pg_url]) == 0
    assert capsys.readouterr().out == f"schema version {SCHEMA_VERSION} (already current)\n"
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [
            (v,) for v in range(1, SCHEMA_VERSION + 1)]  # one row per migration step
        assert con.execute("SELECT count(*) FROM instance").fetchone() == (0,)


def test_a_newer_schema_is_refused(pg_url, capsys):
    PostgreSQLIndex(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION + 1,))
    assert main(["migrate", "--database-url", pg_url]) == 1
    assert "upgrade the archive" in capsys.readouterr().err
    with pytest.raises(DatabaseRefused, match=f"version {SCHEMA_VERSION + 1}"):
        PostgreSQLIndex(pg_url)


def test_settings_need_a_database_url_for_postgresql(monkeypatch):
    with pytest.raises(ValueError, match="--database-url"):
        Settings(index="postgresql")
    monkeypatch.setenv("DICOMWEB_DATABASE_URL", "postgresql://u@h:5/db")
    assert Settings(index="postgresql").database_url == "postgresql://u@h:5/db"


def test_nul_in_a_stored_value_fails_nothing_and_matches_as_elsewhere(pg_url, tmp_path):
    """PostgreSQL text cannot hold NUL: without the mapping the whole batch (every
    request of a group commit) failed with DataError."""
    from dicomweb_server.dicom.instance import describe_instance
    from dicomweb_server.dicom.matching import parse_query
    from dicomweb_server.store.memory import MemoryIndex
    from tests.helpers import make_dataset

    recs = []
    for i, kw in enumerate(({"PatientName": "Doe\x00John", "StudyDescription": "a\x00b"}, {"PatientName": "Doe^Jo"})):
        path = tmp_path / f"{i}.dcm"
        make_dataset(**kw).save_as(path, enforce_file_format=True)
        recs.append(describe_instance(path))
    pg, mem = PostgreSQLIndex(pg_url), MemoryIndex()
    try:
        assert pg.add(recs) == mem.add(recs) == [True, True]
        for params in ({"PatientName": "doe*"}, {"PatientName": "doe?john"}, {"StudyDescription": "a?b"},
                       {"StudyDescription": "a*"}, {"PatientName": "john"}):
            q = parse_query("study", [*params.items(), ("fuzzymatching", "true")])
            got = [(h.study_uid, h.study_json) for h in pg.search(q)]
            assert got == [(h.study_uid, h.study_json) for h in mem.search(q)], params
        assert len(pg.search(parse_query("study", [("PatientName", "doe?john")]))) == 1
    finally:
        pg.close()

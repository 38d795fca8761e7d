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


def _stored(archive, n=1):
    from tests.helpers import make_dataset, to_bytes
    from dicomweb_server.dicom.multipart import SpooledPart

    parts = []
    for _ in range(n):
        ds = make_dataset()
        p = archive.blobs.spool / f"{ds.SOPInstanceUID}.part"
        p.write_bytes(to_bytes(ds))
        parts.append(SpooledPart(headers={}, path=p, size=p.stat().st_size, complete=True))
    return archive.store(parts)


def test_a_store_while_postgresql_is_down_fails_at_once_then_recovers(tmp_path, monkeypatch):
    """PostgreSQL stopped: a STOW-RS waited the placement pool's 600 s for a connection
    (its request, worker thread and folder locks held), then failed with a 500. Now it
    fails as soon as the pool's connection attempts fail, each instance with 0x0110,
    nothing spooled or stored; once PostgreSQL is back, stores succeed (no restart)."""
    import threading

    from dicomweb_server.archive import Archive
    from dicomweb_server.store import postgresql
    from tests.postgres import PostgresServer, skipped

    if skipped():
        pytest.skip("DICOMWEB_POSTGRES=skip")
    pg = PostgresServer()  # a server of its own: this test stops it
    data = pg.dir / "data"
    archive = Archive.open(Settings(data_dir=tmp_path, index="postgresql", database_url=pg.url))
    try:
        first = _stored(archive).stored
        assert len(first) == 1
        pg._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        result = {}
        worker = threading.Thread(target=lambda: result.update(outcome=_stored(archive, 2)), daemon=True)
        worker.start()
        worker.join(120)  # a bound, not a measurement: before the fix this waited 600 s
        assert not worker.is_alive(), "the store waited for the database"
        outcome = result["outcome"]
        assert outcome.stored == [] and [int(f.reason) for f in outcome.failed] == [0x0110, 0x0110]
        assert all("the index database cannot be reached" in f.message for f in outcome.failed)
        assert not list(archive.blobs.spool.iterdir())
        assert [p.rsplit("/", 1)[1] for p in archive.blobs.walk()] == [first[0].sop_instance_uid + ".dcm"]
        # searches and DELETEs: 503 with Retry-After at once (they waited the pool's 30 s,
        # then answered 500); the QIDO first, on the read pool's stale idle connection
        from starlette.testclient import TestClient

        from dicomweb_server.app import create_app

        with TestClient(create_app(archive.settings, archive=archive)) as c:
            prefix = archive.settings.prefix
            for r in (c.get(f"{prefix}/studies"), c.get(f"{prefix}/instances", params={"PatientID": "X"}),
                      c.delete(f"{prefix}/studies/{first[0].study_uid}")):
                assert (r.status_code, r.headers.get("retry-after")) == (503, "5"), r.text
                assert "the index database cannot be reached" in r.json()["detail"]
        # the outbox (routing, storage commitment reports, background jobs) too: at once,
        # not PoolTimeout after 30 s (the app's shutdown above waited that for its jobs' queue)
        from dicomweb_server.routing.outbox_pg import PostgreSQLOutbox
        from dicomweb_server.store.base import IndexUnavailable

        with pytest.raises(IndexUnavailable, match="cannot be reached"):
            PostgreSQLOutbox(pg.url)
        pg._run("pg_ctl", "-D", str(data), "-l", str(pg.dir / "log"), "-w", "-t", "60", "-o",
                f"-c listen_addresses=127.0.0.1 -p {pg.port} -k {pg.dir}", "start")
        assert archive.index.locate(first[0].sop_instance_uid) is not None  # reads on stale pooled
        assert archive.index.count() == 1  # connections are tried again (they were 500s)
        assert len(_stored(archive).stored) == 1  # recovered, same process
        assert archive.index.count() == 2
    finally:
        archive.close()
        pg.stop()


def test_a_placement_session_lost_after_the_commit_keeps_the_store(pg_url, tmp_path, monkeypatch):
    """The placement locks' session killed (PostgreSQL restart, idle timeout) after the
    index commit: the unlock's OperationalError escaped and the committed store answered
    500. The session's locks died with it; the store is acknowledged."""
    from dicomweb_server import archive as archive_module
    from dicomweb_server.archive import Archive

    archive = Archive.open(Settings(data_dir=tmp_path, index="postgresql", database_url=pg_url))
    real = archive_module.faults.point

    def kill_placing_session(step):
        if step == "indexed":
            with psycopg.connect(pg_url, autocommit=True) as con:
                killed = con.execute("SELECT pg_terminate_backend(pid) FROM pg_locks "
                                     "WHERE locktype = 'advisory' AND objid > 0 AND classid = %s",
                                     (0x44434D50,)).fetchall()
                assert killed == [(True,)]
        real(step)

    monkeypatch.setattr(archive_module.faults, "point", kill_placing_session)
    try:
        outcome = _stored(archive)
        assert len(outcome.stored) == 1 and not outcome.failed
        monkeypatch.setattr(archive_module.faults, "point", real)
        assert len(_stored(archive).stored) == 1  # the pool replaced the lost connection
        assert archive.index.count() == 2
    finally:
        archive.close()

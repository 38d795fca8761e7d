"""Where the outbox lives and what its leases promise, on each SQL index: its rows
commit or roll back with the instance rows (one transaction); with PostgreSQL they are
in the database every node shares (no file in a node's folder), claims of one
destination by several nodes never overlap and stay within ``concurrency``, and a
lease ends on the database's clock, not on a node's."""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.routing import open_outbox
from dicomweb_server.routing.outbox import Entry, Settlement
from dicomweb_server.settings import Settings
from dicomweb_server.store.postgresql import MIGRATIONS, SCHEMA_VERSION, PostgreSQLIndex
from tests.helpers import make_dataset
from tests.routing.conftest import Backend

ROUTES = ('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
          '[[rules]]\ndestinations = ["pacs"]\n')


def _open(tmp_path, backend: Backend, folder: str = "data") -> Archive:
    routes = tmp_path / "routes.toml"
    routes.write_text(ROUTES)
    return Archive.open(Settings(data_dir=tmp_path / folder, index=backend.index, routes_file=routes,
                                 **backend.settings))


def _store(archive: Archive, n: int):
    parts = []
    for _ in range(n):
        path = archive.blobs.spool / f"{len(os.listdir(archive.blobs.spool))}.dcm"
        make_dataset().save_as(path, enforce_file_format=True)
        parts.append(SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True))
    return archive.store(parts)


def test_outbox_rows_roll_back_with_the_instance_rows(tmp_path, backend):
    """A failure after routing's hook, before the index commits: neither the instance
    nor its forward stays (before, the PostgreSQL index's forwards were committed to
    data/outbox.sqlite first, and stayed owed for an instance never stored)."""
    archive = _open(tmp_path, backend)
    try:
        assert len(_store(archive, 2).stored) == 2

        def later_hook(con, records, added):
            raise OSError(28, "No space left on device")

        archive.index.add_write_hook(later_hook)  # runs after routing's own hook, in the same transaction
        failed = _store(archive, 1)
        assert not failed.stored and len(failed.failed) == 1
        assert archive.index.count() == 2
        assert [r["state"] for r in archive.routing.outbox.rows()] == ["pending", "pending"]
    finally:
        archive.close()


def test_postgresql_outbox_is_in_the_database_every_node_shares(tmp_path, pg_url):
    pg = Backend("postgresql", pg_url)
    a, b = _open(tmp_path, pg, "node-a"), _open(tmp_path, pg, "node-b")  # two folders: two machines
    try:
        stored = _store(a, 3).stored
        assert not list((tmp_path / "node-a").glob("outbox.sqlite*"))
        assert sorted(r["SOPInstanceUID"] for r in b.routing.outbox.rows()) == sorted(s.sop_instance_uid
                                                                                     for s in stored)
        assert b.routing.outbox.stats()["pacs"]["pending"] == 3
    finally:
        a.close()
        b.close()


def test_claims_of_two_nodes_never_overlap_and_stay_within_concurrency(tmp_path, backend):
    """Two outboxes on one index (two worker processes, or two nodes on PostgreSQL)."""
    a = _open(tmp_path, backend)
    b_outbox = open_outbox(a.settings, a.committer.writer)
    try:
        _store(a, 6)
        rows_a, _ = a.routing.outbox.claim("pacs", 2, "host-a:1:x:0", 60, 2)
        rows_b, _ = b_outbox.claim("pacs", 2, "host-b:1:x:0", 60, 2)
        assert len(rows_a) == len(rows_b) == 2 and not {r.sop_uid for r in rows_a} & {r.sop_uid for r in rows_b}
        assert b_outbox.claim("pacs", 2, "host-b:1:x:1", 60, 2) == ([], pytest.approx(time.time(), abs=30))
        # A settles: a lease is free, B may claim the last two; a row settled by A is not B's to touch
        a.routing.outbox.settle(Settlement([r.id for r in rows_a], [], [], []), "host-a:1:x:0")
        b_outbox.settle(Settlement([], [], [(rows_a[0].id, "not mine")], []), "host-b:1:x:0")
        rows_c, _ = b_outbox.claim("pacs", 5, "host-b:1:x:2", 60, 2)
        assert len(rows_c) == 2
        assert {r["state"] for r in b_outbox.rows() if r["id"] in {x.id for x in rows_a}} == {"delivered"}
    finally:
        b_outbox.close()
        a.close()


def test_a_lease_ends_on_the_database_clock_not_the_nodes(tmp_path, pg_url, monkeypatch):
    """Node B's clock runs 10 minutes ahead of A's: it still sees A's 60 s lease as
    live (on the database's clock), so it does not send A's batch a second time."""
    a = _open(tmp_path, Backend("postgresql", pg_url))
    b_outbox = open_outbox(a.settings)
    try:
        _store(a, 1)
        rows_a, _ = a.routing.outbox.claim("pacs", 5, "host-a:1:x:0", 60, 2)
        assert len(rows_a) == 1
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 600)
        assert b_outbox.claim("pacs", 5, "host-b:1:x:0", 60, 2)[0] == []
        monkeypatch.setattr(time, "time", real)
        # the retry time A asks for is A's clock: kept as "due in 100 s" on the database's clock
        a.routing.outbox.settle(Settlement([], [(rows_a[0].id, real() + 100, "HTTP 503")], [], []), "host-a:1:x:0")
        assert b_outbox.claim("pacs", 5, "host-b:1:x:1", 60, 2)[1] == pytest.approx(real() + 100, abs=5)
    finally:
        b_outbox.close()
        a.close()


def test_a_version_1_database_migrates_to_the_outbox(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as con:  # what an archive before the outbox left
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for statement in MIGRATIONS[1]():
            con.execute(statement)
        con.execute("INSERT INTO schema_version VALUES (1)")
    PostgreSQLIndex(pg_url).close()
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
        assert SCHEMA_VERSION >= 2
        assert con.execute("SELECT count(*) FROM outbox").fetchone() == (0,)


def test_a_row_settled_while_another_node_claims_it_is_not_sent_again(tmp_path, pg_url, monkeypatch):
    """A's lease ran out while it was still sending; B's claim picks the row; A records the
    delivery before B's claim writes its lease (PostgreSQL: A's settle does not wait for
    the claim lock). B must not take the row: the instance arrived already."""
    a = _open(tmp_path, Backend("postgresql", pg_url))
    b_outbox = open_outbox(a.settings)
    try:
        _store(a, 1)
        (row,), _ = a.routing.outbox.claim("pacs", 5, "host-a:1:x:0", 0.001, 2)  # a lease that ends at once
        time.sleep(0.05)
        many = type(b_outbox)._many

        def settle_first(con, sql, params):
            if "SET _lease_owner = %s, _lease_until" in sql:  # B's lease, after B chose the row
                a.routing.outbox.settle(Settlement([row.id], [], [], []), "host-a:1:x:0")
            return many(con, sql, params)

        monkeypatch.setattr(b_outbox, "_many", settle_first)
        assert b_outbox.claim("pacs", 5, "host-b:1:x:0", 60, 2)[0] == []
        [r] = b_outbox.rows()
        assert (r["state"], r["attempts"]) == ("delivered", 1)
    finally:
        b_outbox.close()
        a.close()

"""The outbox in the PostgreSQL index's database (``--index postgresql``): the
table every node shares (schema version 2, store/postgresql.py), so that the
forwards owed are one queue for the whole archive, whichever node stored the
instance, and survive any node.

- Rows owed by a store are inserted by the index's write hook on the index's own
  connection, inside the transaction that indexes the instance (store/postgresql.py
  ``PostgreSQLIndex.add``): the instance and its forwards commit together
  (``synchronous_commit = on``), or neither does.
- Claims of one destination are serialised across nodes by a transaction
  advisory lock on the destination's name, so the bound on live leases
  (``concurrency``) and "one instance in one live lease per destination" hold for
  all nodes together.
- Leases are measured on the database server's clock (``clock_timestamp()``), not
  the nodes': two nodes whose clocks differ still agree on when a lease ends, so one
  never takes over a batch the other is still sending.
- A node killed with its leases held: a forwarder on the same host frees them when
  it starts (``reap``, by pid); any other node takes the rows over when the lease
  expires (``lease`` in the routes file).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..store.postgresql import READ_WAIT, _configure, _key, _pooled, check_durable, migrate
from .outbox import Outbox

_CLAIM_LOCK = "dicomweb-outbox:"  # advisory lock key of a destination's claims: _key(prefix + name)


class PostgreSQLOutbox(Outbox):
    """The ``outbox`` table of a PostgreSQL index database, with its own small pool."""

    placeholder = "%s"

    def __init__(self, url: str, pool_size: int = 4) -> None:
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, kwargs={"autocommit": True},
                                    configure=_configure, check=ConnectionPool.check_connection, open=True,
                                    name="dicomweb-outbox")
        try:
            with self._connection() as con:
                check_durable(con)
                migrate(con)  # the table may be new to this database (an archive that never routed)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def _connection(self) -> Iterator:
        """A pooled connection, as the index takes its own (store/postgresql.py ``_pooled``):
        IndexUnavailable at once when the database cannot be reached, not after the pool's
        30 s wait (a DIMSE listener stopping with the database down waited that twice:
        its storage commitment thread's claim, then the release of its leases; an app
        stopping waited for its background jobs' runner opening its queue)."""
        con = _pooled(self._pool, READ_WAIT)
        try:
            yield con
        finally:
            self._pool.putconn(con)  # (a broken connection is discarded by the pool)

    @contextmanager
    def _reading(self) -> Iterator:
        with self._connection() as con:
            yield con

    @contextmanager
    def _transaction(self, hooked: bool = False) -> Iterator:
        # no index lock to respect: PostgreSQL's row locks and the claim lock serialise
        with self._connection() as con, con.transaction():
            yield con

    def _now(self, con) -> float:
        return con.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

    def _claim_lock(self, con, destination: str) -> None:
        con.execute("SELECT pg_advisory_xact_lock(%s)", (_key(_CLAIM_LOCK + destination),))

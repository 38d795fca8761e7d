"""The ``jobs`` table: each background job's parameters, state, checkpoint and counts
(jobs/__init__.py, jobs/runner.py), beside the routing outbox whose row runs it: in
``index.sqlite`` (SQLite index), ``outbox.sqlite`` (in-memory index) or the PostgreSQL
index's database (schema version 13, store/postgresql.py).

States: ``queued`` (owed: its outbox row is pending), ``running`` (a worker holds the
row's lease), ``done``, ``failed``, ``cancelled``. A job whose worker died is still
``running`` here until another worker takes its row over and runs it again from its
checkpoint; the row's lease, not this column, decides who runs it.
"""

from __future__ import annotations

import secrets
import time

import orjson

from ..routing.outbox import Outbox

_COLUMNS = ("id", "kind", "params", "owner", "restricted", "state", "created", "started", "updated",
            "finished", "checkpoint", "progress", "result", "error", "cancel", "attempts")
_SCHEMA = """CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  params TEXT NOT NULL,
  owner TEXT,
  restricted INTEGER NOT NULL DEFAULT 0,
  state TEXT NOT NULL DEFAULT 'queued',
  created {real} NOT NULL,
  started {real},
  updated {real},
  finished {real},
  checkpoint TEXT,
  progress TEXT,
  result TEXT,
  error TEXT,
  cancel INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created)"

#: states a job does not leave
FINAL = frozenset({"done", "failed", "cancelled"})


def postgresql_schema() -> list[str]:
    return [_SCHEMA.format(real="double precision"), _INDEX]


def destination(kind: str) -> str:
    """The outbox destination of a job kind's rows (routes files cannot name ``job:``
    destinations: routing/rules.py)."""
    return f"job:{kind}"


class JobStore:
    """The statements on the ``jobs`` table, on the outbox's connections and transactions
    (SQLite or PostgreSQL alike)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        if outbox.placeholder == "?":  # SQLite: created here (PostgreSQL: by its migration)
            with outbox._transaction() as con:
                con.execute(_SCHEMA.format(real="REAL"))
                con.execute(_INDEX)

    def _sql(self, text: str) -> str:
        return self.outbox._sql(text)

    def submit(self, kind: str, params: dict, owner: str | None, restricted: bool) -> str:
        """A new job, queued: its row here and its outbox row in one durable transaction."""
        job_id = secrets.token_hex(8)
        with self.outbox._transaction() as con:
            now = time.time()
            con.execute(self._sql("INSERT INTO jobs (id, kind, params, owner, restricted, state, created, updated, "
                                  "progress) VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?)"),
                        (job_id, kind, orjson.dumps(params).decode(), owner, int(restricted), now, now,
                         orjson.dumps({"total": None, "done": 0, "failed": 0, "skipped": 0}).decode()))
            self.outbox.insert_job(destination(kind), kind, job_id, "", 0.0, con)
        return job_id

    def get(self, job_id: str) -> dict | None:
        with self.outbox._reading() as con:
            row = con.execute(self._sql(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?"),
                              (job_id,)).fetchone()
        return _job(row) if row is not None else None

    def list(self, owner: str | None = None, limit: int = 100, exclude_kinds: tuple[str, ...] = ()) -> list[dict]:
        """The newest jobs first; only ``owner``'s when given; none of ``exclude_kinds``."""
        clauses, params = [], []
        if owner is not None:
            clauses.append("owner = ?")
            params.append(owner)
        if exclude_kinds:
            clauses.append(f"kind NOT IN ({', '.join('?' * len(exclude_kinds))})")
            params.extend(exclude_kinds)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        with self.outbox._reading() as con:
            rows = con.execute(self._sql(f"SELECT {', '.join(_COLUMNS)} FROM jobs {where}ORDER BY created DESC "
                                         "LIMIT ?"), (*params, limit)).fetchall()
        return [_job(r) for r in rows]

    def start(self, job_id: str) -> dict | None:
        """Mark a job running (one attempt more) and return it; None when it is unknown."""
        with self.outbox._transaction() as con:
            now = time.time()
            con.execute(self._sql("UPDATE jobs SET state = 'running', started = coalesce(started, ?), updated = ?, "
                                  "attempts = attempts + 1 WHERE id = ? AND state IN ('queued', 'running')"),
                        (now, now, job_id))
        return self.get(job_id)

    def _held(self, lease_owner: str | None) -> tuple[str, tuple]:
        """The condition that the job's queue row is still leased by ``lease_owner`` (a
        runner that lost its lease writes nothing more); none when None."""
        if lease_owner is None:
            return "", ()
        return (" AND EXISTS (SELECT 1 FROM outbox WHERE outbox.SOPInstanceUID = jobs.id AND "
                "outbox.destination = 'job:' || jobs.kind AND outbox._lease_owner = ?)"), (lease_owner,)

    def save(self, job_id: str, checkpoint: dict, progress: dict, lease_owner: str | None = None
             ) -> tuple[bool, bool]:
        """Make the checkpoint and counts durable (only while ``lease_owner`` holds the job's
        queue row, when given); returns (cancelled, written)."""
        cond, extra = self._held(lease_owner)
        with self.outbox._transaction() as con:
            written = con.execute(self._sql("UPDATE jobs SET checkpoint = ?, progress = ?, updated = ? WHERE id = ?"
                                            + cond),
                                  (orjson.dumps(checkpoint).decode(), orjson.dumps(progress).decode(), time.time(),
                                   job_id, *extra)).rowcount
            row = con.execute(self._sql("SELECT cancel FROM jobs WHERE id = ?"), (job_id,)).fetchone()
        return bool(row and row[0]), written > 0

    def cancelled(self, job_id: str) -> bool:
        with self.outbox._reading() as con:
            row = con.execute(self._sql("SELECT cancel FROM jobs WHERE id = ?"), (job_id,)).fetchone()
        return bool(row and row[0])

    def requeue(self, job_id: str, error: str | None = None, lease_owner: str | None = None) -> None:
        """Back to ``queued`` (stopped by a shutdown, or to be tried again after ``error``),
        while ``lease_owner`` (when given) still holds its queue row."""
        cond, extra = self._held(lease_owner)
        with self.outbox._transaction() as con:
            con.execute(self._sql("UPDATE jobs SET state = 'queued', error = coalesce(?, error), updated = ? "
                                  "WHERE id = ? AND state IN ('queued', 'running')" + cond),
                        (error, time.time(), job_id, *extra))

    def finish(self, job_id: str, state: str, result: dict | None = None, error: str | None = None,
               progress: dict | None = None, lease_owner: str | None = None) -> bool:
        """The job's final state, while ``lease_owner`` (when given) still holds its queue
        row; returns whether it was written (False: another runner has the job now)."""
        assert state in FINAL
        cond, extra = self._held(lease_owner)
        with self.outbox._transaction() as con:
            now = time.time()
            return con.execute(self._sql(
                "UPDATE jobs SET state = ?, result = ?, error = ?, finished = ?, updated = ?, "
                "progress = coalesce(?, progress) WHERE id = ?" + cond),
                (state, orjson.dumps(result).decode() if result is not None else None, error, now, now,
                 orjson.dumps(progress).decode() if progress is not None else None, job_id, *extra)).rowcount > 0

    def cancel(self, job_id: str) -> str | None:
        """Ask a job to stop: a queued one is cancelled now, a running one at its next
        checkpoint. Returns its state after the request (None: unknown job)."""
        with self.outbox._transaction() as con:
            now = time.time()
            con.execute(self._sql("UPDATE jobs SET cancel = 1, updated = ? WHERE id = ? AND state NOT IN "
                                  "('done', 'failed', 'cancelled')"), (now, job_id))
            con.execute(self._sql("UPDATE jobs SET state = 'cancelled', finished = ? WHERE id = ? AND "
                                  "state = 'queued'"), (now, job_id))
            row = con.execute(self._sql("SELECT state FROM jobs WHERE id = ?"), (job_id,)).fetchone()
        return row[0] if row else None


def _job(row) -> dict:
    job = dict(zip(_COLUMNS, row))
    for key in ("params", "checkpoint", "progress", "result"):
        if job[key] is not None:
            job[key] = orjson.loads(job[key])
    job["restricted"] = bool(job["restricted"])
    job["cancel"] = bool(job["cancel"])
    return job

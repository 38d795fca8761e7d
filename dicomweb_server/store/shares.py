"""Share links (api/shares.py, docs/share-links.md): one row per link, in the
index's database (the in-memory index's journal). The token itself is never stored:
only its SHA-256 (hex), by which a request's token is looked up (a unique index).

Statements are written with ``?`` for :data:`changes.Execute` (the caller translates).
"""

from __future__ import annotations

from dataclasses import dataclass

from .changes import Execute

_COLUMNS = "id, token_sha256, StudyInstanceUID, created, expires, creator, revoked"


@dataclass(frozen=True, slots=True)
class Share:
    id: str
    token_sha256: str
    study_uid: str
    created: float  # seconds since the epoch
    expires: float
    creator: str | None
    revoked: bool = False

    def valid(self, now: float) -> bool:
        return not self.revoked and now < self.expires


def sqlite_schema() -> str:
    return """
CREATE TABLE IF NOT EXISTS share (
  id TEXT PRIMARY KEY,
  token_sha256 TEXT NOT NULL UNIQUE,
  StudyInstanceUID TEXT NOT NULL,
  created REAL NOT NULL,
  expires REAL NOT NULL,
  creator TEXT,
  revoked INTEGER NOT NULL DEFAULT 0
);
"""


def postgresql_schema() -> list[str]:
    """The table in PostgreSQL (store/postgresql.py's migration)."""
    text = 'TEXT COLLATE "C"'
    return [f"""
CREATE TABLE IF NOT EXISTS share (
  id {text} PRIMARY KEY,
  token_sha256 {text} NOT NULL UNIQUE,
  StudyInstanceUID {text} NOT NULL,
  created DOUBLE PRECISION NOT NULL,
  expires DOUBLE PRECISION NOT NULL,
  creator TEXT,
  revoked INTEGER NOT NULL DEFAULT 0
)"""]


def _share(row) -> Share:
    return Share(row[0], row[1], row[2], float(row[3]), float(row[4]), row[5], bool(row[6]))


def put(x: Execute, share: Share) -> None:
    x(f"INSERT INTO share ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
      (share.id, share.token_sha256, share.study_uid, share.created, share.expires, share.creator,
       int(share.revoked)))


def by_token(x: Execute, token_sha256: str) -> Share | None:
    row = x(f"SELECT {_COLUMNS} FROM share WHERE token_sha256 = ?", (token_sha256,)).fetchone()
    return _share(row) if row is not None else None


def by_id(x: Execute, share_id: str) -> Share | None:
    row = x(f"SELECT {_COLUMNS} FROM share WHERE id = ?", (share_id,)).fetchone()
    return _share(row) if row is not None else None


def every(x: Execute) -> list[Share]:
    """Every link, newest first."""
    return [_share(r) for r in x(f"SELECT {_COLUMNS} FROM share ORDER BY created DESC, id", ()).fetchall()]


def revoke(x: Execute, share_id: str) -> bool:
    """Revoke a link; False when there is none by that id."""
    return x("UPDATE share SET revoked = 1 WHERE id = ?", (share_id,)).rowcount == 1

"""The SQLite index refuses, at start, a SQLite library without ``INSERT ... RETURNING``
(3.35), which its ``Index.add`` uses: not every store failing later."""

from __future__ import annotations

import sqlite3

import pytest

from dicomweb_server.store import sqlite as sqlite_index


def test_an_older_sqlite_is_refused_at_start(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    with pytest.raises(RuntimeError, match=r"needs SQLite 3\.35\.0 or later; this Python uses 3\.34\.1"):
        sqlite_index.SQLiteIndex(tmp_path / "index.sqlite")
    assert not (tmp_path / "index.sqlite").exists()


def test_this_pythons_sqlite_is_new_enough():
    assert sqlite3.sqlite_version_info >= sqlite_index.MIN_SQLITE

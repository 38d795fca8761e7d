"""Routing tests run on each index whose transaction holds the outbox: SQLite
(``index.sqlite``), PostgreSQL (its database, shared by nodes) and, where a test
says so, the in-memory index (``outbox.sqlite``). A test takes the ``backend``
fixture; ``@pytest.mark.parametrize("backend", [...], indirect=True)`` chooses
other kinds than the default two."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.routing.sink import Sink

FAST = """
[delivery]
batch_size = 5
backoff_base = 0.05
backoff_max = 0.3
max_attempts = 100000
poll_interval = 0.2
timeout = 10
"""


def write_routes(path: Path, sink_url: str, extra: str = "", match: str = "") -> Path:
    path.write_text(f"""
[[destinations]]
name = "sink"
stow_url = "{sink_url}"

[[rules]]
name = "everything"
{match}
destinations = ["sink"]
{extra}
{FAST}""")
    return path


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll until ``predicate()`` is true (a deadline, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def sink(tmp_path):
    s = Sink(tmp_path / "sink").start()
    yield s
    s.stop()


@dataclass(frozen=True)
class Backend:
    """An index kind and what a server needs to open it."""

    index: str
    database_url: str | None = None

    @property
    def settings(self) -> dict:
        """Settings fields (``Settings(index=..., **backend.settings)``)."""
        return {"database_url": self.database_url} if self.database_url else {}

    @property
    def args(self) -> list[str]:
        """Command-line flags for a ``dicomweb-server`` command."""
        return ["--index", self.index] + (["--database-url", self.database_url] if self.database_url else [])

    def env(self, monkeypatch) -> None:
        """Server processes started from here open this index (``DICOMWEB_DATABASE_URL``)."""
        if self.database_url:
            monkeypatch.setenv("DICOMWEB_DATABASE_URL", self.database_url)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request) -> Backend:
    if request.param == "postgresql":
        return Backend("postgresql", request.getfixturevalue("pg_url"))
    return Backend(request.param)


ALL = ["sqlite", "memory", "postgresql"]  # for tests that cover the in-memory index's outbox.sqlite too

from __future__ import annotations

import httpx
import pytest

from tests.helpers import LiveServer
from tests.postgres import PostgresServer, skipped


def pytest_generate_tests(metafunc) -> None:
    """``index_kind``: sqlite and memory everywhere, postgresql too in the modules
    that say ``POSTGRESQL = True`` (the conformance cases: cheap enough)."""
    if "index_kind" in metafunc.fixturenames:
        kinds = ["sqlite", "memory"] + (["postgresql"] if getattr(metafunc.module, "POSTGRESQL", False) else [])
        metafunc.parametrize("index_kind", kinds)


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the whole run (tests/postgres.py)."""
    if skipped():
        pytest.skip("DICOMWEB_POSTGRES=skip")
    srv = PostgresServer()
    yield srv
    srv.stop()


@pytest.fixture
def pg_url(postgres) -> str:
    """A database URL whose tables land in a new, empty schema."""
    return postgres.fresh_url()


@pytest.fixture
def server(request, tmp_path, index_kind):
    extra = {"database_url": request.getfixturevalue("pg_url")} if index_kind == "postgresql" else {}
    srv = LiveServer(tmp_path / "data", index_kind, **extra).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client

from __future__ import annotations

import httpx
import pytest

from tests.helpers import LiveServer
from tests.postgres import PostgresServer, skipped


def pytest_generate_tests(metafunc) -> None:
    """``index_kind``: sqlite and memory everywhere, postgresql too in the modules
    that say ``POSTGRESQL = True`` (the conformance cases: cheap enough), and
    ``sqlite+s3`` (SQLite index, instances in a local S3 server: tests/s3server.py)
    in the modules that say ``S3 = True``."""
    if "index_kind" in metafunc.fixturenames:
        kinds = ["sqlite", "memory"] + (["postgresql"] if getattr(metafunc.module, "POSTGRESQL", False) else [])
        kinds += ["sqlite+s3"] if getattr(metafunc.module, "S3", False) else []
        metafunc.parametrize("index_kind", kinds)


@pytest.fixture(scope="session")
def s3_server():
    """One local S3-compatible server (moto) for the whole run; a bucket per test."""
    from tests.s3server import S3Server

    srv = S3Server()
    yield srv
    srv.stop()


@pytest.fixture
def s3_storage(s3_server) -> dict:
    """Settings that keep instances in a new, empty bucket of the local S3 server."""
    from tests.s3server import storage_settings

    return storage_settings(s3_server)


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
    index, _, storage = index_kind.partition("+")
    extra = {"database_url": request.getfixturevalue("pg_url")} if index == "postgresql" else {}
    if storage == "s3":
        extra.update(request.getfixturevalue("s3_storage"))
    srv = LiveServer(tmp_path / "data", index, **extra).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client

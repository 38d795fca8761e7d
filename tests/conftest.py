from __future__ import annotations

import httpx
import pytest

from tests.helpers import LiveServer
from tests.postgres import PostgresServer, skipped


#: modules (or node id prefixes) whose tests run alone (scripts/test.sh runs ``-m "not serial"``
#: on every core with pytest-xdist, then ``-m serial`` in one process): SIGKILLs at random
#: moments, real SIGKILLs with deadlines, load tests and timing assertions, which a second
#: test's load distorts; every test using the ``browser`` fixture (tests/interop) too. Not
#: here: kills at deterministic fault points with no deadline a loaded machine misses
#: (reliability/test_update_crash.py, test_reject_crash.py, the write path steps of
#: test_crash.py), the interop tests without a browser (the PyPI client, the viewer's
#: serving) and the benchmarks' smoke tests (their figures are not checked)
SERIAL = (
    "tests/reliability/test_crash.py::test_kill_at_random_moments", "tests/reliability/test_lifecycle.py",
    "tests/reliability/test_process_tree.py", "tests/reliability/test_resources.py",
    "tests/routing/test_crash.py", "tests/routing/test_orphans.py", "tests/routing/test_webhook.py",
    "tests/dimse/test_reactor.py", "tests/dimse/test_commitment.py", "tests/dimse/test_respawn.py", "tests/loadtests/",
    "tests/interop/test_oidc_login.py", "tests/interop/test_ui_token_renewal.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.nodeid.startswith(SERIAL) or "browser" in item.fixturenames:
            item.add_marker(pytest.mark.serial)


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

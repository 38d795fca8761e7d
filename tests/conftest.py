from __future__ import annotations

import httpx
import pytest

from tests.helpers import LiveServer


@pytest.fixture(params=["sqlite", "memory"])
def index_kind(request) -> str:
    return request.param


@pytest.fixture
def server(tmp_path, index_kind):
    srv = LiveServer(tmp_path / "data", index_kind).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client

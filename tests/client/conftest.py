"""Fixtures for the client tests.

Every client test that only uses the public API takes the ``api`` fixture: a
client (sync or async: the fixture is parametrised over both) wrapped so that
tests can ``await`` any method. Its server is chosen by ``dicomweb_url``:

* by default, an in-memory fake DICOMweb server (``fakeserver.FakeArchive``)
  reached through ``httpx.MockTransport``;
* with ``DICOMWEB_TEST_URL=http://127.0.0.1:8080`` in the environment, or a
  ``dicomweb_url`` fixture overridden in another conftest (e.g. one that
  starts uvicorn on a free port and returns its URL), the same tests drive a
  real server over real HTTP. Tests that inspect the fake's recorded requests
  take the ``archive`` fixture and are skipped against a real server.
"""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from pydicom.data import get_testdata_file

from dicomweb_client import AsyncDICOMwebClient, DICOMwebClient

from .fakeserver import FAKE_URL, FakeArchive

SAMPLE_FILES = ["CT_small.dcm", "MR_small.dcm", "rtdose.dcm", "test-SR.dcm"]


def sample_path(name: str) -> Path:
    p = get_testdata_file(name)
    assert p is not None, name
    return Path(p)


class Runner:
    """Calls a sync or async client the same way: ``await runner.method(...)``.

    ``iter_*`` methods are drained into a list, so both clients return the
    same values.
    """

    def __init__(self, client, is_async: bool) -> None:
        self.client = client
        self.is_async = is_async
        self.mode = "async" if is_async else "sync"

    def __getattr__(self, name):
        fn = getattr(self.client, name)
        if not callable(fn):
            return fn
        if name.startswith("iter_"):
            async def call_iter(*args, **kwargs):
                it = fn(*args, **kwargs)
                if self.is_async:
                    return [x async for x in it]
                return list(it)

            return call_iter

        async def call(*args, **kwargs):
            result = fn(*args, **kwargs)
            if self.is_async:
                result = await result
            return result

        return call


@pytest.fixture
def dicomweb_url() -> str:
    """Base URL of the server under test (the fake, unless DICOMWEB_TEST_URL is set)."""
    return os.environ.get("DICOMWEB_TEST_URL", FAKE_URL)


@pytest.fixture
def real_server(dicomweb_url) -> bool:
    return dicomweb_url != FAKE_URL


@pytest.fixture
def archive(dicomweb_url, real_server) -> FakeArchive:
    """The fake server (skips the test when a real server is under test)."""
    if real_server:
        pytest.skip("inspects the fake server's recorded requests")
    return FakeArchive(dicomweb_url)


@pytest.fixture
def make_client(dicomweb_url, real_server, request):
    """Factory: ``make_client(is_async, **kwargs)`` -> client on the server under test."""
    created = []

    def make(is_async: bool, server: FakeArchive | None = None, url: str | None = None, **kwargs):
        if not real_server and "client" not in kwargs and "transport" not in kwargs:
            server = server or request.getfixturevalue("archive")
            kwargs["transport"] = httpx.MockTransport(server.handler)
        kwargs.setdefault("backoff_factor", 0.0)
        cls = AsyncDICOMwebClient if is_async else DICOMwebClient
        client = cls(url or dicomweb_url, **kwargs)
        created.append(client)
        return client

    yield make
    for c in created:
        if isinstance(c, DICOMwebClient):
            c.close()


@pytest.fixture(params=["sync", "async"])
async def api(request, make_client, real_server):
    """A Runner over a sync or an async client (both are tested)."""
    is_async = request.param == "async"
    server = None if real_server else request.getfixturevalue("archive")
    client = make_client(is_async, server)
    runner = Runner(client, is_async)
    yield runner
    if is_async:
        await client.aclose()


@pytest.fixture
def loaded(archive):
    """The archive holding the sample files; returns {file name: Dataset}."""
    return {name: archive.add_file(str(sample_path(name))) for name in SAMPLE_FILES}


def uids(ds):
    return str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID), str(ds.SOPInstanceUID)

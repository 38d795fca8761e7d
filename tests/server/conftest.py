"""Fixtures of the web-layer tests that need no server process: the app on an
in-process SQLite archive, driven by Starlette's TestClient."""

from __future__ import annotations

import pytest
from pydicom.dataset import Dataset
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import multipart, to_bytes


@pytest.fixture
def app_client(tmp_path):
    archive = Archive.open(Settings(data_dir=tmp_path, index="sqlite"))
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def stored(client: TestClient, ds: Dataset) -> str:
    """STOW ``ds``; its instance URL (path)."""
    body, ctype = multipart([to_bytes(ds)])
    r = client.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"

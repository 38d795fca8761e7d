"""WADO-RS instance (PS3.18 §10.4.1.1.1) of a file that is all in the page cache: read on
the event loop (retrieve.cached_file, ``preadv2`` with ``RWF_NOWAIT``), no worker-thread
hand-off (issue 33); the same answer as through the thread, and a file that would need a
disk read, is gone or is not the size recorded is handled as before."""

from __future__ import annotations

import os

import pytest

from dicomweb_server import retrieve
from dicomweb_server.api import wado
from tests.helpers import make_dataset, to_bytes
from tests.server.conftest import stored
from tests.server.test_sample_files import split_multipart

ACCEPT = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}

pytestmark = pytest.mark.skipif(retrieve._NOWAIT is None, reason="no preadv2 RWF_NOWAIT on this system")


def _instance(app_client):
    ds = make_dataset(rows=64, columns=64)
    url = stored(app_client, ds)
    archive = app_client.app.state.archive
    loc = archive.index.locate(ds.SOPInstanceUID)
    return url, to_bytes(ds), loc, archive.blobs.source(loc.path)


def test_a_file_in_memory_is_answered_without_a_worker_thread(app_client, monkeypatch):
    url, _, loc, path = _instance(app_client)
    data = path.read_bytes()  # in the page cache now
    assert bytes(retrieve.cached_file(path, loc)) == data

    async def no_thread(*args):
        raise AssertionError("a worker thread was used for a file in memory")
    monkeypatch.setattr(wado, "run_blocking", no_thread)
    r = app_client.get(url, headers=ACCEPT)
    assert r.status_code == 200, r.text
    ((h, body),) = split_multipart(r)
    assert body == data and h["content-type"] == "application/dicom; transfer-syntax=1.2.840.10008.1.2.1"
    r = app_client.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"})  # single part
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "application/dicom; transfer-syntax=1.2.840.10008.1.2.1"


def test_a_file_that_needs_a_disk_read_goes_to_a_worker_thread(app_client, monkeypatch):
    url, _, loc, path = _instance(app_client)
    data = path.read_bytes()
    real_preadv, threads = os.preadv, []

    def not_cached(fd, buffers, offset, flags=0):
        if flags & retrieve._NOWAIT:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_preadv(fd, buffers, offset, flags)
    monkeypatch.setattr(os, "preadv", not_cached)
    assert retrieve.cached_file(path, loc) is None
    real_run_blocking = wado.run_blocking

    async def counted(fn, *args):
        threads.append(fn.__name__)
        return await real_run_blocking(fn, *args)
    monkeypatch.setattr(wado, "run_blocking", counted)
    r = app_client.get(url, headers=ACCEPT)
    assert r.status_code == 200
    ((_, body),) = split_multipart(r)
    assert body == data and threads == ["instance_payload"]


def test_a_partly_cached_file_is_not_served_short(app_client, monkeypatch):
    """RWF_NOWAIT may read the cached start of a file and stop: that is no answer."""
    _, _, loc, path = _instance(app_client)
    real_preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset, flags=0: real_preadv(fd, [memoryview(buffers[0])[:100]],
                                                                                        offset, flags))
    assert retrieve.cached_file(path, loc) is None


def test_gone_or_replaced_files_are_gone_as_before(app_client):
    url, _, loc, path = _instance(app_client)
    size = path.stat().st_size
    with open(path, "ab") as f:  # not the file the index row describes
        f.write(b"\0\0")
    with pytest.raises(retrieve.Gone, match="replaced"):
        retrieve.cached_file(path, loc)
    os.truncate(path, size)
    assert bytes(retrieve.cached_file(path, loc)) == path.read_bytes()
    path.unlink()
    with pytest.raises(retrieve.Gone, match="deleted"):
        retrieve.cached_file(path, loc)
    assert retrieve.cached_file(object(), loc) is None  # an object (store/s3.py): read in a worker thread

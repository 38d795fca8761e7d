"""WADO-RS instance (PS3.18 §10.4.1.1.1) of a file that is all in the page cache: read on
the event loop (loop_read.cached_file, ``preadv2`` with ``RWF_NOWAIT``), no worker-thread
hand-off (issue 33); the same answer as through the thread, and a file that would need a
disk read, is gone or is not the size recorded is handled as before."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dicomweb_server import loop_read, retrieve
from dicomweb_server.api import wado
from tests.helpers import make_dataset, to_bytes
from tests.server.conftest import stored
from tests.server.test_sample_files import split_multipart

ACCEPT = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}



def _nowait_works(folder) -> bool:
    """Whether this system's file system at ``folder`` answers ``RWF_NOWAIT`` (tmpfs refuses it)."""
    if loop_read.NOWAIT is None:
        return False
    probe = folder / "nowait-probe"
    probe.write_bytes(b"x" * 4096)
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], 0, loop_read.NOWAIT)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


@pytest.fixture(autouse=True)
def _nowait_file_system(tmp_path):
    if not _nowait_works(tmp_path):
        pytest.skip("this file system does not answer preadv2 RWF_NOWAIT (e.g. tmpfs)")


def _instance(app_client):
    ds = make_dataset(rows=64, columns=64)
    url = stored(app_client, ds)
    archive = app_client.app.state.archive
    loc = archive.index.locate(ds.SOPInstanceUID)
    return url, to_bytes(ds), loc, archive.blobs.source(loc.path)


def test_a_file_in_memory_is_answered_without_a_worker_thread(app_client, monkeypatch):
    url, _, loc, path = _instance(app_client)
    data = path.read_bytes()  # in the page cache now
    assert bytes(loop_read.cached_file(path, loc)) == data

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
        if flags & loop_read.NOWAIT:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_preadv(fd, buffers, offset, flags)
    monkeypatch.setattr(os, "preadv", not_cached)
    assert loop_read.cached_file(path, loc) is None
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
    assert loop_read.cached_file(path, loc) is None


def test_gone_or_replaced_files_are_gone_as_before(app_client):
    url, _, loc, path = _instance(app_client)
    size = path.stat().st_size
    with open(path, "ab") as f:  # not the file the index row describes
        f.write(b"\0\0")
    with pytest.raises(retrieve.Gone, match="replaced"):
        loop_read.cached_file(path, loc)
    os.truncate(path, size)
    assert bytes(loop_read.cached_file(path, loc)) == path.read_bytes()
    path.unlink()
    with pytest.raises(retrieve.Gone, match="deleted"):
        loop_read.cached_file(path, loc)
    assert loop_read.cached_file(object(), loc) is None  # an object (store/s3.py): read in a worker thread


def test_the_file_system_type_is_read_from_mountinfo(tmp_path):
    """Only a blob folder on a local block-device file system is read on the event loop: on
    NFS an open may wait for the network (store.blobs.local_block_file_system)."""
    from dicomweb_server.store.blobs import LOCAL_FILE_SYSTEMS, file_system_type

    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /srv/archive rw,relatime shared:20 - nfs4 pacs:/export rw,vers=4.2\n"
        "41 40 8:17 / /srv/archive/local\\040disk rw shared:21 - xfs /dev/sdb1 rw\n"
        "42 22 0:51 / /srv/archive2 rw - fuse.s3fs s3fs rw\n")
    kinds = {p: file_system_type(p, str(mountinfo)) for p in
             (Path("/var/lib/x"), Path("/srv/archive/blobs/1.2"), Path("/srv/archive/local disk/blobs"),
              Path("/srv/archive2/blobs"), Path("/srv/archivelike"))}
    assert list(kinds.values()) == ["ext4", "nfs4", "xfs", "fuse.s3fs", "ext4"]
    assert [k in LOCAL_FILE_SYSTEMS for k in kinds.values()] == [True, False, True, False, True]


def test_an_archive_on_a_network_file_system_reads_in_a_worker_thread(app_client, monkeypatch):
    url, _, loc, path = _instance(app_client)
    data = path.read_bytes()
    archive = app_client.app.state.archive
    assert archive.blobs.loop_reads is True  # this test folder's file system (probed above)
    monkeypatch.setattr(archive.blobs, "loop_reads", False)

    def not_on_the_loop(*args):
        raise AssertionError("read on the event loop")
    monkeypatch.setattr(loop_read, "cached_file", not_on_the_loop)
    r = app_client.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"})
    assert r.status_code == 200 and r.content == data


def test_a_file_system_that_refuses_nowait_is_not_asked_again(app_client, monkeypatch):
    _, _, loc, path = _instance(app_client)
    calls = []

    def refused(fd, buffers, offset, flags=0):
        calls.append(flags)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(os, "preadv", refused)
    monkeypatch.setattr(loop_read, "_refused", set())
    assert loop_read.cached_file(path, loc) is None
    assert loop_read.cached_file(path, loc) is None
    assert len(calls) == 1

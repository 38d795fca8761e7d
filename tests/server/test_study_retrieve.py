"""Whole-study and series retrieve as stored (issue 11): the files are opened before
the answer starts and sent with a Content-Length (no chunked framing), a few files
per thread hop; every descriptor is closed afterwards, also when the answer is
dropped unsent; more than MAX_OPEN_FILES instances, or a transcoded answer, stream
file by file as before."""

from __future__ import annotations

import gc
import io
import os
import time

import pydicom
import pytest
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian
from starlette.testclient import TestClient

from dicomweb_server import retrieve
from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes

WHOLE = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}


@pytest.fixture
def archive(tmp_path):
    a = Archive.open(Settings(data_dir=tmp_path, index="sqlite"))
    yield a
    a.close()


def _open_fds(under: str | None = None) -> int:
    """Descriptors of this process, but those of the SQLite index: a worker thread
    started meanwhile opens its own connection (two descriptors), not a leak. With
    ``under``: only those of files in that folder."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
        n += "index.sqlite" not in target and (under is None or target.startswith(under))
    return n


def _parts(r) -> list[bytes]:
    boundary = r.headers["content-type"].split("boundary=")[1].split(";")[0].strip('"')
    return [c.split(b"\r\n\r\n", 1)[1][:-2] for c in r.content.split(b"--" + boundary.encode())[1:-1]]


def _study(c: TestClient, n: int, rows: int = 16) -> tuple[str, str, list[bytes]]:
    first = make_dataset(rows=rows, columns=rows)
    datasets = [first] + [make_dataset(study=first.StudyInstanceUID, series=first.SeriesInstanceUID,
                                       rows=rows, columns=rows) for _ in range(n - 1)]
    files = [to_bytes(ds) for ds in datasets]
    body, ctype = multipart(files)
    assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    return first.StudyInstanceUID, first.SeriesInstanceUID, files


@pytest.mark.parametrize("rows", [16, 800])  # 800x800x2 bytes: 1.28 MB files, several pieces each
def test_study_is_sent_with_its_length_and_the_stored_bytes(archive, monkeypatch, rows):
    monkeypatch.setattr(retrieve, "READ_BATCH", 3 * 1024 * 1024)  # two 1.28 MB files per hop, then one
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, series, files = _study(c, 3, rows)
        c.get(f"/studies/{study}", headers=WHOLE)  # warm: the index's per-thread connections
        before = _open_fds()
        for url in (f"/studies/{study}", f"/studies/{study}/series/{series}"):
            r = c.get(url, headers=WHOLE)
            assert r.status_code == 200
            assert "chunked" not in r.headers.get("transfer-encoding", "")
            assert int(r.headers["content-length"]) == len(r.content)
            assert sorted(_parts(r)) == sorted(files)
            assert 'type="application/dicom"' in r.headers["content-type"]
        head = c.head(f"/studies/{study}", headers=WHOLE)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == r.headers["content-length"]
        # every descriptor closed: the maps of the last answer go once the app's send task, which
        # may still be unwinding in TestClient's portal thread when the client has the bytes, ends
        deadline = time.monotonic() + 10
        while _open_fds() != before and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        assert _open_fds() == before


def test_a_file_removed_after_the_answer_started_is_still_sent(archive, monkeypatch):
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, files = _study(c, 3)
        real = retrieve.populate

        def remove_then_read(spans):  # every name unlinked after the files were opened (mapped)
            for rel in archive.blobs.walk():
                os.unlink(archive.blobs.resolve(rel))
            return real(spans)

        monkeypatch.setattr(retrieve, "populate", remove_then_read)
        r = c.get(f"/studies/{study}", headers=WHOLE)
        assert r.status_code == 200
        assert sorted(_parts(r)) == sorted(files)


def test_large_studies_and_transcoding_stream_file_by_file(archive, monkeypatch):
    monkeypatch.setattr(retrieve, "MAX_OPEN_FILES", 2)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, files = _study(c, 3)
        r = c.get(f"/studies/{study}", headers=WHOLE)
        assert r.status_code == 200 and "content-length" not in r.headers  # streamed (chunked over HTTP)
        assert sorted(_parts(r)) == sorted(files)
        monkeypatch.setattr(retrieve, "MAX_OPEN_FILES", 256)
        stored_implicit = make_dataset(rows=8, columns=8, transfer_syntax=ImplicitVRLittleEndian)
        body, ctype = multipart([to_bytes(stored_implicit)])
        assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        implicit = c.get(f"/studies/{stored_implicit.StudyInstanceUID}",  # converted to Explicit VR LE
                         headers={"Accept": 'multipart/related; type="application/dicom"'})
        assert implicit.status_code == 200 and "content-length" not in implicit.headers
        (part,) = _parts(implicit)
        assert pydicom.dcmread(io.BytesIO(part)).file_meta.TransferSyntaxUID == ExplicitVRLittleEndian


def test_an_answer_dropped_unsent_closes_its_files(archive):
    import asyncio

    from dicomweb_server.api import wado

    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, _files = _study(c, 3)
    locs = archive.index.instances(study)
    before = _open_fds()
    response = asyncio.run(wado._opened_files_response(archive, locs, "b", {}))
    assert _open_fds() == before + 3
    del response
    gc.collect()
    assert _open_fds() == before


def test_an_answer_ended_early_closes_its_files(archive, monkeypatch):
    import asyncio

    from dicomweb_server.api import wado

    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, files = _study(c, 3)
    monkeypatch.setattr(retrieve, "READ_BATCH", len(files[0]))  # one file per hop: one in flight, one not read
    locs = archive.index.instances(study)
    before = _open_fds()

    async def main():
        response = await wado._opened_files_response(archive, locs, "b", {})
        body = response.body_iterator
        # a part header and the first file (a view of its map: copied, as a client has it)
        first = [bytes(await body.__anext__()) for _ in range(2)]
        await body.aclose()  # the client went away
        await asyncio.sleep(0.2)  # the read in flight finishes in its thread
        return first

    head, data = asyncio.run(main())
    assert head.startswith(b"--b\r\n") and data in files
    gc.collect()
    assert _open_fds() == before


def test_answers_hold_at_most_the_descriptor_budget_then_stream(archive, monkeypatch):
    """A few dozen stalled whole-study readers (256 descriptors each) used to exhaust
    RLIMIT_NOFILE; answers now take their descriptors from a per-process budget and
    one that does not fit streams file by file (one descriptor at a time)."""
    import asyncio

    from dicomweb_server.api import wado

    budget = retrieve.DescriptorBudget(limit=4)
    monkeypatch.setattr(retrieve, "DESCRIPTORS", budget)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, files = _study(c, 3)
        locs = archive.index.instances(study)
        held = asyncio.run(wado._opened_files_response(archive, locs, "b", {}))  # a stalled reader
        assert held is not None and budget.in_use == 3
        r = c.get(f"/studies/{study}", headers=WHOLE)
        assert r.status_code == 200 and "content-length" not in r.headers  # did not fit: streamed
        assert sorted(_parts(r)) == sorted(files)
        assert budget.in_use == 3
        del held
        gc.collect()
        assert budget.in_use == 0  # a dropped answer gives its descriptors back
        r = c.get(f"/studies/{study}", headers=WHOLE)
        assert int(r.headers["content-length"]) == len(r.content)  # fits again: opened files
        assert sorted(_parts(r)) == sorted(files)
        assert budget.in_use == 0  # a sent answer gives them back as its batches are read


def test_budget_given_back_when_an_answer_ends_early_or_files_are_gone(archive, monkeypatch):
    import asyncio

    from dicomweb_server.api import wado

    budget = retrieve.DescriptorBudget(limit=10)
    monkeypatch.setattr(retrieve, "DESCRIPTORS", budget)
    monkeypatch.setattr(retrieve, "READ_BATCH", 1)  # one file per hop
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, _files = _study(c, 3)
    locs = archive.index.instances(study)
    os.unlink(archive.blobs.resolve(locs[0].path))  # deleted after the look-up

    async def main():
        response = await wado._opened_files_response(archive, locs, "b", {})
        assert budget.in_use == 2  # the gone file's share given back at once
        body = response.body_iterator
        await body.__anext__()
        await body.aclose()  # the client went away mid-answer
        await asyncio.sleep(0.2)

    asyncio.run(main())
    gc.collect()
    assert budget.in_use == 0


def test_out_of_descriptors_is_503_with_retry_after_and_leaks_nothing(archive, monkeypatch):
    """EMFILE while opening a study's files was an unhandled OSError: a 500."""
    import errno

    with TestClient(create_app(archive.settings, archive=archive)) as c:
        study, _series, _files = _study(c, 3)
        c.get(f"/studies/{study}", headers=WHOLE)  # warm
        # the study's files only: os.open is patched process-wide, and another thread of the
        # test process (a server an earlier test of this worker left) may open a file meanwhile
        # (CI, 2026-12-07: 101 descriptors against 100)
        blobs = str(archive.blobs.root)
        before = _open_fds(blobs)
        real_open, calls = os.open, []

        def open_until_full(path, *a, **k):
            if not str(path).startswith(blobs):
                return real_open(path, *a, **k)
            calls.append(path)
            if len(calls) == 2:
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, *a, **k)

        monkeypatch.setattr(retrieve.os, "open", open_until_full)
        r = c.get(f"/studies/{study}", headers=WHOLE)
        monkeypatch.setattr(retrieve.os, "open", real_open)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "Too many open files" in r.headers["warning"]
        assert retrieve.DESCRIPTORS.in_use == 0
        gc.collect()
        assert len(calls) == 2  # the first file was opened, the second refused
        assert _open_fds(blobs) == before  # the first file opened was closed

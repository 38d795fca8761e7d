"""Object storage (store/s3.py, issue 13 "Blobs") against a local S3 server (moto,
tests/s3server.py): names that cannot leave the prefix, the conditional PUT and the
duplicate policy it backs, reads as ranged GETs (asserted on the server's request
log), DELETE after the index commit, the in-memory index rebuilt from the bucket, and
``check`` on orphan objects and rows without objects."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys

import httpx
import pydantic
import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.check import reconcile
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.settings import Settings
from dicomweb_server.store.blobs import Placed
from dicomweb_server.store.s3 import S3BlobStore, parse_storage_url
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.server.test_sample_files import split_multipart

WHOLE = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}
FRAMES = {"Accept": 'multipart/related; type="application/octet-stream"'}


def bucket_of(storage: dict) -> tuple[str, str]:
    return parse_storage_url(storage["storage"])


def instance_url(ds) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def rel(ds) -> str:
    return f"{ds.StudyInstanceUID}/{ds.SeriesInstanceUID}/{ds.SOPInstanceUID}.dcm"


def stow(client, datasets) -> httpx.Response:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    return client.post("/studies", content=body, headers={"Content-Type": ctype})


def spooled(archive: Archive, ds) -> SpooledPart:
    p = archive.blobs.spool / f"{ds.SOPInstanceUID}.part"
    p.write_bytes(to_bytes(ds))
    return SpooledPart(headers={}, path=p, size=p.stat().st_size, complete=True)


@pytest.fixture
def store(tmp_path, s3_server, s3_storage) -> S3BlobStore:
    return S3BlobStore(tmp_path, s3_storage["storage"], endpoint_url=s3_server.url)


@pytest.fixture
def archive(tmp_path, s3_storage):
    a = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", **s3_storage))
    yield a
    a.close()


# --- settings and names ---------------------------------------------------------------------


def test_storage_url_and_settings():
    assert parse_storage_url("s3://bkt/a/b/") == ("bkt", "a/b/")
    assert parse_storage_url("s3://bkt") == ("bkt", "")
    for bad in ("file:///tmp/x", "s3:///prefix", "s3://bkt/a/../b", "s3://bkt/a//b", "/srv/blobs", "s3://b/x?y=1"):
        with pytest.raises(ValueError):
            parse_storage_url(bad)
        with pytest.raises(pydantic.ValidationError):
            Settings(storage=bad)
    assert Settings(storage="").storage is None
    assert Settings(storage=" s3://bkt/p ").storage == "s3://bkt/p"


def test_env_names_the_storage(monkeypatch):
    monkeypatch.setenv("DICOMWEB_STORAGE", "s3://bkt/pfx")
    monkeypatch.setenv("DICOMWEB_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    s = Settings()
    assert (s.storage, s.s3_endpoint_url) == ("s3://bkt/pfx", "http://127.0.0.1:9")


def test_keys_never_leave_the_prefix(store):
    assert store.key("1.2/3.4/5.6.dcm") == "archive/1.2/3.4/5.6.dcm"
    for bad in ("../x.dcm", "/abs.dcm", "a/../../b.dcm", "..", "a\0b", "."):
        with pytest.raises(ValueError):
            store.key(bad)
    with pytest.raises(TypeError):
        store.resolve("1.2/3.4/5.6.dcm")  # no local path: a file read of an object is a loud error


def test_missing_bucket_is_a_clear_error(tmp_path, s3_server):
    with pytest.raises(RuntimeError, match="no-such-bucket"):
        Archive.open(Settings(data_dir=tmp_path, storage="s3://no-such-bucket/x", s3_endpoint_url=s3_server.url))


# --- writes ---------------------------------------------------------------------------------


def test_place_is_a_conditional_put_with_content_md5(store, s3_server, tmp_path):
    bucket, _ = parse_storage_url(store.url)
    one, other = tmp_path / "one", tmp_path / "other"
    one.write_bytes(b"A" * 5000)
    other.write_bytes(b"B" * 5000)  # same size, other bytes
    assert store.probe_conditional_put() is True  # moto refuses the second PUT with 412
    start = len(s3_server.requests)
    assert store.place(one, "1.2/3.4/5.6.dcm") is Placed.NEW
    assert not one.exists()  # placed: the spool file is gone, as with the file store
    one.write_bytes(b"A" * 5000)
    [put] = [r for r in s3_server.requests[start:] if r.method == "PUT"]
    assert put.path == f"/{bucket}/archive/1.2/3.4/5.6.dcm" and put.if_none_match == "*"
    assert put.content_md5 == base64.b64encode(hashlib.md5(b"A" * 5000).digest()).decode()
    assert store.place(other, "1.2/3.4/5.6.dcm") is Placed.EXISTS  # 412: never over a stored object
    assert s3_server.get(bucket, "archive/1.2/3.4/5.6.dcm") == b"A" * 5000
    assert store.same(one, "1.2/3.4/5.6.dcm") and not store.same(other, "1.2/3.4/5.6.dcm")
    store.replace(other, "1.2/3.4/5.6.dcm")  # an orphan (the archive holds the locks): replaced
    assert s3_server.get(bucket, "archive/1.2/3.4/5.6.dcm") == b"B" * 5000
    assert not [k for k in s3_server.keys(bucket) if ".probe" in k]  # the probe left nothing
    store.remove("1.2/3.4/5.6.dcm")
    store.remove("1.2/3.4/5.6.dcm")  # gone already: nothing to do
    assert s3_server.keys(bucket) == []


def test_without_conditional_put_a_head_comes_first(store, s3_server, tmp_path):
    """A server that ignores If-None-Match (found by the start-up probe): ``place``
    asks with a HEAD and never PUTs over an existing object."""
    bucket, _ = parse_storage_url(store.url)
    f = tmp_path / "f"
    f.write_bytes(b"stored")
    store.conditional_put = False
    assert store.place(f, "1/2/3.dcm") is Placed.NEW
    f.write_bytes(b"other content")  # (placed: the spool file was removed)
    start = len(s3_server.requests)
    assert store.place(f, "1/2/3.dcm") is Placed.EXISTS
    assert [r.method for r in s3_server.requests[start:]] == ["HEAD"]
    assert s3_server.get(bucket, "archive/1/2/3.dcm") == b"stored"


def test_duplicate_policy_and_failed_commit_leave_one_object(archive, s3_server, s3_storage, monkeypatch):
    bucket, prefix = bucket_of(s3_storage)
    ds = make_dataset()
    first = archive.store([spooled(archive, ds)])
    assert [s.duplicate for s in first.stored] == [False]
    again = archive.store([spooled(archive, ds)])
    assert [s.duplicate for s in again.stored] == [True] and not again.failed
    changed = make_dataset(study=ds.StudyInstanceUID, series=ds.SeriesInstanceUID, sop=ds.SOPInstanceUID,
                           PatientID="OTHER")
    refused = archive.store([spooled(archive, changed)])
    assert [f.reason.value for f in refused.failed] == [0x0111] and not refused.stored
    assert s3_server.keys(bucket) == [prefix + rel(ds)]
    assert s3_server.get(bucket, prefix + rel(ds)) == to_bytes(ds)  # the acknowledged content is kept
    # the index commit fails after the PUT: nothing acknowledged, no object left behind
    lost = make_dataset()

    def broken(records, dirs, announced=None):  # Committer.commit's signature
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(archive.committer, "commit", broken)
    failed = archive.store([spooled(archive, lost)])
    assert [f.reason.value for f in failed.failed] == [0xA700]
    assert s3_server.keys(bucket) == [prefix + rel(ds)]


# --- reads ----------------------------------------------------------------------------------


def test_a_frame_is_one_ranged_get_of_its_bytes(tmp_path, s3_server, s3_storage):
    bucket, prefix = bucket_of(s3_storage)
    srv = LiveServer(tmp_path / "data", "sqlite", **s3_storage).start()
    try:
        ds = make_dataset(rows=64, columns=64, frames=3)
        flen = 64 * 64 * 2
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert stow(c, [ds]).status_code == 200
            loc = srv.archive.index.locate(ds.SOPInstanceUID)
            offset = loc.pixel["offset"]
            assert to_bytes(ds)[offset : offset + 3 * flen] == ds.PixelData
            key = f"/{bucket}/{prefix}{rel(ds)}"
            start = len(s3_server.requests)
            r = c.get(instance_url(ds) + "/frames/2", headers=FRAMES)
            assert r.status_code == 200
            [(_h, frame)] = split_multipart(r)
            assert frame == ds.PixelData[flen : 2 * flen]
            asked = [(q.method, q.path, q.range) for q in s3_server.requests[start:]]
            # one GET of exactly frame 2 (no HEAD: the GET checks the size the row holds)
            assert asked == [("GET", key, f"bytes={offset + flen}-{offset + 2 * flen - 1}")]
            # bulk data (native Pixel Data): read from its offset on, not from the start of the object
            start = len(s3_server.requests)
            r = c.get(instance_url(ds) + "/bulkdata/7FE00010", headers={"Accept": "application/octet-stream"})
            assert r.status_code == 200 and r.content == ds.PixelData
            gets = [q.range for q in s3_server.requests[start:] if q.method == "GET"]
            assert gets == [f"bytes={offset}-{len(to_bytes(ds)) - 1}"]
    finally:
        srv.stop()


def test_an_object_gone_or_replaced_behind_the_index_is_instance_data_missing(tmp_path, s3_server, s3_storage):
    """The index row is read first, the object after: an object deleted, or replaced by
    one of another size, behind the archive's back (its index row still there) is damaged
    storage: 500 "instance data missing" before any part is sent (missing_data.py; a
    DELETE racing the read stays 404: tests/server/test_read_races.py)."""
    bucket, prefix = bucket_of(s3_storage)
    srv = LiveServer(tmp_path / "data", "sqlite", **s3_storage).start()
    try:
        small, large = make_dataset(rows=16, columns=16, frames=2), make_dataset(rows=512, columns=512, frames=5)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert stow(c, [small, large]).status_code == 200
            s3_server.client.put_object(Bucket=bucket, Key=prefix + rel(small), Body=to_bytes(small) + b"\0\0")
            s3_server.client.delete_object(Bucket=bucket, Key=prefix + rel(large))
            for ds, what in ((small, ""), (small, "/frames/2"), (large, ""), (large, "/frames/1"),
                             (large, "/bulkdata/7FE00010"), (small, "/rendered")):
                r = c.get(instance_url(ds) + what, headers={"Accept": "*/*"})
                assert r.status_code == 500, (what, r.status_code, r.text[:200])
                assert r.json()["detail"].startswith("instance data missing"), what
            assert c.get(f"/studies/{small.StudyInstanceUID}/metadata").status_code == 200  # the index alone
    finally:
        srv.stop()


def test_a_large_instance_streams_from_one_get(tmp_path, s3_server, s3_storage):
    """An instance above retrieve.LARGE_FILE is streamed: one GET handed on in bounded
    pieces (tests/server/test_streaming_bounds.py checks the pieces)."""
    bucket, prefix = bucket_of(s3_storage)
    srv = LiveServer(tmp_path / "data", "sqlite", **s3_storage).start()
    try:
        ds = make_dataset(rows=512, columns=512, frames=5)  # 2.6 MB
        size = len(to_bytes(ds))
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert stow(c, [ds]).status_code == 200
            start = len(s3_server.requests)
            r = c.get(instance_url(ds), headers=WHOLE)
            [(_h, body)] = split_multipart(r)
            assert hashlib.sha256(body).hexdigest() == hashlib.sha256(to_bytes(ds)).hexdigest()
            gets = [q.range for q in s3_server.requests[start:] if q.method == "GET"]
            assert gets == [f"bytes=0-{size - 1}"]
    finally:
        srv.stop()


def test_delete_removes_objects_after_the_index_commit(archive, s3_server, s3_storage):
    bucket, prefix = bucket_of(s3_storage)
    a = make_dataset()
    b = make_dataset(study=a.StudyInstanceUID)
    assert len(archive.store([spooled(archive, a), spooled(archive, b)]).stored) == 2
    assert s3_server.keys(bucket) == sorted([prefix + rel(a), prefix + rel(b)])
    order = []
    index_delete, remove = archive.index.delete, archive.blobs.remove

    def spy_delete(*args):
        order.append(("index", archive.blobs.exists(rel(a))))  # objects still there at the commit
        return index_delete(*args)

    def spy_remove(relpath):
        order.append(("remove", archive.index.locate(os.path.basename(relpath)[:-4]) is None))
        return remove(relpath)

    archive.index.delete, archive.blobs.remove = spy_delete, spy_remove
    assert archive.delete(a.StudyInstanceUID) == 2
    assert order == [("index", True), ("remove", True), ("remove", True)]
    assert s3_server.keys(bucket) == []


def test_memory_index_is_rebuilt_from_the_bucket(tmp_path, s3_storage):
    ds = make_dataset(PatientID="REBUILT")
    srv = LiveServer(tmp_path / "data", "memory", **s3_storage).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert stow(c, [ds]).status_code == 200
        srv.restart()  # a new in-memory index, filled from the objects
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            [(_h, body)] = split_multipart(c.get(instance_url(ds), headers=WHOLE))
            assert body == to_bytes(ds)
            assert len(c.get("/studies", params={"PatientID": "REBUILT"}).json()) == 1
    finally:
        srv.stop()
    assert [p.name for p in (tmp_path / "data" / "tmp").rglob("*.dcm")] == []  # downloads removed


# --- check ----------------------------------------------------------------------------------


def test_check_finds_and_repairs_orphans_and_rows_without_objects(archive, s3_server, s3_storage):
    bucket, prefix = bucket_of(s3_storage)
    kept, lost, orphan = make_dataset(), make_dataset(), make_dataset()
    assert len(archive.store([spooled(archive, kept), spooled(archive, lost)]).stored) == 2
    s3_server.client.put_object(Bucket=bucket, Key=prefix + rel(orphan), Body=to_bytes(orphan))  # a PUT, no commit
    s3_server.client.delete_object(Bucket=bucket, Key=prefix + rel(lost))  # a row whose object is gone

    young = reconcile(archive, grace=3600)  # the orphan may be a store in flight: left alone
    assert young.young == 1 and [(p.kind, p.subject) for p in young.problems] == [("missing file", lost.SOPInstanceUID)]
    dry = reconcile(archive, grace=0)
    assert sorted((p.kind, p.subject) for p in dry.problems) == [("missing file", lost.SOPInstanceUID),
                                                                  ("orphan", rel(orphan))]
    assert prefix + rel(orphan) in s3_server.keys(bucket) and archive.index.locate(lost.SOPInstanceUID)  # dry run
    fixed = reconcile(archive, repair=True, grace=0)
    assert sorted((p.subject, p.action) for p in fixed.problems) == sorted([
        (lost.SOPInstanceUID, "index row dropped"), (rel(orphan), "object removed")])  # UIDs are random
    assert s3_server.keys(bucket) == [prefix + rel(kept)]
    assert archive.index.locate(lost.SOPInstanceUID) is None and archive.index.locate(kept.SOPInstanceUID)
    assert reconcile(archive, grace=0).clean


def test_check_keeps_an_object_indexed_after_its_snapshot(archive, s3_server, s3_storage, monkeypatch):
    """The rows are read before the listing: an instance committed in between shows as
    unindexed, and is looked up again under its placement locks before removal."""
    ds = make_dataset()
    assert len(archive.store([spooled(archive, ds)]).stored) == 1
    monkeypatch.setattr(archive.index, "paths", lambda: iter(()))  # the snapshot before the commit
    report = reconcile(archive, repair=True, grace=0)
    assert [(p.kind, p.action) for p in report.problems] == [("orphan", "not removed: the index is empty "
                                                                         "(is this the archive's database?)")]
    other = make_dataset()
    assert len(archive.store([spooled(archive, other)]).stored) == 1
    monkeypatch.setattr(archive.index, "paths", lambda: iter([(other.SOPInstanceUID, rel(other))]))
    report = reconcile(archive, repair=True, grace=0)
    assert [(p.subject, p.action) for p in report.problems] == [(rel(ds), "indexed meanwhile: kept")]
    bucket, prefix = bucket_of(s3_storage)
    assert s3_server.keys(bucket) == sorted([prefix + rel(ds), prefix + rel(other)])


def test_check_command_on_object_storage(tmp_path, s3_server, s3_storage):
    bucket, prefix = bucket_of(s3_storage)
    data = tmp_path / "data"
    a = Archive.open(Settings(data_dir=data, index="sqlite", **s3_storage))
    try:
        kept = make_dataset()
        assert len(a.store([spooled(a, kept)]).stored) == 1
    finally:
        a.close()
    orphan = make_dataset()
    s3_server.client.put_object(Bucket=bucket, Key=prefix + rel(orphan), Body=to_bytes(orphan))
    cmd = [sys.executable, "-m", "dicomweb_server.cli", "check", "--data-dir", str(data), "--storage",
           s3_storage["storage"], "--s3-endpoint-url", s3_storage["s3_endpoint_url"]]
    young = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert young.returncode == 0 and "1 unindexed object(s) younger than the grace period" in young.stdout
    dry = subprocess.run(cmd + ["--grace", "0"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 1 and f"orphan: {rel(orphan)}" in dry.stdout, dry.stdout + dry.stderr
    fixed = subprocess.run(cmd + ["--grace", "0", "--repair"], capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0 and "-> object removed" in fixed.stdout
    assert s3_server.keys(bucket) == [prefix + rel(kept)]


def test_routes_deliver_from_object_storage(tmp_path, s3_storage, s3_server):
    """The forwarder sends a local copy of each object (in the spool, removed after the send)."""
    from tests.routing.conftest import wait_for, write_routes
    from tests.routing.sink import Sink
    from tests.routing.test_delivery import at_sink, queue

    sink = Sink(tmp_path / "sink").start()
    try:
        routes = write_routes(tmp_path / "routes.toml", sink.url)
        srv = LiveServer(tmp_path / "data", "sqlite", routes_file=routes, **s3_storage).start()
        try:
            datasets = [make_dataset() for _ in range(3)]
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                assert stow(c, datasets).status_code == 200
            wait_for(lambda: queue(srv.url).get("sink", {}).get("delivered") == 3, what="3 delivered")
            for ds in datasets:
                assert at_sink(sink, ds.SOPInstanceUID) == to_bytes(ds)
            assert not [p for p in (tmp_path / "data" / "tmp").rglob("*") if p.is_file() and p.suffix == ".dcm"]
        finally:
            srv.stop()
    finally:
        sink.stop()


def test_serve_refuses_a_bucket_it_cannot_reach(tmp_path, s3_server):
    r = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path),
                        "--port", "0", "--storage", "s3://no-such-bucket/x", "--s3-endpoint-url", s3_server.url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "s3://no-such-bucket/x: the bucket cannot be reached" in r.stderr, r.stderr


def test_import_command_stores_into_the_bucket(tmp_path, s3_server, s3_storage):
    bucket, prefix = bucket_of(s3_storage)
    ds = make_dataset()
    f = tmp_path / "one.dcm"
    f.write_bytes(to_bytes(ds))
    r = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "import", "--quiet", "--data-dir",
                        str(tmp_path / "data"), "--storage", s3_storage["storage"], "--s3-endpoint-url",
                        s3_storage["s3_endpoint_url"], str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "imported 1 new instance(s)" in r.stdout, r.stdout + r.stderr
    assert s3_server.keys(bucket) == [prefix + rel(ds)] and s3_server.get(bucket, prefix + rel(ds)) == to_bytes(ds)
    assert not list((tmp_path / "data" / "blobs").rglob("*.dcm"))  # nothing kept on local disk


def test_check_repair_against_the_wrong_prefix_or_index_changes_nothing(tmp_path, s3_server, s3_storage):
    """An operator's `check --repair` with the wrong --storage prefix (or bucket) saw every
    row as a "missing file" and dropped the whole index; with another archive's (non-empty)
    index it removed every object as an "orphan". When the index and the storage share no
    instance at all, nothing is repaired and the report says why."""
    bucket, prefix = bucket_of(s3_storage)
    data = tmp_path / "data"
    a = Archive.open(Settings(data_dir=data, index="sqlite", **s3_storage))
    try:
        stored = [make_dataset(), make_dataset()]
        assert len(a.store([spooled(a, ds) for ds in stored]).stored) == 2
    finally:
        a.close()
    elsewhere = "elsewhere/" + rel(make_dataset())  # another archive's object
    s3_server.client.put_object(Bucket=bucket, Key=elsewhere, Body=b"x")
    wrong = Archive.open(Settings(data_dir=data, index="sqlite", storage=f"s3://{bucket}/elsewhere",
                                  s3_endpoint_url=s3_storage["s3_endpoint_url"]))
    try:
        report = reconcile(wrong, repair=True, grace=0)
        assert sorted(p.kind for p in report.problems) == ["missing file", "missing file", "orphan"]
        assert {p.action for p in report.problems} == {
            "not repaired: the index and the storage share no instance (the wrong --storage or database?)"}
        assert all(wrong.index.locate(ds.SOPInstanceUID) for ds in stored)  # every row kept
        assert elsewhere in s3_server.keys(bucket)  # and every object
    finally:
        wrong.close()


@pytest.mark.parametrize("outage", ["503", "no connection"])
def test_an_object_store_outage_fails_the_request_at_once_and_keeps_nothing(archive, s3_server, s3_storage, outage):
    """S3 answering 503 (or not at all) during a STOW-RS: each instance went through
    botocore's retries and back-off in turn (23 s for 3 instances with the archive's
    client, a STOW-RS of 100 instances ~13 min, past any proxy's timeout). Now the first
    failure after the retries fails the rest of the request at once, each with its
    status; nothing is acknowledged, indexed, spooled or left in the bucket."""
    import boto3
    from botocore.awsrequest import AWSResponse
    from botocore.config import Config
    from botocore.exceptions import EndpointConnectionError
    from starlette.testclient import TestClient

    from dicomweb_server.app import create_app

    client = boto3.session.Session().client(  # the archive's client, with fewer retries (a quicker test)
        "s3", endpoint_url=s3_server.url, config=Config(retries={"mode": "standard", "max_attempts": 2},
                                                        s3={"addressing_style": "path"}))
    archive.blobs.client = client
    puts = []

    class Body:
        def stream(self, **_kw):
            yield b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"

    def down(request, **_kw):
        puts.append(request.url)
        if outage == "503":
            return AWSResponse(request.url, 503, {}, Body())
        raise EndpointConnectionError(endpoint_url=request.url)

    client.meta.events.register("before-send.s3.PutObject", down)
    datasets = [make_dataset() for _ in range(3)]
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        r = stow(c, datasets)
    assert r.status_code == 409
    failed = r.json()["00081198"]["Value"]
    assert [f["00081197"]["Value"] for f in failed] == [[0x0110]] * 3
    assert sorted(f["00081155"]["Value"][0] for f in failed) == sorted(ds.SOPInstanceUID for ds in datasets)
    assert len(puts) >= 2 and len(set(puts)) == 1  # one instance's attempts; the other two not tried
    assert "not tried: the storage failed an earlier instance" in r.headers["warning"]
    assert archive.index.count() == 0 and not list(archive.blobs.spool.iterdir())
    bucket, _prefix = bucket_of(s3_storage)
    assert s3_server.keys(bucket) == []


@pytest.mark.parametrize("endpoint", ["garbage", "http://", "ftp://127.0.0.1:9000", "http://[::1", "http://h:port",
                                      "minio:9000"])
def test_a_garbage_endpoint_url_is_one_clear_line_not_a_traceback(tmp_path, capsys, endpoint):
    """--s3-endpoint-url garbage: botocore's bare ValueError came out of Archive.open as a
    traceback (check, import) or a crashed start-up (serve)."""
    from dicomweb_server.cli import main

    with pytest.raises(pydantic.ValidationError, match="S3 endpoint"):
        Settings(data_dir=tmp_path, storage="s3://b/x", s3_endpoint_url=endpoint)
    args = ["--data-dir", str(tmp_path), "--storage", "s3://b/x", "--s3-endpoint-url", endpoint]
    with pytest.raises(SystemExit) as exit_:
        main(["check", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    line = "dicomweb-server: s3_endpoint_url (DICOMWEB_S3_ENDPOINT_URL): S3 endpoint "
    assert err.startswith(line) and "Traceback" not in err
    if endpoint == "garbage":  # serve re-executes itself: in a process of its own
        serve = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "serve", "--port", "0", *args],
                               capture_output=True, text=True, timeout=120)
        assert serve.returncode == 2 and serve.stderr.startswith(line)
    assert Settings(data_dir=tmp_path, s3_endpoint_url=" https://s3.example:9000/ ").s3_endpoint_url == \
        "https://s3.example:9000/"


def test_check_with_an_unreachable_bucket_is_one_line(tmp_path, s3_server, capsys):
    from dicomweb_server.cli import main

    assert main(["check", "--data-dir", str(tmp_path), "--storage", "s3://no-such-bucket/x",
                 "--s3-endpoint-url", s3_server.url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dicomweb-server: storage s3://no-such-bucket/x: the bucket cannot be reached")

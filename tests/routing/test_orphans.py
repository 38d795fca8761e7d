"""An instance indexed outside the normal store path owes its forwards (issue 25).

A SIGKILL between placing a file and committing its index row leaves an orphan: on
disk, never acknowledged. Whatever indexes it later owes the forwards the store would
have: the in-memory index's start-up rebuild, ``check --repair`` given the routes, and
(when ``check --repair`` ran without them) the client's retry of the same STOW-RS,
which is an identical duplicate. Instances stored before routes were in force are
not owed by a restart."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes
from tests.reliability.test_crash import Server
from tests.routing.conftest import ALL, wait_for, write_routes
from tests.routing.test_delivery import at_sink


def _post(url: str, data: bytes) -> httpx.Response:
    body, ctype = multipart([data])
    return httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=30)


def _killed_at_placed(tmp_path, sink, monkeypatch, backend, extra: str = "") -> tuple:
    """A server (routes in DICOMWEB_ROUTES_FILE, ``extra`` appended) acknowledges
    instance ``a``, then is SIGKILLed after placing ``b``'s file, before its index
    commit. Returns the data folder and the two instances' bytes."""
    routes = write_routes(tmp_path / "routes.toml", sink.url, extra)
    monkeypatch.setenv("DICOMWEB_ROUTES_FILE", str(routes))
    backend.env(monkeypatch)
    data = tmp_path / "data"
    a, b = (to_bytes(make_dataset(PatientID=p)) for p in ("acked", "orphan"))
    srv = Server(data, backend.index, "placed:2")
    assert _post(srv.url, a).status_code == 200
    with pytest.raises(httpx.HTTPError):
        _post(srv.url, b)
    srv.proc.wait(10)
    assert len(list((data / "blobs").rglob("*.dcm"))) == 2  # b's file is in place, unindexed
    return data, routes, a, b


def _sop(data: bytes) -> str:
    import io

    import pydicom

    return str(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).SOPInstanceUID)


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_the_rebuild_of_the_memory_index_owes_the_orphans_forwards(tmp_path, sink, monkeypatch, backend):
    sink.recorder.down = True  # (503) nothing reaches the sink before the kill: each is counted once
    data, _, a, b = _killed_at_placed(tmp_path, sink, monkeypatch, backend)
    sink.recorder.down = False
    srv = Server(data, backend.index)  # the rebuild indexes b: visible, so it owes its forward
    try:
        assert len(httpx.get(srv.url + "/instances").json()) == 2
        wait_for(lambda: at_sink(sink, _sop(a)) == a and at_sink(sink, _sop(b)) == b, what="both at the sink")
        assert _post(srv.url, b).status_code == 200  # the client's retry: a duplicate, owes nothing more
        wait_for(lambda: httpx.get(srv.url + "/admin/queue").json()["destinations"]["sink"]["delivered"] == 2,
                 what="both deliveries recorded")
    finally:
        srv.kill()
    srv = Server(data, backend.index)  # another restart owes nothing again
    try:
        q = wait_for(lambda: httpx.get(srv.url + "/admin/queue").json()["destinations"].get("sink"), what="queue")
        assert (q["pending"], q["in_flight"], q["delivered"], q["failed"]) == (0, 0, 2, 0)
        assert sink.recorder.received[_sop(a)] == 1 and sink.recorder.received[_sop(b)] == 1
    finally:
        srv.kill()


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_the_rebuild_owes_the_orphans_forwards_and_tells_the_webhooks(tmp_path, sink, monkeypatch, backend):
    """Both at once on the in-memory index: the rebuild's orphan owes its forward (the
    ledger decides) and the webhooks hear of its create (the change log), while the
    acknowledged instance is forwarded once and not owed again by a restart."""
    from tests.routing.test_webhook import HookSink

    hooks = HookSink()
    try:
        sink.recorder.down = True
        data, _, a, b = _killed_at_placed(tmp_path, sink, monkeypatch, backend,
                                          f'[[destinations]]\nname = "events"\nwebhook = {{ url = "{hooks.url}" }}\n')
        sink.recorder.down = False
        for _ in range(2):  # the second restart owes nothing again
            srv = Server(data, backend.index)
            try:
                wait_for(lambda: at_sink(sink, _sop(a)) == a and at_sink(sink, _sop(b)) == b, what="both at the sink")
                wait_for(lambda: {_sop(a), _sop(b)} <= {x["SopInstanceUid"] for x in hooks.bodies
                                                        if x["Action"] == "create"}, what="both creates at the webhook")
                wait_for(lambda: httpx.get(srv.url + "/admin/queue").json()["destinations"]["sink"]["delivered"] == 2,
                         what="both deliveries recorded")
            finally:
                srv.kill()
        assert sink.recorder.received[_sop(a)] == 1 and sink.recorder.received[_sop(b)] == 1
        feed = [(x["Action"], x["SopInstanceUid"]) for x in hooks.bodies]
        assert sorted(set(feed)) == sorted({("create", _sop(a)), ("create", _sop(b))})
    finally:
        hooks.stop()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_check_repair_with_the_routes_owes_the_orphans_forwards(tmp_path, sink, monkeypatch, backend):
    data, routes, a, b = _killed_at_placed(tmp_path, sink, monkeypatch, backend)
    monkeypatch.delenv("DICOMWEB_ROUTES_FILE")
    out = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "check", "--repair", "--routes", str(routes),
                          "--data-dir", str(data), *backend.args], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert "orphan" in out.stdout and "-> indexed" in out.stdout
    monkeypatch.setenv("DICOMWEB_ROUTES_FILE", str(routes))
    srv = Server(data, backend.index)
    try:
        wait_for(lambda: at_sink(sink, _sop(a)) == a and at_sink(sink, _sop(b)) == b, what="both at the sink")
    finally:
        srv.kill()


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_a_retry_after_a_repair_without_routes_owes_the_forward(tmp_path, sink, monkeypatch, backend):
    """``check --repair`` run without the routes indexes the orphan and owes nothing;
    the client's retry of the killed request is then an identical duplicate (200),
    which owes the forward no row was ever written for."""
    data, routes, a, b = _killed_at_placed(tmp_path, sink, monkeypatch, backend)
    env = {k: v for k, v in os.environ.items() if k != "DICOMWEB_ROUTES_FILE"}
    out = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "check", "--repair",
                          "--data-dir", str(data), *backend.args], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    srv = Server(data, backend.index)
    try:
        r = _post(srv.url, b)
        assert r.status_code == 200, r.text
        wait_for(lambda: at_sink(sink, _sop(a)) == a and at_sink(sink, _sop(b)) == b, what="both at the sink")
        assert _post(srv.url, a).status_code == 200  # a duplicate of a forward owed already: no new row
        rows = httpx.get(srv.url + "/admin/queue").json()["destinations"]["sink"]
        assert rows["delivered"] + rows["pending"] + rows["in_flight"] == 2
    finally:
        srv.kill()


def _part(archive: Archive, ds) -> SpooledPart:
    path = archive.blobs.spool / f"{ds.SOPInstanceUID}.dcm"
    ds.save_as(path, enforce_file_format=True)
    return SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True)


def test_memory_index_restarts_owe_only_what_routes_were_in_force_for(tmp_path):
    """The in-memory index's ledger: files stored before the routes (or by a process
    without them) are not owed by a restart with routes; a file the ledger does not
    name, placed while routes were in force, is."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
                      '[[rules]]\ndestinations = ["pacs"]\n')
    data = tmp_path / "data"
    plain, routed = Settings(data_dir=data, index="memory"), Settings(data_dir=data, index="memory", routes_file=routes)

    def owed(archive) -> list[str]:
        return sorted(r["SOPInstanceUID"] for r in archive.routing.outbox.rows())

    before, during, orphan, unrouted, later = (make_dataset() for _ in range(5))
    archive = Archive.open(plain)
    assert len(archive.store([_part(archive, before)]).stored) == 1
    archive.close()
    archive = Archive.open(routed)  # "before" was stored while no routes were in force
    assert owed(archive) == []
    assert len(archive.store([_part(archive, during)]).stored) == 1
    assert owed(archive) == [during.SOPInstanceUID]
    # a file placed but never committed (what a SIGKILL at "placed" leaves)
    target = archive.blobs.resolve(f"{orphan.StudyInstanceUID}/{orphan.SeriesInstanceUID}/{orphan.SOPInstanceUID}.dcm")
    target.parent.mkdir(parents=True)
    orphan.save_as(target, enforce_file_format=True)
    archive.close()
    archive = Archive.open(routed)
    assert owed(archive) == sorted([during.SOPInstanceUID, orphan.SOPInstanceUID])
    archive.close()
    archive = Archive.open(plain)  # a process without the routes stores: not owed, ever
    assert len(archive.store([_part(archive, unrouted)]).stored) == 1
    archive.close()
    archive = Archive.open(routed)
    assert owed(archive) == sorted([during.SOPInstanceUID, orphan.SOPInstanceUID])
    assert len(archive.store([_part(archive, later)]).stored) == 1
    archive.close()
    archive = Archive.open(routed)  # restarts owe nothing twice
    assert owed(archive) == sorted([during.SOPInstanceUID, orphan.SOPInstanceUID, later.SOPInstanceUID])
    archive.close()


def test_import_with_routes_owes_forwards(tmp_path, capsys):
    from dicomweb_server.cli import main

    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
                      '[[rules]]\nmatch = { Modality = "MR" }\ndestinations = ["pacs"]\n')
    files = tmp_path / "in"
    files.mkdir()
    mr, ct = make_dataset(modality="MR"), make_dataset(modality="CT")
    for ds in (mr, ct):
        ds.save_as(files / f"{ds.SOPInstanceUID}.dcm", enforce_file_format=True)
    data = tmp_path / "data"
    assert main(["import", "--quiet", "--routes", str(routes), "--data-dir", str(data), str(files)]) == 0
    archive = Archive.open(Settings(data_dir=data, routes_file=routes))
    try:
        assert [r["SOPInstanceUID"] for r in archive.routing.outbox.rows()] == [mr.SOPInstanceUID]
    finally:
        archive.close()

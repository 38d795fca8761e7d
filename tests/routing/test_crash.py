"""SIGKILL of the archive while it forwards loses nothing: after a restart every
acknowledged instance reaches the sink, byte-identical (issue 12). A kill between
sending and recording the delivery makes the receiver see that batch again: counted,
and harmless (byte-identical duplicates are a success at our receivers)."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.reliability.test_crash import CLIENTS, Server, _storer
from tests.routing.conftest import ALL, wait_for, write_routes


@pytest.mark.parametrize("backend", ALL, indirect=True)
@pytest.mark.parametrize("fault", [None, "forwarded:3"])
def test_sigkill_while_forwarding_loses_nothing(tmp_path, sink, monkeypatch, backend, fault):
    routes = write_routes(tmp_path / "routes.toml", sink.url)
    monkeypatch.setenv("DICOMWEB_ROUTES_FILE", str(routes))
    backend.env(monkeypatch)
    index = backend.index
    data = tmp_path / "data"
    srv = Server(data, index, fault)
    acked: dict[str, bytes] = {}
    stop = threading.Event()
    threads = [threading.Thread(target=_storer, args=(srv.url, i, acked, stop)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    if fault is None:
        # kill while forwarding is under way AND instances are still owed (acknowledged, not
        # yet at the sink): a forwarder that keeps up with the storers would otherwise leave
        # nothing for the restart to prove (dict.copy: atomic while the storers add)
        wait_for(lambda: len(sink.recorder.received) >= 10
                 and len(set(acked.copy()) - set(dict(sink.recorder.received))) >= 3,
                 timeout=60, what="forwarding under way with instances owed")
        srv.kill()
    else:
        srv.proc.wait(60)  # the third batch sent kills it before its rows are settled
    stop.set()
    for t in threads:
        t.join(30)
    srv.kill()
    assert acked and len(set(acked) - set(sink.recorder.received)) > 0 or fault is not None
    srv = Server(data, index)  # restart: the forwarder finds what is owed
    try:
        wait_for(lambda: set(acked) <= set(sink.recorder.received), timeout=90, what="every acknowledged instance")
        # then the queue settles: every batch answered by the sink (stored there), none given up
        q = wait_for(lambda: (lambda s: s if s["pending"] == 0 and s["in_flight"] == 0 else None)(
            httpx.get(srv.url + "/admin/queue").json()["destinations"]["sink"]), what="an empty queue")
        assert q["failed"] == 0
        with httpx.Client(base_url=sink.url, timeout=30) as c:
            for sop, original in acked.items():
                (hit,) = c.get("/instances", params={"SOPInstanceUID": sop}).json()
                r = c.get(hit["00081190"]["Value"][0], headers={"Accept": "application/dicom; transfer-syntax=*"})
                assert r.content == original
        dup = sum(n - 1 for n in sink.recorder.received.values())
        if fault is not None:
            assert dup >= 1  # the batch sent before the kill was sent again: at least once, never lost
    finally:
        srv.kill()

"""Two archive nodes (``dicomweb-server`` processes) on one PostgreSQL index and one
folder forward to one sink (issue 13, "Nodes"): the outbox is one queue in the
database, so every instance arrives exactly once whichever node stored it and
whichever node's forwarder claimed it; a node SIGKILLed between sending a batch and
recording it loses nothing: its leases expire and the other node delivers (the batch
it had sent arrives again: at least once, never lost)."""

from __future__ import annotations

import httpx

from tests.reliability.test_crash import Server
from tests.routing.conftest import wait_for, write_routes
from tests.routing.test_delivery import metric, queue, store
from tests.helpers import make_dataset

LEASE = 6.0  # seconds; the forwarder's send timeout is half of it


def _nodes_env(tmp_path, sink, pg_url, monkeypatch):
    routes = write_routes(tmp_path / "routes.toml", sink.url)
    # in [delivery], the file's last table; the timeout within half the lease (routing/rules.py)
    routes.write_text(routes.read_text().replace("timeout = 10", f"timeout = {LEASE / 2:g}") + f"lease = {LEASE}\n")
    monkeypatch.setenv("DICOMWEB_ROUTES_FILE", str(routes))
    monkeypatch.setenv("DICOMWEB_DATABASE_URL", pg_url)
    return tmp_path / "data"


def _settled(url: str, total: int, exact: bool = True):
    """The queue once ``total`` (at least ``total``) rows are delivered and none is owed."""
    q = queue(url).get("sink", {})
    done = q.get("delivered", 0) == total if exact else q.get("delivered", 0) >= total
    return q if done and q["pending"] == 0 and q["in_flight"] == 0 else None


def test_two_nodes_deliver_each_instance_exactly_once(tmp_path, sink, pg_url, monkeypatch):
    data = _nodes_env(tmp_path, sink, pg_url, monkeypatch)
    a, b = Server(data, "postgresql"), Server(data, "postgresql")
    try:
        sent: dict[str, bytes] = {}
        for i in range(10):  # stores through both nodes; both forwarders race for the rows
            sent.update(store((a, b)[i % 2].url, [make_dataset() for _ in range(3)]))
        q = wait_for(lambda: _settled(b.url, 30), what="30 delivered")
        assert q["failed"] == 0
        other = _settled(a.url, 30)  # one queue, whichever node is asked
        assert other is not None and {**other, "last_delivered": None} == {**q, "last_delivered": None}
        assert sink.recorder.received == {sop: 1 for sop in sent}  # each exactly once, counted at the sink
        assert sink.recorder.max_in_flight <= 2  # concurrency 2 per destination, across both nodes
        # each node counts what it delivered itself: together, each instance once
        assert sum(metric(n.url, 'dicomweb_forwarded_total{destination="sink"}') for n in (a, b)) == 30
    finally:
        a.kill()
        b.kill()


def test_sigkill_of_a_node_mid_forwarding_loses_nothing(tmp_path, sink, pg_url, monkeypatch):
    data = _nodes_env(tmp_path, sink, pg_url, monkeypatch)
    b = Server(data, "postgresql")  # started first: it never reaps A's leases (it cannot see A die)
    a = Server(data, "postgresql", fault="forwarded:2")  # dies after sending its 2nd batch, before settling it
    try:
        acked: dict[str, bytes] = {}
        while a.proc.poll() is None and len(acked) < 300:  # A's own stores wake A's forwarder at once
            try:
                acked.update(store(a.url, [make_dataset() for _ in range(5)]))
            except (httpx.TransportError, AssertionError):
                break  # A died during this request: not acknowledged
        a.proc.wait(60)
        assert a.proc.returncode == -9, "node A did not die at its fault point"
        # the rows A had sent and not settled stay leased to A until the lease ends; then B sends them
        # (at least: the request cut by the kill may have committed without being answered)
        q = wait_for(lambda: _settled(b.url, len(acked), exact=False), timeout=90,
                     what="every acknowledged instance delivered")
        assert q["failed"] == 0
        assert set(acked) <= set(sink.recorder.received)
        with httpx.Client(base_url=sink.url, timeout=30) as c:
            for sop, original in acked.items():
                (hit,) = c.get("/instances", params={"SOPInstanceUID": sop}).json()
                r = c.get(hit["00081190"]["Value"][0], headers={"Accept": "application/dicom; transfer-syntax=*"})
                assert r.content == original
        # A's batch sent before the kill arrived twice (once from A, once from B after the lease): at least once
        assert sum(n - 1 for n in sink.recorder.received.values()) >= 1
    finally:
        a.kill()
        b.kill()

"""Routing of updates (issue 27): a rule with ``on = ["store", "update"]`` forwards each new
version an ``$update``, ``$merge`` or ``$restore`` makes current, its outbox rows written in
the index transaction that switches the versions; a rule without it (``on`` defaults to
``["store"]``) forwards an instance once. On every index (SQLite, in-memory, PostgreSQL)."""

from __future__ import annotations

import httpx
import pytest
from pydicom.uid import generate_uid

from dicomweb_server.routing.rules import RoutesError, load_routes
from tests.helpers import LiveServer, make_dataset
from tests.routing.conftest import ALL, FAST, wait_for
from tests.routing.sink import Sink
from tests.routing.test_delivery import at_sink, queue, store


def routes_file(path, updates_url: str, stores_url: str) -> str:
    path.write_text(f"""
[[destinations]]
name = "follows"
stow_url = "{updates_url}"

[[destinations]]
name = "once"
stow_url = "{stores_url}"

[[rules]]
name = "every version"
destinations = ["follows"]
on = ["store", "update"]

[[rules]]
name = "first store only"
destinations = ["once"]
{FAST}""")
    return str(path)


def test_on_is_parsed_and_checked(tmp_path):
    routes = load_routes(routes_file(tmp_path / "r.toml", "http://a.example", "http://b.example"))
    assert [sorted(r.on) for r in routes.rules] == [["store", "update"], ["store"]]
    assert routes.on_update
    for bad in ('on = ["upload"]', "on = []", 'on = "update"'):
        (tmp_path / "b.toml").write_text('[[destinations]]\nname = "d"\nstow_url = "http://x.example"\n'
                                         f'[[rules]]\ndestinations = ["d"]\n{bad}\n')
        with pytest.raises(RoutesError, match=r"line 6: \[\[rules\]\] #1 on: .*'store', 'update'"):
            load_routes(tmp_path / "b.toml")


def _name_at(sink, sop: str) -> str | None:
    from pydicom import dcmread
    import io

    data = at_sink(sink, sop)
    return None if data is None else str(dcmread(io.BytesIO(data)).PatientName)


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_updates_are_forwarded_to_rules_that_ask(tmp_path, backend):
    follows = Sink(tmp_path / "follows", duplicate_policy="replace").start()  # takes each version as new
    once = Sink(tmp_path / "once").start()
    routes = routes_file(tmp_path / "r.toml", follows.url, once.url)
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    try:
        st, se = generate_uid(), generate_uid()
        dss = [make_dataset(study=st, series=se, PatientID="P1", PatientName="Old^Name") for _ in range(2)]
        sops = list(store(srv.url, dss))
        wait_for(lambda: all(_name_at(follows, s) == "Old^Name" and at_sink(once, s) for s in sops),
                 what="the first versions at both destinations")
        r = httpx.post(f"{srv.url}/studies/{st}/$update", timeout=60,
                       json={"00100010": {"vr": "PN", "Value": [{"Alphabetic": "New^Name"}]}})
        assert r.status_code == 200, r.text
        wait_for(lambda: all(_name_at(follows, s) == "New^Name" for s in sops), what="the new versions forwarded")
        r = httpx.post(f"{srv.url}/studies/{st}/$restore", timeout=60)
        assert r.status_code == 200, r.text
        wait_for(lambda: all(_name_at(follows, s) == "Old^Name" for s in sops), what="the restored versions")
        q = wait_for(lambda: (lambda d: d if d["follows"]["delivered"] == 6 and d["once"]["delivered"] == 2
                              else None)(queue(srv.url)), what="all delivered")
        assert (q["follows"]["failed"], q["follows"]["pending"], q["once"]["failed"], q["once"]["pending"]) == \
            (0, 0, 0, 0)
        assert {s: follows.recorder.received[s] for s in sops} == {s: 3 for s in sops}
        assert {s: once.recorder.received[s] for s in sops} == {s: 1 for s in sops}
        assert _name_at(once, sops[0]) == "Old^Name"
    finally:
        srv.stop()
        follows.stop()
        once.stop()


@pytest.mark.parametrize("backend", ["sqlite", "memory"], indirect=True)
def test_an_owed_forward_sends_the_current_version(tmp_path, backend):
    """A destination down when the instance is updated (its forward a dead letter, no rule
    asking for updates) gets, once retried, the version current then: the owed row is
    re-pointed at the new file in the update's transaction."""
    follows = Sink(tmp_path / "follows", duplicate_policy="replace").start()
    once = Sink(tmp_path / "once").start()
    once.recorder.down = True
    routes = tmp_path / "r.toml"
    routes_file(routes, follows.url, once.url)
    routes.write_text(routes.read_text().replace("max_attempts = 100000", "max_attempts = 1"))  # a dead letter at once
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=str(routes), **backend.settings).start()
    try:
        st = generate_uid()
        sop = next(iter(store(srv.url, [make_dataset(study=st, PatientID="P2", PatientName="Old^Name")])))
        wait_for(lambda: queue(srv.url)["once"]["failed"] == 1, what="a dead letter")
        r = httpx.post(f"{srv.url}/studies/{st}/$update", timeout=60,
                       json={"00100010": {"vr": "PN", "Value": [{"Alphabetic": "New^Name"}]}})
        assert r.status_code == 200, r.text
        once.recorder.down = False
        assert httpx.post(f"{srv.url}/admin/queue/retry-failed").status_code == 200
        wait_for(lambda: queue(srv.url)["once"]["delivered"] == 1, what="delivered")
        assert _name_at(once, sop) == "New^Name"
        assert once.recorder.received[sop] == 1 and queue(srv.url)["once"]["failed"] == 0
    finally:
        srv.stop()
        follows.stop()
        once.stop()


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_rejected_instances_shown_again_are_not_forwarded_again(tmp_path, backend):
    """A rejection and its restore ($restore-rejected) owe no forward: the instance was
    forwarded when stored (before, the restore indexed it like a store and owed its
    forwards again, to every rule)."""
    follows = Sink(tmp_path / "follows", duplicate_policy="replace").start()
    once = Sink(tmp_path / "once").start()
    routes = routes_file(tmp_path / "r.toml", follows.url, once.url)
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    try:
        st = generate_uid()
        ds = make_dataset(study=st, PatientID="P3")
        sop = next(iter(store(srv.url, [ds])))
        wait_for(lambda: (lambda q: q["follows"]["delivered"] == 1 and q["once"]["delivered"] == 1)(queue(srv.url)),
                 what="the first forwards")
        r = httpx.post(f"{srv.url}/studies/{st}/series/{ds.SeriesInstanceUID}/reject/113001%5EDCM")
        assert r.status_code == 200 and r.json() == {"count": 1}
        r = httpx.post(f"{srv.url}/studies/{st}/$restore-rejected")
        assert r.status_code == 200 and r.json() == {"count": 1}
        q = queue(srv.url)  # (rows are written in the restore's transaction: none owed now, none later)
        owed = [(q[d]["pending"] + q[d]["in_flight"], q[d]["delivered"], q[d]["failed"]) for d in ("follows", "once")]
        assert owed == [(0, 1, 0), (0, 1, 0)]
        assert (follows.recorder.received[sop], once.recorder.received[sop]) == (1, 1)
    finally:
        srv.stop()
        follows.stop()
        once.stop()

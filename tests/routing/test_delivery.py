"""Forwarding (issue 12): what is stored is delivered, a destination that is down
gets the backlog, one refused instance is dead-lettered without blocking the others,
two workers on one data folder never send an instance twice. Each on the SQLite and
the PostgreSQL index (tests/routing/conftest.py ``backend``)."""

from __future__ import annotations

from contextlib import contextmanager

import httpx
import pytest

from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.routing.conftest import ALL, Backend, wait_for, write_routes


@contextmanager
def forwarding(tmp_path, sink, backend: Backend, match: str = ""):
    """An archive forwarding every instance (or those ``match`` selects) to ``sink``."""
    routes = write_routes(tmp_path / "routes.toml", sink.url, match=match)
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    try:
        yield srv
    finally:
        srv.stop()


def store(url: str, datasets) -> dict[str, bytes]:
    datas = {ds.SOPInstanceUID: to_bytes(ds) for ds in datasets}
    body, ctype = multipart(list(datas.values()))
    r = httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=30)
    assert r.status_code == 200, r.text
    return datas


def at_sink(sink, sop: str) -> bytes | None:
    r = httpx.get(f"{sink.url}/instances", params={"SOPInstanceUID": sop})
    if not r.json():
        return None
    url = r.json()[0]["00081190"]["Value"][0]
    return httpx.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"}).content


def metric(url: str, series: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def queue(url: str) -> dict:
    r = httpx.get(url + "/admin/queue")
    assert r.status_code == 200, r.text
    return r.json()["destinations"]


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_stored_instances_are_delivered_byte_identical(tmp_path, sink, backend):
    with forwarding(tmp_path, sink, backend, match='match = { Modality = "CT" }') as srv:
        before = metric(srv.url, 'dicomweb_forwarded_total{destination="sink"}')
        study = "1.2.826.0.1.3680043.8.498.1"
        cts = [make_dataset(study=study, modality="CT") for _ in range(7)]
        mr = make_dataset(study=study, modality="MR")
        sent = store(srv.url, cts + [mr])
        wait_for(lambda: queue(srv.url).get("sink", {}).get("delivered") == 7, what="7 delivered")
        for ds in cts:
            assert at_sink(sink, ds.SOPInstanceUID) == sent[ds.SOPInstanceUID]
        assert at_sink(sink, mr.SOPInstanceUID) is None  # the rule matches CT only
        assert sink.recorder.received == {ds.SOPInstanceUID: 1 for ds in cts}
        assert sink.recorder.requests < 7  # batched (batch_size 5)
        q = queue(srv.url)["sink"]
        assert (q["pending"], q["in_flight"], q["failed"], q["oldest_pending_age"]) == (0, 0, 0, None)
        # counters are per process (tests share one): compare with the value before
        assert metric(srv.url, 'dicomweb_forwarded_total{destination="sink"}') == before + 7
        assert metric(srv.url, 'dicomweb_outbox_rows{destination="sink",state="delivered"}') == 7
        assert metric(srv.url, 'dicomweb_outbox_rows{destination="sink",state="pending"}') == 0
        # the outbox survives a restart: nothing is owed twice, nothing is sent again
        srv.restart()
        assert queue(srv.url)["sink"]["delivered"] == 7
        store(srv.url, cts[:1])  # a byte-identical duplicate: stored already, owes nothing new
        assert queue(srv.url)["sink"]["delivered"] == 7 and queue(srv.url)["sink"]["pending"] == 0



def test_a_sink_down_for_a_while_gets_the_backlog(tmp_path, sink, backend):
    with forwarding(tmp_path, sink, backend) as srv:
        sink.stop()  # connection refused
        sent = {}
        for _ in range(3):
            sent.update(store(srv.url, [make_dataset() for _ in range(4)]))
        wait_for(lambda: (queue(srv.url)["sink"]["last_error"] or "").startswith("ConnectError"), what="an error")
        assert queue(srv.url)["sink"]["delivered"] == 0
        sink.recorder.down = True
        sink.start()  # up, but answering 503
        wait_for(lambda: "HTTP 503" in (queue(srv.url)["sink"]["last_error"] or ""), what="a 503")
        sink.recorder.down = False
        wait_for(lambda: queue(srv.url)["sink"]["delivered"] == 12, what="the backlog")
        for sop, data in sent.items():
            assert at_sink(sink, sop) == data
        assert set(sink.recorder.received) == set(sent)
        assert queue(srv.url)["sink"]["failed"] == 0



def test_one_instance_refused_is_dead_lettered_without_blocking_the_rest(tmp_path, sink, backend):
    with forwarding(tmp_path, sink, backend) as srv:
        # the sink already holds this SOP Instance UID with other content: it answers 0x0111 for it
        clash = make_dataset(PatientID="ours")
        other = make_dataset(study=clash.StudyInstanceUID, series=clash.SeriesInstanceUID, sop=clash.SOPInstanceUID,
                             PatientID="theirs")
        store(sink.url, [other])
        good = [make_dataset() for _ in range(3)]
        sent = store(srv.url, good[:2] + [clash] + good[2:])
        wait_for(lambda: queue(srv.url)["sink"]["delivered"] == 3 and queue(srv.url)["sink"]["failed"] == 1,
                 what="3 delivered, 1 failed")
        q = queue(srv.url)["sink"]
        assert q["pending"] == 0 and "FailureReason 0x0111" in q["last_error"]
        for ds in good:
            assert at_sink(sink, ds.SOPInstanceUID) == sent[ds.SOPInstanceUID]
        assert at_sink(sink, clash.SOPInstanceUID) == to_bytes(other)  # theirs, untouched
        # retry-failed puts it back; it fails again the same way (a permanent refusal)
        r = httpx.post(srv.url + "/admin/queue/retry-failed")
        assert r.json() == {"requeued": 1}
        wait_for(lambda: queue(srv.url)["sink"]["failed"] == 1 and queue(srv.url)["sink"]["pending"] == 0,
                 what="failed again")
        assert sink.recorder.received[clash.SOPInstanceUID] == 3  # theirs, then ours twice



def test_a_batch_refused_whole_with_400_is_split_and_only_the_culprit_dead_lettered(tmp_path, sink, backend):
    with forwarding(tmp_path, sink, backend) as srv:
        datasets = [make_dataset() for _ in range(4)]
        bad = datasets[1].SOPInstanceUID
        sink.recorder.reject = {bad}
        sent = store(srv.url, datasets)
        wait_for(lambda: queue(srv.url)["sink"]["delivered"] == 3 and queue(srv.url)["sink"]["failed"] == 1,
                 what="3 delivered, 1 failed")
        assert queue(srv.url)["sink"]["last_error"] == "HTTP 400"
        for ds in datasets:
            assert at_sink(sink, ds.SOPInstanceUID) == (None if ds.SOPInstanceUID == bad else sent[ds.SOPInstanceUID])
        assert sink.recorder.received[bad] == 2  # in the batch, then alone



def test_two_workers_on_one_data_folder_never_double_send(tmp_path, sink, backend):
    routes = write_routes(tmp_path / "routes.toml", sink.url, extra="")
    a = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    b = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    try:
        sent = {}
        for i in range(8):  # both workers take stores; both forwarders race for the rows
            sent.update(store((a if i % 2 else b).url, [make_dataset() for _ in range(3)]))
        wait_for(lambda: queue(a.url)["sink"]["delivered"] == 24, what="24 delivered")
        assert sink.recorder.received == {sop: 1 for sop in sent}  # each exactly once
        assert sink.recorder.max_in_flight <= 2  # concurrency 2 per destination, across both workers
    finally:
        a.stop()
        b.stop()


def test_manual_export_and_scopes(tmp_path, sink, backend):
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[destinations]]\nname = "sink"\nstow_url = "{sink.url}"\n')  # no rules
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings,
                     api_keys={"w": ["read", "write"], "r": ["read"]}).start()
    try:
        ds = [make_dataset(study="1.2.3.4", series="1.2.3.4.5") for _ in range(2)] + [make_dataset(study="1.2.3.4")]
        body, ctype = multipart([to_bytes(d) for d in ds])
        w = {"Authorization": "Bearer w"}
        assert httpx.post(srv.url + "/studies", content=body, headers={"Content-Type": ctype, **w}).status_code == 200
        assert httpx.get(srv.url + "/admin/queue", headers={"Authorization": "Bearer r"}).status_code == 403
        assert httpx.get(srv.url + "/admin/queue", headers=w).json() == {"destinations": {}}  # no rule: nothing
        r = httpx.post(srv.url + "/admin/export/sink/studies/1.2.3.4/series/1.2.3.4.5", headers=w)
        assert r.status_code == 200 and r.json() == {"destination": "sink", "instances": 2, "enqueued": 2}
        assert httpx.post(srv.url + "/admin/export/nowhere/studies/1.2.3.4", headers=w).status_code == 404
        assert httpx.post(srv.url + "/admin/export/sink/studies/1.2.3.9", headers=w).status_code == 404
        wait_for(lambda: httpx.get(srv.url + "/admin/queue", headers=w).json()["destinations"]["sink"]["delivered"]
                 == 2, what="export delivered")
        assert set(sink.recorder.received) == {ds[0].SOPInstanceUID, ds[1].SOPInstanceUID}
    finally:
        srv.stop()

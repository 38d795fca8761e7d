"""``serve --workers 2 --routes``: both worker processes forward (leases keep them
from sending one instance twice) and ``/metrics`` sums both workers whichever
answers (prometheus-client multi-process mode)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx

from loadtests.common import wait_http
from tests.helpers import free_port, make_dataset, multipart, to_bytes
from tests.routing.conftest import wait_for, write_routes
from tests.routing.test_delivery import metric


def test_two_worker_processes(tmp_path, sink, backend):
    routes = write_routes(tmp_path / "routes.toml", sink.url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"),
                             "--port", str(port), "--workers", "2", "--routes", str(routes), *backend.args],
                            env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        wait_http(url + "/studies?limit=1", proc=proc)
        sops = set()
        for _ in range(6):
            datasets = [make_dataset() for _ in range(2)]
            sops |= {ds.SOPInstanceUID for ds in datasets}
            body, ctype = multipart([to_bytes(ds) for ds in datasets])
            with httpx.Client() as c:  # a new connection each time: both workers take stores
                assert c.post(url + "/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        wait_for(lambda: metric(url, 'dicomweb_outbox_rows{destination="sink",state="delivered"}') == 12,
                 what="12 delivered")
        for _ in range(4):  # whichever worker answers
            with httpx.Client() as c:
                text = c.get(url + "/metrics").text
            assert 'dicomweb_forwarded_total{destination="sink"} 12.0' in text
            assert "dicomweb_instances_stored_total 12.0" in text
        assert sink.recorder.received == {sop: 1 for sop in sops}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)

"""``/metrics`` of a node counts that node's processes, all of them, and only them:
its uvicorn workers and its DIMSE listener process (tests/dimse/test_serve.py), not
the processes of another node sharing its data folder. (The multi-process folder was
``data/metrics``: a second node on the folder wiped the first's files at its start and
then both summed each other's counters.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx

from loadtests.common import wait_http
from tests.helpers import free_port, make_dataset, multipart, to_bytes


def _node(data, port):
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["DICOMWEB_LOG_LEVEL"] = "warning"
    return subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data),
                             "--port", str(port), "--workers", "2", "--dimse-port", "0"],
                            env=env, start_new_session=True, stderr=subprocess.DEVNULL)


def _stored(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("dicomweb_instances_stored_total "):
            return float(line.split()[1])
    raise AssertionError("no dicomweb_instances_stored_total")


def test_two_nodes_on_one_folder_count_their_own_stores(tmp_path):
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = []
    try:
        for port, url in zip(ports, urls):
            procs.append(_node(tmp_path / "data", port))
            wait_http(url + "/studies?limit=1", proc=procs[-1])
        for url, n in zip(urls, (2, 3)):
            for _ in range(n):  # a new connection each time: either worker of the node may take it
                body, ctype = multipart([to_bytes(make_dataset())])
                with httpx.Client() as c:
                    assert c.post(url + "/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        for _ in range(3):  # whichever worker answers
            assert (_stored(urls[0]), _stored(urls[1])) == (2.0, 3.0)
        assert not (tmp_path / "data" / "metrics").exists()
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(30)

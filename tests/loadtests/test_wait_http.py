"""loadtests.common.wait_http, the readiness wait of every server the tests and load tests
start: no HTTP request while the port does not listen, one answer below 500 ends it, a
process that exited or a 5xx until the deadline is an error that says which."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtests.common import wait_http
from tests.helpers import free_port


def _server(port: int, status: int, seen: list[str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_waits_for_the_port_then_asks_once():
    port, seen, box = free_port(), [], []
    timer = threading.Timer(0.4, lambda: box.append(_server(port, 404, seen)))  # listens late
    timer.start()
    try:
        t0 = time.monotonic()
        wait_http(f"http://127.0.0.1:{port}/studies?limit=1", timeout=10)
        assert 0.35 < time.monotonic() - t0 < 5
        assert seen == ["/studies?limit=1"]  # refused connects before, then one request (404 < 500)
    finally:
        timer.join()
        for srv in box:
            srv.shutdown()
            srv.server_close()


def test_a_server_answering_5xx_is_not_ready():
    port, seen = free_port(), []
    srv = _server(port, 503, seen)
    try:
        with pytest.raises(RuntimeError, match="did not answer within 1 s \\(HTTP 503\\)"):
            wait_http(f"http://127.0.0.1:{port}/", timeout=1)
        assert len(seen) >= 2  # asked again
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_process_that_exited_is_named():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with code 3"):
        wait_http(f"http://127.0.0.1:{free_port()}/", timeout=10, proc=proc)

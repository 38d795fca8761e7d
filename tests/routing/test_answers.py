"""Delivered means the destination stored it (issue 25): a STOW-RS answer counts only
when it is a Store Instances Response (DICOM JSON, labelled application/dicom+json or,
as some servers do, application/json) whose ReferencedSOPSequence names the instance
(PS3.18 §10.5.3, Table 10.5.3-1); an empty 200, an HTML page (a login portal) or a 202
``{}`` is retried and then dead-lettered with the start of the answer. An answer is
read bounded."""

from __future__ import annotations

import socketserver
import threading

import orjson
import pytest

from dicomweb_server.routing.destinations import MAX_ANSWER, Verdict, stow_verdicts
from tests.helpers import LiveServer, make_dataset
from tests.routing.conftest import FAST, wait_for
from tests.routing.test_delivery import queue, store

JSON = "application/dicom+json"


def _response(stored: list[str], failed: dict[str, int] | None = None) -> bytes:
    doc: dict = {"00081199": {"vr": "SQ", "Value": [{"00081155": {"vr": "UI", "Value": [s]}} for s in stored]}}
    if failed:
        doc["00081198"] = {"vr": "SQ", "Value": [
            {"00081155": {"vr": "UI", "Value": [s]}, "00081197": {"vr": "US", "Value": [c]}}
            for s, c in failed.items()]}
    return orjson.dumps(doc)


def test_only_instances_named_in_the_referenced_sop_sequence_are_delivered():
    sops = ["1.2.1", "1.2.2", "1.2.3"]
    got = stow_verdicts(202, _response(["1.2.1"], {"1.2.2": 0xC000}), sops, content_type=JSON + "; charset=utf-8")
    assert [v for v, _ in got] == [Verdict.DELIVERED, Verdict.FAILED, Verdict.RETRY]
    assert got[2][1].startswith("HTTP 202; not named in ReferencedSOPSequence (0008,1199): ")
    assert stow_verdicts(200, _response(sops), sops, content_type=JSON) == [(Verdict.DELIVERED, None)] * 3


def test_dicom_json_labelled_application_json_is_read_as_a_store_response():
    """Some servers send the Store Instances Response as ``application/json``: what
    counts is the DICOM JSON inside (ReferencedSOPSequence, FailedSOPSequence)."""
    sops = ["1.2.1", "1.2.2", "1.2.3"]
    got = stow_verdicts(200, _response(["1.2.1"], {"1.2.2": 0xC000}), sops,
                        content_type="application/json; charset=utf-8")
    assert [v for v, _ in got] == [Verdict.DELIVERED, Verdict.FAILED, Verdict.RETRY]
    assert got[1][1] == "HTTP 200; FailureReason 0xC000"
    assert stow_verdicts(200, _response(sops), sops, content_type="Application/JSON") == [(Verdict.DELIVERED, None)] * 3
    # a label other than the two JSON ones is not read, whatever the body
    assert stow_verdicts(200, _response(sops), sops, content_type="text/plain")[0][0] is Verdict.RETRY


@pytest.mark.parametrize("status, body, ctype, shown", [
    (200, b"", "", "an empty body"),
    (200, b"<html><body>Sign in to continue</body></html>", "text/html", "<html><body>Sign in"),
    (202, b"{}", JSON, "'{}'"),
    (200, b"not json", JSON, "not json"),
    # labelled application/json (as some servers label DICOM JSON): still nothing named
    (200, b"", "application/json", "an empty body"),
    (202, b"{}", "application/json; charset=utf-8", "'{}'"),
    (200, b"<html><body>Sign in to continue</body></html>", "application/json", "<html><body>Sign in"),
    (200, _response(["1.2.8"]), "application/json", "00081199"),  # another instance named
])
def test_an_answer_that_names_nothing_is_retried_with_its_start(status, body, ctype, shown):
    ((verdict, error),) = stow_verdicts(status, body, ["1.2.9"], content_type=ctype)
    assert verdict is Verdict.RETRY
    assert error.startswith(f"HTTP {status}; ") and shown in error


class FakeDestination:
    """A STOW-RS destination (a plain HTTP/1.1 socket server, chunked answers) that
    answers every POST with ``answer() -> (status, content type, body chunks)``, and
    counts the answer bytes the socket took (until the client closed it)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests = 0
        self.sent = 0
        dest = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while self.rfile.readline():  # the request line; keep-alive until the client closes
                    length = 0
                    while (line := self.rfile.readline()) not in (b"\r\n", b""):
                        name, _, value = line.decode("latin-1").partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    self.rfile.read(length)
                    dest.requests += 1
                    status, ctype, chunks = dest.answer()
                    head = f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n"
                    head += f"Content-Type: {ctype}\r\n\r\n" if ctype else "\r\n"
                    try:
                        self.wfile.write(head.encode())
                        for chunk in chunks:
                            if chunk:
                                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                                dest.sent += len(chunk)
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:  # the client closed the connection
                        return

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeDestination":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _routes(tmp_path, url: str, attempts: int):
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[destinations]]\nname = "dest"\nstow_url = "{url}"\n[[rules]]\ndestinations = ["dest"]\n'
                      + FAST.replace("max_attempts = 100000", f"max_attempts = {attempts}"))
    return routes


@pytest.mark.parametrize("answer", [
    (200, "", [b""]),
    (200, "text/html; charset=utf-8", [b"<!DOCTYPE html><html><title>Single sign-on</title></html>"]),
    (202, JSON, [b"{}"]),
], ids=["200-empty", "200-html", "202-empty-json"])
def test_an_answer_that_is_not_a_store_response_is_a_dead_letter_in_the_end(tmp_path, answer):
    status, ctype, chunks = answer
    with FakeDestination(lambda: answer) as dest:
        srv = LiveServer(tmp_path / "data", "sqlite", routes_file=_routes(tmp_path, dest.url, 2)).start()
        try:
            store(srv.url, [make_dataset()])
            q = wait_for(lambda: (lambda d: d if d["failed"] == 1 else None)(queue(srv.url)["dest"]),
                         what="a dead letter")
            assert (q["delivered"], q["pending"]) == (0, 0) and dest.requests == 2
            assert q["last_error"].startswith(f"gave up after 2 attempt(s)")
            assert f"HTTP {status}; " in q["last_error"]
            assert (chunks[0][:30].decode() if chunks[0] else "an empty body") in q["last_error"]
        finally:
            srv.stop()


def test_a_store_response_labelled_application_json_is_delivered(tmp_path):
    """End to end: a destination answering its Store Instances Response as
    ``application/json`` (chunked, over a socket) gets the instance delivered once."""
    ds = make_dataset()
    with FakeDestination(lambda: (200, "application/json", [_response([str(ds.SOPInstanceUID)])])) as dest:
        srv = LiveServer(tmp_path / "data", "sqlite", routes_file=_routes(tmp_path, dest.url, 2)).start()
        try:
            store(srv.url, [ds])
            q = wait_for(lambda: (lambda d: d if d["delivered"] == 1 else None)(queue(srv.url)["dest"]),
                         what="a delivery")
            assert (q["pending"], q["in_flight"], q["failed"], dest.requests) == (0, 0, 0, 1)
        finally:
            srv.stop()


def test_a_huge_answer_is_not_read(tmp_path):
    """A destination answering 1 GiB: the archive reads at most MAX_ANSWER of it (the
    rest is left unread, the connection closed) and retries the batch."""
    chunk = b"x" * (1 << 16)
    gib = (1 << 30) // len(chunk)
    with FakeDestination(lambda: (200, JSON, (chunk for _ in range(gib)))) as dest:
        srv = LiveServer(tmp_path / "data", "sqlite", routes_file=_routes(tmp_path, dest.url, 100000)).start()
        try:
            store(srv.url, [make_dataset()])
            wait_for(lambda: (queue(srv.url)["dest"]["last_error"] or "").startswith("HTTP 200: the answer is longer"),
                     what="a retry for a long answer")
            q = queue(srv.url)["dest"]
            assert q["delivered"] == 0 and q["pending"] + q["in_flight"] == 1
            assert str(MAX_ANSWER) in q["last_error"]
            # what was sent is bounded by the socket buffers, not the answer's 1 GiB
            assert dest.sent < 64 * MAX_ANSWER, dest.sent
        finally:
            srv.stop()

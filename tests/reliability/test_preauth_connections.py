"""Pre-auth harm, connections (issue 14 §3): slowloris (no header-read timeout:
1,100 trickling connections locked everyone out at 1,024 open files), a 200 MB
header or URL read whole before the 431, a trickled STOW-RS body without a total
deadline. A real server on a loopback socket, raw sockets; behaviour is asserted,
never durations."""

from __future__ import annotations

import resource
import select
import socket
import subprocess
import sys

import httpx
import orjson
import pytest

from tests.helpers import LiveServer


@pytest.fixture
def guarded(tmp_path):
    srv = LiveServer(tmp_path / "data", header_timeout=0.5, max_header_bytes=8192, body_timeout=1.0,
                     body_min_rate=1000).start()
    yield srv
    srv.stop()


def _connect(srv: LiveServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.settings.port), timeout=20)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (socket timeout 20 s: a hang fails)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_slowloris_connections_are_closed_and_others_served(guarded):
    loris = []
    try:
        for _ in range(200):
            s = _connect(guarded)
            s.sendall(b"GET /studies HTTP/1.1\r\nHost: x\r\nX-a: ")  # and never the end of the headers
            loris.append(s)
        idle = _connect(guarded)  # connected, sends nothing
        loris.append(idle)
        r = httpx.get(guarded.url + "/studies", timeout=20)
        assert r.status_code == 200 and r.json() == []
        for s in loris[:-1]:
            answer = _read_all(s)  # closed by the server, with a 408
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert _read_all(idle) == b""  # an idle connection is closed without an answer
    finally:
        for s in loris:
            s.close()


def test_the_header_deadline_holds_for_later_requests_of_a_keep_alive_connection(guarded):
    with _connect(guarded) as s:
        s.sendall(b"GET /studies HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        s.sendall(b"GET /studies HTTP/1.1\r\nHost: x\r\n")
        for _ in range(100):  # trickle a header, one byte per 50 ms (5 s at most)
            try:
                s.sendall(b"a")
            except OSError:
                break
            if select.select([s], [], [], 0.05)[0]:
                break
        assert _read_all(s).startswith(b"HTTP/1.1 408 ")


def _flood(srv: LiveServer, head: bytes, filler: bytes, total: int) -> tuple[bytes, int]:
    """Send ``head`` then ``filler`` up to ``total`` bytes, never ending the head,
    stopping when the server answers or closes; returns (answer, bytes sent)."""
    sent = 0
    with _connect(srv) as s:
        s.sendall(head)
        piece = filler * (65536 // len(filler))
        while sent < total:
            try:
                sent += s.send(piece)
            except OSError:  # reset: the server closed after answering
                break
            if select.select([s], [], [], 0)[0]:
                break
        try:
            answer = _read_all(s)
        except ConnectionResetError:
            answer = b""
    return answer, sent


def test_a_huge_header_is_refused_431_before_it_ends(guarded):
    answer, sent = _flood(guarded, b"GET /studies HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a", 64 * 1024 * 1024)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert b"8192 bytes" in answer
    # answered while the header was still arriving: the server stopped reading at the bound
    assert sent < 64 * 1024 * 1024
    assert httpx.get(guarded.url + "/studies", timeout=20).status_code == 200


def test_a_huge_url_is_refused_414_before_it_ends(guarded):
    answer, sent = _flood(guarded, b"GET /studies?PatientID=", b"a", 64 * 1024 * 1024)
    assert answer.startswith(b"HTTP/1.1 414 "), answer[:80]
    assert sent < 64 * 1024 * 1024


def _flood_after_one_request(srv: LiveServer, head: bytes, filler: bytes) -> bytes:
    """Like :func:`_flood`, on a keep-alive connection that has already been answered
    once: the head of its second request must be counted from its first byte."""
    with _connect(srv) as s:
        s.sendall(b"GET /studies HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        s.sendall(head + filler * 100)  # line (and Host) in one read, as a client sends them
        piece, sent = filler * (65536 // len(filler)), 0
        while sent < 64 * 1024 * 1024:
            try:
                sent += s.send(piece)
            except OSError:
                break
            if select.select([s], [], [], 0)[0]:
                break
        try:
            return _read_all(s)
        except ConnectionResetError:
            return b""


def test_the_second_request_of_a_connection_gets_431_for_a_huge_header(guarded):
    """The read that starts a keep-alive connection's next request was not counted,
    so its request line was never seen and a huge header got 414 (CI, 2026-12-03)."""
    answer = _flood_after_one_request(guarded, b"GET /studies HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]


def test_the_second_request_of_a_connection_gets_414_for_a_huge_url(guarded):
    answer = _flood_after_one_request(guarded, b"GET /studies?PatientID=", b"a")
    assert answer.startswith(b"HTTP/1.1 414 "), answer[:80]


def _one_read(srv: LiveServer, url_bytes: int) -> tuple[bytes, dict]:
    """A whole request with a URL of ``url_bytes`` in one sendall (the server reads it
    at once); returns the status line and the JSON body."""
    path = b"/studies?PatientID="
    request = path + b"a" * (url_bytes - len(path))
    with _connect(srv) as s:
        s.sendall(b"GET " + request + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _read_all(s)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return head.split(b"\r\n")[0], orjson.loads(body)


@pytest.mark.parametrize("url_bytes", [65_600, 300_000])
def test_a_huge_url_in_one_read_gets_the_json_414(guarded, url_bytes):
    """A request line of 64 KiB or more arriving whole was fed to httptools before it was
    counted: parse_url failed and uvicorn answered a plain-text 400 ``Invalid HTTP request
    received.``"""
    status, body = _one_read(guarded, url_bytes)
    assert status.startswith(b"HTTP/1.1 414 "), status
    assert body == {"detail": "request line exceeds 8192 bytes"}


def test_a_url_httptools_cannot_parse_gets_414_under_a_larger_header_bound(tmp_path):
    """max_header_bytes may be up to 1 MiB, but httptools reads no URL over 65,535 bytes."""
    srv = LiveServer(tmp_path / "data", max_header_bytes=1024**2).start()
    try:
        status, body = _one_read(srv, 100_000)
        assert status.startswith(b"HTTP/1.1 414 "), status
        assert body == {"detail": "request line exceeds 65535 bytes"}
        status, body = _one_read(srv, 60_000)  # parsed, and refused by the app (a PatientID of 256 characters at most)
        assert status.startswith(b"HTTP/1.1 400 "), status
        assert body["detail"] == "PatientID: value longer than 256 characters"
    finally:
        srv.stop()


def test_many_header_fields_count_towards_the_bound(guarded):
    answer, _ = _flood(guarded, b"GET /studies HTTP/1.1\r\nHost: x\r\n", b"X-h: v\r\n", 64 * 1024 * 1024)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]


def test_a_normal_request_with_a_body_larger_than_the_header_bound_is_served(guarded):
    """The bound is on the head: a read that completes the head and carries body bytes is fine."""
    r = httpx.post(guarded.url + "/studies", content=b"x" * 200_000,
                   headers={"content-type": 'multipart/related; type="application/dicom"; boundary=b'}, timeout=20)
    assert r.status_code in (400, 409)  # not DICOM, but read and answered by the app


def test_body_bytes_after_a_head_end_split_across_reads_are_not_counted(guarded):
    """The head's CRLF CRLF split between two reads ("\r\n\r" | "\n" + 20 KB of body): the
    second read holds one byte of head, not 20 KB (the guard counts before parsing)."""
    body = b"x" * 20_000
    with _connect(guarded) as s:
        s.sendall(b"POST /studies HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n"
                  b'Content-Type: multipart/related; type="application/dicom"; boundary=b\r\n\r')
        select.select([s], [], [], 0.3)  # the server reads the first part on its own
        s.sendall(b"\n" + body)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]  # not DICOM: read and answered by the app


def test_a_trickled_stow_body_meets_the_total_deadline(guarded):
    """1 byte per 50 ms never stalls for body_timeout (1 s), but falls below
    body_min_rate: 408 once body_timeout + received / min_rate has passed."""
    body_head = (b"POST /studies HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                 b'Content-Type: multipart/related; type="application/dicom"; boundary=b\r\n\r\n--b\r\n')
    with _connect(guarded) as s:
        s.sendall(body_head)
        answered = False
        for _ in range(400):  # 20 s at most
            try:
                s.sendall(b"a")
            except OSError:
                break
            if select.select([s], [], [], 0.05)[0]:
                answered = True
                break
        assert answered
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert b"too slow" in answer


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = ("import resource\n"
            "from dicomweb_server.api.limits import raise_open_files_limit\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    new, now, hard_ = (int(x) for x in out)
    assert new == now
    assert now == (hard_ if hard_ != resource.RLIM_INFINITY else 1 << 20)
    assert now > 256
    del soft, hard

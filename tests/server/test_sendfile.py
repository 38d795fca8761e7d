"""Whole-study answers sent by the kernel (api/sendfile.py) on a real uvicorn server
(uvloop, our protocol subclass): the stored bytes, in order, with their length; HEAD;
keep-alive and pipelined requests after such an answer; no worker thread held by a
client that does not read; every descriptor given back when the client goes away
mid-answer; a file cut short underneath ends the connection rather than the length."""

from __future__ import annotations

import os
import socket
import time
import types

import httpx
import pytest

from dicomweb_server import retrieve
from dicomweb_server.api import sendfile, threads
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

WHOLE = 'multipart/related; type="application/dicom"; transfer-syntax=*'


@pytest.fixture
def live(tmp_path):
    srv = LiveServer(tmp_path / "data").start()
    yield srv
    srv.stop()


def _store_study(url: str, n: int, rows: int) -> tuple[str, list[bytes]]:
    first = make_dataset(rows=rows, columns=rows)
    datasets = [first] + [make_dataset(study=first.StudyInstanceUID, series=first.SeriesInstanceUID,
                                       rows=rows, columns=rows) for _ in range(n - 1)]
    files = [to_bytes(ds) for ds in datasets]
    body, ctype = multipart(files)
    r = httpx.post(f"{url}/studies", content=body, headers={"Content-Type": ctype}, timeout=60)
    assert r.status_code == 200
    return first.StudyInstanceUID, files


def _parts(ctype: str, content: bytes) -> list[bytes]:
    boundary = ctype.split("boundary=")[1].split(";")[0].strip('"')
    return [c.split(b"\r\n\r\n", 1)[1][:-2] for c in content.split(b"--" + boundary.encode())[1:-1]]


def _request(study: str, method: str = "GET") -> bytes:
    return (f"{method} /studies/{study} HTTP/1.1\r\nHost: t\r\nAccept: {WHOLE}\r\n\r\n").encode()


def _read_answer(s: socket.socket, buf: bytes = b"") -> tuple[dict[str, str], bytes, bytes]:
    """One HTTP/1.1 answer with a Content-Length from ``s``: (headers, body, what follows)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, "connection closed before the head"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    n = int(headers["content-length"])
    while len(rest) < n:
        chunk = s.recv(1 << 20)
        assert chunk, f"connection closed after {len(rest)} of {n} body bytes"
        rest += chunk
    return headers, rest[:n], rest[n:]


def test_study_is_the_stored_bytes_with_its_length_and_keep_alive_goes_on(live):
    study, files = _store_study(live.url, 4, 512)  # 512 KB files: several socket buffers per answer
    with httpx.Client(base_url=live.url, timeout=60) as c:
        for _ in range(3):  # the same connection each time
            r = c.get(f"/studies/{study}", headers={"Accept": WHOLE})
            assert r.status_code == 200
            assert "transfer-encoding" not in r.headers
            assert int(r.headers["content-length"]) == len(r.content)
            assert sorted(_parts(r.headers["content-type"], r.content)) == sorted(files)
        head = c.head(f"/studies/{study}", headers={"Accept": WHOLE})
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == r.headers["content-length"]
        assert c.get("/studies", params={"StudyInstanceUID": study}).json()[0]["0020000D"]["Value"] == [study]
    assert retrieve.DESCRIPTORS.in_use == 0


def test_the_extension_is_what_sends_the_study(live, monkeypatch):
    """The answer above went through SENDFILE (not the mapped-file fallback)."""
    study, files = _store_study(live.url, 2, 64)
    calls = []
    real = sendfile.write_pieces
    monkeypatch.setattr(sendfile, "write_pieces", lambda *a: calls.append(a[1]) or real(*a))
    r = httpx.get(f"{live.url}/studies/{study}", headers={"Accept": WHOLE}, timeout=60)
    assert sorted(_parts(r.headers["content-type"], r.content)) == sorted(files)
    assert calls and sum(isinstance(p, tuple) for p in calls[0]) == 2  # both files by descriptor


def test_pipelined_requests_are_answered_in_order(live):
    study, files = _store_study(live.url, 3, 256)
    other, other_files = _store_study(live.url, 2, 128)
    with socket.create_connection(("127.0.0.1", live.settings.port), timeout=30) as s:
        s.sendall(_request(study) + _request(other) + _request(study, "HEAD") + _request(study))
        h1, b1, rest = _read_answer(s)
        h2, b2, rest = _read_answer(s, rest)
        while b"\r\n\r\n" not in rest:
            rest += s.recv(65536)
        head, _, rest = rest.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and f"content-length: {len(b1)}".encode() in head.lower()
        h4, b4, rest = _read_answer(s, rest)
    assert sorted(_parts(h1["content-type"], b1)) == sorted(files)
    assert sorted(_parts(h2["content-type"], b2)) == sorted(other_files)
    assert sorted(_parts(h4["content-type"], b4)) == sorted(files)
    assert rest == b""


def test_a_client_that_does_not_read_holds_no_worker_thread(live, monkeypatch):
    """Clients that stop reading a big answer wait on the event loop (writability),
    not in a worker thread: with a pool of 2 threads, 4 such clients leave the
    server answering everyone else; each answer ends when its client reads on."""
    monkeypatch.setattr(threads, "_pool", threads.Pool(max_threads=2, name="test"))
    study, files = _store_study(live.url, 6, 1024)  # 6 x 2 MB: more than the socket buffers hold
    stalled = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", live.settings.port), timeout=60)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(_request(study))
        stalled.append(s)
    time.sleep(1.0)  # every answer has filled its socket buffers by now
    t0 = time.monotonic()
    r = httpx.get(f"{live.url}/studies", params={"StudyInstanceUID": study}, timeout=10)
    assert r.status_code == 200 and time.monotonic() - t0 < 5
    for s in stalled:
        headers, body, rest = _read_answer(s)
        assert sorted(_parts(headers["content-type"], body)) == sorted(files) and rest == b""
        s.close()
    assert retrieve.DESCRIPTORS.in_use == 0


def test_a_client_gone_mid_answer_gives_every_descriptor_back(live):
    study, _ = _store_study(live.url, 6, 1024)
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", live.settings.port), timeout=30)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(_request(study))
        s.recv(1000)  # the answer has started
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
        s.close()
    deadline = time.monotonic() + 10
    while retrieve.DESCRIPTORS.in_use and time.monotonic() < deadline:
        time.sleep(0.05)
    assert retrieve.DESCRIPTORS.in_use == 0
    # the server goes on, and holds no descriptor of those answers (a few index ones may come and go)
    r = httpx.get(f"{live.url}/studies", params={"StudyInstanceUID": study}, timeout=10)
    assert r.status_code == 200
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 4


def test_write_pieces_in_order_with_resume_after_a_full_buffer(tmp_path):
    data = os.urandom(3 << 20)
    path = tmp_path / "f"
    path.write_bytes(data)
    a, b = socket.socketpair()
    a.setblocking(False)
    fd = os.open(path, os.O_RDONLY)
    try:
        pieces = [b"head-", (fd, 10, len(data) - 10), b"-mid-", (fd, 0, 10), b"-tail"]
        got = bytearray()
        i = off = 0
        stops = 0
        while i < len(pieces):
            i, off = sendfile.write_pieces(a.fileno(), pieces, i, off)
            stops += i < len(pieces)
            b.setblocking(False)
            try:
                while True:
                    chunk = b.recv(1 << 20)
                    if not chunk:
                        break
                    got += chunk
            except BlockingIOError:
                pass
        assert stops > 0  # it stopped at a full buffer and went on from there
        assert bytes(got) == b"head-" + data[10:] + b"-mid-" + data[:10] + b"-tail"
    finally:
        os.close(fd)
        a.close()
        b.close()


def test_a_file_shorter_than_promised_is_an_error(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    a, b = socket.socketpair()
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(sendfile.ShortFile):
            sendfile.write_pieces(a.fileno(), [(fd, 0, 200)], 0, 0)
        assert b.recv(1000) == b"x" * 100
    finally:
        os.close(fd)
        a.close()
        b.close()


def test_a_file_cut_short_underneath_ends_the_connection(live):
    """Stored files never change; one truncated by hand after the answer opened it
    cannot keep the Content-Length: the connection ends (the client sees a short
    body), the server goes on."""
    study, _ = _store_study(live.url, 2, 512)
    real = retrieve.open_files

    def open_then_truncate(items):
        opened = real(items)
        os.truncate(items[-1][0], 1000)
        return opened

    mp = pytest.MonkeyPatch()
    mp.setattr(retrieve, "open_files", open_then_truncate)
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"{live.url}/studies/{study}", headers={"Accept": WHOLE}, timeout=30)
    finally:
        mp.undo()
    assert httpx.get(f"{live.url}/studies", timeout=10).status_code == 200
    deadline = time.monotonic() + 10
    while retrieve.DESCRIPTORS.in_use and time.monotonic() < deadline:
        time.sleep(0.05)
    assert retrieve.DESCRIPTORS.in_use == 0


def test_no_extension_over_tls():
    class Transport:
        def __init__(self, **extra):
            self.extra = extra

        def get_extra_info(self, name, default=None):
            return self.extra.get(name, default)

    tcp = types.SimpleNamespace(type=socket.SOCK_STREAM)
    assert sendfile.can_sendfile(Transport(socket=tcp))
    assert not sendfile.can_sendfile(Transport(socket=tcp, sslcontext=object()))
    assert not sendfile.can_sendfile(Transport(socket=tcp, ssl_object=object()))
    assert not sendfile.can_sendfile(Transport())

"""The writes of one event-loop turn in one system call (api/coalesce.py, issue 33): an
answer's head and body reach the transport in one ``writelines``, in order; nothing is
held past the turn or beyond HOLD_BYTES, and every other use of the transport sees
what was written before it."""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.server import ServerState

from dicomweb_server.api import coalesce
from dicomweb_server.api.coalesce import CoalescingTransport
from dicomweb_server.api.limits import GuardedHttpToolsProtocol


class Recorder(asyncio.Transport):
    """A transport that records what is done to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.closing = False
        self.protocol = None

    def write(self, data):
        self.calls.append(("write", bytes(data)))

    def writelines(self, data):
        self.calls.append(("writelines", [bytes(d) for d in data]))

    def close(self):
        self.calls.append(("close",))
        self.closing = True

    def is_closing(self):
        return self.closing

    def get_write_buffer_size(self):
        self.calls.append(("size",))
        return 0

    def write_eof(self):
        self.calls.append(("eof",))

    def can_write_eof(self):
        return True

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8042), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def set_protocol(self, protocol):
        self.protocol = protocol

    def pause_reading(self):
        self.calls.append(("pause_reading",))

    def resume_reading(self):
        self.calls.append(("resume_reading",))


def test_one_turns_writes_are_one_writelines_after_the_turn():
    async def main():
        rec = Recorder()
        t = CoalescingTransport(rec, asyncio.get_running_loop())
        t.write(b"head")
        t.write(b"")
        t.write(b"body")
        t.write(b"tail")
        assert rec.calls == []  # nothing before the turn ends
        await asyncio.sleep(0)
        assert rec.calls == [("writelines", [b"head", b"body", b"tail"])]
        t.write(b"alone")
        await asyncio.sleep(0)
        assert rec.calls[-1] == ("write", b"alone")
    asyncio.run(main())


def test_more_than_hold_bytes_go_at_once_and_in_order():
    async def main():
        rec = Recorder()
        t = CoalescingTransport(rec, asyncio.get_running_loop())
        big = b"x" * coalesce.HOLD_BYTES
        t.write(b"head")
        t.write(big)  # over the bound: handed over now (the transport's flow control sees it)
        assert rec.calls == [("writelines", [b"head", big])]
        t.write(b"end")
        await asyncio.sleep(0)
        assert rec.calls[-1] == ("write", b"end")
    asyncio.run(main())


def test_other_uses_of_the_transport_see_what_was_written_first():
    async def main():
        rec = Recorder()
        t = CoalescingTransport(rec, asyncio.get_running_loop())
        t.write(b"a")
        assert t.get_write_buffer_size() == 0
        assert rec.calls == [("write", b"a"), ("size",)]
        t.write(b"b")
        t.write_eof()  # through __getattr__
        assert rec.calls[-2:] == [("write", b"b"), ("eof",)]
        t.pause_reading()  # reading side: nothing to hand over first
        t.write(b"c")
        t.close()
        assert rec.calls[-3:] == [("pause_reading",), ("write", b"c"), ("close",)]
        t.write(b"late")  # on a closing transport: straight to it, as without this class
        assert rec.calls[-1] == ("write", b"late")
        await asyncio.sleep(0)
        assert rec.calls[-1] == ("write", b"late")  # nothing kept
    asyncio.run(main())


def test_kept_bytes_of_a_connection_gone_meanwhile_are_dropped():
    async def main():
        rec = Recorder()
        t = CoalescingTransport(rec, asyncio.get_running_loop())
        t.write(b"a")
        rec.closing = True  # e.g. the peer reset the connection
        await asyncio.sleep(0)
        assert rec.calls == []
    asyncio.run(main())


def test_an_answer_is_one_write_through_the_archives_uvicorn_protocol():
    """The protocol the server runs (api/limits.py) on a recording transport: head and
    body pieces of one answer reach the transport in one call, in order."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"01234", "more_body": True})
        await send({"type": "http.response.body", "body": b"56789"})

    async def main():
        config = uvicorn.Config(app, lifespan="off", log_level="warning", proxy_headers=False)
        config.load()
        protocol = GuardedHttpToolsProtocol(config=config, server_state=ServerState(), app_state={},
                                            header_timeout=5, max_header_bytes=8192)
        rec = Recorder()
        protocol.connection_made(rec)
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        for _ in range(20):
            await asyncio.sleep(0)
        writes = [c for c in rec.calls if c[0] in ("write", "writelines")]
        assert len(writes) == 1, writes
        assert writes[0][0] == "writelines"
        data = b"".join(writes[0][1])
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\n0123456789")
        protocol.connection_lost(None)
    asyncio.run(main())

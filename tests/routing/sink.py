"""A receiving archive for routing tests: a real archive app (our duplicate policy)
behind a recorder that counts every SOP Instance UID each STOW-RS request carries
(so double sends are seen even though the archive answers them idempotently), and
can be switched off (503) to play a destination that is down."""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from pathlib import Path

import pydicom
import uvicorn

from dicomweb_server.app import create_app
from dicomweb_server.dicom.media_types import parse_media_type
from dicomweb_server.settings import Settings
from tests.helpers import PromptServer, free_port


def sops_in(body: bytes, content_type: str) -> list[str]:
    boundary = parse_media_type(content_type).params["boundary"].encode()
    out = []
    for part in body.split(b"--" + boundary)[1:-1]:
        data = part.split(b"\r\n\r\n", 1)[1][:-2]
        out.append(str(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).SOPInstanceUID))
    return out


class Recorder:
    def __init__(self, app) -> None:
        self.app = app
        self.received: Counter[str] = Counter()
        self.requests = 0
        self.down = False
        self.reject: set[str] = set()  # a request carrying one of these SOP Instance UIDs gets a bare 400
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        if self.down:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            return await send({"type": "http.response.body", "body": b""})
        chunks = []
        while True:
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        body = b"".join(chunks)
        ctype = dict(scope["headers"]).get(b"content-type", b"").decode()
        sops = sops_in(body, ctype)
        with self._lock:
            self.requests += 1
            self.received.update(sops)
        if self.reject & set(sops):
            await send({"type": "http.response.start", "status": 400, "headers": []})
            return await send({"type": "http.response.body", "body": b"no"})
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            await self.app(scope, replay, send)
        finally:
            with self._lock:
                self.in_flight -= 1


class Sink:
    def __init__(self, data_dir: Path, **settings) -> None:
        self.settings = Settings(data_dir=data_dir, index="sqlite", port=free_port(), **settings)
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self.recorder = Recorder(create_app(self.settings))
        self._server = None
        self._thread = None

    def start(self) -> "Sink":
        config = uvicorn.Config(self.recorder, host="127.0.0.1", port=self.settings.port, log_level="warning",
                                access_log=False, lifespan="on")
        self._server = PromptServer(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "sink did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.wake()
            self._thread.join(timeout=20)
            self._server = None

"""The clients over real sockets: the fake server behind uvicorn on 127.0.0.1.

This module overrides ``dicomweb_url`` -- the same mechanism a test of the real
archive uses -- so the contract tests imported below run over real HTTP
(chunked uploads, streamed downloads, connection handling), not MockTransport.
"""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pydicom
import pytest
import uvicorn

from dicomweb_client import DICOMwebClient, NetworkError, NotFound

from .conftest import sample_path
from .fakeserver import FakeArchive
from .test_contract import (  # noqa: F401  (collected again here, over real HTTP)
    stored,
    test_delete,
    test_errors,
    test_frames_and_bulkdata,
    test_store_search_retrieve_roundtrip,
)


def _asgi_app(archive: FakeArchive):
    async def app(scope, receive, send):
        if scope["type"] != "http":  # pragma: no cover
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        host, port = scope["server"]
        url = httpx.URL(f"http://{host}:{port}").copy_with(raw_path=raw)
        request = httpx.Request(scope["method"], url, headers=scope["headers"], content=bytes(body))
        response = archive.handler(request)
        headers = [(k.encode(), v.encode()) for k, v in response.headers.multi_items()]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        for chunk in response.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live_server():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    archive = FakeArchive(url)
    config = uvicorn.Config(_asgi_app(archive), host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:  # pragma: no cover
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    yield url, archive
    server.should_exit = True
    thread.join(5)


@pytest.fixture
def dicomweb_url(live_server):
    return live_server[0]


def test_chunked_upload_and_streamed_download(live_server):
    url, archive = live_server
    datasets = [pydicom.dcmread(sample_path(n)) for n in ("CT_small.dcm", "rtdose.dcm")]
    with DICOMwebClient(url) as client:
        result = client.store_instances(ds for ds in datasets)  # generator: chunked transfer
        assert result.ok and len(result.referenced) == 2
        dose = datasets[1]
        got = list(client.iter_series(dose.StudyInstanceUID, dose.SeriesInstanceUID))
        assert got[0].PixelData == dose.PixelData
        frames = client.retrieve_instance_frames(dose.StudyInstanceUID, dose.SeriesInstanceUID, dose.SOPInstanceUID, range(1, 16))
        assert b"".join(frames) == dose.PixelData
        with pytest.raises(NotFound):
            client.retrieve_study_metadata("1.2.3.404")
        for ds in datasets:
            client.delete_study(ds.StudyInstanceUID)
    assert archive.instances == {}


def test_connection_refused_is_retried_then_reported():
    url = f"http://127.0.0.1:{_free_port()}"
    with DICOMwebClient(url, retries=2, backoff_factor=0.01) as client:
        start = time.monotonic()
        with pytest.raises(NetworkError):
            client.search_for_studies()
        assert time.monotonic() - start >= 0.03  # 0.01 + 0.02 of backoff

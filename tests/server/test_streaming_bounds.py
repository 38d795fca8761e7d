"""Slow readers (issue 14 §3): streamed answers hand the server's transport
bounded pieces (uvicorn waits for its write buffer to drain before each send),
so a client that reads slowly never makes the server buffer a whole file or
frame. Checked at the ASGI boundary: every body message is at most SEND_PIECE, or
for a study or series answer sent from opened files (api/wado.py ``_send_opened``)
retrieve.SEND_PIECE (1 MiB: a 512x512 CT file in one send; such an answer holds at
most two READ_BATCH reads whatever the piece size, so the bound per slow reader is the
same). The RSS this saves is measured by benchmarks/slow_readers.py."""

from __future__ import annotations

import asyncio

import pytest

from dicomweb_server import retrieve
from dicomweb_server.api.responses import SEND_PIECE
from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, to_bytes

SIDE = 800  # 800 x 800 x 2 bytes = 1.28 MB per frame, five pieces


async def _get(app, path: str, accept: str) -> list[bytes]:
    """Body messages the app sends for one GET (a raw ASGI call)."""
    bodies: list[bytes] = []
    sent = {"request": False}

    async def receive():
        if not sent["request"]:
            sent["request"] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects

    async def send(message):
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message
        elif message["type"] == "http.response.body":
            bodies.append(bytes(message.get("body", b"")))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"test"), (b"accept", accept.encode())], "client": ("127.0.0.1", 1),
             "server": ("test", 80)}
    await app(scope, receive, send)
    return bodies


@pytest.fixture(params=["files", "s3"])
def stored(request, tmp_path):
    """Files, or objects in a local S3 server (ranged GETs handed on in bounded pieces)."""
    extra = request.getfixturevalue("s3_storage") if request.param == "s3" else {}
    archive = Archive.open(Settings(data_dir=tmp_path, index="sqlite", **extra))
    one = make_dataset(rows=SIDE, columns=SIDE)
    two = make_dataset(study=one.StudyInstanceUID, series=one.SeriesInstanceUID, rows=SIDE, columns=SIDE, frames=2)
    spooled = []
    for ds in (one, two):
        p = archive.blobs.spool / f"{ds.SOPInstanceUID}.tmp"
        p.write_bytes(to_bytes(ds))
        spooled.append(p)
    outcome = archive.store([SpooledPart(headers={}, path=p, size=p.stat().st_size, complete=True) for p in spooled])
    assert len(outcome.stored) == 2
    yield create_app(archive.settings, archive=archive), one, two
    archive.close()


@pytest.mark.parametrize("what", ["study", "series", "instance", "frames", "one frame"])
def test_streamed_answers_are_sent_in_bounded_pieces(stored, what, request):
    app, one, two = stored
    opened = request.node.callspec.params["stored"] == "files" and what in ("study", "series")
    assert retrieve.SEND_PIECE <= retrieve.READ_BATCH
    inst = f"/studies/{two.StudyInstanceUID}/series/{two.SeriesInstanceUID}/instances/{two.SOPInstanceUID}"
    path, accept, expected = {
        "study": (f"/studies/{one.StudyInstanceUID}", 'multipart/related; type="application/dicom"; transfer-syntax=*',
                  [to_bytes(one), to_bytes(two)]),
        "series": (f"/studies/{one.StudyInstanceUID}/series/{one.SeriesInstanceUID}",
                   'multipart/related; type="application/dicom"; transfer-syntax=*', [to_bytes(one), to_bytes(two)]),
        "instance": (inst, "application/dicom; transfer-syntax=*", [to_bytes(two)]),
        "frames": (inst + "/frames/2,1", 'multipart/related; type="application/octet-stream"',
                   [two.PixelData[SIDE * SIDE * 2:], two.PixelData[: SIDE * SIDE * 2]]),
        "one frame": (inst + "/frames/1", 'multipart/related; type="application/octet-stream"',
                              [two.PixelData[: SIDE * SIDE * 2]]),
    }[what]
    bodies = asyncio.run(_get(app, path, accept))
    assert max(len(b) for b in bodies) <= (retrieve.SEND_PIECE if opened else SEND_PIECE)
    body = b"".join(bodies)
    at = [body.find(value) for value in expected]  # every value arrives whole, in order
    assert -1 not in at and at == sorted(at)

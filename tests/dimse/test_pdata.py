"""P-DATA-TF PDUs handed to the DIMSE layer as views of one buffer (dicomweb_server/dimse/pdata.py):
the bytes stored are the bytes sent, whatever the PDV layout (PS3.8 §9.3.5, Annex E), and a
PDU whose PDV items do not tile it still aborts the association with nothing stored."""

from __future__ import annotations

import hashlib
import io
import itertools
import socket
import struct
import time

import pydicom
import pytest
from pydicom.filereader import read_dataset

from benchmarks.dimse_latency import ROOT as STUDY_ROOT
from benchmarks.dimse_latency import (
    _acceptor_max_pdu,
    _read_pdu,
    associate_rq,
    c_store_rq,
    ct_dataset,
)
from dicomweb_server.dimse import pdata
from dicomweb_server.dimse import status as S
from tests.helpers import make_dataset, spool_files

ROOT = "1.2.826.0.1.3680043.8.498.79"
PDV_ITEMS = pdata.pdv_items  # the test's own reads, not counted by the one patched below


def _pdv(payload: bytes, command: bool, last: bool, context_id: int = 1) -> bytes:
    """One PDV item: Item-length (context ID + control header + fragment), context ID, message
    control header (bit 0 command, bit 1 last fragment: PS3.8 E.2)."""
    return struct.pack(">IBB", len(payload) + 2, context_id, (1 if command else 0) | (2 if last else 0)) + payload


def _pdu(*pdvs: bytes) -> bytes:
    body = b"".join(pdvs)
    return struct.pack(">BBI", 0x04, 0, len(body)) + body


def test_pdv_items_tile_the_body_exactly():
    a, b = _pdv(b"\x01\x02\x03", True, True, 1), _pdv(b"", False, False, 3)
    items = pdata.pdv_items(a + b)
    assert [(cx, bytes(v)) for cx, v in items] == [(1, b"\x03\x01\x02\x03"), (3, b"\x00")]
    assert all(isinstance(v, memoryview) for _, v in items)  # no copy
    for bad in (b"",  # no item
                a[:-1],  # the last item cut short
                a + b"\x00\x00\x00",  # bytes after the last item
                struct.pack(">IB", 1, 1) + b"\x00",  # Item-length 1: no message control header
                struct.pack(">IBB", 0xFFFFFFF0, 1, 0) + b"x"):  # Item-length beyond the PDU
        assert pdata.pdv_items(bad) is None


def _associate(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(associate_rq("DICOMWEB", "PDATASCU"))
    kind, ac = _read_pdu(s)
    assert kind == 0x02, "association not accepted"
    assert _acceptor_max_pdu(ac) >= 64 * 1024
    return s


def _status(body: bytes) -> int:
    """Status (0000,0900) of the command set in a C-STORE-RSP's P-DATA-TF body (one PDV)."""
    items = PDV_ITEMS(body)
    assert items is not None and len(items) == 1 and items[0][1][0] == 0x03
    return int(read_dataset(io.BytesIO(bytes(items[0][1][1:])), True, True).Status)


def _release(s: socket.socket) -> None:
    s.sendall(struct.pack(">BBI", 0x05, 0, 4) + bytes(4))  # A-RELEASE-RQ
    assert _read_pdu(s)[0] == 0x06  # A-RELEASE-RP
    s.close()


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_stored_bytes_equal_sent_for_any_pdv_layout(dimse, monkeypatch):
    """One C-STORE whose command shares a PDU with the first data fragment and whose data set
    is cut in PDVs of odd sizes (several per PDU, an empty one among them), then one sent as
    storescu does (one PDV per PDU): both stored with the exact pixel data, every P-DATA-TF
    through the lane."""
    lanes = []
    items = pdata.pdv_items
    monkeypatch.setattr(pdata, "pdv_items", lambda body: lanes.append(len(body)) or items(body))
    pixels = [bytes(range(256)) * 2048, hashlib.sha256(b"second").digest() * 16384]  # 512 KB each
    sops = [f"{ROOT}.1", f"{ROOT}.2"]
    s = _associate(dimse.port)
    data = ct_dataset(sops[0], pixels[0])  # a 512x512 CT, 16 bits
    cuts = [0, 1, 7, 7, 40_001, 300_000, len(data)]
    frags = [data[a:b] for a, b in itertools.pairwise(cuts)]
    s.sendall(_pdu(_pdv(c_store_rq(sops[0], 1), True, True), _pdv(frags[0], False, False)))
    s.sendall(_pdu(*(_pdv(f, False, False) for f in frags[1:4])))
    s.sendall(_pdu(*(_pdv(f, False, i == len(frags) - 5) for i, f in enumerate(frags[4:]))))
    kind, body = _read_pdu(s)
    assert kind == 0x04 and _status(body) == S.SUCCESS
    data = ct_dataset(sops[1], pixels[1])
    s.sendall(_pdu(_pdv(c_store_rq(sops[1], 2), True, True)))
    for at in range(0, len(data), 16378):
        s.sendall(_pdu(_pdv(data[at:at + 16378], False, at + 16378 >= len(data))))
    kind, body = _read_pdu(s)
    assert kind == 0x04 and _status(body) == S.SUCCESS
    _release(s)
    assert len(lanes) == 3 + 1 + -(-len(data) // 16378)  # every P-DATA-TF took the lane
    for sop, px in zip(sops, pixels):
        r = dimse.http.get(f"/studies/{STUDY_ROOT}.1/series/{STUDY_ROOT}.1.1/instances/{sop}",
                           headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
        assert r.status_code == 200
        got = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"DICM") - 128:]))
        assert hashlib.sha256(got.PixelData).hexdigest() == hashlib.sha256(px).hexdigest()
        assert got.file_meta.SourceApplicationEntityTitle == "PDATASCU"
    assert spool_files(dimse.server.settings.data_dir) == []


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_pdv_items_that_do_not_tile_the_pdu_abort(dimse):
    """Half a data set, then a P-DATA-TF whose PDV claims more bytes than its PDU holds: the
    listener aborts the association (PS3.8 §9.2, event 19) and keeps nothing of it."""
    s = _associate(dimse.port)
    data = ct_dataset(f"{ROOT}.3", bytes(524288))
    s.sendall(_pdu(_pdv(c_store_rq(f"{ROOT}.3", 1), True, True)))
    s.sendall(_pdu(_pdv(data[:60_000], False, False)))
    item = struct.pack(">IBB", 20_000, 1, 0x00) + data[60_000:70_000]  # Item-length 20,000, 10,002 there
    s.sendall(struct.pack(">BBI", 0x04, 0, len(item)) + item)
    assert _read_pdu(s)[0] == 0x07  # A-ABORT
    s.close()
    assert dimse.http.get("/instances").json() == []
    deadline = time.monotonic() + 10
    while spool_files(dimse.server.settings.data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)  # the listener drops the partial spool file on its own thread
    assert spool_files(dimse.server.settings.data_dir) == []
    assert dimse.store([make_dataset()]) == [S.SUCCESS]

"""P-DATA-TF PDUs handed to the DIMSE layer as views of one buffer (dicomweb_server/dimse/pdata.py):
the bytes stored are the bytes sent, whatever the PDV layout (PS3.8 §9.3.5, Annex E), and a
PDU whose PDV items do not tile it still aborts the association with nothing stored. Then the
rules of message assembly (PS3.7 §6.3.1) and the bounds on a PDU in length and time, each
from a case that used to lose or leak something when a peer sent crafted PDUs."""

from __future__ import annotations

import hashlib
import io
import itertools
import socket
import struct
import time

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.filereader import read_dataset
from pydicom.filewriter import write_dataset

from benchmarks.dimse_latency import (
    APP_CONTEXT,
    CT,
    EXPLICIT_LE,
    IMPL_CLASS,
    IMPLICIT_LE,
    _acceptor_max_pdu,
    _implicit,
    _item,
    _read_pdu,
    associate_rq,
    c_store_rq,
    ct_dataset,
)
from benchmarks.dimse_latency import ROOT as STUDY_ROOT
from dicomweb_server.dimse import pdata
from dicomweb_server.dimse import status as S
from tests.helpers import LiveServer, free_port, make_dataset, spool_files

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


# --- the rules of message assembly (pdata.receive_primitive), found by attacking the listener ---

ABORT = 0x07


def _small(sop: str) -> bytes:
    """An 8x8 CT data set (Explicit VR LE, no file meta) of this test's patient."""
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = CT, sop
    ds.StudyInstanceUID, ds.SeriesInstanceUID = f"{ROOT}.9", f"{ROOT}.9.1"
    ds.PatientID, ds.Modality = "PDATA-RULES", "CT"
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = hashlib.sha256(sop.encode()).digest() * 4
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_dataset(fp, ds)
    return fp.getvalue()


def _two_contexts(port: int) -> socket.socket:
    """An association with CT Image Storage on context 1 (Explicit VR LE) and on 3 (Implicit)."""
    pcs = b"".join(_item(0x20, bytes([cx, 0, 0, 0]) + _item(0x30, CT.encode()) + _item(0x40, ts.encode()))
                   for cx, ts in ((1, EXPLICIT_LE), (3, IMPLICIT_LE)))
    user = _item(0x51, struct.pack(">I", 0)) + _item(0x52, IMPL_CLASS.encode())
    body = (struct.pack(">HH", 1, 0) + b"DICOMWEB".ljust(16) + b"PDATASCU".ljust(16) + bytes(32)
            + _item(0x10, APP_CONTEXT.encode()) + pcs + _item(0x50, user))
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(struct.pack(">BBI", 0x01, 0, len(body)) + body)
    assert _read_pdu(s)[0] == 0x02
    return s


def _until_closed(s: socket.socket) -> list[int]:
    """The PDU types received until the listener closes the connection."""
    kinds = []
    try:
        while True:
            kinds.append(_read_pdu(s)[0])
    except (ConnectionError, OSError):
        pass
    s.close()
    return kinds


def _stored(dimse) -> list[str]:
    return sorted(f["00080018"]["Value"][0] for f in dimse.http.get(
        "/instances", params={"PatientID": "PDATA-RULES"}).json())


def _nothing_left(dimse) -> None:
    deadline = time.monotonic() + 10
    while spool_files(dimse.server.settings.data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert spool_files(dimse.server.settings.data_dir) == []
    assert dimse.store([make_dataset()]) == [S.SUCCESS]  # still serving


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_new_command_in_the_middle_of_a_data_set_aborts_and_leaves_no_spool_file(dimse):
    """pynetdicom opened a second spool file and left the first (all data sent so far) in the
    spool for good: any peer could fill the disk. Now: A-ABORT, the partial file removed."""
    s = _two_contexts(dimse.port)
    s.sendall(_pdu(_pdv(c_store_rq(f"{ROOT}.10", 1), True, True)))
    for _ in range(4):
        s.sendall(_pdu(_pdv(bytes(1 << 20), False, False)))  # 4 MiB of a data set never finished
    s.sendall(_pdu(_pdv(c_store_rq(f"{ROOT}.11", 2), True, True)))
    s.sendall(_pdu(_pdv(_small(f"{ROOT}.11"), False, True)))
    assert _until_closed(s)[0] == ABORT
    assert _stored(dimse) == []
    _nothing_left(dimse)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_pdvs_of_consecutive_messages_in_one_pdu_are_all_received(dimse):
    """PS3.8 §9.3.5: a P-DATA-TF carries PDVs, in order, whatever message they belong to.
    pynetdicom stopped at the first message completed in a PDU: the second C-STORE of a PDU
    was never stored nor answered; a C-STORE whose last data fragment shared a PDU with the
    next command was stored, but its peer got an A-ABORT instead of its C-STORE-RSP."""
    s = _two_contexts(dimse.port)
    a, b, c = (f"{ROOT}.{n}" for n in (20, 21, 22))
    s.sendall(_pdu(_pdv(c_store_rq(a, 1), True, True), _pdv(_small(a), False, True),
                   _pdv(c_store_rq(b, 2), True, True), _pdv(_small(b), False, True)))
    assert [_status(_read_pdu(s)[1]) for _ in range(2)] == [S.SUCCESS, S.SUCCESS]
    head, tail = _small(c)[:100], _small(c)[100:]
    s.sendall(_pdu(_pdv(c_store_rq(c, 3), True, True), _pdv(head, False, False)))
    s.sendall(_pdu(_pdv(tail, False, True), _pdv(c_store_rq(f"{ROOT}.23", 4), True, True)))
    assert _status(_read_pdu(s)[1]) == S.SUCCESS  # C's answer, before D's data set arrives
    s.sendall(_pdu(_pdv(_small(f"{ROOT}.23"), False, True)))
    assert _status(_read_pdu(s)[1]) == S.SUCCESS
    _release(s)
    assert _stored(dimse) == sorted([a, b, c, f"{ROOT}.23"])
    _nothing_left(dimse)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
@pytest.mark.parametrize("case", ["data on another context", "data before any command", "no PDV",
                                  "context not accepted"])
def test_pdus_that_break_the_rules_of_message_assembly_abort(dimse, case):
    """A data set on another presentation context than its command (PS3.8 Annex E) was stored
    as if in the command's transfer syntax; data before any command (PS3.7 §6.3.1) was kept in
    memory without bound; a P-DATA-TF without a PDV (PS3.8 §9.3.5) was ignored. Each now
    aborts its association with nothing stored or left in the spool."""
    sop = f"{ROOT}.30"
    s = _two_contexts(dimse.port)
    if case == "data on another context":
        s.sendall(_pdu(_pdv(c_store_rq(sop, 1), True, True)))
        s.sendall(_pdu(_pdv(_small(sop), False, True, context_id=3)))
    elif case == "data before any command":
        s.sendall(_pdu(_pdv(bytes(1 << 20), False, False)))
    elif case == "no PDV":
        s.sendall(_pdu(_pdv(c_store_rq(sop, 1), True, True), _pdv(_small(sop)[:50], False, False)))
        s.sendall(struct.pack(">BBI", 0x04, 0, 0))
    else:
        s.sendall(_pdu(_pdv(c_store_rq(sop, 1), True, True, context_id=5)))
    assert _until_closed(s)[0] == ABORT
    assert _stored(dimse) == []
    _nothing_left(dimse)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_c_store_without_its_data_set_is_refused_with_a_status(dimse):
    """Command Data Set Type 0x0101 on a C-STORE-RQ (PS3.7 §9.3.1.1: the data set is
    mandatory): 0xC000 and a comment; before, the handler failed on Path(None) with a
    traceback and pynetdicom answered 0xC211."""
    cmd = Dataset()
    cmd.AffectedSOPClassUID, cmd.CommandField, cmd.MessageID = CT, 0x0001, 1
    cmd.Priority, cmd.CommandDataSetType, cmd.AffectedSOPInstanceUID = 0, 0x0101, f"{ROOT}.40"
    body = _implicit(cmd)
    group = Dataset()
    group.CommandGroupLength = len(body)
    s = _two_contexts(dimse.port)
    s.sendall(_pdu(_pdv(_implicit(group) + body, True, True)))
    assert _status(_read_pdu(s)[1]) == S.STORE_CANNOT_UNDERSTAND
    _release(s)
    _nothing_left(dimse)


def test_a_pdu_trickled_in_is_refused_after_the_network_timeout(tmp_path):
    """A peer sending a PDU's body a byte at a time held its association, and the DUL thread
    (so the network timeout's A-ABORT was never sent), for as long as it liked. Now the whole
    PDU must arrive within the network timeout plus its length at 10 KiB/s: an A-ABORT, and
    the connection closed."""
    import select

    port = free_port()
    srv = LiveServer(tmp_path / "d", "sqlite", dimse_port=port, dimse_in_worker=True,
                     dimse_network_timeout=1).start()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(associate_rq("DICOMWEB", "PDATASCU"))
        assert _read_pdu(s)[0] == 0x02
        s.sendall(struct.pack(">BBI", 0x04, 0, 1000))  # a P-DATA-TF of 1,000 bytes ...
        start, answer = time.monotonic(), None
        while answer is None and time.monotonic() - start < 20:
            try:
                s.sendall(b"\x00")  # ... a byte every 0.3 s
            except OSError:
                break
            if select.select([s], [], [], 0.3)[0]:
                answer = s.recv(10)
        assert answer is not None and answer[:1] == bytes([ABORT]), answer
        assert time.monotonic() - start < 5
        assert _until_closed(s) == []  # then closed
    finally:
        srv.stop()


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_pdu_one_byte_longer_than_announced_is_refused(dimse):
    """The Maximum Length announced bounds a P-DATA-TF's variable field (PS3.8 §D.1.1); the
    limit used to let 6 bytes more through."""
    s = socket.create_connection(("127.0.0.1", dimse.port), timeout=20)
    s.sendall(associate_rq("DICOMWEB", "PDATASCU"))
    kind, ac = _read_pdu(s)
    assert kind == 0x02
    s.sendall(struct.pack(">BBI", 0x04, 0, _acceptor_max_pdu(ac) + 1))
    assert _until_closed(s) == [ABORT]
    _nothing_left(dimse)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # no dead DUL thread
@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_p_data_before_the_association_is_accepted_ends_it_without_a_dead_thread(dimse):
    """A P-DATA-TF sent with the A-ASSOCIATE-RQ, before the A-ASSOCIATE-AC: the state machine
    aborts (Sta3 + event 10, PS3.8 Table 9-10) and the association thread's A-ASSOCIATE
    response then finds Sta13, an event pynetdicom raised on in the DUL thread (it died with
    a traceback). The association ends; the listener goes on."""
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", dimse.port), timeout=20)
        s.sendall(associate_rq("DICOMWEB", "PDATASCU") + _pdu(_pdv(c_store_rq(f"{ROOT}.50", 1), True, True)))
        kinds = []
        try:
            while not kinds or kinds[-1] != ABORT:
                kinds.append(_read_pdu(s)[0])
        except (ConnectionError, OSError):
            pass
        s.close()  # as a peer does after an A-ABORT (the listener would wait for it: ARTIM)
        assert kinds[-1:] == [ABORT] or not kinds, kinds
    time.sleep(0.5)  # the listener's threads finish their part
    _nothing_left(dimse)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_data_set_in_one_byte_fragments_is_stored_exactly(dimse):
    """3,000 one-byte PDVs in one PDU and 500 one-byte PDUs, then the rest: the data fragments
    are written without a flush each (pynetdicom made a write system call per fragment), and
    the stored bytes are the bytes sent."""
    sop = f"{ROOT}.60"
    pixels = hashlib.sha256(b"one byte at a time").digest() * 16384  # 512 KB
    data = ct_dataset(sop, pixels)
    s = _two_contexts(dimse.port)
    s.sendall(_pdu(_pdv(c_store_rq(sop, 1), True, True)))
    s.sendall(_pdu(*(_pdv(data[i:i + 1], False, False) for i in range(3000))))
    for i in range(3000, 3500):
        s.sendall(_pdu(_pdv(data[i:i + 1], False, False)))
    s.sendall(_pdu(_pdv(data[3500:], False, True)))
    assert _status(_read_pdu(s)[1]) == S.SUCCESS
    _release(s)
    r = dimse.http.get(f"/studies/{STUDY_ROOT}.1/series/{STUDY_ROOT}.1.1/instances/{sop}",
                       headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
    assert r.status_code == 200
    assert data in r.content  # the data set as sent, after the file meta the listener wrote
    stored = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"DICM") - 128:]))
    assert hashlib.sha256(stored.PixelData).digest() == hashlib.sha256(pixels).digest()
    _nothing_left(dimse)

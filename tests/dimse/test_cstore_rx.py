"""The C-STORE receive path written for the archive (dicomweb_server/dimse/cstore_rx.py): the
command set read without pydicom, the data set stored and the C-STORE-RSP sent from the
receiving thread. For the peer nothing changes: the C-STORE-RSP PDU is byte for byte the one
pynetdicom's path sends (PS3.7 §9.3.1.2, PS3.8 §9.3.5 / Annex E.2), the stored file is byte
for byte the same, and anything else goes to pynetdicom as before."""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import struct
from io import BytesIO

import pytest
from pydicom.dataset import Dataset
from pydicom.filewriter import write_file_meta_info
from pynetdicom.dimse_messages import C_STORE_RSP
from pynetdicom.dimse_primitives import C_STORE
from pynetdicom.pdu import P_DATA_TF
from pynetdicom.service_class import StorageServiceClass

from benchmarks.dimse_latency import CT, EXPLICIT_LE, _implicit, _read_pdu, c_store_rq
from dicomweb_server.dicom import multipart
from dicomweb_server.dimse import cstore_rx, pdata
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.file_meta import _file_meta_with_ae_slot
from tests.dimse.test_pdata import ABORT, _nothing_left, _pdu, _pdv, _release, _small, _stored, _two_contexts, _until_closed

ROOT = "1.2.826.0.1.3680043.8.498.79"


# --- the command set, read without pydicom ----------------------------------------------------

def _command(**elements) -> bytes:
    cmd = Dataset()
    for k, v in elements.items():
        setattr(cmd, k, v)
    body = _implicit(cmd)
    group = Dataset()
    group.CommandGroupLength = len(body)
    return _implicit(group) + body


def test_a_c_store_rq_command_set_is_read_as_pydicom_reads_it():
    got = cstore_rx.parse_c_store_rq(c_store_rq(f"{ROOT}.1", 7))
    assert got == {"AffectedSOPClassUID": CT, "CommandField": 1, "MessageID": 7, "Priority": 0,
                   "CommandDataSetType": 0, "AffectedSOPInstanceUID": f"{ROOT}.1"}
    moved = _command(AffectedSOPClassUID=CT, CommandField=1, MessageID=3, Priority=2, CommandDataSetType=1,
                     AffectedSOPInstanceUID="1.2.3", MoveOriginatorApplicationEntityTitle=" MOVER ",
                     MoveOriginatorMessageID=9)
    assert cstore_rx.parse_c_store_rq(moved) == {
        "AffectedSOPClassUID": CT, "CommandField": 1, "MessageID": 3, "Priority": 2, "CommandDataSetType": 1,
        "AffectedSOPInstanceUID": "1.2.3", "MoveOriginatorApplicationEntityTitle": "MOVER",
        "MoveOriginatorMessageID": 9}


@pytest.mark.parametrize("case", ["truncated", "cut in an element header", "an element of another group",
                                  "out of order", "unknown element", "C-ECHO-RQ", "no data set",
                                  "multi-valued UID", "empty UID", "US of 4 bytes", "no Message ID", "not ASCII"])
def test_any_other_command_set_is_left_to_pynetdicom(case):
    """None: pynetdicom decodes it and does what it always did (aborts, answers, ignores)."""
    good = c_store_rq(f"{ROOT}.1", 7)
    base = dict(AffectedSOPClassUID=CT, CommandField=1, MessageID=1, Priority=0, CommandDataSetType=0,
                AffectedSOPInstanceUID="1.2.3")
    command = {
        "truncated": good[:-3],
        "cut in an element header": good + b"\x00\x00\x00",
        "an element of another group": good + struct.pack("<HHI", 8, 0x18, 2) + b"12",
        "out of order": good[12:] + good[:12],
        "unknown element": _command(**base, MoveDestination="X"),
        "C-ECHO-RQ": _command(AffectedSOPClassUID="1.2.840.10008.1.1", CommandField=0x30, MessageID=1,
                              CommandDataSetType=0x0101),
        "no data set": _command(**{**base, "CommandDataSetType": 0x0101}),
        "multi-valued UID": _command(**{**base, "AffectedSOPInstanceUID": ["1.2", "1.3"]}),
        "empty UID": _command(**{**base, "AffectedSOPInstanceUID": ""}),
        "US of 4 bytes": good.replace(struct.pack("<HHIH", 0, 0x110, 2, 7), struct.pack("<HHIHH", 0, 0x110, 4, 7, 7)),
        "no Message ID": _command(**{k: v for k, v in base.items() if k != "MessageID"}),
        "not ASCII": good.replace(f"{ROOT}.1".encode(), f"{ROOT}.\xe9".encode("latin-1")),
    }[case]
    assert cstore_rx.parse_c_store_rq(command) is None


# --- the C-STORE-RSP: pynetdicom's bytes -----------------------------------------------------------

def _request(sop: str, message_id: int) -> C_STORE:
    req = C_STORE()
    req.MessageID, req.AffectedSOPClassUID, req.AffectedSOPInstanceUID, req.Priority = message_id, CT, sop, 0
    return req


def _pynetdicoms_pdu(req: C_STORE, context_id: int, result, max_pdu: int) -> bytes:
    """What StorageServiceClass.SCP, DIMSEServiceProvider.send_msg and DT-1 send for ``result``."""
    rsp = C_STORE()
    rsp.MessageID = req.MessageID
    rsp.MessageIDBeingRespondedTo = req.MessageID
    rsp.AffectedSOPInstanceUID = req.AffectedSOPInstanceUID
    rsp.AffectedSOPClassUID = req.AffectedSOPClassUID
    rsp = StorageServiceClass(None).validate_status(result, rsp)
    msg = C_STORE_RSP()
    msg.primitive_to_message(rsp)
    (primitive,) = list(msg.encode_msg(context_id, max_pdu))
    return P_DATA_TF(primitive).encode()


@pytest.mark.parametrize(("status", "comment"), [
    (S.SUCCESS, None),
    (0xB000, "coercion of data elements"), (0xB007, "data set does not match SOP class"),
    (0xB006, "elements discarded"),  # warnings (PS3.4 B.2.3)
    (S.STORE_OUT_OF_RESOURCES, "cannot write the received part: No space left on device"),
    (0xA7FF, None), (S.STORE_DATASET_MISMATCH, "AffectedSOPInstanceUID '1.2' of the command is not"),
    (0xA9FF, "odd"), (S.STORE_CANNOT_UNDERSTAND, "C-STORE-RQ without a data set"), (0xC123, None),
    (S.DUPLICATE_SOP_INSTANCE, "stored with other content"), (S.NOT_AUTHORIZED, "needs the 'write' scope"),
    (S.PROCESSING_FAILURE, "processing failure: boom"),
])
@pytest.mark.parametrize("sop", [f"{ROOT}.1", f"{ROOT}.12"])  # odd and even length: NUL padding
def test_the_c_store_rsp_pdu_is_pynetdicoms_byte_for_byte(status, comment, sop):
    req = _request(sop, 0xBEEF)
    result = S.dataset(status, comment) if comment is not None else status
    ours = cstore_rx.response_pdu(req, 5, result, 16384)
    assert ours == _pynetdicoms_pdu(req, 5, result, 16384)
    assert ours[:2] == b"\x04\x00" and ours[10:12] == b"\x05\x03"  # P-DATA-TF; context 5, last command fragment
    assert cstore_rx.response_pdu(req, 5, result, 0) == ours  # no maximum: the same one PDU
    assert cstore_rx.response_pdu(req, 5, result, 40) is None  # too small for one PDV: pynetdicom's path


# --- live: the same bytes for the peer, the same file stored --------------------------------------

def _expected_file(sop: str, data: bytes, ae: str) -> bytes:
    """The PS3.10 file the listener stores (before this path too): preamble, pydicom's file meta
    with the calling AE title in its 16-byte Source AE Title slot, the data set as sent."""
    meta = _file_meta_with_ae_slot(sop_class_uid=CT, sop_instance_uid=sop, transfer_syntax=EXPLICIT_LE)
    meta.SourceApplicationEntityTitle = ae.ljust(16)
    fp = BytesIO()
    write_file_meta_info(fp, meta)
    return b"\x00" * 128 + b"DICM" + fp.getvalue() + data


def _stored_file(dimse, sop: str) -> bytes:
    for d, _s, files in os.walk(dimse.server.settings.data_dir):
        for f in files:
            if f.endswith(".dcm") and sop.encode() in (data := open(os.path.join(d, f), "rb").read()):
                return data
    raise AssertionError(f"{sop} not stored")


def _send(s: socket.socket, sop: str, message_id: int, data: bytes, fragment: int = 100) -> tuple[int, bytes]:
    """One C-STORE: the command in one PDV, the data set in PDVs of ``fragment`` bytes, two to
    a PDU; the C-STORE-RSP PDU received."""
    s.sendall(_pdu(_pdv(c_store_rq(sop, message_id), True, True)))
    frags = [data[i:i + fragment] for i in range(0, len(data), fragment)]
    for i in range(0, len(frags), 2):
        s.sendall(_pdu(*(_pdv(f, False, i + j == len(frags) - 1) for j, f in enumerate(frags[i:i + 2]))))
    kind, body = _read_pdu(s)
    return kind, struct.pack(">BBI", kind, 0, len(body)) + body


@pytest.fixture
def taken(monkeypatch):
    """The C-STOREs the archive's path finished (pdata calls cstore_rx.finish)."""
    done = []
    monkeypatch.setattr(pdata, "finish", lambda provider, rx: done.append(rx.request.AffectedSOPInstanceUID)
                        or cstore_rx.finish(provider, rx))
    return done


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
@pytest.mark.parametrize("path", ["archive's", "pynetdicom's"])
def test_success_mismatch_and_duplicate_answer_and_store_the_same_bytes_on_either_path(dimse, monkeypatch, taken,
                                                                                     path):
    """The same C-STOREs on this path and on pynetdicom's (cstore_rx.begin declining): the
    C-STORE-RSP PDUs are the bytes pynetdicom encodes for the status the archive gives, and the
    stored file is the expected PS3.10 file (SHA-256)."""
    if path == "pynetdicom's":
        monkeypatch.setattr(pdata, "begin", lambda *a: None)
    n = 50 if path == "archive's" else 60
    good, other, dup = (f"{ROOT}.{n + i}" for i in range(3))
    s = _two_contexts(dimse.port)
    data = _small(good)
    kind, pdu = _send(s, good, 1, data)
    assert kind == 0x04 and pdu == _pynetdicoms_pdu(_request(good, 1), 1, S.SUCCESS, 16384)
    assert hashlib.sha256(_stored_file(dimse, good)).hexdigest() == \
        hashlib.sha256(_expected_file(good, data, "PDATASCU")).hexdigest()
    # the command names another instance than the data set: 0xA900 and why (PS3.4 B.2.3)
    kind, pdu = _send(s, other, 2, _small(f"{ROOT}.99"))
    why = f"AffectedSOPInstanceUID {other!r} of the command is not the data set's SOPInstanceUID '{ROOT}.99'"
    assert pdu == _pynetdicoms_pdu(_request(other, 2), 1, S.dataset(S.STORE_DATASET_MISMATCH, why), 16384)
    # the same instance again: Success; the same SOP Instance UID with other content: 0x0111
    assert _send(s, good, 3, data)[1] == _pynetdicoms_pdu(_request(good, 3), 1, S.SUCCESS, 16384)
    changed = data.replace(b"PDATA-RULES", b"PDATA-RULEX")
    kind, pdu = _send(s, good, 0xFFFF, changed, fragment=7)
    assert _status_of(pdu) == S.DUPLICATE_SOP_INSTANCE
    comment = _comment_of(pdu)
    assert pdu == _pynetdicoms_pdu(_request(good, 0xFFFF), 1, S.dataset(S.DUPLICATE_SOP_INSTANCE, comment), 16384)
    _release(s)
    assert _stored(dimse) == [good]
    assert taken == ([good, other, good, good] if path == "archive's" else [])
    _nothing_left(dimse)


def _command_of(pdu: bytes) -> Dataset:
    from pydicom.filereader import read_dataset

    return read_dataset(BytesIO(pdu[12:]), True, True)


def _status_of(pdu: bytes) -> int:
    return int(_command_of(pdu).Status)


def _comment_of(pdu: bytes) -> str:
    return str(_command_of(pdu).ErrorComment)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_malformed_command_set_aborts_the_association_and_the_listener_serves_on(dimse, taken):
    """A C-STORE-RQ command set whose Affected SOP Class UID claims more bytes than the command
    holds (the Command Field and the rest swallowed by it): this path declines it, pynetdicom's
    finds no Command Field and the association is aborted (A-ABORT, PS3.8 §9.3.1, event 19);
    nothing is stored or left in the spool, and the listener serves the next association on
    this path."""
    s = _two_contexts(dimse.port)
    sop = f"{ROOT}.70"
    good = c_store_rq(sop, 1)
    bad = good[:12] + struct.pack("<HHI", 0, 2, 0xFFFF0000) + good[20:]
    assert cstore_rx.parse_c_store_rq(bad) is None
    s.sendall(_pdu(_pdv(bad, True, True)))
    s.sendall(_pdu(_pdv(_small(sop), False, True)))
    assert _until_closed(s)[0] == ABORT
    assert _stored(dimse) == [] and taken == []
    s = _two_contexts(dimse.port)
    assert _send(s, f"{ROOT}.71", 1, _small(f"{ROOT}.71"))[0] == 0x04
    _release(s)
    assert taken == [f"{ROOT}.71"]
    _nothing_left(dimse)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_an_a_abort_in_the_middle_of_a_data_set_leaves_nothing(dimse, taken):
    """Half a data set on this path, then the peer's A-ABORT (PS3.8 §9.3.8): the partial spool
    file is removed, nothing is stored; a C-STORE on a new association is."""
    s = _two_contexts(dimse.port)
    sop = f"{ROOT}.80"
    data = _small(sop)
    s.sendall(_pdu(_pdv(c_store_rq(sop, 1), True, True), _pdv(data[:100], False, False)))
    s.sendall(struct.pack(">BBI", 0x07, 0, 4) + bytes(4))  # A-ABORT, service user
    s.close()
    assert _stored(dimse) == [] and taken == []
    _nothing_left(dimse)


# --- the SOP Class/Instance UID check reads them without a Dataset ----------------------------------

def _file_head(ds: Dataset, implicit: bool) -> bytes:
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset

    meta = _file_meta_with_ae_slot(sop_class_uid=CT, sop_instance_uid="1.2.3",
                                   transfer_syntax="1.2.840.10008.1.2" if implicit else EXPLICIT_LE)
    fp = BytesIO()
    write_file_meta_info(fp, meta)
    body = DicomBytesIO()
    body.is_little_endian, body.is_implicit_VR = True, implicit
    write_dataset(body, ds)
    return b"\x00" * 128 + b"DICM" + fp.getvalue() + body.getvalue()


@pytest.mark.parametrize("implicit", [False, True])
@pytest.mark.parametrize("case", ["plain", "trailing space and NUL", "leading space", "sequence before",
                                  "multi-valued", "missing", "empty"])
def test_the_sop_uids_are_the_ones_pydicom_reads(implicit, case):
    """scp._sop_uids: the values pydicom's read_dataset gives (stop at (0008,0018)), or None
    where the pydicom path must read them (a sequence before them, a multi-valued UID, one
    missing); an implicit VR sequence of defined length is stepped over."""
    from pydicom.filereader import read_dataset
    from pydicom.sequence import Sequence

    from dicomweb_server.dimse.scp import _sop_uids

    ds = Dataset()
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ImageType = ["ORIGINAL", "PRIMARY"]
    ds.SOPClassUID, ds.SOPInstanceUID = CT, "1.2.826.0.1.3680043.8.498.5"
    ds.StudyDate = "20261206"
    if case == "trailing space and NUL":
        ds.SOPInstanceUID = "1.2.3 \x00"
    elif case == "leading space":
        ds.SOPClassUID = " 1.2.3"
    elif case == "sequence before":
        item = Dataset()
        item.CodeValue = "X"
        ds.add_new(0x00080006, "SQ", Sequence([item]))
    elif case == "multi-valued":
        ds.SOPInstanceUID = ["1.2", "1.3"]
    elif case == "missing":
        del ds.SOPClassUID
    elif case == "empty":
        ds.SOPInstanceUID = ""
    head = _file_head(ds, implicit)
    start = 144 + int.from_bytes(head[140:144], "little")
    got = _sop_uids(head, start, implicit)
    if case in ("multi-valued", "missing") or (case == "sequence before" and not implicit):  # SQ: a VR declined
        assert got is None
        return
    fp = BytesIO(head)
    fp.seek(start)
    ref = read_dataset(fp, is_implicit_VR=implicit, is_little_endian=True,
                       stop_when=lambda tag, vr, length: tag > 0x00080018)
    assert got == {"SOPClassUID": str(ref.SOPClassUID), "SOPInstanceUID": str(ref.SOPInstanceUID)}


# --- a small data set to the archive in memory, a large one spooled (issue 33) ---------------------

def _threshold(monkeypatch, nbytes: int) -> None:
    """The listener's in-memory data set threshold (DimseServer.memory_data_set) from now on."""
    def begin(provider, context_id, value):
        server = getattr(provider.assoc.ae, "dicomweb_cstore", None)  # (None: a test's own SCU)
        if server is not None:
            server.memory_data_set = nbytes
        return cstore_rx.begin(provider, context_id, value)

    monkeypatch.setattr(pdata, "begin", begin)


@pytest.fixture
def opened(monkeypatch):
    """The names of the files opened (os.open: the spool files' opener) from now on."""
    names: list[str] = []
    real = os.open

    def spy(path, flags, *a, **k):
        names.append(os.path.basename(os.fsdecode(path)))
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    return names


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_a_small_data_set_is_written_once_from_memory_a_large_one_spooled_the_same_bytes(dimse, monkeypatch,
                                                                                       taken, opened):
    """The same C-STORE three times (the study deleted between): under the threshold (the
    default, 1 MiB) no spool file is created on receipt, the archive writes the file once
    (``part-*``, as a STOW-RS part in memory); with the threshold 0 it is spooled
    on receipt (``dimse-*``); with a threshold the data set passes mid-stream, the bytes so far
    go to the spool file and no more than the threshold was ever held. The stored file is the
    same bytes (SHA-256) every time, the expected PS3.10 file."""
    held: list[int] = []
    write = cstore_rx.Receiver.write

    def watched(rx, fragment):
        write(rx, fragment)
        held.append(0 if rx.data is None else rx.data.tell())  # the file's bytes held in memory

    sop = f"{ROOT}.90"
    data = _small(sop)
    expected = hashlib.sha256(_expected_file(sop, data, "PDATASCU")).hexdigest()
    hashes, spooled = [], []
    for threshold in (None, 0, 200):
        if threshold is not None:
            _threshold(monkeypatch, threshold)
        if threshold == 200:
            monkeypatch.setattr(cstore_rx.Receiver, "write", watched)
        opened.clear()
        s = _two_contexts(dimse.port)
        kind, pdu = _send(s, sop, 1, data, fragment=50)
        assert kind == 0x04 and _status_of(pdu) == S.SUCCESS
        _release(s)
        spooled.append(sorted({n.split("-")[0] for n in opened if n.startswith(("dimse-", "part-"))}))
        assert spooled[-1] == (["part"] if threshold is None else ["dimse"])  # no spool file up front when small
        hashes.append(hashlib.sha256(_stored_file(dimse, sop)).hexdigest())
        assert dimse.http.delete(f"/studies/{ROOT}.9").status_code == 204
    assert hashes == [expected] * 3
    head = len(_expected_file(sop, b"", "PDATASCU"))  # preamble, "DICM", file meta
    assert len(data) > 200 and held[0] > head and max(held) <= head + 200 and held[-1] == 0
    assert taken == [sop] * 3
    _nothing_left(dimse)


class _FullDisk:
    """A spool file on a disk that fills after ``room`` bytes (ENOSPC, as write(2) says it)."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room, self.name = f, room, f.name

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)

    def close(self) -> None:
        self.f.close()


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
@pytest.mark.parametrize("path", ["in memory", "spooled"])
def test_a_full_disk_answers_out_of_resources_and_the_association_goes_on(dimse, monkeypatch, taken, path):
    """The disk fills while a C-STORE's data set is written: in memory, when the archive writes
    the file (its spool file's creation fails as on a full disk, the project's way, tests/store/test_write_syncs.py);
    spooled, in the middle of the data set. Either answers 0xA700 Refused: Out of Resources
    (PS3.4 B.2.3) with an Error Comment naming it, stores nothing, leaves nothing in the spool,
    and the next C-STORE on the same association is stored (before: the spooled one aborted
    the association)."""
    import builtins

    full, other = f"{ROOT}.100", f"{ROOT}.101"
    if path == "in memory":
        real = multipart.new_spool_file

        def new_spool_file(*a, **k):
            if state["full"]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*a, **k)

        monkeypatch.setattr(multipart, "new_spool_file", new_spool_file)
        comment = "cannot write the received part: No space left on device"
    else:
        _threshold(monkeypatch, 0)

        def spool_open(*a, **k):
            f = builtins.open(*a, **k)
            return _FullDisk(f, 300) if state["full"] else f

        monkeypatch.setattr(cstore_rx, "open", spool_open, raising=False)
        comment = "cannot write the received data set: No space left on device"
    state = {"full": True}
    s = _two_contexts(dimse.port)
    kind, pdu = _send(s, full, 1, _small(full), fragment=50)
    assert kind == 0x04 and _status_of(pdu) == S.STORE_OUT_OF_RESOURCES == 0xA700
    assert _comment_of(pdu) == comment
    state["full"] = False
    kind, pdu = _send(s, other, 2, _small(other))
    assert kind == 0x04 and _status_of(pdu) == S.SUCCESS
    _release(s)
    assert _stored(dimse) == [other]
    assert taken == [full, other]
    _nothing_left(dimse)


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
@pytest.mark.parametrize("path", ["in memory", "spooled"])
def test_an_unexpected_failure_before_the_store_answers_0xc211_and_leaves_nothing(dimse, monkeypatch, taken, path):
    """The access rules fail while a received C-STORE is being stored (a bug, a rules file that
    cannot be evaluated): the peer is answered 0xC211 (as pynetdicom answers an exception of
    its C-STORE handler), the spool file is removed, and the next C-STORE on the same
    association is stored. Before: the exception left the DUL thread's handler, the
    association was aborted without an answer, and a spooled data set stayed on disk."""
    from dicomweb_server.access.rules import AccessRules

    if path == "spooled":
        _threshold(monkeypatch, 0)
    state = {"fail": True}
    real = AccessRules.access

    def access(self, *a, **k):
        if state["fail"]:
            raise RuntimeError("the rules cannot be evaluated")
        return real(self, *a, **k)

    monkeypatch.setattr(AccessRules, "access", access)
    bad, good = f"{ROOT}.110", f"{ROOT}.111"
    s = _two_contexts(dimse.port)
    kind, pdu = _send(s, bad, 1, _small(bad))
    assert kind == 0x04 and _status_of(pdu) == S.STORE_HANDLER_EXCEPTION == 0xC211
    assert _comment_of(pdu) == "the archive could not process the C-STORE"
    state["fail"] = False
    kind, pdu = _send(s, good, 2, _small(good))
    assert kind == 0x04 and _status_of(pdu) == S.SUCCESS
    _release(s)
    assert _stored(dimse) == [good]
    assert taken == [bad, good]
    _nothing_left(dimse)


def test_a_store_longer_than_the_network_timeout_does_not_abort_the_association_after_it(tmp_path, monkeypatch,
                                                                                        taken):
    """A store that takes longer than the network timeout (1 s here; a slow disk, an index
    busy) is not idle time: after its answer the idle timer counts again from the answer, so
    the peer's next C-STORE 0.6 s later is served (not aborted as idle). finish() now restarts
    the timer itself before it lets the association thread look at it again; before, the DUL
    loop restarted it just after finish() returned, a window of microseconds this test guards
    the behaviour around but cannot hit on purpose."""
    import time

    from dicomweb_server.dimse.scp import DimseServer
    from tests.helpers import LiveServer, free_port

    real = DimseServer.store_one
    monkeypatch.setattr(DimseServer, "store_one", lambda *a, **k: (time.sleep(1.5), real(*a, **k))[1])
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=None,
                     dimse_network_timeout=1.0).start()
    try:
        first, second = f"{ROOT}.120", f"{ROOT}.121"
        s = _two_contexts(port)
        kind, pdu = _send(s, first, 1, _small(first))
        assert kind == 0x04 and _status_of(pdu) == S.SUCCESS
        time.sleep(0.6)
        kind, pdu = _send(s, second, 2, _small(second))
        assert kind == 0x04 and _status_of(pdu) == S.SUCCESS  # (before: 0x07 A-ABORT)
        _release(s)
        assert taken == [first, second]
    finally:
        srv.stop()


@pytest.mark.parametrize("which", ["mismatch", "success"])
def test_a_c_store_answered_before_pynetdicom_calls_the_association_established_gets_its_response(
        tmp_path, monkeypatch, taken, which):
    """pynetdicom's acceptor sends the A-ASSOCIATE-AC, runs the EVT_ACCEPTED handlers (the
    archive's audit record), and only then sets ``is_established``; the peer's C-STORE can be
    received and answered on the DUL thread before that. The CI run of 2026-12-07 lost the
    0xA900 answer of a refused C-STORE in that window (tests/dimse/test_corpus.py: the SCU
    waited out its 30 s DIMSE timeout). Here the audit handler takes 1.5 s, so every C-STORE of
    the first moments falls in the window: each is answered, and the association goes on."""
    import time

    from pynetdicom import evt

    from dicomweb_server.dimse.scp import DimseServer
    from tests.helpers import LiveServer, free_port

    real = DimseServer._audit
    monkeypatch.setattr(DimseServer, "_audit", lambda self, e: (
        e.event == evt.EVT_ACCEPTED and time.sleep(1.5), real(self, e))[1])
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=None).start()
    try:
        sop, after = f"{ROOT}.130", f"{ROOT}.131"
        s = _two_contexts(port)
        s.settimeout(5)  # (without the fix: nothing, until the listener's network timeout)
        data = _small(f"{ROOT}.99" if which == "mismatch" else sop)
        kind, pdu = _send(s, sop, 1, data)
        assert kind == 0x04
        assert _status_of(pdu) == (S.STORE_DATASET_MISMATCH if which == "mismatch" else S.SUCCESS)
        time.sleep(1.5)  # established now: the next one as always
        kind, pdu = _send(s, after, 2, _small(after))
        assert kind == 0x04 and _status_of(pdu) == S.SUCCESS
        _release(s)
        assert taken == [sop, after]
    finally:
        srv.stop()


def test_a_data_set_received_in_memory_is_handed_to_the_store_without_a_copy(tmp_path):
    """A 512 KB data set received in 16 KiB fragments (PDV values, views of their PDUs) is
    held once: handing the PS3.10 file to the archive allocates no second copy of it (before
    issue 33's CPU round, ``bytes(bytearray)`` copied all of it once more: 5.7 % of the
    listener's GIL samples). The bytes handed over are the file's: preamble, file meta, data set."""
    import tracemalloc

    meta = b"\x02\x00\x00\x00UL\x04\x00" + struct.pack("<I", 0)
    data_set = os.urandom(512 * 1024)
    pdu = memoryview(bytearray(data_set))
    tracemalloc.start()  # (before the buffer is made: its reallocations are traced as such)
    try:
        rx = cstore_rx.Receiver(_request(f"{ROOT}.200", 1), 1, EXPLICIT_LE, tmp_path, meta, memory=1024 * 1024)
        for at in range(0, len(data_set), 16384):
            rx.write(pdu[at:at + 16384])
        assert rx.path is None and list(tmp_path.iterdir()) == []  # in memory: no spool file
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        data = rx.take()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert data == b"\x00" * 128 + b"DICM" + meta + data_set
    assert type(data) is bytes and rx.data is None
    assert peak < 64 * 1024, f"{peak} bytes allocated to hand over a {len(data)}-byte file"

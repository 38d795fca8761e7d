"""C-MOVE of lossy JPEG Baseline and JPEG 2000 instances to a destination that negotiates
by this archive's own rule (dimse/negotiation.py: a lossy first choice is passed over for a
lossless one proposed in the same context): the instances arrive as stored, byte for byte,
because the archive proposes a compressed stored syntax in a presentation context of its
own (PS3.8 9.3.2.2, dimse/retrieve.py ``sending_contexts``); an uncompressed instance goes
as before. Pulling from another instance of the archive stored them decoded."""

from __future__ import annotations

import hashlib

import httpx
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.filebase import DicomBytesIO
from pydicom.filereader import _read_file_meta_info, read_preamble
from pynetdicom import AE, acse, build_context, evt
from pynetdicom.sop_class import (
    MRImageStorage,
    SecondaryCaptureImageStorage,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from dicomweb_server.dimse import negotiation
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.retrieve import proposed_syntaxes
from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES
from tests.helpers import LiveServer, free_port, multipart, to_bytes

from .conftest import Dimse

ELE = "1.2.840.10008.1.2.1"
JPEG_BASELINE, J2K_LOSSY = "1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.91"
STUDY = "1.2.826.0.1.3680043.8.498.7731"
FILES = {"SC_rgb_jpeg_dcmtk.dcm": JPEG_BASELINE, "JPEG2000.dcm": J2K_LOSSY, "MR_small.dcm": ELE}


def _instances() -> list[pydicom.Dataset]:
    out = []
    for name, ts in FILES.items():
        ds = pydicom.dcmread(get_testdata_file(name))
        assert ds.file_meta.TransferSyntaxUID == ts
        ds.StudyInstanceUID = STUDY  # one study, one patient; a series each
        ds.SeriesInstanceUID = f"{STUDY}.{len(out) + 1}"
        ds.PatientID, ds.PatientName = "LOSSY", "Lossy^Pull"
        out.append(ds)
    return out


def _data_set_bytes(raw: bytes) -> bytes:
    """A PS3.10 file's data set: what a C-STORE carries (the file meta is not sent)."""
    fp = DicomBytesIO(raw)
    read_preamble(fp, False)
    _read_file_meta_info(fp)
    return raw[fp.tell():]


@pytest.fixture
def destination(tmp_path):
    """(archive, received): a Storage SCP (AE PACSB) accepting Secondary Capture and MR in
    every syntax the archive's listener takes, negotiating by the archive's rule; received:
    SOP Instance UID -> (transfer syntax, SHA-256 of the data set bytes, contexts proposed
    for its class)."""
    previous = acse.negotiate_as_acceptor
    negotiation.install()
    received: dict[str, tuple[str, str, list[list[str]]]] = {}

    def on_store(event):
        cls = event.request.AffectedSOPClassUID
        proposed = [list(cx.transfer_syntax) for cx in event.assoc.requestor.requested_contexts
                    if cx.abstract_syntax == cls]
        data = event.request.DataSet.getvalue()
        if not data:  # STORE_RECV_CHUNKED_DATASET (set by the archive's listener in this process)
            data = _data_set_bytes(event.dataset_path.read_bytes())
        received[event.request.AffectedSOPInstanceUID] = (
            str(event.context.transfer_syntax), hashlib.sha256(data).hexdigest(), proposed)
        return 0x0000

    ae = AE(ae_title="PACSB")
    for cls in (SecondaryCaptureImageStorage, MRImageStorage):
        ae.add_supported_context(cls, TRANSFER_SYNTAXES)
    ae.add_supported_context(Verification)
    port = free_port()
    scp = ae.start_server(("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[PACSB]\nhost = "127.0.0.1"\nport = {port}\n')
    dimse_port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=dimse_port, dimse_in_worker=True,
                     dimse_peers_file=peers).start()
    client = httpx.Client(base_url=srv.url, timeout=60)
    try:
        yield Dimse(srv, dimse_port, client), received
    finally:
        client.close()
        srv.stop()
        scp.shutdown()
        acse.negotiate_as_acceptor = previous


def test_move_sends_lossy_instances_as_stored(destination):
    archive, received = destination
    instances = _instances()
    body, ctype = multipart([to_bytes(ds) for ds in instances])
    r = archive.http.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    stored = {}
    for ds in instances:
        loc = archive.server.archive.index.locate(ds.SOPInstanceUID)
        raw = archive.server.archive.blobs.resolve(loc.path).read_bytes()
        stored[ds.SOPInstanceUID] = hashlib.sha256(_data_set_bytes(raw)).hexdigest()

    ident = pydicom.Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    ident.StudyInstanceUID = STUDY
    assoc = archive.associate([build_context(StudyRootQueryRetrieveInformationModelMove)])
    final = list(assoc.send_c_move(ident, "PACSB", StudyRootQueryRetrieveInformationModelMove))[-1][0]
    assoc.release()
    assert final.Status == S.SUCCESS, hex(final.Status)
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (3, 0)

    for ds in instances:
        ts, digest, _ = received[ds.SOPInstanceUID]
        assert ts == ds.file_meta.TransferSyntaxUID
        assert digest == stored[ds.SOPInstanceUID], f"{ts}: not the stored bytes"
    jpeg, j2k, mr = (received[ds.SOPInstanceUID] for ds in instances)
    assert (jpeg[0], j2k[0], mr[0]) == (JPEG_BASELINE, J2K_LOSSY, ELE)
    # Secondary Capture: each lossy syntax alone, and the uncompressed fallback
    fallback = proposed_syntaxes(JPEG_BASELINE)[1:]
    assert sorted(jpeg[2]) == sorted([[JPEG_BASELINE], [J2K_LOSSY], fallback])
    # MR stored uncompressed: one context, as before
    assert mr[2] == [proposed_syntaxes(ELE)]


def test_sending_contexts_room():
    """A compressed pair is split only while every later pair keeps a context (128 at most)."""
    from dicomweb_server.dimse.retrieve import sending_contexts

    sc, mr = SecondaryCaptureImageStorage, MRImageStorage
    assert sending_contexts([(sc, JPEG_BASELINE), (sc, ELE), (mr, ELE)], 127) == [
        (sc, [JPEG_BASELINE]), (sc, proposed_syntaxes(JPEG_BASELINE)[1:]), (mr, proposed_syntaxes(ELE))]
    pairs = [(f"1.2.3.{i}", JPEG_BASELINE) for i in range(100)]
    contexts = sending_contexts(pairs, 127)
    assert len(contexts) == 127
    # 27 pairs split (54 contexts), the 73 after them one context each, as before
    assert contexts[:2] == [("1.2.3.0", [JPEG_BASELINE]), ("1.2.3.0", proposed_syntaxes(JPEG_BASELINE)[1:])]
    assert contexts[53] == ("1.2.3.26", proposed_syntaxes(JPEG_BASELINE)[1:])
    assert contexts[54] == ("1.2.3.27", proposed_syntaxes(JPEG_BASELINE))
    assert contexts[-1] == ("1.2.3.99", proposed_syntaxes(JPEG_BASELINE))
    assert len(sending_contexts([(f"1.2.3.{i}", ELE) for i in range(200)], 127)) == 127

"""C-GET and C-MOVE send each instance from its stored file, PDU by PDU (PS3.7 C.4.2/C.4.3
sub-operations, PS3.8 D.1.1 maximum length): the bytes delivered equal the bytes stored, and a
32 MB multi-frame instance is never held whole in memory (pynetdicom read it whole with
dcmread, then encoded it whole again before the first PDU: twice its size)."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import httpx
import pytest
from pydicom import uid as U
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.dsutils import split_dataset
from pynetdicom.sop_class import (
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
)

from dicomweb_server.dimse import status as S
from tests.helpers import LiveServer, free_port, make_dataset

from .conftest import Dimse
from .test_query_retrieve import _ident

XA = "1.2.840.10008.5.1.4.1.1.12.1"  # X-Ray Angiographic Image Storage
FRAMES, SIZE = 64, 512  # 64 frames of 512 x 512 x 16 bit: 32 MiB of pixel data


def _data_set_digest(path: Path) -> tuple[str, int]:
    """SHA-256 and length of a PS3.10 file's data set (after its file meta), read in chunks."""
    _, offset = split_dataset(path)
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


@pytest.fixture
def big(dimse):
    ds = make_dataset(sop_class=XA, modality="XA", rows=SIZE, columns=SIZE, frames=FRAMES, PatientID="BIGXA")
    assert dimse.store([ds]) == [S.SUCCESS]
    rel = dimse.server.archive.index.locate(str(ds.SOPInstanceUID)).path
    stored = dimse.server.archive.blobs.resolve(rel)
    digest = _data_set_digest(stored)
    assert digest[1] > FRAMES * SIZE * SIZE * 2
    return ds, digest


def test_c_get_sends_a_large_instance_from_its_file(dimse, big):
    ds, (stored_sha, stored_len) = big
    received: list[tuple[str, int]] = []

    def on_store(event):  # the requestor's Storage SCP role: the data set arrives in a file
        path = Path(event.dataset_path)
        received.append(_data_set_digest(path))
        os.unlink(path)
        return 0x0000

    ae = AE(ae_title="GETSCU")
    ae.maximum_pdu_size = 256 * 1024  # the archive must fragment to this
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 60
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    ae.add_requested_context(XA, [U.ExplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", dimse.port, ae_title="DICOMWEB", ext_neg=[build_role(XA, scp_role=True)],
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.is_established
    tracemalloc.start()
    try:
        responses = list(assoc.send_c_get(_ident("STUDY", StudyInstanceUID=ds.StudyInstanceUID),
                                          StudyRootQueryRetrieveInformationModelGet))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        assoc.release()
    final = responses[-1][0]
    assert (final.Status, final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (S.SUCCESS, 1, 0)
    assert received == [(stored_sha, stored_len)]  # bytes delivered == bytes stored
    # sender and receiver in this process: a few PDUs at a time, never the 32 MiB instance
    # (read whole and encoded whole again, as before: over 64 MiB)
    assert peak < 16 * 1024 * 1024, f"peak traced memory {peak} bytes"


def test_c_get_converts_when_the_stored_transfer_syntax_was_not_accepted(dimse, big):
    """Stored Explicit VR LE, accepted Implicit VR LE only: read and converted (pynetdicom)."""
    ds, _ = big
    got = []

    def on_store(event):
        got.append(event.dataset.PixelData == ds.PixelData)
        return 0x0000

    ae = AE(ae_title="GETSCU")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 60
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    ae.add_requested_context(XA, [U.ImplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", dimse.port, ae_title="DICOMWEB", ext_neg=[build_role(XA, scp_role=True)],
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    responses = list(assoc.send_c_get(_ident("IMAGE", StudyInstanceUID=ds.StudyInstanceUID,
                                             SeriesInstanceUID=ds.SeriesInstanceUID,
                                             SOPInstanceUID=ds.SOPInstanceUID),
                                      StudyRootQueryRetrieveInformationModelGet))
    assoc.release()
    assert responses[-1][0].Status == S.SUCCESS and got == [True]


def test_c_move_sends_a_large_instance_from_its_file(tmp_path):
    received: list[tuple[str, int]] = []

    def on_store(event):
        path = Path(event.dataset_path)
        received.append(_data_set_digest(path))
        os.unlink(path)
        return 0x0000

    dest = AE(ae_title="MOVEDEST")
    dest.maximum_pdu_size = 0  # "unlimited": the archive still sends bounded PDUs
    dest.add_supported_context(XA, [U.ExplicitVRLittleEndian])
    dest_port = free_port()
    scp = dest.start_server(("127.0.0.1", dest_port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[MOVEDEST]\nhost = "127.0.0.1"\nport = {dest_port}\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=peers).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            d = Dimse(srv, port, client)
            ds = make_dataset(sop_class=XA, modality="XA", rows=SIZE, columns=SIZE, frames=FRAMES, PatientID="BIGXA")
            assert d.store([ds]) == [S.SUCCESS]
            stored = _data_set_digest(srv.archive.blobs.resolve(srv.archive.index.locate(str(ds.SOPInstanceUID)).path))
            assoc = d.associate([build_context(StudyRootQueryRetrieveInformationModelMove)])
            tracemalloc.start()
            try:
                responses = list(assoc.send_c_move(_ident("STUDY", StudyInstanceUID=ds.StudyInstanceUID), "MOVEDEST",
                                                   StudyRootQueryRetrieveInformationModelMove))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
                assoc.release()
    finally:
        srv.stop()
        scp.shutdown()
    final = responses[-1][0]
    assert (final.Status, final.NumberOfCompletedSuboperations) == (S.SUCCESS, 1)
    assert received == [stored]
    assert peak < 16 * 1024 * 1024, f"peak traced memory {peak} bytes"  # never the 32 MiB instance

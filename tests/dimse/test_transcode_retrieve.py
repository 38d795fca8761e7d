"""C-MOVE and C-GET to a peer that accepts only Explicit VR Little Endian, of
instances stored as JPEG-LS and JPEG 2000 lossless: the peer gets decoded copies with
the same pixels, not failed sub-operations (PS3.4 C.4.2.3.1, C.4.3.3.1); a peer that
accepts only JPEG 2000 lossless gets instances stored uncompressed encoded so."""

from __future__ import annotations

import httpx
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.sop_class import (
    CTImageStorage,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from dicomweb_server.dimse import status as S
from dicomweb_server.policy import transcode
from tests.helpers import LiveServer, free_port, multipart, to_bytes
from tests.policy.test_transcode import _synthetic

from .conftest import Dimse

ELE = "1.2.840.10008.1.2.1"
JLS, J2K = "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.90"
STUDY = "1.2.826.0.1.3680043.8.498.30"


def _stored_compressed() -> list[tuple[Dataset, np.ndarray]]:
    """(instance as stored, its pixels): a 12-bit signed 2-frame CT in JPEG-LS, a 16-bit
    signed one in JPEG 2000 lossless; one study."""
    a = _synthetic(12, True, frames=2)
    b = _synthetic(16, True)
    out = []
    for ds, ts in ((a, JLS), (b, J2K)):
        ds.StudyInstanceUID = STUDY
        pixels = ds.pixel_array.copy()
        out.append((transcode.transcode(ds, ts), pixels))
    return out


def _keep(received: list[Dataset]):
    """A C-STORE handler appending each data set (with its file meta) to ``received``."""
    def on_store(event):
        ds = event.dataset
        ds.file_meta = event.file_meta
        received.append(ds)
        return 0x0000

    return on_store


def _scp(syntaxes: list[str]):
    received: list[Dataset] = []
    on_store = _keep(received)
    ae = AE(ae_title="ONLYELE")
    ae.add_supported_context(CTImageStorage, syntaxes)
    ae.add_supported_context(Verification)
    port = free_port()
    server = ae.start_server(("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    return server, port, received


@pytest.fixture
def move_to(tmp_path):
    """start(syntaxes) -> (archive, the peer's received data sets): a Storage SCP
    (AE ONLYELE) accepting CT Image Storage in ``syntaxes`` only, and an archive
    whose peers file names it."""
    running = []

    def start(syntaxes: list[str]):
        server, port, received = _scp(syntaxes)
        running.append(server)
        peers = tmp_path / "peers.toml"
        peers.write_text(f'[ONLYELE]\nhost = "127.0.0.1"\nport = {port}\n')
        dimse_port = free_port()
        srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=dimse_port, dimse_in_worker=True,
                         dimse_peers_file=peers).start()
        running.append(srv)
        client = httpx.Client(base_url=srv.url, timeout=60)
        running.append(client)
        return Dimse(srv, dimse_port, client), received

    yield start
    for thing in reversed(running):
        for stop in ("close", "stop", "shutdown"):
            if hasattr(thing, stop):
                getattr(thing, stop)()
                break


def _stow(client: httpx.Client, datasets: list[Dataset]) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = client.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text


def _study() -> Dataset:
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    ident.StudyInstanceUID = STUDY
    return ident


def test_move_to_a_peer_accepting_explicit_vr_le_only(move_to):
    archive, received = move_to([ELE])
    stored = _stored_compressed()
    _stow(archive.http, [ds for ds, _ in stored])
    assoc = archive.associate([build_context(StudyRootQueryRetrieveInformationModelMove)])
    responses = list(assoc.send_c_move(_study(), "ONLYELE", StudyRootQueryRetrieveInformationModelMove))
    assoc.release()
    final = responses[-1][0]
    assert final.Status == S.SUCCESS, hex(final.Status)
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (2, 0)
    got = {ds.SOPInstanceUID: ds for ds in received}
    for ds, pixels in stored:
        copy = got[ds.SOPInstanceUID]
        assert copy.file_meta.TransferSyntaxUID == ELE
        assert np.array_equal(copy.pixel_array, pixels)


def test_move_to_a_peer_accepting_jpeg_2000_only(move_to):
    archive, received = move_to([J2K])
    ds = _synthetic(16, False)
    _stow(archive.http, [ds])
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    ident.StudyInstanceUID = ds.StudyInstanceUID
    assoc = archive.associate([build_context(StudyRootQueryRetrieveInformationModelMove)])
    final = list(assoc.send_c_move(ident, "ONLYELE", StudyRootQueryRetrieveInformationModelMove))[-1][0]
    assoc.release()
    assert final.Status == S.SUCCESS and final.NumberOfCompletedSuboperations == 1
    (copy,) = received
    assert copy.file_meta.TransferSyntaxUID == J2K
    assert np.array_equal(copy.pixel_array, ds.pixel_array)


def test_get_accepting_explicit_vr_le_only(move_to):
    archive, _received = move_to([ELE])
    stored = _stored_compressed()
    _stow(archive.http, [ds for ds, _ in stored])
    got: list[Dataset] = []
    on_store = _keep(got)
    ae = AE(ae_title="GETSCU")
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    ae.add_requested_context(CTImageStorage, [ELE])
    assoc = ae.associate("127.0.0.1", archive.port, ae_title="DICOMWEB",
                         ext_neg=[build_role(CTImageStorage, scp_role=True)],
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.is_established
    final = list(assoc.send_c_get(_study(), StudyRootQueryRetrieveInformationModelGet))[-1][0]
    assoc.release()
    assert final.Status == S.SUCCESS, hex(final.Status)
    assert final.NumberOfCompletedSuboperations == 2
    by_uid = {ds.SOPInstanceUID: ds for ds in got}
    for ds, pixels in stored:
        assert by_uid[ds.SOPInstanceUID].file_meta.TransferSyntaxUID == ELE
        assert np.array_equal(by_uid[ds.SOPInstanceUID].pixel_array, pixels)


def test_c_store_with_a_store_as_rule(tmp_path):
    """Compress on ingest through the DIMSE front door: a C-STORE of an uncompressed CT
    that a ``[[store_as]]`` rule matches is stored as JPEG-LS, pixel-identical, before
    the C-STORE-RSP's Success."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nmatch = { Modality = "CT" }\nstore_as = "jpeg-ls-lossless"\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, routes_file=routes).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            ds = _synthetic(16, True, frames=2)
            assert Dimse(srv, port, client).store([ds]) == [S.SUCCESS]
            loc = srv.archive.index.locate(ds.SOPInstanceUID)
            assert loc.transfer_syntax_uid == JLS
            on_disk = pydicom.dcmread(srv.archive.blobs.resolve(loc.path))
            assert np.array_equal(on_disk.pixel_array, ds.pixel_array)
    finally:
        srv.stop()

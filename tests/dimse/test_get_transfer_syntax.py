"""The transfer syntax of C-GET's storage contexts (PS3.7 D.3.3.4: the requestor takes the
SCP role) and of C-STORE's (dimse/negotiation.py). C-STORE: each context is accepted with the
requestor's first proposed syntax the archive holds (a lossy one passed over for a lossless one
proposed with it). C-GET: the requestor's first plain or Deflated choice (every instance can be
sent in it); a compressed first choice with an uncompressed one after it is passed over (one
context carries every instance of its SOP class, and the encoders refuse some: a 1-bit
Segmentation's C-GET failed when J2K Lossless was accepted); a compressed syntax proposed alone
is accepted, and the instances stored in it go byte for byte (PS3.4 C.4.3).

DCMTK's getscu (Debian package ``dcmtk``) and pynetdicom as the C-GET requestor."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import numpy as np
import pydicom
import pytest
from pydicom import uid as U
from pydicom.dataset import Dataset
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.presentation import PresentationContext
from pydicom.pixels import pack_bits
from pynetdicom.sop_class import (
    MRImageStorage,
    SegmentationStorage,
    StudyRootQueryRetrieveInformationModelGet,
)

from dicomweb_server.dimse import negotiation
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES
from dicomweb_server.policy import transcode
from tests.helpers import LiveServer, free_port, make_dataset, multipart, to_bytes
from tests.policy.test_transcode import _synthetic

from .test_dcmtk import dcmtk

STUDY = "1.2.826.0.1.3680043.8.498.77"
UNCOMPRESSED = [U.ExplicitVRLittleEndian, U.ImplicitVRLittleEndian]


def _mr(bits: int, ts: str, seed: int = 0) -> Dataset:
    """An MR of ``bits`` bits in study STUDY, encoded in ``ts`` (policy/transcode.py)."""
    ds = _synthetic(bits, False, rows=32 + seed, cols=24)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = MRImageStorage
    ds.Modality = "MR"
    ds.StudyInstanceUID = STUDY
    return transcode.transcode(ds, ts) if ts != U.ExplicitVRLittleEndian else ds


@pytest.fixture
def archive(tmp_path):
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=None).start()
    srv.dimse_port = port
    try:
        yield srv
    finally:
        srv.stop()


def _stow(srv: LiveServer, datasets: list[Dataset]) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = httpx.post(srv.url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=60)
    assert r.status_code == 200, r.text


def _stored_file(srv: LiveServer, sop_uid: str) -> bytes:
    loc = srv.archive.index.locate(sop_uid)
    return Path(srv.archive.blobs.resolve(loc.path)).read_bytes()


def _data_set(file: bytes) -> bytes:
    """The data set of a PS3.10 file: the bytes after its file meta (group 0002)."""
    end = 144 + int.from_bytes(file[140:144], "little")  # (0002,0000) File Meta Information Group Length
    return file[end:]


def _get(srv: LiveServer, syntaxes: list[str], ident_study: str = STUDY, sop_class: str = MRImageStorage):
    """C-GET of the study by pynetdicom proposing ``sop_class`` (MR Image Storage) with
    ``syntaxes`` (SCP role); (final response, [(transfer syntax, raw data set bytes, decoded data set)])."""
    got = []

    def on_store(event):
        path = getattr(event.request, "_dataset_path", None)  # the listener in this process: received into a file
        raw = _data_set(Path(path).read_bytes()) if path is not None else event.request.DataSet.getvalue()
        ds = event.dataset
        ds.file_meta = event.file_meta
        got.append((event.context.transfer_syntax, raw, ds))
        return 0x0000

    ae = AE(ae_title="MODA")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    ae.add_requested_context(sop_class, syntaxes)
    assoc = ae.associate("127.0.0.1", srv.dimse_port, ae_title="DICOMWEB",
                         ext_neg=[build_role(sop_class, scp_role=True)],
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.is_established
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    ident.StudyInstanceUID = ident_study
    final, identifier = list(assoc.send_c_get(ident, StudyRootQueryRetrieveInformationModelGet))[-1]
    assoc.release()
    final.identifier = identifier
    return final, got


@pytest.mark.parametrize("ts", [U.JPEG2000Lossless, U.JPEGLSLossless, U.RLELossless])
def test_get_proposing_the_stored_syntax_alone_gets_the_stored_bytes(archive, ts):
    ds = _mr(12, ts)
    _stow(archive, [ds])
    final, got = _get(archive, [ts])
    assert final.Status == S.SUCCESS and final.NumberOfCompletedSuboperations == 1
    [(accepted, raw, received)] = got
    assert accepted == ts and received.file_meta.TransferSyntaxUID == ts
    assert raw == _data_set(_stored_file(archive, ds.SOPInstanceUID))  # the stored data set, byte for byte
    assert received.PixelData == ds.PixelData


@pytest.mark.parametrize(("proposed", "accepted"), [
    (UNCOMPRESSED, U.ExplicitVRLittleEndian),  # decoded
    ([U.JPEG2000Lossless, *UNCOMPRESSED], U.ExplicitVRLittleEndian),  # compressed first: passed over
    ([U.JPEGLSLossless, *UNCOMPRESSED], U.ExplicitVRLittleEndian),
    ([U.DeflatedExplicitVRLittleEndian, *UNCOMPRESSED], U.DeflatedExplicitVRLittleEndian),  # decoded, deflated
    ([U.JPEGLSLossless], U.JPEGLSLossless),  # alone: re-encoded losslessly
])
def test_get_gets_the_same_pixels_in_the_accepted_syntax(archive, proposed, accepted):
    """Stored JPEG 2000 Lossless; what the requestor proposed decides the syntax it gets."""
    ds = _mr(12, U.JPEG2000Lossless)
    _stow(archive, [ds])
    final, got = _get(archive, proposed)
    assert final.Status == S.SUCCESS
    [(ts, _raw, received)] = got
    assert ts == accepted and received.file_meta.TransferSyntaxUID == accepted
    assert np.array_equal(received.pixel_array, ds.pixel_array)


def _segmentation() -> Dataset:
    """A binary Segmentation (1-bit pixels, PS3.3 C.8.20.2), which no lossless encoder here takes."""
    ds = make_dataset(PatientID="SEG")
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = SegmentationStorage
    ds.StudyInstanceUID = STUDY
    ds.Modality = "SEG"
    ds.Rows = ds.Columns = 16
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.NumberOfFrames = 1, "MONOCHROME2", 1
    ds.BitsAllocated = ds.BitsStored = 1
    ds.HighBit = ds.PixelRepresentation = 0
    for keyword in ("RescaleIntercept", "RescaleSlope", "WindowCenter", "WindowWidth"):
        if keyword in ds:
            delattr(ds, keyword)
    ds.PixelData = pack_bits(np.eye(16, dtype=np.uint8))
    return ds


def test_get_of_a_segmentation_proposing_jpeg_2000_first_is_sent_uncompressed(archive):
    """Found in review: with [J2K Lossless, Explicit VR LE, Implicit VR LE] (getscu +xv) J2K
    was accepted and the 1-bit Segmentation's sub-operation failed (0xA702); it succeeds in
    Explicit VR LE, its bytes as stored."""
    seg = _segmentation()
    _stow(archive, [seg])
    final, got = _get(archive, [U.JPEG2000Lossless, *UNCOMPRESSED], sop_class=SegmentationStorage)
    assert final.Status == S.SUCCESS, hex(final.Status)
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations) == (1, 0)
    [(accepted, raw, received)] = got
    assert accepted == U.ExplicitVRLittleEndian
    assert raw == _data_set(_stored_file(archive, seg.SOPInstanceUID))
    assert received.PixelData == seg.PixelData


def test_lossy_stored_instance_requested_uncompressed_keeps_lossy_image_compression(archive):
    ds = _mr(8, U.JPEGBaseline8Bit)
    assert ds.LossyImageCompression == "01"
    _stow(archive, [ds])
    final, got = _get(archive, UNCOMPRESSED)
    assert final.Status == S.SUCCESS
    [(accepted, _raw, received)] = got
    assert accepted == U.ExplicitVRLittleEndian
    assert received.LossyImageCompression == "01"  # PS3.3 C.7.6.1.1.5: never reset
    assert received.LossyImageCompressionMethod == ds.LossyImageCompressionMethod
    assert np.array_equal(received.pixel_array, ds.pixel_array)


def test_a_lossy_first_choice_is_passed_over_when_an_uncompressed_one_follows(archive):
    """[JPEG Baseline, uncompressed] (getscu +xy): Explicit VR LE, so that instances stored in
    other syntaxes are sent too; the JPEG instance decoded, still marked lossy."""
    lossy, lossless = _mr(8, U.JPEGBaseline8Bit, 1), _mr(12, U.JPEG2000Lossless, 2)
    _stow(archive, [lossy, lossless])
    final, got = _get(archive, [U.JPEGBaseline8Bit, *UNCOMPRESSED])
    assert final.Status == S.SUCCESS and final.NumberOfCompletedSuboperations == 2
    assert {str(t) for t, _, _ in got} == {U.ExplicitVRLittleEndian}
    by_uid = {r.SOPInstanceUID: r for _, _, r in got}
    assert by_uid[lossy.SOPInstanceUID].LossyImageCompression == "01"


def test_an_instance_whose_stored_syntax_cannot_be_produced_fails_its_sub_operation(archive):
    """JPEG Baseline proposed alone: the JPEG instance goes as stored, the JPEG 2000
    Lossless one cannot be sent in it (never lossy-encoded for DIMSE): one completed, one
    failed with its UID listed, final status Warning 0xB000 (PS3.4 C.4.3.1.4, C.4.3.3.1)."""
    lossy, lossless = _mr(8, U.JPEGBaseline8Bit, 1), _mr(12, U.JPEG2000Lossless, 2)
    _stow(archive, [lossy, lossless])
    final, got = _get(archive, [U.JPEGBaseline8Bit])
    assert final.Status == 0xB000, hex(final.Status)
    assert (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations,
            final.NumberOfWarningSuboperations) == (1, 1, 0)
    assert final.identifier.FailedSOPInstanceUIDList == lossless.SOPInstanceUID
    [(accepted, raw, received)] = got
    assert accepted == U.JPEGBaseline8Bit and received.SOPInstanceUID == lossy.SOPInstanceUID
    assert raw == _data_set(_stored_file(archive, lossy.SOPInstanceUID))


def test_c_store_proposing_jpeg_2000_first_in_one_context_is_stored_as_sent(archive):
    """A C-STORE requestor offering [JPEG 2000 Lossless, Explicit VR LE] in one context:
    JPEG 2000 accepted, the data set stored in it as received."""
    ds = _mr(12, U.JPEG2000Lossless)
    ae = AE(ae_title="MODA")
    ae.add_requested_context(MRImageStorage, [U.JPEG2000Lossless, U.ExplicitVRLittleEndian])
    assoc = ae.associate("127.0.0.1", archive.dimse_port, ae_title="DICOMWEB")
    assert assoc.is_established
    assert assoc.accepted_contexts[0].transfer_syntax[0] == U.JPEG2000Lossless
    assert assoc.send_c_store(ds).Status == S.SUCCESS
    assoc.release()
    assert archive.archive.index.locate(ds.SOPInstanceUID).transfer_syntax_uid == U.JPEG2000Lossless
    assert pydicom.dcmread(_stored_file_path(archive, ds.SOPInstanceUID)).PixelData == ds.PixelData


def _stored_file_path(srv: LiveServer, sop_uid: str) -> Path:
    return Path(srv.archive.blobs.resolve(srv.archive.index.locate(sop_uid).path))


# --- DCMTK getscu --------------------------------------------------------------------------


def _getscu(srv: LiveServer, out: Path, *flags: str) -> subprocess.CompletedProcess:
    out.mkdir()
    proc = subprocess.run([dcmtk("getscu"), *flags, "-aec", "DICOMWEB", "-aet", "MODA", "-od", str(out), "-S",
                           "-k", "QueryRetrieveLevel=STUDY", "-k", f"StudyInstanceUID={STUDY}",
                           "127.0.0.1", str(srv.dimse_port)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize(("flag", "ts"), [("+xv", U.JPEG2000Lossless), ("+xt", U.JPEGLSLossless)])
def test_getscu_proposing_a_compressed_syntax_first_gets_explicit_vr_le(archive, tmp_path, flag, ts):
    """getscu proposes the compressed syntax first, then the uncompressed ones, in one context
    per SOP class: Explicit VR LE accepted (every instance of the class can be sent in it),
    the instance decoded, the same pixels."""
    ds = _mr(12, ts)
    _stow(archive, [ds])
    _getscu(archive, tmp_path / "out", flag)
    [file] = (tmp_path / "out").iterdir()
    received = pydicom.dcmread(file)
    assert received.file_meta.TransferSyntaxUID == U.ExplicitVRLittleEndian
    assert np.array_equal(received.pixel_array, ds.pixel_array)


def test_getscu_proposing_uncompressed_gets_it_decoded(archive, tmp_path):
    ds = _mr(12, U.JPEG2000Lossless)
    _stow(archive, [ds])
    _getscu(archive, tmp_path / "out")  # +x= (default): the uncompressed syntaxes only
    [file] = (tmp_path / "out").iterdir()
    received = pydicom.dcmread(file)
    assert received.file_meta.TransferSyntaxUID == U.ExplicitVRLittleEndian
    assert np.array_equal(received.pixel_array, ds.pixel_array)


# --- the negotiation rule itself -----------------------------------------------------------


def _supported() -> list[PresentationContext]:
    ae = AE()
    ae.add_supported_context(MRImageStorage, TRANSFER_SYNTAXES, scu_role=True, scp_role=True)
    return ae.supported_contexts


def _negotiate(syntaxes: list[str], scp_role: bool) -> str:
    cx = build_context(MRImageStorage, syntaxes)
    cx.context_id = 1
    roles = {MRImageStorage: (False, True)} if scp_role else None
    [result], _ = negotiation.negotiate_as_acceptor([cx], _supported(), roles)
    assert result.result == 0x00
    assert result.as_scu is scp_role
    return result.transfer_syntax[0]


@pytest.mark.parametrize(("syntaxes", "scp_role", "accepted"), [
    # C-STORE (the archive receives): the first the archive holds
    ([U.JPEG2000Lossless, U.ExplicitVRLittleEndian], False, U.JPEG2000Lossless),
    # a lossy first choice is passed over for a lossless one proposed with it; alone it is accepted
    ([U.JPEGBaseline8Bit, U.ExplicitVRLittleEndian], False, U.ExplicitVRLittleEndian),
    ([U.JPEG2000, U.JPEG2000Lossless, U.ExplicitVRLittleEndian], False, U.JPEG2000Lossless),
    ([U.JPEGBaseline8Bit, U.JPEG2000], False, U.JPEGBaseline8Bit),
    ([U.JPEGBaseline8Bit], False, U.JPEGBaseline8Bit),
    ([U.ExplicitVRBigEndian, U.ExplicitVRLittleEndian], False, U.ExplicitVRLittleEndian),  # plain: ELE preferred
    ([U.ImplicitVRLittleEndian, U.ExplicitVRLittleEndian], False, U.ExplicitVRLittleEndian),  # pynetdicom's default
    ([U.ExplicitVRBigEndian, U.ImplicitVRLittleEndian], False, U.ImplicitVRLittleEndian),
    ([U.ExplicitVRBigEndian], False, U.ExplicitVRBigEndian),
    ([U.DeflatedExplicitVRLittleEndian, U.ExplicitVRLittleEndian], False, U.DeflatedExplicitVRLittleEndian),
    (["1.2.3.4", U.ImplicitVRLittleEndian, U.JPEG2000Lossless], False, U.ImplicitVRLittleEndian),
    # C-GET's storage contexts (the archive sends): the first it can send every instance in
    ([U.JPEG2000Lossless, U.ExplicitVRLittleEndian], True, U.ExplicitVRLittleEndian),  # 1-bit: no encoder
    ([U.JPEGLSLossless, U.ImplicitVRLittleEndian], True, U.ImplicitVRLittleEndian),
    ([U.JPEG2000Lossless, U.DeflatedExplicitVRLittleEndian, U.ExplicitVRLittleEndian], True,
     U.DeflatedExplicitVRLittleEndian),
    ([U.DeflatedExplicitVRLittleEndian, U.ExplicitVRLittleEndian], True, U.DeflatedExplicitVRLittleEndian),
    ([U.JPEGBaseline8Bit, U.ExplicitVRLittleEndian], True, U.ExplicitVRLittleEndian),
    ([U.ExplicitVRBigEndian, U.ExplicitVRLittleEndian, U.ImplicitVRLittleEndian], True, U.ExplicitVRLittleEndian),
    ([U.JPEGLosslessSV1, U.ImplicitVRLittleEndian], True, U.ImplicitVRLittleEndian),
    ([U.ImplicitVRLittleEndian, U.ExplicitVRLittleEndian], True, U.ExplicitVRLittleEndian),
    ([U.JPEGBaseline8Bit], True, U.JPEGBaseline8Bit),  # alone: accepted, only JPEG instances go
])
def test_the_requestors_order_decides(syntaxes, scp_role, accepted):
    assert _negotiate(syntaxes, scp_role) == accepted

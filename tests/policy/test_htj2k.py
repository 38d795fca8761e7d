"""HTJ2K Lossless RPCL (.4.202, PS3.5 10.18) and lossy ``store_as`` (PS3.3 C.7.6.1.1.5).

- Every frame written as .202 has, in its COD marker, the RPCL progression order, the
  5-3 reversible wavelet, no colour transform and enough decompositions for a 64-pixel
  thumbnail, a TLM marker, and decodes (pydicom) to the original pixels.
- HTJ2K (.201 too) keeps the samples in their colour space (no RCT): Photometric
  Interpretation RGB stays true.
- A lossy rule must say ``lossy = true``; the stored instance is the new derived image
  C.7.6.1.1.5 describes, with exact attribute values; a re-sent instance gives the same.
- encode_file (what recompress reuses) takes an instance file and a rule.
"""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.encaps import generate_frames
from pydicom.uid import HTJ2KLossless, HTJ2KLosslessRPCL, JPEGBaseline8Bit
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.dicom.codestream import coding_style
from dicomweb_server.policy import ingest, transcode
from dicomweb_server.routing.rules import RoutesError, StoreAs, load_routes
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, to_bytes
from tests.policy.test_transcode import _synthetic, _written
from tests.server.conftest import stored

HTJ2K_LOSSY, J2K_LOSSY = "1.2.840.10008.1.2.4.203", "1.2.840.10008.1.2.4.91"


def _frames(ds) -> list[bytes]:
    n = int(ds.get("NumberOfFrames", 1))
    return list(generate_frames(ds.PixelData, number_of_frames=n))


def _wide() -> pydicom.Dataset:
    """8 x 4100 pixels: 5 decompositions leave 129 columns, so 7 are needed."""
    ds = make_dataset(rows=8, columns=4100)
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
    ds.PixelData = (np.arange(8 * 4100) % 251).astype(np.uint8).tobytes()
    return ds


@pytest.mark.parametrize("name, make, decompositions", [
    ("CT_small 128x128 16-bit signed", lambda: pydicom.dcmread(get_testdata_file("CT_small.dcm")), 5),
    ("MR 300x484 12-bit", lambda: pydicom.dcmread(get_testdata_file("examples_overlay.dcm")), 5),
    ("12-bit signed, 3 frames", lambda: _synthetic(12, True, frames=3), 5),
    ("8-bit RGB", lambda: _synthetic(8, False, rgb=True), 5),
    ("8 x 4100", _wide, 7),
])
def test_rpcl_codestream_is_progressive_and_lossless(name, make, decompositions):
    ds = make()
    out = _written(transcode.transcode(ds, HTJ2KLosslessRPCL))
    assert out.file_meta.TransferSyntaxUID == HTJ2KLosslessRPCL
    frames = _frames(out)
    assert len(frames) == int(ds.get("NumberOfFrames", 1))
    for frame in frames:
        style = coding_style(frame)
        assert (style.progression_order, style.reversible, style.multiple_component_transform, style.tlm,
                style.layers, style.decompositions) == ("RPCL", True, False, True, 1, decompositions)
        assert max(ds.Rows, ds.Columns) >> style.decompositions <= 64  # PS3.5 10.18 thumbnail
    assert transcode.rpcl_decompositions(ds.Rows, ds.Columns) == decompositions
    assert np.array_equal(out.pixel_array, ds.pixel_array)
    assert out.PhotometricInterpretation == ds.PhotometricInterpretation
    assert out.SOPInstanceUID == ds.SOPInstanceUID and "LossyImageCompression" not in out


def test_htj2k_lossless_writes_no_colour_transform():
    """RGB stays RGB inside the codestream (PS3.5 8.2.4: a codestream with the RCT would
    need Photometric Interpretation YBR_RCT). OpenJPH applies the RCT to 3 samples
    unless told not to: .201 wrote it with Photometric Interpretation RGB."""
    ds = _synthetic(8, False, rgb=True)
    for ts in (HTJ2KLossless, HTJ2KLosslessRPCL):
        out = _written(transcode.transcode(ds, ts))
        assert coding_style(_frames(out)[0]).multiple_component_transform is False
        assert out.PhotometricInterpretation == "RGB"
        assert np.array_equal(out.pixel_array, ds.pixel_array)


def test_lossy_rules_must_say_so(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nmatch = { Modality = "CT" }\nstore_as = "htj2k-lossy"\n')
    with pytest.raises(RoutesError, match="line 3.*'htj2k-lossy' is lossy: the rule must also say lossy = true"):
        load_routes(routes)
    routes.write_text('[[store_as]]\nstore_as = "htj2k-rpcl-lossless"\nlossy = true\n')
    with pytest.raises(RoutesError, match="line 3.*lossy.*is lossless"):
        load_routes(routes)
    routes.write_text('[[store_as]]\nstore_as = "j2k-lossy"\nlossy = "yes"\n')
    with pytest.raises(RoutesError, match="lossy: true or false is required"):
        load_routes(routes)
    routes.write_text('[[store_as]]\nstore_as = "htj2k-lossy"\nlossy = true\n'
                      '[[store_as]]\nstore_as = "htj2k-rpcl-lossless"\n')
    assert [(r.transfer_syntax, r.lossy) for r in load_routes(routes).store_as] == [
        (HTJ2K_LOSSY, True), (HTJ2KLosslessRPCL, False)]


@pytest.fixture
def lossy_archive(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nmatch = { Modality = "CT" }\nstore_as = "htj2k-lossy"\nlossy = true\n'
                      '[[store_as]]\nmatch = { Modality = "MR" }\nstore_as = "htj2k-rpcl-lossless"\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c, archive
    archive.close()


def _on_disk(archive, uid):
    loc = archive.index.locate(uid)
    return loc, pydicom.dcmread(archive.blobs.resolve(loc.path))


def _ratio(ds) -> float:
    return ds.Rows * ds.Columns * ds.SamplesPerPixel * ds.BitsAllocated // 8 * int(ds.get("NumberOfFrames", 1)) \
        / sum(len(f) for f in _frames(ds))


def test_lossy_store_as_stores_the_derived_image(lossy_archive):
    """PS3.3 C.7.6.1.1.5: 01, DERIVED, a new SOP Instance UID, ratio and method; the
    received instance named as the uncompressed predecessor."""
    c, archive = lossy_archive
    ct = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    received_uid = ct.SOPInstanceUID
    stored(c, ct)
    new_uid = ingest.lossy_uid(received_uid, HTJ2K_LOSSY)
    assert new_uid.startswith("2.25.") and new_uid != received_uid
    assert archive.index.locate(received_uid) is None  # the received instance is not kept
    loc, out = _on_disk(archive, new_uid)
    assert loc.transfer_syntax_uid == out.file_meta.TransferSyntaxUID == HTJ2K_LOSSY
    assert out.SOPInstanceUID == out.file_meta.MediaStorageSOPInstanceUID == new_uid
    assert (out.StudyInstanceUID, out.SeriesInstanceUID) == (ct.StudyInstanceUID, ct.SeriesInstanceUID)
    assert out.LossyImageCompression == "01"
    assert out.LossyImageCompressionMethod == "ISO_15444_15"
    assert float(out.LossyImageCompressionRatio) == pytest.approx(_ratio(out), abs=0.01)
    assert 5 < float(out.LossyImageCompressionRatio) < 30
    assert list(out.ImageType) == ["DERIVED", "PRIMARY", "AXIAL"]  # received ORIGINAL\PRIMARY\AXIAL
    assert list(ct.ImageType) == ["ORIGINAL", "PRIMARY", "AXIAL"]
    (source,) = out.SourceImageSequence
    assert (source.ReferencedSOPClassUID, source.ReferencedSOPInstanceUID) == (ct.SOPClassUID, received_uid)
    (purpose,) = source.PurposeOfReferenceCodeSequence
    assert (purpose.CodeValue, purpose.CodingSchemeDesignator, purpose.CodeMeaning) == \
        ("121320", "DCM", "Uncompressed predecessor")
    (derivation,) = out.DerivationCodeSequence
    assert (derivation.CodeValue, derivation.CodingSchemeDesignator, derivation.CodeMeaning) == \
        ("113040", "DCM", "Lossy Compression")
    assert out.DerivationDescription == f"Lossy compression ISO_15444_15, ratio {out.LossyImageCompressionRatio}:1"
    diff = np.abs(out.pixel_array.astype(int) - ct.pixel_array.astype(int))
    assert 0 < diff.max() < 200  # lossy, but the picture
    # a re-sent instance: the same new UID and the same bytes (an identical duplicate)
    before = archive.blobs.resolve(loc.path).read_bytes()
    stored(c, ct)
    assert archive.blobs.resolve(archive.index.locate(new_uid).path).read_bytes() == before
    # MR: the lossless rule, the UID kept
    mr = pydicom.dcmread(get_testdata_file("MR_small.dcm"))
    stored(c, mr)
    loc, out = _on_disk(archive, mr.SOPInstanceUID)
    assert loc.transfer_syntax_uid == HTJ2KLosslessRPCL and "LossyImageCompression" not in out
    assert np.array_equal(out.pixel_array, mr.pixel_array)


def test_lossy_after_lossy_appends(lossy_archive):
    """An image already lossy compressed (JPEG Baseline here) keeps its earlier ratio and
    method first, this step's after them (C.7.6.1.1.5.1: values in the order applied)."""
    c, archive = lossy_archive
    first = _written(transcode.transcode(_synthetic(8, False), JPEGBaseline8Bit))
    first.Modality, first.ImageType = "CT", ["ORIGINAL", "PRIMARY", "AXIAL"]
    first.DerivationDescription = "from the sensor"
    earlier_ratio = first.LossyImageCompressionRatio
    stored(c, first)
    _loc, out = _on_disk(archive, ingest.lossy_uid(first.SOPInstanceUID, HTJ2K_LOSSY))
    assert out.LossyImageCompression == "01"
    assert list(out.LossyImageCompressionMethod) == ["ISO_10918_1", "ISO_15444_15"]
    ratios = list(out.LossyImageCompressionRatio)
    assert ratios[0] == earlier_ratio and float(ratios[1]) == pytest.approx(_ratio(out), abs=0.01)
    assert list(out.ImageType) == ["DERIVED", "PRIMARY", "AXIAL"]
    assert out.DerivationDescription == f"from the sensor; Lossy compression ISO_15444_15, ratio {ratios[1]}:1"


def test_encode_file_takes_an_instance_file_and_a_rule(tmp_path):
    """The function recompress reuses: file + rule -> verified file; a refusal says why
    and leaves nothing behind."""
    src = tmp_path / "ct.dcm"
    src.write_bytes(to_bytes(pydicom.dcmread(get_testdata_file("CT_small.dcm"))))
    out = ingest.encode_file(src, StoreAs("rpcl", ((),), HTJ2KLosslessRPCL), directory=tmp_path)
    back = pydicom.dcmread(out)
    assert back.file_meta.TransferSyntaxUID == HTJ2KLosslessRPCL
    assert np.array_equal(back.pixel_array, pydicom.dcmread(src).pixel_array)
    with pytest.raises(ingest.NotEncoded, match="lossy and the rule does not say lossy = true"):
        ingest.encode_file(src, StoreAs("j2k", ((),), J2K_LOSSY), directory=tmp_path)
    with pytest.raises(ingest.NotEncoded, match="8-bit unsigned"):  # 16-bit signed as JPEG Baseline
        ingest.encode_file(src, StoreAs("jpeg", ((),), JPEGBaseline8Bit, lossy=True), directory=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ct.dcm", out.name])

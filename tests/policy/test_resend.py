"""A modality re-sending the original of an instance stored re-encoded (``recompress``, an
after-ack rule) gets success (a duplicate), as for any identical re-send; other content in
another syntax is still refused (409 / 0x0111), and a lossy stored version is never the same
(policy/ingest.py same_instance_transcoded, archive.py _same_data_set)."""

from __future__ import annotations

from pathlib import Path

import pydicom
from pydicom.data import get_testdata_file
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.jobs import run_inline
from dicomweb_server.policy import ingest, transcode
from tests.helpers import multipart, to_bytes
from tests.policy.test_recompress import ELE, JLS, _fill, _sizes


def _stow(c: TestClient, ds) -> int:
    body, ctype = multipart([to_bytes(ds)])
    return c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code


def test_stow_of_the_original_after_recompress_is_a_duplicate(tmp_path):
    """Re-encoded by a recompress run; the server then stores as received (its routes file
    has no rule encoding on arrival: none, or an after-ack one), so the re-sent original is
    not the stored bytes. Before: 409 for each."""
    settings, originals = _fill(tmp_path)
    archive = Archive.open(settings)
    try:
        result, _ = run_inline("recompress", {"quiet": 0}, archive)
        assert result["done"] == 6
    finally:
        archive.close()
    archive = Archive.open(settings.model_copy(update={"routes_file": None}))
    try:
        ct = [ds for ds in originals.values() if ds.Modality == "CT"]
        after = _sizes(settings)
        changes = archive.index.changes(limit=100)
        with TestClient(create_app(archive.settings, archive=archive)) as c:
            for ds in ct:  # the originals (Explicit VR Little Endian) as the modality has them
                assert archive.index.locate(ds.SOPInstanceUID).transfer_syntax_uid == JLS
                assert _stow(c, ds) == 200
            other = ct[0].copy()
            other.PatientName = "Other^Content"
            assert _stow(c, other) == 409  # one attribute changed: other content, refused
        assert archive.index.changes(limit=100) == changes  # no new version
        for ds in ct:
            assert archive.index.locate(ds.SOPInstanceUID).transfer_syntax_uid == JLS  # the stored one kept
    finally:
        archive.close()
    assert _sizes(settings) == after


def test_same_instance_transcoded(tmp_path):
    """Implicit VR original against its JPEG-LS re-encoding: the same; a changed attribute
    or changed pixels: not; the same syntax: left to the byte comparison."""
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2"
    ds.add_new(0x00091010, "LO", "private value")  # read back as UN from the Implicit VR file
    orig, jls = tmp_path / "orig.dcm", tmp_path / "jls.dcm"
    ds.save_as(orig, implicit_vr=True, little_endian=True)
    transcode.transcode(pydicom.dcmread(orig), JLS).save_as(jls, enforce_file_format=True)
    assert ingest.same_instance_transcoded(orig, jls) and ingest.same_instance_transcoded(jls, orig)
    assert not ingest.same_instance_transcoded(orig, orig)
    changed = tmp_path / "changed.dcm"
    d = pydicom.dcmread(orig)
    d.PatientName = "Other^Content"
    d.save_as(changed)
    assert not ingest.same_instance_transcoded(changed, jls)
    d = pydicom.dcmread(orig)
    arr = d.pixel_array.copy()
    arr[0, 0] += 1
    d.PixelData = arr.tobytes()
    d.save_as(changed)
    assert not ingest.same_instance_transcoded(changed, jls)


def test_a_lossy_stored_version_is_never_the_same(tmp_path):
    """pydicom's JPEG2000.dcm (lossy 4.91) and its decoded copy in Explicit VR Little Endian:
    equal decoded pixels and attributes, yet the lossy file is not the instance re-sent."""
    lossy = Path(get_testdata_file("JPEG2000.dcm"))
    native = tmp_path / "native.dcm"
    transcode.transcode(pydicom.dcmread(lossy), ELE).save_as(native, enforce_file_format=True)
    assert ingest.same_pixels(str(native), str(lossy)) is None  # (what a pixel check alone would accept)
    assert not ingest.same_instance_transcoded(native, lossy)
    assert not ingest.same_instance_transcoded(lossy, native)

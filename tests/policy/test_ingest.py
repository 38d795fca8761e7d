"""Compress on ingest (policy/ingest.py, ``[[store_as]]`` in the routes file): matching
instances are stored re-encoded and pixel-identical, others as received; a failed
verification keeps the received file (and logs it); a re-sent instance is an
identical duplicate; bad rules are refused with their line."""

from __future__ import annotations

import io
import logging

import numpy as np
import pydicom
import pytest
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.policy import ingest
from dicomweb_server.routing.rules import RoutesError, load_routes
from dicomweb_server.settings import Settings
from tests.helpers import to_bytes
from tests.policy.test_transcode import _synthetic
from tests.server.conftest import stored

ELE, JLS, J2K, RLE = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.5"
ROUTES = """
[[store_as]]
name = "CT as JPEG-LS"
match = { Modality = "CT" }
store_as = "jpeg-ls-lossless"

[[store_as]]
match = { Modality = ["MR", "US"] }
store_as = "rle-lossless"
"""


@pytest.fixture
def client_archive(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text(ROUTES)
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c, archive
    archive.close()


def _stored_file(archive, ds) -> pydicom.Dataset:
    loc = archive.index.locate(ds.SOPInstanceUID)
    return loc, pydicom.dcmread(archive.blobs.resolve(loc.path))


def test_matching_instances_are_stored_compressed(client_archive):
    c, archive = client_archive
    ct, mr, sc = _synthetic(12, True, frames=2), _synthetic(16, False), _synthetic(8, False, rgb=True)
    mr.Modality, sc.Modality = "MR", "OT"
    for ds in (ct, mr, sc):
        stored(c, ds)
    for ds, ts in ((ct, JLS), (mr, RLE), (sc, ELE)):
        loc, on_disk = _stored_file(archive, ds)
        assert loc.transfer_syntax_uid == ts and on_disk.file_meta.TransferSyntaxUID == ts
        assert np.array_equal(on_disk.pixel_array, ds.pixel_array)
        assert loc.size == archive.blobs.resolve(loc.path).stat().st_size
    # reads give the received pixels: native frames decoded from the JPEG-LS file
    url = f"/studies/{ct.StudyInstanceUID}/series/{ct.SeriesInstanceUID}/instances/{ct.SOPInstanceUID}"
    r = c.get(url, headers={"Accept": "application/dicom"})
    assert np.array_equal(pydicom.dcmread(io.BytesIO(r.content)).pixel_array, ct.pixel_array)
    assert c.get(url + "/metadata").json()[0]["00080060"]["Value"] == ["CT"]


def test_a_resent_instance_is_an_identical_duplicate(client_archive):
    c, archive = client_archive
    ct = _synthetic(16, True)
    stored(c, ct)
    _loc, first = _stored_file(archive, ct)
    before = archive.blobs.resolve(_loc.path).read_bytes()
    stored(c, ct)  # the encoders are deterministic: the same compressed file, a success
    loc, _ = _stored_file(archive, ct)
    assert archive.blobs.resolve(loc.path).read_bytes() == before


def test_a_failed_verification_keeps_the_received_file(client_archive, monkeypatch, caplog):
    c, archive = client_archive
    monkeypatch.setattr(ingest, "_verify", lambda received, encoded: "1 sample(s) differ")
    ct = _synthetic(12, False)
    with caplog.at_level(logging.WARNING, logger="dicomweb_server.policy.ingest"):
        stored(c, ct)
    loc, on_disk = _stored_file(archive, ct)
    assert loc.transfer_syntax_uid == ELE
    assert archive.blobs.resolve(loc.path).read_bytes() == to_bytes(ct)
    assert any("kept as received" in r.message and "1 sample(s) differ" in r.message for r in caplog.records)
    assert not list(archive.blobs.spool.glob("*.store_as"))  # the rejected copy removed


def test_bad_store_as_rules_are_refused(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[store_as]]\nmatch = { Modality = "CT" }\nstore_as = "jpeg-baseline"\n')
    with pytest.raises(RoutesError, match="line 3.*store_as"):
        load_routes(routes)
    routes.write_text('[[store_as]]\nmatch = { NoSuchKey = "CT" }\nstore_as = "j2k-lossless"\n')
    with pytest.raises(RoutesError, match="store_as"):
        load_routes(routes)
    routes.write_text(ROUTES)
    rules = load_routes(routes).store_as
    assert [(r.name, r.transfer_syntax) for r in rules] == [("CT as JPEG-LS", JLS), ("store_as 2", RLE)]

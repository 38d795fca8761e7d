"""The client library against the real archive (uvicorn on 127.0.0.1, both
indexes): the contract tests, and every method on pydicom's bundled files."""

from __future__ import annotations

import io

import pydicom
import pytest
from PIL import Image

from dicomweb_client import AsyncDICOMwebClient, DICOMwebClient, NotAcceptable, NotFound
from tests.helpers import LiveServer, sample_files

from .test_contract import (  # noqa: F401  (collected again here, against the archive)
    stored,
    test_delete,
    test_errors,
    test_frames_and_bulkdata,
    test_store_search_retrieve_roundtrip,
)


@pytest.fixture(params=["sqlite", "memory"])
def dicomweb_url(request, tmp_path):
    srv = LiveServer(tmp_path / "data", request.param).start()
    yield srv.url
    srv.stop()


SAMPLES = sample_files()


@pytest.fixture(scope="module")
def archive_with_samples(tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("data"), "sqlite").start()
    with DICOMwebClient(srv.url) as client:
        result = client.store_instances([str(p) for p in SAMPLES.values()])
        assert result.ok and len(result.referenced) == len(SAMPLES)
    yield srv
    srv.stop()


def _uids(path):
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    return str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID), str(ds.SOPInstanceUID)


def test_every_sample_round_trips_sync(archive_with_samples):
    with DICOMwebClient(archive_with_samples.url) as client:
        for sop, path in SAMPLES.items():
            s, se, i = _uids(path)
            ds = client.retrieve_instance(s, se, i)
            orig = pydicom.dcmread(path)
            assert ds.SOPInstanceUID == sop
            if "PixelData" in orig:
                assert ds.PixelData == orig.PixelData
            assert client.retrieve_instance(s, se, i, raw=True) == path.read_bytes()
            meta = client.retrieve_instance_metadata(s, se, i)
            assert meta["00080018"]["Value"] == [sop]
        studies = client.search_for_studies(get_remaining=True, limit=7)
        assert len(studies) == len({_uids(p)[0] for p in SAMPLES.values()})


async def test_every_method_async(archive_with_samples):
    path = SAMPLES[next(k for k, p in SAMPLES.items() if p.name == "CT_small.dcm")]
    s, se, i = _uids(path)
    orig = pydicom.dcmread(path)
    async with AsyncDICOMwebClient(archive_with_samples.url) as client:
        assert [x["0020000D"]["Value"][0] for x in await client.search_for_studies(
            search_filters={"PatientID": orig.PatientID})] == [s]
        assert (await client.search_for_series(s))[0]["0020000E"]["Value"] == [se]
        assert (await client.search_for_instances(s, se, fields=["Rows"]))[0]["00280010"]["Value"] == [orig.Rows]
        assert [d.SOPInstanceUID async for d in client.iter_study(s)] == [i]
        assert (await client.retrieve_series(s, se))[0].PixelData == orig.PixelData
        assert len(await client.retrieve_study_metadata(s)) == 1
        assert len(await client.retrieve_series_metadata(s, se)) == 1
        (frame,) = await client.retrieve_instance_frames(s, se, i, [1])
        assert frame == orig.PixelData
        meta = await client.retrieve_instance_metadata(s, se, i)
        assert b"".join(await client.retrieve_bulkdata(meta["7FE00010"]["BulkDataURI"])) == orig.PixelData
        jpeg = await client.retrieve_instance_rendered(s, se, i)
        img = Image.open(io.BytesIO(jpeg))
        img.load()
        assert img.size == (orig.Columns, orig.Rows)
        png = await client.retrieve_instance_frames_rendered(s, se, i, [1], media_types=("image/png",))
        assert Image.open(io.BytesIO(png)).format == "PNG"
        thumb = await client.retrieve_instance_thumbnail(s, se, i)
        assert max(Image.open(io.BytesIO(thumb)).size) <= 128
        with pytest.raises(NotFound):
            await client.retrieve_instance_metadata(s, se, "1.2.3.4")
        with pytest.raises(NotAcceptable):
            # JPEG Lossless SV1: decoded here but never encoded (JPEG 2000 is: policy/transcode.py)
            await client.retrieve_instance(s, se, i, media_types=(("application/dicom", "1.2.840.10008.1.2.4.70"),))

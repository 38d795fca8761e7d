"""Behaviour any conforming server must show, through the public API only.

These run against the fake server by default. To run them against the real
archive, start it and set ``DICOMWEB_TEST_URL`` (or override the
``dicomweb_url`` fixture in a conftest that starts uvicorn)::

    DICOMWEB_TEST_URL=http://127.0.0.1:8080 python -m pytest tests/client/test_contract.py
"""
from __future__ import annotations

import pydicom
import pytest

from dicomweb_client import NotFound, StoreError

from .conftest import sample_path

FILES = ["CT_small.dcm", "MR_small.dcm", "rtdose.dcm"]


def value(item, tag):
    return item[tag]["Value"][0]


@pytest.fixture
async def stored(api):
    datasets = [pydicom.dcmread(sample_path(n)) for n in FILES]
    result = await api.store_instances([str(sample_path(n)) for n in FILES])
    assert result.ok, result
    yield datasets
    for ds in datasets:
        try:
            await api.delete_study(ds.StudyInstanceUID)
        except NotFound:
            pass


async def test_store_search_retrieve_roundtrip(api, stored):
    for ds in stored:
        s, se, i = str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID), str(ds.SOPInstanceUID)
        studies = await api.search_for_studies(search_filters={"StudyInstanceUID": s})
        assert [value(x, "0020000D") for x in studies] == [s]
        series = await api.search_for_series(s)
        assert se in [value(x, "0020000E") for x in series]
        instances = await api.search_for_instances(s, se)
        assert i in [value(x, "00080018") for x in instances]
        got = await api.retrieve_instance(s, se, i)
        assert got.SOPInstanceUID == i
        assert got.PixelData == ds.PixelData
        assert [d.SOPInstanceUID for d in await api.iter_series(s, se)] == [i]
        meta = await api.retrieve_instance_metadata(s, se, i)
        assert value(meta, "00080018") == i
        assert value(meta, "00100020") == ds.PatientID


async def test_frames_and_bulkdata(api, stored):
    dose = stored[2]
    s, se, i = str(dose.StudyInstanceUID), str(dose.SeriesInstanceUID), str(dose.SOPInstanceUID)
    size = dose.Rows * dose.Columns * dose.BitsAllocated // 8
    frames = await api.retrieve_instance_frames(s, se, i, [2, 1], media_types=("application/octet-stream",))
    assert frames == [dose.PixelData[size : 2 * size], dose.PixelData[:size]]
    meta = await api.retrieve_instance_metadata(s, se, i)
    uri = meta["7FE00010"].get("BulkDataURI")
    if uri:
        assert b"".join(await api.retrieve_bulkdata(uri)) == dose.PixelData


async def test_errors(api, stored):
    with pytest.raises(NotFound):
        await api.retrieve_study("1.2.3.4.5.6.7.8.9.0.404")
    ct = stored[0]
    with pytest.raises(StoreError) as info:
        await api.store_instances([str(sample_path("MR_small.dcm"))], study_instance_uid=str(ct.StudyInstanceUID))
    assert info.value.status_code == 409 and info.value.result.failed


async def test_delete(api, stored):
    mr = stored[1]
    await api.delete_study(str(mr.StudyInstanceUID))
    assert await api.search_for_studies(search_filters={"StudyInstanceUID": str(mr.StudyInstanceUID)}) == []

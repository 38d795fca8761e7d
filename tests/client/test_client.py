"""Every client method, sync and async, against the fake server.

These tests check what goes over the wire (URL, query string, headers)
and what comes back (parsed values), error mapping and retries.
"""
from __future__ import annotations

import io

from urllib.parse import unquote

import httpx
import pydicom
import pytest

from dicomweb_client import (
    AsyncDICOMwebClient,
    DICOMwebClient,
    HTTPError,
    MultipartError,
    NetworkError,
    NotAcceptable,
    NotFound,
    PayloadTooLarge,
    ResponseError,
    ServiceUnavailable,
    StoreError,
    StoreResult,
    UnsupportedMediaType,
)
from dicomweb_client import negotiation

from .conftest import uids
from .conftest import SAMPLE_FILES, Runner, sample_path
from .fakeserver import FAKE_URL, FakeArchive, build_multipart

CT = "CT_small.dcm"
MR = "MR_small.dcm"
DOSE = "rtdose.dcm"  # 15 frames, 10x10, 32 bit
SR = "test-SR.dcm"


def value(item, tag):
    return item[tag]["Value"][0]


def params_of(request: httpx.Request):
    return request.url.params.multi_items()


# ------------------------------------------------------------------ QIDO-RS
async def test_search_for_studies_query_and_result(api, archive, loaded):
    ct = loaded[CT]
    result = await api.search_for_studies(
        search_filters={"PatientID": ct.PatientID, "00080020": str(ct.StudyDate)},
        fields=["StudyDescription", "00081030", "StudyDescription"],
        fuzzymatching=True,
        limit=10,
        offset=0,
    )
    req = archive.last()
    assert req.method == "GET"
    assert req.url.path == "/studies"
    assert params_of(req) == [
        ("PatientID", ct.PatientID),
        ("00080020", str(ct.StudyDate)),
        ("includefield", "StudyDescription"),
        ("includefield", "00081030"),
        ("fuzzymatching", "true"),
        ("limit", "10"),
        ("offset", "0"),
    ]
    assert "application/dicom+json" in req.headers["accept"]
    assert [value(r, "0020000D") for r in result] == [ct.StudyInstanceUID]
    assert value(result[0], "00201208") == 1


async def test_search_filter_value_types(api, archive, loaded):
    import datetime

    await api.search_for_studies(
        search_filters={
            "StudyDate": (datetime.date(2020, 1, 1), None),
            "StudyInstanceUID": ["1.2.3", "4.5.6"],
            0x00100020: "X*",
            (0x0008, 0x0061): "CT",
            "NumberOfStudyRelatedInstances": 3,
            "PatientName": None,  # omitted
        }
    )
    assert params_of(archive.last()) == [
        ("StudyDate", "20200101-"),
        ("StudyInstanceUID", "1.2.3,4.5.6"),
        ("00100020", "X*"),
        ("00080061", "CT"),
        ("NumberOfStudyRelatedInstances", "3"),
    ]


async def test_search_for_series_scopes(api, archive, loaded):
    ct = loaded[CT]
    all_series = await api.search_for_series()
    assert archive.last().url.path == "/series"
    assert len(all_series) == len(SAMPLE_FILES)
    in_study = await api.search_for_series(ct.StudyInstanceUID, search_filters={"Modality": "CT"})
    assert archive.last().url.path == f"/studies/{ct.StudyInstanceUID}/series"
    assert [value(s, "0020000E") for s in in_study] == [ct.SeriesInstanceUID]


async def test_search_for_instances_scopes(api, archive, loaded):
    ct = loaded[CT]
    s, se, i = uids(ct)
    assert len(await api.search_for_instances()) == len(SAMPLE_FILES)
    assert archive.last().url.path == "/instances"
    await api.search_for_instances(s)
    assert archive.last().url.path == f"/studies/{s}/instances"
    found = await api.search_for_instances(s, se, fields=["all"])
    assert archive.last().url.path == f"/studies/{s}/series/{se}/instances"
    assert ("includefield", "all") in params_of(archive.last())
    assert value(found[0], "00080018") == i
    assert "00280010" in found[0]  # Rows
    with pytest.raises(ValueError):
        await api.search_for_instances(series_instance_uid=se)


async def test_search_no_match_and_empty_bodies(api, archive, loaded):
    assert await api.search_for_studies(search_filters={"PatientID": "does-not-exist"}) == []
    archive.script.append(httpx.Response(204))
    assert await api.search_for_studies() == []
    archive.script.append(httpx.Response(200, content=b"", headers={"Content-Type": "application/dicom+json"}))
    assert await api.search_for_studies() == []


async def test_search_invalid_arguments(api, archive):
    with pytest.raises(ValueError):
        await api.search_for_studies(limit=0)
    with pytest.raises(ValueError):
        await api.search_for_studies(offset=-1)
    assert archive.requests == []


async def test_get_remaining_follows_pages(api, archive, loaded):
    archive.max_results = 1  # server caps every answer at one result, with a Warning
    everything = await api.search_for_instances(get_remaining=True)
    assert len(everything) == len(SAMPLE_FILES)
    offsets = [dict(params_of(r)).get("offset") for r in archive.requests]
    assert offsets == [str(n) for n in range(len(SAMPLE_FILES) + 1)]  # last page is empty
    assert len({value(i, "00080018") for i in everything}) == len(SAMPLE_FILES)


async def test_get_remaining_with_limit_stops_on_short_page(api, archive, loaded):
    everything = await api.search_for_instances(limit=3, get_remaining=True)
    assert len(everything) == len(SAMPLE_FILES)
    assert [dict(params_of(r))["offset"] for r in archive.requests] == ["0", "3"]
    assert all(dict(params_of(r))["limit"] == "3" for r in archive.requests)


async def test_get_remaining_stops_if_server_ignores_offset(api, archive, loaded):
    page = httpx.Response(200, json=[{"00080018": {"vr": "UI", "Value": ["1"]}}])
    archive.script.extend([page, page, page])
    result = await api.search_for_studies(get_remaining=True)
    assert len(result) == 1 and len(archive.requests) == 2


async def test_search_bad_json_is_response_error(api, archive):
    archive.script.append(httpx.Response(200, content=b"<html>", headers={"Content-Type": "text/html"}))
    with pytest.raises(ResponseError):
        await api.search_for_studies()
    archive.script.append(httpx.Response(200, json={"not": "a list"}))
    assert await api.search_for_studies() == [{"not": "a list"}]  # one object is wrapped
    archive.script.append(httpx.Response(200, json=[1, 2]))
    with pytest.raises(ResponseError):
        await api.search_for_studies()


# ------------------------------------------------------------------ WADO-RS
DICOM_ANY = negotiation.INSTANCES.preferred


async def test_retrieve_study_returns_datasets(api, archive, loaded):
    ct = loaded[CT]
    result = await api.retrieve_study(ct.StudyInstanceUID)
    req = archive.last()
    assert req.url.path == f"/studies/{ct.StudyInstanceUID}"
    assert req.headers["accept"] == DICOM_ANY
    assert [d.SOPInstanceUID for d in result] == [ct.SOPInstanceUID]
    assert isinstance(result[0], pydicom.Dataset)
    assert result[0].PixelData == ct.PixelData
    assert result[0].file_meta.TransferSyntaxUID == ct.file_meta.TransferSyntaxUID


async def test_iter_study_streams(api, archive, loaded):
    ct = loaded[CT]
    items = await api.iter_study(ct.StudyInstanceUID)
    assert [d.SOPInstanceUID for d in items] == [ct.SOPInstanceUID]
    raw = await api.iter_study(ct.StudyInstanceUID, raw=True)
    assert raw == [sample_path(CT).read_bytes()]


async def test_iter_study_is_lazy_and_streaming(archive, loaded, make_client):
    ct = loaded[CT]
    client = make_client(False)
    it = client.iter_study(ct.StudyInstanceUID)
    assert archive.requests == []  # nothing sent before iteration
    assert next(it).SOPInstanceUID == ct.SOPInstanceUID
    it.close()
    aclient = make_client(True)
    ait = aclient.iter_study(ct.StudyInstanceUID)
    assert (await ait.__anext__()).SOPInstanceUID == ct.SOPInstanceUID
    await ait.aclose()
    await aclient.aclose()


async def test_retrieve_series_and_transfer_syntax_selection(api, archive, loaded):
    mr = loaded[MR]
    s, se, _ = uids(mr)
    explicit = "1.2.840.10008.1.2.1"
    result = await api.retrieve_series(s, se, media_types=(("application/dicom", explicit),))
    assert archive.last().url.path == f"/studies/{s}/series/{se}"
    assert archive.last().headers["accept"] == f'multipart/related; type="application/dicom"; transfer-syntax={explicit}'
    assert result[0].SOPInstanceUID == mr.SOPInstanceUID
    assert len(await api.iter_series(s, se)) == 1
    with pytest.raises(NotAcceptable):
        await api.retrieve_series(s, se, media_types=(("application/dicom", "1.2.840.10008.1.2.4.50"),))
    with pytest.raises(ValueError):
        await api.retrieve_series(s, se, media_types=("image/jpeg",))
    with pytest.raises(ValueError):
        await api.retrieve_series(s, se, media_types=(("application/dicom", "not a uid"),))


async def test_retrieve_instance(api, archive, loaded):
    ct = loaded[CT]
    s, se, i = uids(ct)
    ds = await api.retrieve_instance(s, se, i)
    assert archive.last().url.path == f"/studies/{s}/series/{se}/instances/{i}"
    assert archive.last().headers["accept"] == DICOM_ANY
    assert ds.SOPInstanceUID == i and ds.PixelData == ct.PixelData
    raw = await api.retrieve_instance(s, se, i, raw=True)
    assert raw == sample_path(CT).read_bytes()
    with pytest.raises(NotFound):
        await api.retrieve_instance(s, se, "9.9.9")


async def test_retrieve_instance_single_part_answer(api, archive, loaded):
    archive.single_part_instances = True  # server answers application/dicom, not multipart
    ds = await api.retrieve_instance(*uids(loaded[MR]))
    assert ds.SOPInstanceUID == loaded[MR].SOPInstanceUID


async def test_retrieve_instance_with_two_parts_is_an_error(api, archive, loaded):
    body = build_multipart([({"Content-Type": "application/dicom"}, sample_path(CT).read_bytes())] * 2)
    archive.script.append(
        httpx.Response(200, content=body, headers={"Content-Type": 'multipart/related; type="application/dicom"; boundary="fake=bound.ary\'x+y"'})
    )
    with pytest.raises(ResponseError, match="exactly one"):
        await api.retrieve_instance(*uids(loaded[CT]))


async def test_truncated_multipart_answer_is_an_error(api, archive, loaded):
    body = build_multipart([({"Content-Type": "application/dicom"}, sample_path(CT).read_bytes())])
    archive.script.append(
        httpx.Response(200, content=body[:-40], headers={"Content-Type": 'multipart/related; type="application/dicom"; boundary="fake=bound.ary\'x+y"'})
    )
    with pytest.raises(MultipartError):
        await api.retrieve_study(loaded[CT].StudyInstanceUID)


async def test_non_dicom_part_is_an_error(api, archive, loaded):
    body = build_multipart([({"Content-Type": "text/plain"}, b"hello")])
    archive.script.append(httpx.Response(200, content=body, headers={"Content-Type": "multipart/related; boundary=\"fake=bound.ary'x+y\""}))
    with pytest.raises(ResponseError):
        await api.retrieve_study(loaded[CT].StudyInstanceUID)


async def test_uids_are_percent_encoded(api, archive):
    with pytest.raises(NotFound):
        await api.retrieve_study("1.2/../../etc?x=#")
    raw_path = archive.last().url.raw_path.decode()
    assert raw_path == "/studies/1.2%2F..%2F..%2Fetc%3Fx%3D%23"
    assert unquote(raw_path.split("/")[2]) == "1.2/../../etc?x=#"
    with pytest.raises(ValueError):
        await api.retrieve_study("")
    with pytest.raises(TypeError):
        await api.retrieve_study(123)


async def test_metadata_at_each_level(api, archive, loaded):
    ct = loaded[CT]
    s, se, i = uids(ct)
    study = await api.retrieve_study_metadata(s)
    assert archive.last().url.path == f"/studies/{s}/metadata"
    assert "application/dicom+json" in archive.last().headers["accept"]
    series = await api.retrieve_series_metadata(s, se)
    assert archive.last().url.path == f"/studies/{s}/series/{se}/metadata"
    instance = await api.retrieve_instance_metadata(s, se, i)
    assert archive.last().url.path == f"/studies/{s}/series/{se}/instances/{i}/metadata"
    assert isinstance(study, list) and isinstance(series, list) and isinstance(instance, dict)
    assert value(instance, "00080018") == i
    assert value(instance, "00100020") == ct.PatientID
    assert study[0] == instance == series[0]
    assert "BulkDataURI" in instance["7FE00010"]


async def test_frames(api, archive, loaded):
    dose = loaded[DOSE]
    s, se, i = uids(dose)
    frame_size = dose.Rows * dose.Columns * dose.BitsAllocated // 8
    frames = await api.retrieve_instance_frames(s, se, i, [3, 1])
    req = archive.last()
    assert req.url.path == f"/studies/{s}/series/{se}/instances/{i}/frames/3,1"
    assert req.headers["accept"] == negotiation.FRAMES.preferred
    assert frames == [dose.PixelData[2 * frame_size : 3 * frame_size], dose.PixelData[:frame_size]]
    octet = await api.iter_instance_frames(s, se, i, [15], media_types=("application/octet-stream",))
    assert archive.last().headers["accept"] == 'multipart/related; type="application/octet-stream"'
    assert octet == [dose.PixelData[14 * frame_size :]]
    typed = await api.retrieve_instance_frames(
        s, se, i, [1], media_types=(("application/octet-stream", "1.2.840.10008.1.2.1"),)
    )
    assert archive.last().headers["accept"] == (
        'multipart/related; type="application/octet-stream"; transfer-syntax=1.2.840.10008.1.2.1'
    )
    assert typed == [dose.PixelData[:frame_size]]


async def test_frames_errors(api, archive, loaded):
    s, se, i = uids(loaded[DOSE])
    with pytest.raises(NotFound, match="no such frame"):
        await api.retrieve_instance_frames(s, se, i, [16])
    with pytest.raises(NotFound, match="no pixel data"):
        await api.retrieve_instance_frames(*uids(loaded[SR]), [1])
    n = len(archive.requests)
    for bad in ([], [0], [-1]):
        with pytest.raises(ValueError):
            await api.retrieve_instance_frames(s, se, i, bad)
    with pytest.raises(TypeError):
        await api.retrieve_instance_frames(s, se, i, ["x"])
    with pytest.raises(ValueError):
        await api.retrieve_instance_frames(s, se, i, [1], media_types=("application/dicom",))
    assert len(archive.requests) == n  # validated before sending


async def test_bulkdata_from_metadata(api, archive, loaded):
    ct = loaded[CT]
    meta = await api.retrieve_instance_metadata(*uids(ct))
    uri = meta["7FE00010"]["BulkDataURI"]
    data = await api.retrieve_bulkdata(uri)
    assert str(archive.last().url) == uri
    assert archive.last().headers["accept"] == negotiation.BULKDATA.preferred
    assert data == [ct.PixelData]
    part = await api.iter_bulkdata(uri, media_types=("application/octet-stream",), byte_range=(10, 19))
    assert archive.last().headers["range"] == "bytes=10-19"
    assert part == [ct.PixelData[10:20]]
    # a server that ignores Range (RFC 9110 14.2: 200, the whole value): the client cuts the range itself
    archive.ignore_range = True
    assert await api.retrieve_bulkdata(uri, byte_range=(10, 19)) == [ct.PixelData[10:20]]
    assert await api.iter_bulkdata(uri, byte_range=(100, None)) == [ct.PixelData[100:]]
    archive.ignore_range = False
    assert await api.iter_bulkdata(uri, byte_range=(100, None)) == [ct.PixelData[100:]]
    # relative BulkDataURI resolved against the service root
    relative = uri[len(FAKE_URL) + 1 :]
    assert await api.retrieve_bulkdata(relative) == [ct.PixelData]
    assert str(archive.last().url) == uri


async def test_rendered_and_thumbnails(api, archive, loaded):
    ct = loaded[CT]
    s, se, i = uids(ct)
    img = await api.retrieve_instance_rendered(
        s, se, i, media_types=("image/png",), window=(40, 400), viewport=(128, 128), quality=90
    )
    req = archive.last()
    assert req.url.path == f"/studies/{s}/series/{se}/instances/{i}/rendered"
    assert req.headers["accept"] == "image/png"
    assert params_of(req) == [("window", "40,400,linear"), ("viewport", "128,128"), ("quality", "90")]
    assert img.startswith(b"rendered " + i.encode())
    await api.retrieve_study_rendered(s, params={"quality": 75})
    assert archive.last().url.path == f"/studies/{s}/rendered"
    assert params_of(archive.last()) == [("quality", "75")]
    assert archive.last().headers["accept"] == negotiation.RENDERED.preferred
    await api.retrieve_series_rendered(s, se, window="1,2,sigmoid")
    assert archive.last().url.path == f"/studies/{s}/series/{se}/rendered"
    assert params_of(archive.last()) == [("window", "1,2,sigmoid")]
    frames = await api.retrieve_instance_frames_rendered(s, se, i, [1], media_types=("image/jpeg",))
    assert archive.last().url.path == f"/studies/{s}/series/{se}/instances/{i}/frames/1/rendered"
    assert frames.startswith(b"rendered")
    for method, args, path in [
        ("retrieve_study_thumbnail", (s,), f"/studies/{s}/thumbnail"),
        ("retrieve_series_thumbnail", (s, se), f"/studies/{s}/series/{se}/thumbnail"),
        ("retrieve_instance_thumbnail", (s, se, i), f"/studies/{s}/series/{se}/instances/{i}/thumbnail"),
        ("retrieve_instance_frames_thumbnail", (s, se, i, [1]), f"/studies/{s}/series/{se}/instances/{i}/frames/1/thumbnail"),
    ]:
        thumb = await getattr(api, method)(*args, viewport=(64, 64))
        assert archive.last().url.path == path
        assert params_of(archive.last()) == [("viewport", "64,64")]
        assert thumb.startswith(b"thumbnail")
    with pytest.raises(ValueError):
        await api.retrieve_instance_rendered(s, se, i, quality=0)
    with pytest.raises(ValueError):
        await api.retrieve_instance_rendered(s, se, i, media_types=("application/dicom",))


async def test_iter_rendered_multipart(api, archive, loaded):
    ct = loaded[CT]
    s, se, i = uids(ct)
    images = await api.iter_study_rendered(s)
    assert archive.last().headers["accept"] == negotiation.RENDERED_MULTIPART.preferred
    assert images == [f"rendered {i} ".encode()]
    assert len(await api.iter_series_rendered(s, se, media_types=("image/png",))) == 1
    assert archive.last().headers["accept"] == 'multipart/related; type="image/png"'
    assert len(await api.iter_instance_rendered(s, se, i)) == 1
    assert len(await api.iter_instance_frames_rendered(s, se, i, [1])) == 1
    # a multipart answer to a plain retrieve_* gives a list when it holds several images
    body = build_multipart([({"Content-Type": "image/jpeg"}, b"A"), ({"Content-Type": "image/jpeg"}, b"B")])
    archive.script.append(httpx.Response(200, content=body, headers={"Content-Type": "multipart/related; boundary=\"fake=bound.ary'x+y\""}))
    assert await api.retrieve_study_rendered(s) == [b"A", b"B"]


# ------------------------------------------------------------------ STOW-RS
def _stow_parts(request: httpx.Request):
    from .fakeserver import parse_content_type, parse_multipart_request

    ct, params = parse_content_type(request.headers["content-type"])
    return ct, params, parse_multipart_request(request.content, params["boundary"])


async def test_store_files_and_datasets(api, archive):
    paths = [sample_path(CT), sample_path(MR)]
    result = await api.store_instances([str(p) for p in paths])
    req = archive.last()
    assert req.method == "POST" and req.url.path == "/studies"
    ct, params, parts = _stow_parts(req)
    assert ct == "multipart/related" and params["type"] == "application/dicom"
    assert int(req.headers["content-length"]) == len(req.content)
    assert [p for _, p in parts] == [p.read_bytes() for p in paths]
    assert all(h["content-type"] == "application/dicom" for h, _ in parts)
    assert "application/dicom+json" in req.headers["accept"]
    assert isinstance(result, StoreResult) and result.ok and result.status_code == 200
    assert [r.sop_instance_uid for r in result.referenced] == [
        pydicom.dcmread(p).SOPInstanceUID for p in paths
    ]
    assert all(r.retrieve_url.startswith(FAKE_URL) for r in result.referenced)
    sop_class, sop_uid, url = result.referenced[0]
    assert sop_class == pydicom.dcmread(paths[0]).SOPClassUID
    # datasets, one at a time, sent with chunked transfer encoding
    ds = pydicom.dcmread(sample_path(DOSE))
    result = await api.store_instances(ds for ds in [ds])
    req = archive.last()
    assert req.headers.get("transfer-encoding") == "chunked"
    assert result.referenced[0].sop_instance_uid == ds.SOPInstanceUID
    # a single dataset / path / bytes is accepted too
    assert (await api.store_instances(ds)).ok
    assert (await api.store_instances(sample_path(MR))).ok
    assert (await api.store_instances(sample_path(MR).read_bytes())).ok
    assert (await api.store_instances([io.BytesIO(sample_path(CT).read_bytes())])).ok


async def test_store_in_study_partial_failure_is_inspectable(api, archive):
    ct = pydicom.dcmread(sample_path(CT))
    result = await api.store_instances([str(sample_path(CT)), str(sample_path(MR))], study_instance_uid=ct.StudyInstanceUID)
    assert archive.last().url.path == f"/studies/{ct.StudyInstanceUID}"
    assert result.status_code == 202 and result.partial and not result.ok
    assert [r.sop_instance_uid for r in result.referenced] == [ct.SOPInstanceUID]
    mr = pydicom.dcmread(sample_path(MR))
    assert result.failed[0].sop_instance_uid == mr.SOPInstanceUID
    assert result.failed[0].failure_reason == 0xA900
    assert "does not match" in result.failed[0].reason
    assert result.retrieve_url == f"{FAKE_URL}/studies/{ct.StudyInstanceUID}"
    # PyPI compatibility: DICOM keywords through the Dataset view
    assert result.FailedSOPSequence[0].FailureReason == 0xA900
    assert result.dataset.ReferencedSOPSequence[0].ReferencedSOPInstanceUID == ct.SOPInstanceUID
    assert result.summary()["failed"][0]["failure_reason"] == 0xA900
    with pytest.raises(AttributeError):
        result.not_there


async def test_store_all_failed_raises_store_error(api, archive):
    with pytest.raises(StoreError) as info:
        await api.store_instances([str(sample_path(MR)), b"not dicom at all"], study_instance_uid="1.2.3")
    exc = info.value
    assert exc.status_code == 409 and isinstance(exc, HTTPError)
    assert [f.failure_reason for f in exc.result.failed] == [0xA900, 0xC000]
    assert exc.result.referenced == []
    assert "2 instance(s) failed" in exc.message
    assert len(archive.requests) == 1


_STORE_409_WITH_WARNING = """
import httpx
from dicomweb_client import DICOMwebClient, StoreError
failed = {"00081198": {"vr": "SQ", "Value": [{"00081155": {"vr": "UI", "Value": ["1.2.3.4"]},
                                              "00081197": {"vr": "US", "Value": [43264]}}]}}
answer = httpx.Response(409, json=failed, headers={"Warning": '299 archive: "study 1.2.3 is locked"'})
with DICOMwebClient("http://x", transport=httpx.MockTransport(lambda request: answer)) as client:
    try:
        client.store_instances([b"DICM"])
    except StoreError as exc:
        print(exc)
"""


def test_store_409_warning_is_in_the_exception_not_on_stderr():
    """Issue 15 item 8: a library does not print; the Warning travels in the exception."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _STORE_409_WITH_WARNING], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "1 instance(s) failed: 0xA900" in run.stdout and 'server warning: 299 archive: "study 1.2.3 is locked"' in run.stdout


async def test_store_error_statuses(api, archive):
    archive.script.append(httpx.Response(415, json={"detail": "expected application/dicom"}))
    with pytest.raises(UnsupportedMediaType, match="expected application/dicom"):
        await api.store_instances([str(sample_path(CT))])
    archive.script.append(httpx.Response(413, text="too big"))
    with pytest.raises(PayloadTooLarge, match="too big"):
        await api.store_instances([str(sample_path(CT))])
    archive.script.append(httpx.Response(200, content=b"not json", headers={"Content-Type": "application/dicom+json"}))
    with pytest.raises(ResponseError):
        await api.store_instances([str(sample_path(CT))])
    archive.script.append(httpx.Response(200))  # empty body: nothing to report
    assert (await api.store_instances([str(sample_path(CT))])).referenced == []


async def test_store_is_not_retried(api, archive):
    archive.script.extend([httpx.Response(503), httpx.Response(503)])
    with pytest.raises(ServiceUnavailable):
        await api.store_instances([str(sample_path(CT))])
    assert len(archive.requests) == 1
    archive.script.clear()
    archive.script.append(httpx.ConnectError("refused"))
    with pytest.raises(NetworkError):
        await api.store_instances([str(sample_path(CT))])
    assert len(archive.requests) == 2


# ------------------------------------------------------------------- DELETE
async def test_delete_levels(api, archive, loaded):
    ct, mr, dose = loaded[CT], loaded[MR], loaded[DOSE]
    await api.delete_instance(*uids(ct))
    req = archive.last()
    assert req.method == "DELETE" and req.url.path == "/studies/{}/series/{}/instances/{}".format(*uids(ct))
    await api.delete_series(mr.StudyInstanceUID, mr.SeriesInstanceUID)
    assert archive.last().url.path == f"/studies/{mr.StudyInstanceUID}/series/{mr.SeriesInstanceUID}"
    assert await api.delete_study(dose.StudyInstanceUID) is None
    assert archive.last().url.path == f"/studies/{dose.StudyInstanceUID}"
    assert set(archive.instances) == {str(loaded[SR].SOPInstanceUID)}
    with pytest.raises(NotFound):
        await api.delete_study(dose.StudyInstanceUID)


# -------------------------------------------------------------- construction
@pytest.mark.parametrize("is_async", [False, True])
async def test_auth_token_headers(archive, make_client, is_async):
    client = make_client(is_async, token="secret-token", headers={"X-Tenant": "t1"})
    await Runner(client, is_async).search_for_studies()
    assert archive.last().headers["authorization"] == "Bearer secret-token"
    assert archive.last().headers["x-tenant"] == "t1"
    client = make_client(is_async, auth=("user", "pw"))
    await Runner(client, is_async).search_for_studies()
    assert archive.last().headers["authorization"].startswith("Basic ")
    with pytest.raises(ValueError):
        make_client(is_async, auth=("u", "p"), token="t")


@pytest.mark.parametrize("is_async", [False, True])
async def test_existing_httpx_client_and_prefix(is_async):
    archive = FakeArchive("http://host:8042/dicom-web")
    transport = httpx.MockTransport(archive.handler)
    http = (httpx.AsyncClient if is_async else httpx.Client)(
        transport=transport, base_url="http://host:8042/dicom-web/", headers={"X-From": "app"}
    )
    cls = AsyncDICOMwebClient if is_async else DICOMwebClient
    client = cls(client=http, token="tok", timeout=5.0)
    assert client.base_url == "http://host:8042/dicom-web" and client.url_prefix == "/dicom-web"
    api = Runner(client, is_async)
    await api.search_for_studies()
    req = archive.last()
    assert str(req.url) == "http://host:8042/dicom-web/studies"
    assert req.headers["x-from"] == "app" and req.headers["authorization"] == "Bearer tok"
    # the caller's client stays open
    if is_async:
        await client.aclose()
        assert not http.is_closed
        await http.aclose()
    else:
        client.close()
        assert not http.is_closed
        http.close()
    with pytest.raises(TypeError):
        cls(FAKE_URL, client=(httpx.Client() if is_async else httpx.AsyncClient()))


@pytest.mark.parametrize("is_async", [False, True])
async def test_service_prefixes(archive, make_client, is_async):
    client = make_client(is_async, qido_url_prefix="qidors", wado_url_prefix="wadors", stow_url_prefix="stowrs")
    api = Runner(client, is_async)
    archive.script.extend([httpx.Response(200, json=[])] * 2)
    await api.search_for_studies()
    assert archive.last().url.path == "/qidors/studies"
    await api.retrieve_study_metadata("1.2")
    assert archive.last().url.path == "/wadors/studies/1.2/metadata"
    assert client.qido_url_prefix == "qidors" and client.delete_url_prefix is None


def test_constructor_validation():
    for bad in ("ftp://x", "not a url", "http://x/?q=1"):
        with pytest.raises(ValueError):
            DICOMwebClient(bad)
    with pytest.raises(ValueError):
        DICOMwebClient()
    with pytest.raises(ValueError):
        DICOMwebClient(FAKE_URL, retries=-1)
    with pytest.raises(ValueError):
        DICOMwebClient(FAKE_URL, qido_url_prefix="")
    with DICOMwebClient(FAKE_URL + "/") as c:
        assert c.base_url == FAKE_URL and repr(c) == f"DICOMwebClient({FAKE_URL!r})"
        assert c.lookup_keyword("00080018") == "SOPInstanceUID"
        assert c.lookup_tag("SOPInstanceUID") == "00080018"
        with pytest.raises(KeyError):
            c.lookup_tag("NoSuchKeyword")
        with pytest.raises(ValueError):
            c.set_chunk_size(0)


async def test_user_agent_and_default_timeout(api, archive):
    await api.search_for_studies()
    assert archive.last().headers["user-agent"].startswith("dicomweb-archive-client/")
    assert archive.last().extensions["timeout"]["read"] == 30.0


def test_same_method_objects_for_sync_and_async():
    """One implementation: the public methods are shared, not copied."""
    names = [n for n in dir(DICOMwebClient) if not n.startswith("_") and callable(getattr(DICOMwebClient, n))]
    shared = [n for n in names if getattr(DICOMwebClient, n) is getattr(AsyncDICOMwebClient, n)]
    assert set(names) - set(shared) <= {"close", "http"}
    for name in ("search_for_studies", "retrieve_instance_frames", "store_instances", "iter_study", "delete_study"):
        assert name in shared


async def test_async_client_runs_on_real_event_loop(archive, loaded, make_client):
    """The async client streams a study while other tasks keep running."""
    import asyncio

    client = make_client(True)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        got = [d async for d in client.iter_study(loaded[CT].StudyInstanceUID)]
    finally:
        task.cancel()
    assert len(got) == 1 and ticks > 0
    await client.aclose()





class _LazyFramesStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A ~100 MB multipart answer produced on the fly (never whole in memory)."""

    def __init__(self, n_frames: int, frame_size: int, boundary: str) -> None:
        self.n, self.size, self.b = n_frames, frame_size, boundary.encode()
        self.block = bytes(range(256)) * (frame_size // 256)

    def _chunks(self):
        for _ in range(self.n):
            yield b"--" + self.b + b"\r\nContent-Type: application/octet-stream\r\n\r\n"
            for off in range(0, self.size, 65536):
                yield self.block[off : off + 65536]
            yield b"\r\n"
        yield b"--" + self.b + b"--\r\n"

    def __iter__(self):
        yield from self._chunks()

    async def __aiter__(self):
        for c in self._chunks():
            yield c


@pytest.mark.parametrize("is_async", [False, True])
async def test_iter_frames_of_a_large_answer_in_bounded_memory(make_client, is_async):
    import gc
    import tracemalloc

    n, size = 50, 2 << 20  # 100 MiB of frames

    def handler(request):
        return httpx.Response(
            200,
            stream=_LazyFramesStream(n, size, "big=frames"),
            headers={"Content-Type": 'multipart/related; type="application/octet-stream"; boundary="big=frames"'},
        )

    client = make_client(is_async, transport=httpx.MockTransport(handler))
    frames = client.iter_instance_frames("1", "2", "3", list(range(1, n + 1)))
    gc.collect()
    tracemalloc.start()
    count = total = 0
    try:
        if is_async:
            async for frame in frames:
                count, total = count + 1, total + len(frame)
        else:
            for frame in frames:
                count, total = count + 1, total + len(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (count, total) == (n, n * size)
    assert peak < 16 * (1 << 20), peak  # a frame or two, not 100 MiB
    if is_async:
        await client.aclose()

"""Client error mapping (HTTP status -> typed exception, PS3.18 8.4 / RFC 9110 15) and
retries, sync and async, against the fake server."""
from __future__ import annotations



import httpx
import pytest

from dicomweb_client import (
    BadRequest,
    ClientError,
    DICOMwebError,
    Forbidden,
    NetworkError,
    NotAcceptable,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
)
from dicomweb_client import negotiation
from dicomweb_client.errors import Conflict, MethodNotAllowed, TooManyRequests

from .conftest import uids
from .conftest import SAMPLE_FILES, Runner
from .fakeserver import FAKE_URL

CT = "CT_small.dcm"
MR = "MR_small.dcm"
DOSE = "rtdose.dcm"  # 15 frames, 10x10, 32 bit
SR = "test-SR.dcm"



DICOM_ANY = negotiation.INSTANCES.preferred


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "status,exc",
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (405, MethodNotAllowed),
        (406, NotAcceptable),
        (409, Conflict),
        (413, PayloadTooLarge),
        (415, UnsupportedMediaType),
        (418, ClientError),
        (429, TooManyRequests),
        (500, ServerError),
        (502, ServerError),
        (503, ServiceUnavailable),
    ],
)
async def test_error_mapping(api, archive, status, exc):
    archive.script.extend([httpx.Response(status, json={"detail": f"because {status}"})] * 3)
    with pytest.raises(exc) as info:
        await api.search_for_studies()
    err = info.value
    assert err.status_code == status == err.status
    assert err.message == f"because {status}"
    assert b"because" in err.response_body
    assert err.method == "GET" and err.url == f"{FAKE_URL}/studies"
    assert isinstance(err, DICOMwebError)


async def test_error_on_streamed_retrieve(api, archive, loaded):
    archive.script.extend([httpx.Response(406, text="no such syntax"), httpx.Response(406, text="not as stored"),
                           httpx.Response(406, text="cannot transcode")])
    with pytest.raises(NotAcceptable, match="cannot transcode"):  # the plain form's answer
        await api.iter_study(loaded[CT].StudyInstanceUID)
    assert [r.headers["accept"] for r in archive.requests[-3:]] == [
        DICOM_ANY, negotiation.INSTANCES.single, negotiation.INSTANCES.plain]
    archive.script.append(httpx.Response(406, text="cannot transcode"))
    with pytest.raises(NotAcceptable, match="cannot transcode"):  # a caller's media type: no retry
        await api.iter_study(loaded[CT].StudyInstanceUID, media_types=(("application/dicom", "1.2.3"),))
    assert not archive.script


async def test_default_accept_falls_back_once_and_is_remembered(api, archive, loaded):
    """A server that refuses Accept lists (Orthanc DICOMweb 1.7: 400 'incompatible with
    media type') gets the plain PS3.18 form once, then directly (issue 16)."""
    archive.single_accept = True
    dose, ct = loaded[DOSE], loaded[CT]
    s, se, i = uids(dose)
    frame_size = dose.Rows * dose.Columns * dose.BitsAllocated // 8
    n = len(archive.requests)
    assert await api.retrieve_instance_frames(s, se, i, [2]) == [dose.PixelData[frame_size : 2 * frame_size]]
    sent = [r.headers["accept"] for r in archive.requests[n:]]
    assert sent == [negotiation.FRAMES.preferred, 'multipart/related; type="application/octet-stream"']
    n = len(archive.requests)
    assert await api.iter_instance_frames(s, se, i, [1]) == [dose.PixelData[:frame_size]]
    assert [r.headers["accept"] for r in archive.requests[n:]] == [negotiation.FRAMES.plain]
    # each kind of resource is negotiated on its own
    for call, args, plain in [
        ("retrieve_instance", uids(ct), 'multipart/related; type="application/dicom"; transfer-syntax=*'),
        ("retrieve_instance_rendered", uids(ct), "image/jpeg"),
    ]:
        n = len(archive.requests)
        await getattr(api, call)(*args)
        assert [r.headers["accept"] for r in archive.requests[n:]][-1] == plain
        assert len(archive.requests) - n == 2
    meta = await api.retrieve_instance_metadata(*uids(ct))
    assert await api.retrieve_bulkdata(meta["7FE00010"]["BulkDataURI"]) == [ct.PixelData]
    # a 400 for another reason: the plain form's error is raised, nothing remembered wrongly
    archive.single_accept = False
    n = len(archive.requests)
    with pytest.raises(NotFound, match="no such frame"):
        await api.retrieve_instance_frames(s, se, i, [99])
    assert len(archive.requests) - n == 1


async def test_error_message_sources(api, archive):
    archive.script.append(httpx.Response(400, headers={"Warning": '299 server: "bad includefield"'}))
    with pytest.raises(BadRequest, match="bad includefield"):
        await api.search_for_studies()
    archive.script.append(httpx.Response(400, json={"00000902": {"vr": "LO", "Value": ["bad date"]}}))
    with pytest.raises(BadRequest, match="bad date"):
        await api.search_for_studies()
    archive.script.append(httpx.Response(404))
    with pytest.raises(NotFound, match="Not Found"):
        await api.search_for_studies()


# ------------------------------------------------------------------ retries
async def test_retry_on_503_then_success(api, archive, loaded):
    archive.script.extend([httpx.Response(503, headers={"Retry-After": "0"}), httpx.Response(503)])
    result = await api.search_for_studies()
    assert len(result) == len(SAMPLE_FILES)
    assert len(archive.requests) == 3


async def test_retry_on_connection_error_then_success(api, archive, loaded):
    archive.script.extend([httpx.ConnectError("refused"), httpx.RemoteProtocolError("closed")])
    ds = await api.retrieve_instance(*uids(loaded[CT]))
    assert ds.SOPInstanceUID == loaded[CT].SOPInstanceUID
    assert len(archive.requests) == 3


async def test_retry_on_streamed_request_and_delete(api, archive, loaded):
    archive.script.append(httpx.Response(503))
    assert len(await api.iter_study(loaded[CT].StudyInstanceUID)) == 1
    archive.script.append(httpx.ConnectError("refused"))
    await api.delete_study(loaded[CT].StudyInstanceUID)
    assert [r.method for r in archive.requests] == ["GET", "GET", "DELETE", "DELETE"]


async def test_retries_exhausted(api, archive):
    archive.script.extend([httpx.Response(503)] * 3)
    with pytest.raises(ServiceUnavailable):
        await api.search_for_studies()
    assert len(archive.requests) == 3  # 1 + retries=2
    archive.script.extend([httpx.ConnectError("refused")] * 3)
    with pytest.raises(NetworkError, match="refused") as info:
        await api.search_for_studies()
    assert isinstance(info.value.__cause__, httpx.ConnectError)


@pytest.mark.parametrize("is_async", [False, True])
async def test_retry_configuration(archive, make_client, is_async):
    client = make_client(is_async, retries=0)
    api = Runner(client, is_async)
    archive.script.append(httpx.Response(503))
    with pytest.raises(ServiceUnavailable):
        await api.search_for_studies()
    assert len(archive.requests) == 1
    client.set_http_retry_params(retry=True, max_attempts=3, wait_exponential_multiplier=0, retriable_error_codes=(429,))
    archive.script.extend([httpx.Response(429), httpx.Response(429)])
    assert await api.search_for_studies() == []
    assert len(archive.requests) == 4
    assert client.retry_policy.delay(3, "2") == 2.0
    assert client.retry_policy.delay(0, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


async def test_timeout_maps_to_request_timeout(api, archive):
    archive.script.extend([httpx.ReadTimeout("slow")] * 3)
    with pytest.raises(RequestTimeout):
        await api.search_for_studies()


async def test_single_accept_server_gets_transfer_syntax_star_before_explicit_le(api, archive):
    """Orthanc-like: an Accept list is refused (400), and an instance Accept without
    transfer-syntax means Explicit VR Little Endian (PS3.18 8.7.3.5.2). The client's
    single value keeps ``transfer-syntax=*``, so a JPEG 2000 instance comes back as
    stored (the server is not made to transcode), and the value is remembered."""
    from pydicom.data import get_testdata_file

    archive.single_accept = True
    path = get_testdata_file("MR_small_jp2klossless.dcm")
    with open(path, "rb") as f:
        stored = f.read()
    ds = archive.add(stored)
    assert ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.90"
    for _ in range(2):
        n = len(archive.requests)
        got = await api.retrieve_instance(*uids(ds), raw=True)
        assert got == stored
        sent = [r.headers["accept"] for r in archive.requests[n:]]
        if _ == 0:
            assert sent == [negotiation.INSTANCES.preferred,
                            'multipart/related; type="application/dicom"; transfer-syntax=*']
        else:  # remembered: asked directly
            assert sent == ['multipart/related; type="application/dicom"; transfer-syntax=*']
    assert await api.retrieve_study(ds.StudyInstanceUID, raw=True) == [stored]

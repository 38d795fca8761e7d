"""STOW-RS: store instances (PS3.18 §10.5), and DELETE of studies, series and
instances (not part of PS3.18; offered as other archives do)."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..access import labels_in
from ..archive import DiskFull, StoreOutcome, retrieve_url, source_of_stow
from ..dicom.media_types import DICOM, MULTIPART_RELATED, negotiate_json, parse_accept, parse_media_type
from ..dicom.multipart import PartSpooler
from ..routing.rules import NOWHERE, Arrival
from ..dicom.status import FailureReason
from .deps import (
    ArchiveDep,
    BaseURL,
    SeriesUID,
    SOPInstanceUID,
    StudyUID,
    access_of,
    base_url,
    checked_uid,
)
from .errors import DICOMwebHTTPError, warning_header
from .responses import DicomJSONResponse
from .threads import run_blocking

router = APIRouter(tags=["STOW-RS"])


def _store_response(outcome: StoreOutcome, base: str, study_uid: str | None) -> Response:
    """Store Instances Response Module (PS3.18 §10.5.3, Table 10.5.3-1 for status)."""
    body: dict = {}
    studies = {s.study_uid for s in outcome.stored}
    if study_uid is not None or len(studies) == 1:
        body["00081190"] = {"vr": "UR", "Value": [retrieve_url(base, study_uid or next(iter(studies)))]}
    if outcome.failed:
        items = []
        for f in outcome.failed:
            item: dict = {}
            if f.sop_class_uid:
                item["00081150"] = {"vr": "UI", "Value": [f.sop_class_uid]}
            if f.sop_instance_uid:
                item["00081155"] = {"vr": "UI", "Value": [f.sop_instance_uid]}
            item["00081197"] = {"vr": "US", "Value": [int(f.reason)]}
            items.append(item)
        body["00081198"] = {"vr": "SQ", "Value": items}
    if outcome.stored:
        body["00081199"] = {"vr": "SQ", "Value": [
            {
                "00081150": {"vr": "UI", "Value": [s.sop_class_uid]},
                "00081155": {"vr": "UI", "Value": [s.sop_instance_uid]},
                "00081190": {"vr": "UR", "Value": [retrieve_url(base, s.study_uid, s.series_uid, s.sop_instance_uid)]},
            }
            for s in outcome.stored
        ]}
    if not outcome.failed:
        status = 200
    elif outcome.stored:
        status = 202
    elif all(f.reason == FailureReason.OUT_OF_RESOURCES for f in outcome.failed):
        # nothing stored for lack of room (a full disk, read-only storage, the retention
        # policy's hard limit): 507 Insufficient Storage (RFC 4918 §11.5), as a DELETE that
        # cannot be recorded; each instance's FailureReason 0xA700 in the FailedSOPSequence
        status = 507
    else:
        status = 409
    headers = {}
    if outcome.failed:
        text = "; ".join(
            f"{f.sop_instance_uid or 'part'}: {f.message} (0x{int(f.reason):04X})" for f in outcome.failed[:20])
        headers["Warning"] = warning_header(text)
    return DicomJSONResponse(orjson.dumps(body), status_code=status, headers=headers)


def _source(request: Request) -> str:
    """Where the request's instances come from (archive.source_of_stow): the identity the
    authentication gave (api/auth.py; not an anonymous one), else the client's address."""
    identity = request.scope.get("state", {}).get("identity")
    user = identity.subject if identity is not None and identity.method != "anonymous" else None
    return source_of_stow(user, request.client.host if request.client is not None else None)


async def _stow(request: Request, archive, base: str, study_uid: str | None,
                arrival: Arrival = NOWHERE) -> Response:
    ctype = request.headers.get("content-type", "")
    mr = parse_media_type(ctype)
    if mr.type != MULTIPART_RELATED:
        raise DICOMwebHTTPError(415, f'Content-Type must be multipart/related; type="application/dicom", not {ctype!r}')
    part_type = mr.params.get("type", DICOM).lower()
    if part_type != DICOM:
        raise DICOMwebHTTPError(415, f"multipart/related type {part_type!r} is not supported; "
                                     'send type="application/dicom" (PS3.18 §10.5.1.2)')
    # the Store Instances Response is DICOM JSON only: 406 before any body is read
    # (an unsupported request body is 415 above; RFC 9110 §15.5.7, §15.5.16)
    negotiate_json(parse_accept(request.headers.get("accept")))
    boundary = mr.params.get("boundary")
    if not boundary:
        raise DICOMwebHTTPError(400, "multipart/related Content-Type without a boundary parameter")
    settings = archive.settings
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > settings.max_request_bytes:
        raise DICOMwebHTTPError(413, f"request body of {length} bytes exceeds the limit of "
                                     f"{settings.max_request_bytes} bytes")
    spooler = PartSpooler(boundary, archive.blobs.spool, max_bytes=settings.max_request_bytes,
                          max_parts=settings.max_parts)
    try:
        await _spool_body(request.receive, spooler, settings.body_timeout, settings.body_min_rate)
        spooler.close()
        if not spooler.parts:
            raise DICOMwebHTTPError(400, "the multipart body holds no parts")
        outcome = await run_blocking(archive.store, spooler.parts, study_uid, access_of(request),
                                     _source(request), arrival)
        request.state.audit_studies = {s.study_uid for s in outcome.stored}
    except ClientDisconnect:
        spooler.discard()
        return Response(status_code=400)
    except BaseException:
        spooler.discard()
        raise
    return _store_response(outcome, base, study_uid)


async def _spool_body(receive: Receive, spooler: PartSpooler, stall: float, min_rate: int) -> None:
    """Feed the request body to ``spooler`` as the ASGI messages arrive, within two
    bounds (408, RFC 9110 §15.5.9, with ``Connection: close``: the rest of the body is
    not wanted): no body data for ``stall`` seconds, and a total deadline of ``stall +
    received / min_rate`` seconds from the start, so a client trickling bytes cannot hold
    a worker's spool file and connection for ever (a 100 MB body at the default
    10 KiB/s minimum may take 60 s + ~2.7 h).

    One asyncio deadline per body, moved only when less than ``stall`` is left (so a
    stall is noticed after 1x to 1.5x ``stall``): Starlette's ``Request.stream`` with a
    new ``asyncio.timeout`` per chunk cost ~10% of a STOW-RS's CPU (issue 11)."""
    loop = asyncio.get_running_loop()
    start = last = loop.time()
    received = 0
    try:
        async with asyncio.timeout_at(min(start + 1.5 * stall, start + stall)) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                if chunk:
                    received += len(chunk)
                    spooler.feed(chunk)
                if not message.get("more_body", False):
                    return
                now = loop.time()
                if chunk:
                    last = now
                total = start + stall + received / min_rate
                if now >= total:
                    raise TimeoutError
                if deadline.when() - now < stall:  # type: ignore[operator]
                    deadline.reschedule(min(now + 1.5 * stall, total))
    except TimeoutError:
        elapsed = loop.time() - start
        if loop.time() - last >= stall:
            reason = f"no request body data for {stall:g} s"
        else:
            reason = (f"request body too slow: {received} bytes in {elapsed:.0f} s "
                      f"(minimum {min_rate} bytes/s after {stall:g} s)")
        raise DICOMwebHTTPError(408, reason, {"Connection": "close"}) from None


class _StowEndpoint:
    """``POST /{door}/studies[/{study}]`` (a STOW-RS door) as a plain ASGI app behind a Starlette ``Route``:
    FastAPI's request handling (dependency solving, endpoint wrapping) was ~20% of
    a STOW-RS's CPU (py-spy, issue 11). Errors still go through the app's exception
    handlers (:mod:`.errors`); the FastAPI routes below stay for the OpenAPI schema."""

    def __init__(self, with_study: bool) -> None:
        self.with_study = with_study

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        archive = scope["app"].state.archive
        arrival = _door(request, archive, scope["path_params"]["door"])
        study = checked_uid(scope["path_params"]["study"], "StudyInstanceUID") if self.with_study else None
        response = await _stow(request, archive, await base_url(request), study, arrival)
        await response(scope, receive, send)


def _door(request: Request, archive, name: str) -> Arrival:
    """A STOW-RS door (``stow_prefix`` of the routes file's rules): 404 when no rule names
    it; 403 for a client restricted to labels that may not see every label it gives
    (a client stores only into labels it may write), before the body is read."""
    doors = archive.routing.routes.stow_prefixes if archive.routing is not None else {}
    if name not in doors:
        raise DICOMwebHTTPError(404, f"no STOW-RS door {name!r} (stow_prefix of the routes file's rules)")
    refused = labels_in.door_refusal(access_of(request), doors[name])
    if refused is not None:
        raise DICOMwebHTTPError(403, refused)
    return Arrival(stow_prefix=name)


store_door_instances = _StowEndpoint(False)
store_door_study_instances = _StowEndpoint(True)


def fast_routes(prefix: str) -> list[Route]:
    """The STOW-RS doors of the routes file's ``stow_prefix`` rules
    (``{prefix}/{door}/studies[/{study}]``: labels on arrival, access/labels_in.py), to put
    before the app's other routes (see :class:`_StowEndpoint`). The hot path (api/hot.py)
    answers these, and ``POST {prefix}/studies[/{study}]``, before Starlette, with the same
    endpoints."""
    return [Route(prefix + "/{door}/studies", store_door_instances, methods=["POST"]),
            Route(prefix + "/{door}/studies/{study}", store_door_study_instances, methods=["POST"])]


@router.post("/studies", summary="Store instances")
async def store_instances(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    """STOW-RS (PS3.18 §10.5): ``multipart/related; type="application/dicom"``,
    one PS3.10 file per part. 200 all stored, 202 some failed, 409 none stored,
    400 malformed body, 413 too large, 415 other media types. Answers only after
    every stored instance is fsynced and indexed."""
    return await _stow(request, archive, base, None)


@router.post("/studies/{study}", summary="Store instances of one study")
async def store_study_instances(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID) -> Response:
    """As ``POST /studies``; instances of another study fail with 0xC409."""
    return await _stow(request, archive, base, study)


async def _delete(request: Request, archive, study: str, series: str | None = None, sop: str | None = None
                  ) -> Response:
    allowed = access_of(request).filter
    if not allowed.unrestricted and await run_in_threadpool(archive.index.labels, study, allowed) is None:
        n = 0  # a study the client may not see: as one that does not exist
    else:
        try:
            n = await run_in_threadpool(archive.delete, study, series, sop)
        except DiskFull as e:
            raise DICOMwebHTTPError(507, str(e)) from None  # RFC 4918 §11.5 Insufficient Storage
    if n == 0:
        raise DICOMwebHTTPError(404, "no such " + ("instance" if sop else "series" if series else "study"))
    return Response(status_code=204)


@router.delete("/studies/{study}", status_code=204, summary="Delete a study")
async def delete_study(request: Request, archive: ArchiveDep, study: StudyUID) -> Response:
    """Removes the index rows (one commit), then the files. 204, or 404."""
    return await _delete(request, archive, study)


@router.delete("/studies/{study}/series/{series}", status_code=204, summary="Delete a series")
async def delete_series(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID) -> Response:
    return await _delete(request, archive, study, series)


@router.delete("/studies/{study}/series/{series}/instances/{instance}", status_code=204,
               summary="Delete an instance")
async def delete_instance(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID,
                          instance: SOPInstanceUID) -> Response:
    return await _delete(request, archive, study, series, instance)

"""The lifecycle routes (thin: lifecycle/update.py does the work). PS3.18 has no update
transaction: the routes mirror FHIR-style operations (``$update``, ``$merge``,
``$restore``) on the DICOMweb resources. POST: the ``write`` scope (api/auth.py).

- ``POST /studies/{study}/$update``: a DICOM JSON object of Patient/Study attributes;
- ``POST /studies/{study}/series/{series}/$update``: of Series attributes;
- ``POST /patients/{PatientID}/$merge[?IssuerOfPatientID=]``: the target patient's attributes (PatientID...);
  the path and the issuer name one patient exactly, never a pattern (lifecycle/update.py ``merge``);
- ``GET .../instances/{sop}/versions``, ``POST .../instances/{sop}/$restore?version=N``.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..lifecycle import update as lifecycle
from .deps import Allowed, ArchiveDep, SeriesUID, SOPInstanceUID, VisibleStudyUID
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Lifecycle"])


def _json(doc: object) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


async def _body(request: Request) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > lifecycle.MAX_BODY:
            raise DICOMwebHTTPError(400, f"the body is over {lifecycle.MAX_BODY} bytes")
    return bytes(body)


async def _run(request: Request, fn, *args):
    try:
        out = await run_in_threadpool(fn, *args)
    except lifecycle.UpdateError as e:
        raise DICOMwebHTTPError(e.status, e.message) from None
    results = out if isinstance(out, list) else [out]
    request.state.audit_changes = [c for r in results for c in r.changes]  # the audit log (api/auth.py)
    return out


async def _changes(request: Request, level: str):
    try:
        return lifecycle.parse_changes(await _body(request), level)
    except lifecycle.UpdateError as e:
        raise DICOMwebHTTPError(e.status, e.message) from None


@router.post("/studies/{study}/$update")
async def update_study(request: Request, archive: ArchiveDep, study: VisibleStudyUID) -> Response:
    changes = await _changes(request, "study")
    return _json((await _run(request, lifecycle.update, archive, study, None, changes)).to_json())


@router.post("/studies/{study}/series/{series}/$update")
async def update_series(request: Request, archive: ArchiveDep, study: VisibleStudyUID, series: SeriesUID) -> Response:
    changes = await _changes(request, "series")
    return _json((await _run(request, lifecycle.update, archive, study, series, changes)).to_json())


@router.post("/patients/{patient_id}/$merge")
async def merge(request: Request, archive: ArchiveDep, patient_id: str, allowed: Allowed) -> Response:
    target = await _changes(request, "study")
    issuer = request.query_params.get("IssuerOfPatientID")
    done = await _run(request, lifecycle.merge, archive, patient_id, target, issuer, allowed)  # the caller's studies only
    return _json({"studies": [d.to_json() for d in done]})


@router.get("/studies/{study}/series/{series}/instances/{instance}/versions")
async def versions(archive: ArchiveDep, study: VisibleStudyUID, series: SeriesUID,
                   instance: SOPInstanceUID) -> Response:
    try:
        return _json(await run_in_threadpool(lifecycle.instance_versions, archive, study, series, instance))
    except lifecycle.UpdateError as e:
        raise DICOMwebHTTPError(e.status, e.message) from None


@router.post("/studies/{study}/$restore")
async def restore_study(request: Request, archive: ArchiveDep, study: VisibleStudyUID) -> Response:
    return _json((await _run(request, lifecycle.restore_study, archive, study)).to_json())


@router.post("/studies/{study}/series/{series}/instances/{instance}/$restore")
async def restore(request: Request, archive: ArchiveDep, study: VisibleStudyUID, series: SeriesUID,
                  instance: SOPInstanceUID) -> Response:
    raw = request.query_params.get("version")
    if raw is None:
        raise DICOMwebHTTPError(400, "the version to restore is required: ?version=N (GET .../versions lists them)")
    if not raw.isdigit():
        raise DICOMwebHTTPError(400, f"version: {raw!r} is not a version number")
    done = await _run(request, lifecycle.restore, archive, study, series, instance, int(raw))
    return _json(done.to_json())

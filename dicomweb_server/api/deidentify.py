"""De-identification jobs over HTTP (issue 29), outside PS3.18: ``POST
/studies/{study}/$deidentify`` (one study) and ``POST /$deidentify`` (a list of studies, or
the studies a QIDO-RS query finds) start a ``deidentify`` background job (deid/job.py, run
by jobs/runner.py) into a target: a label of this archive, a routing destination, or
(admin scope: the server's own credentials and folders) an S3 prefix or a folder. ``202 Accepted`` with the job and its Location
(api/jobs.py :func:`accepted`) once it is durably queued; ``GET /jobs/{id}`` follows it.

Who may: a POST, so the ``write`` scope (api/auth.py), as a de-identified download needs;
the job sees only the studies the caller may see (its access filter is a parameter of the
job, applied in each index query); the study of the path is 404 when the caller may not
see it. The body's checks (and the 403s of a target the caller may not write to) are
deid/job.py :func:`request_params`."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..deid.job import RequestError, request_params
from ..identity import SCOPES
from .deps import ArchiveDep, VisibleStudyUID, access_of, read_body
from .errors import DICOMwebHTTPError
from .jobs import accepted

router = APIRouter(tags=["De-identification"])

#: the largest request body (a list of study UIDs: some 15,000 of them)
MAX_BODY = 1024 * 1024


async def _submit(request: Request, archive, study: str | None) -> Response:
    raw = await read_body(request, MAX_BODY)
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as e:
        raise DICOMwebHTTPError(400, f"the body is not JSON: {e}") from None
    identity = request.scope.get("state", {}).get("identity")
    scopes = identity.scopes if identity is not None else SCOPES  # no authentication: every scope
    try:
        params = await run_in_threadpool(request_params, body, archive, access_of(request).filter, scopes, study)
    except RequestError as e:
        raise DICOMwebHTTPError(e.status, str(e)) from None
    return await accepted(request, "deidentify", params)


@router.post("/studies/{study}/$deidentify", status_code=202, summary="De-identify a study into a target (a job)")
async def deidentify_study(request: Request, archive: ArchiveDep, study: VisibleStudyUID) -> Response:
    return await _submit(request, archive, study)


@router.post("/$deidentify", status_code=202,
             summary="De-identify a list of studies or a QIDO-RS query's studies into a target (a job)")
async def deidentify_studies(request: Request, archive: ArchiveDep) -> Response:
    return await _submit(request, archive, None)

"""Background jobs over HTTP (jobs/runner.py): ``GET /jobs``, ``GET /jobs/{id}``,
``DELETE /jobs/{id}`` (cancel). The routes that start a job (``POST
/studies/{study}/$deidentify``, ``POST /admin/recompress``, ``POST /admin/pull``) answer
``202 Accepted`` with the job and its ``Location`` through :func:`accepted`, once the job
is durably queued.

Every ``/jobs`` route needs the ``write`` scope (api/auth.py). A caller whose access
rules restrict it to some studies (labels) sees only the jobs it submitted itself; an
unrestricted caller sees every job, but the jobs of kinds only the ``admin`` scope may start
(:data:`ADMIN_KINDS`: a pull's query names patients, a recompress rewrites every file) only
with that scope.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Path as PathParam, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from .deps import access_of
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Jobs"])

JobId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", description="the job's id")]

#: kinds started with the admin scope only (api/auth.py): seen and cancelled with it only
ADMIN_KINDS = ("pull", "recompress")


def _runner(request: Request):
    runner = getattr(request.app.state, "jobs", None)
    if runner is None or runner.store is None:
        raise DICOMwebHTTPError(503, "background jobs are not available yet: their queue's database cannot "
                                     "be reached", headers={"Retry-After": "5"})
    return runner


def _who(request: Request) -> tuple[str | None, bool]:
    """The caller's name and whether its access is restricted (then it sees its own jobs only)."""
    identity = request.scope.get("state", {}).get("identity")
    name = f"{identity.method}:{identity.subject}" if identity is not None else None
    return name, not access_of(request).filter.unrestricted


def _admin(request: Request) -> bool:
    identity = request.scope.get("state", {}).get("identity")
    return identity is None or "admin" in identity.scopes  # (no authentication: everything)


def public(job: dict) -> dict:
    """A job as the API shows it (its checkpoint is the runner's business)."""
    return {k: job[k] for k in ("id", "kind", "state", "params", "progress", "result", "error", "owner",
                                "created", "started", "finished", "attempts", "cancel")}


def _json(doc: object, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


async def accepted(request: Request, kind: str, params: dict) -> Response:
    """Queue a job of ``kind`` for the caller; ``202`` with the job and its Location."""
    from ..jobs.runner import NotReady

    runner = _runner(request)
    owner, restricted = _who(request)
    try:
        job_id = await run_in_threadpool(runner.submit, kind, params, owner, restricted)
    except NotReady as e:
        raise DICOMwebHTTPError(503, str(e)) from None
    job = await run_in_threadpool(runner.store.get, job_id)
    return _json(public(job), 202, {"Location": f"/jobs/{job_id}"})


def _visible(request: Request, job: dict | None) -> dict:
    owner, restricted = _who(request)
    if job is None or (restricted and job["owner"] != owner) or (job["kind"] in ADMIN_KINDS
                                                                  and not _admin(request)):
        raise DICOMwebHTTPError(404, "no such job")
    return job


@router.get("/jobs", summary="Background jobs, newest first")
async def list_jobs(request: Request, limit: int = Query(100, ge=1, le=1000)) -> Response:
    runner = _runner(request)
    owner, restricted = _who(request)
    jobs = await run_in_threadpool(runner.store.list, owner if restricted else None, limit,
                                   () if _admin(request) else ADMIN_KINDS)
    return _json({"jobs": [public(j) for j in jobs]})


@router.get("/jobs/{job_id}", summary="A background job: state, progress, result")
async def get_job(request: Request, job_id: JobId) -> Response:
    runner = _runner(request)
    return _json(public(_visible(request, await run_in_threadpool(runner.store.get, job_id))))


@router.delete("/jobs/{job_id}", summary="Cancel a background job")
async def cancel_job(request: Request, job_id: JobId) -> Response:
    """A queued job is cancelled at once; a running one at its next checkpoint (then
    ``state`` becomes ``cancelled``); a finished one is left as it is. 202 with the job."""
    runner = _runner(request)
    _visible(request, await run_in_threadpool(runner.store.get, job_id))
    await run_in_threadpool(runner.store.cancel, job_id)
    return _json(public(await run_in_threadpool(runner.store.get, job_id)), 202)

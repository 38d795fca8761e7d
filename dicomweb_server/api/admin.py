"""Operations endpoints outside the DICOMweb prefix: the routing queue, manual
export to a destination (both need the ``write`` scope, see api/auth.py) and the
Prometheus metrics (``/metrics``)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from .. import metrics
from .deps import ArchiveDep, SeriesUID, SOPInstanceUID, VisibleStudyUID
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Operations"])


def _routing(archive):
    if archive.routing is None:
        raise DICOMwebHTTPError(404, "routing is not configured (start the server with --routes FILE)")
    return archive.routing


def _json(doc: object) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


@router.get("/admin/queue", summary="Routing queue per destination")
async def queue(archive: ArchiveDep) -> Response:
    """Per destination: pending, in_flight, delivered, failed, oldest_pending_age (s), last_error."""
    routing = _routing(archive)
    return _json({"destinations": await run_in_threadpool(routing.outbox.stats)})


@router.post("/admin/queue/retry-failed", summary="Dead letters back to pending")
async def retry_failed(archive: ArchiveDep, destination: str | None = Query(None)) -> Response:
    routing = _routing(archive)
    n = await run_in_threadpool(routing.outbox.retry_failed, destination)
    routing.committed_to({destination} if destination else set(routing.routes.destinations))
    return _json({"requeued": n})


async def _export(archive, destination: str, study: str, series: str | None = None, sop: str | None = None
                  ) -> Response:
    routing = _routing(archive)
    if destination not in routing.routes.destinations:
        raise DICOMwebHTTPError(404, f"no destination named {destination!r}; configured: "
                                     + ", ".join(routing.routes.destinations))
    if routing.routes.destinations[destination].webhook is not None:
        raise DICOMwebHTTPError(400, f"{destination!r} is a webhook: it is told of changes, "
                                     "no instances are exported to it")
    found = [i for i in await run_in_threadpool(archive.index.instances, study, series)
             if sop is None or i.sop_uid == sop]
    if not found:
        raise DICOMwebHTTPError(404, "no such " + ("instance" if sop else "series" if series else "study"))
    n = await run_in_threadpool(routing.export, destination, found)
    return _json({"destination": destination, "instances": len(found), "enqueued": n})


@router.post("/admin/export/{destination}/studies/{study}", summary="Export a study to a destination")
async def export_study(archive: ArchiveDep, destination: str, study: VisibleStudyUID) -> Response:
    """Owe every instance of the study to ``destination`` (delivered by the forwarder;
    an instance already pending for it is not queued twice)."""
    return await _export(archive, destination, study)


@router.post("/admin/export/{destination}/studies/{study}/series/{series}", summary="Export a series")
async def export_series(archive: ArchiveDep, destination: str, study: VisibleStudyUID, series: SeriesUID) -> Response:
    return await _export(archive, destination, study, series)


@router.post("/admin/export/{destination}/studies/{study}/series/{series}/instances/{instance}",
             summary="Export an instance")
async def export_instance(archive: ArchiveDep, destination: str, study: VisibleStudyUID, series: SeriesUID,
                          instance: SOPInstanceUID) -> Response:
    return await _export(archive, destination, study, series, instance)


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus_metrics(archive: ArchiveDep) -> Response:
    outbox = archive.routing.outbox if archive.routing is not None else None
    body = await run_in_threadpool(metrics.render, outbox)
    return Response(body, media_type=metrics.CONTENT_TYPE)

"""Operations endpoints outside the DICOMweb prefix: the routing queue, manual
export to a destination (both need the ``write`` scope, see api/auth.py), a
de-identification project's pseudonym table (``admin`` scope: it re-identifies
patients; deid/pseudonyms.py), a pull from another PACS (``admin`` scope: a job,
dimse/pull.py), the recompress job (``admin`` scope: it rewrites stored files;
policy/recompress.py) and the Prometheus metrics (``/metrics``)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from .. import arrivals, metrics
from .deps import Allowed, ArchiveDep, SeriesUID, SOPInstanceUID, StudyUID, VisibleStudyUID, read_body
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


@router.get("/admin/queue/studies/{study}", summary="Routing state of one study per destination")
async def study_queue(archive: ArchiveDep, study: VisibleStudyUID) -> Response:
    """Every configured destination (``kind``: ``stow``, ``dimse`` or ``webhook``) with the
    study's outbox rows for it: pending, in_flight, delivered, failed (dead letters) and the
    last error of a row not delivered (zeros when nothing was ever owed). Read only: the
    operator's page (``/ui/``) shows it; the same ``write`` scope as the rest of ``/admin/``."""
    routing = _routing(archive)
    rows = await run_in_threadpool(routing.outbox.study_stats, study)
    empty = {"pending": 0, "in_flight": 0, "delivered": 0, "failed": 0, "last_error": None}
    out = {}
    for name, dest in routing.routes.destinations.items():
        kind = "webhook" if dest.webhook is not None else "dimse" if dest.dimse is not None else "stow"
        out[name] = {"kind": kind, **rows.pop(name, empty)}
    for name, row in rows.items():  # rows of a destination no longer configured
        out[name] = {"kind": None, **row}
    return _json({"study": study, "destinations": out})


@router.get("/admin/studies/{study}/arrivals", summary="What arrived of a study, from where, against the declared")
async def study_arrivals(archive: ArchiveDep, study: StudyUID, allowed: Allowed) -> Response:
    """Per series: the instances stored, their files' sizes summed, their sources (``dimse:AE``,
    ``stow:user`` or ``stow:address``, ``import``; ``""`` not known) and the Number of Series
    Related Instances (0020,1209) the instances declare (null when none does); the study's
    totals, received time (first and latest), declared Number of Study Related Instances
    (0020,1208), and the Storage Commitment requests that named its instances (declared,
    arrived, missing). From the index only (dicomweb_server/arrivals.py); 404 for a study the
    request may not see. The operator's page (``/ui/``) shows it."""
    doc = await run_in_threadpool(arrivals.study_arrivals, archive.index, study, allowed)
    if doc is None:
        raise DICOMwebHTTPError(404, "no such study")
    return _json(doc)


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


def _project(archive, project: str):
    table = archive.pseudonyms
    if project not in table.projects():
        raise DICOMwebHTTPError(404, f"no de-identification project {project!r}")
    return table


@router.get("/admin/deid/{project}/pseudonyms", summary="A project's pseudonym table (re-identification)")
async def pseudonyms(archive: ArchiveDep, project: str) -> Response:
    """Every PatientID -> pseudonym of the project, in the order handed out: ``source``
    ``generated`` or ``csv``. Needs the ``admin`` scope."""
    table = await run_in_threadpool(_project, archive, project)
    rows = await run_in_threadpool(table.mapping, project)
    return _json({"project": project, "pseudonyms": [
        {"PatientID": m.patient_id, "pseudonym": m.pseudonym, "source": m.source} for m in rows]})


@router.post("/admin/deid/{project}/pseudonyms", summary="Add a trial's pseudonyms (CSV)")
async def add_pseudonyms(archive: ArchiveDep, project: str, request: Request) -> Response:
    """Body: ``PatientID,pseudonym`` lines (text/csv, UTF-8). All or nothing: a patient given
    a second pseudonym, or a pseudonym given to two patients, is refused (400)."""
    from ..deid.pseudonyms import PseudonymError

    body = await read_body(request, 64 * 1024 * 1024, "a pseudonym CSV")
    try:
        n = await run_in_threadpool(archive.pseudonyms.load_csv, project, body.decode("utf-8"))
    except (UnicodeDecodeError, PseudonymError) as e:
        raise DICOMwebHTTPError(400, str(e)) from None
    return _json({"project": project, "added": n})


@router.post("/admin/pull", status_code=202, summary="Pull studies from another PACS (a job)")
async def pull(request: Request, archive: ArchiveDep) -> Response:
    """Body: ``{"from": "ORTHANC", "query": {"PatientID": "123"}, "studies": [...],
    "skip_complete": false}``: a ``pull`` job (dimse/pull.py: C-FIND on that peer of the peers
    file, then C-MOVE of each study to this archive's AE title, or C-GET), ``202`` with the job
    once durably queued; ``GET /jobs/{id}`` follows it. ``400`` for a bad body or an AE title
    that is not a peer with a port. Needs the ``admin`` scope (api/auth.py)."""
    from ..dimse.pull import request_params
    from ..jobs import JobError
    from .jobs import accepted

    raw = await read_body(request, 1024 * 1024, "a pull request")
    try:
        params = await run_in_threadpool(request_params, orjson.loads(raw), archive.settings)  # reads the peers file
    except orjson.JSONDecodeError as e:
        raise DICOMwebHTTPError(400, f"the body is not JSON: {e}") from None
    except JobError as e:
        raise DICOMwebHTTPError(400, str(e)) from None
    return await accepted(request, "pull", params)


@router.post("/admin/recompress", summary="Re-encode stored instances by the [[store_as]] rules (a job)")
async def recompress(archive: ArchiveDep, request: Request) -> Response:
    """Queue the ``recompress`` job (policy/recompress.py): every stored instance (or those
    ``match`` names) re-encoded losslessly by the first ``[[store_as]]`` rule of the routes
    file that matches it, verified, crash-safe. Body (optional): a JSON object of the job's
    parameters ``match`` (QIDO-RS keys), ``rate`` (instances/s), ``bytes_rate`` (bytes/s),
    ``limit``, ``quiet`` (seconds without a store before each instance), ``dry_run``.
    ``202`` with the job and its Location (``GET /jobs/{id}``: progress, then the report of
    bytes saved per transfer syntax); 400 for bad parameters or a routes file without
    ``[[store_as]]`` rules. Needs the ``admin`` scope: it rewrites stored files."""
    from ..jobs import JobError
    from ..policy.recompress import check_params
    from .jobs import accepted

    body = await read_body(request, 64 * 1024, "the parameters")
    try:
        params = orjson.loads(body) if body.strip() else {}
        if isinstance(params, dict) and "follow" in params:
            raise JobError("unknown parameter 'follow' (the server's own after-ack passes)")
        check_params(params)
    except orjson.JSONDecodeError as e:
        raise DICOMwebHTTPError(400, f"the body is not JSON: {e}") from None
    except JobError as e:
        raise DICOMwebHTTPError(400, str(e)) from None
    if archive.routing is None or not archive.routing.routes.store_as:
        raise DICOMwebHTTPError(400, "no [[store_as]] rule: start the server with --routes FILE holding them")
    return await accepted(request, "recompress", params)


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus_metrics(archive: ArchiveDep) -> Response:
    outbox = archive.routing.outbox if archive.routing is not None else None
    body = await run_in_threadpool(metrics.render, outbox)
    return Response(body, media_type=metrics.CONTENT_TYPE)

"""Rejection endpoints (lifecycle/reject.py): dcm4chee's reject (the URL OHIF's reject
button calls: ``POST {wadoRoot}/studies/{study}/series/{series}/reject/113001%5EDCM``),
the restore of rejected instances, and their listing (``/admin/``: ``write`` scope)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..lifecycle import reject as lifecycle
from .deps import ArchiveDep, SeriesUID, Unrestricted, VisibleStudyUID, checked_uid
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Rejection"])
admin_router = APIRouter(tags=["Operations"])


def _json(doc: object) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


async def _reject(archive, study: str, series: str | None, reason: str) -> Response:
    try:
        code = lifecycle.parse_reason(reason)
    except lifecycle.BadReason as e:
        raise DICOMwebHTTPError(400, str(e)) from None
    n = await run_in_threadpool(lifecycle.reject_stored, archive, study, series, code)
    if n == 0:
        raise DICOMwebHTTPError(404, "no such " + ("series" if series else "study"))
    return _json({"count": n})


@router.post("/studies/{study}/reject/{reason}", summary="Reject a study (dcm4chee, IOCM)")
async def reject_study(archive: ArchiveDep, study: VisibleStudyUID, reason: str) -> Response:
    """Hides the study's instances from every search and retrieve, as a rejection note
    titled ``reason`` (``113001^DCM``: PS3.16 CID 7011) would. 200 ``{"count": n}``, 400, 404."""
    return await _reject(archive, study, None, reason)


@router.post("/studies/{study}/series/{series}/reject/{reason}", summary="Reject a series (dcm4chee, IOCM)")
async def reject_series(archive: ArchiveDep, study: VisibleStudyUID, series: SeriesUID, reason: str) -> Response:
    return await _reject(archive, study, series, reason)


async def _restore(archive, study: str, series: str | None) -> Response:
    """200 ``{"count": n}`` (with ``"refused"`` when some stay rejected); 409 when nothing
    came back because every one was refused (the reasons in the message: their rejections
    are kept as they were); 404 when nothing of it is rejected and stored."""
    done = await run_in_threadpool(lifecycle.restore, archive, study, series)
    if done.count == 0 and done.refused:
        raise DICOMwebHTTPError(409, "no rejected instance could be restored, they stay rejected: "
                                + "; ".join(f"{sop}: {why}" for sop, why in done.refused))
    if done.count == 0:
        raise DICOMwebHTTPError(404, "no rejected instances stored in this " + ("series" if series else "study"))
    doc: dict = {"count": done.count}
    if done.refused:
        doc["refused"] = [{"SOPInstanceUID": sop, "Reason": why} for sop, why in done.refused]
    return _json(doc)


@router.post("/studies/{study}/$restore-rejected", summary="Restore the rejected instances of a study")
async def restore_study(archive: ArchiveDep, study: VisibleStudyUID) -> Response:
    """Shows the study's rejected instances again (kept ``keep_rejected`` days). 200 ``{"count": n}``
    (``"refused"``: those that stay rejected, and why), 409 (none could come back), 404."""
    return await _restore(archive, study, None)


@router.post("/studies/{study}/series/{series}/$restore-rejected", summary="Restore the rejected instances of a series")
async def restore_series(archive: ArchiveDep, study: VisibleStudyUID, series: SeriesUID) -> Response:
    return await _restore(archive, study, series)


@admin_router.get("/admin/rejected", summary="Rejected instances", dependencies=[Unrestricted])
async def rejected(archive: ArchiveDep, study: str | None = Query(None), series: str | None = Query(None)) -> Response:
    """The rejected instances (of a study, a series), oldest rejection first: UIDs,
    ``Reason`` (``code^scheme``), ``Time`` (seconds since the epoch), ``Stored``. For
    callers unrestricted by access rules (others: 403; QIDO-RS ``includerejected=true``
    lists the rejected instances of the studies they may see)."""
    study = checked_uid(study, "study") if study is not None else None
    series = checked_uid(series, "series") if series is not None else None
    rows = await run_in_threadpool(archive.index.rejections, study, series)
    return _json([r.entry() for r in rows])

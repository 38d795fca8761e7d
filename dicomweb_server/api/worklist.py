"""Modality worklist management (dicom/worklist.py; answered over DIMSE by
dimse/worklist.py): ``POST /worklist`` (one DICOM JSON entry or a list: ``write`` scope),
``GET /worklist`` (matching keys as QIDO-RS parameters), ``GET /worklist/{id}``,
``DELETE /worklist/{id}`` (``delete`` scope, as every DELETE). ``{id}`` is the Scheduled
Procedure Step ID of the entry's first Scheduled Procedure Step Sequence item.
``GET /mpps/{uid}``: a Modality Performed Procedure Step a modality reported (N-CREATE,
N-SET: dimse/mpps.py), read only."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..dicom.worklist import WorklistError, identifier_from_params, matches, parse_identifier, prefilter, prepare
from .deps import ArchiveDep, Unrestricted, read_body
from .errors import DICOMwebHTTPError

#: a caller restricted by access rules (labels) or a share link gets 403: the worklist is the
#: department's schedule, not a study it may see (api/deps.py)
router = APIRouter(tags=["Modality worklist"], dependencies=[Unrestricted])

#: the largest body of POST /worklist
MAX_BODY = 16 * 1024 * 1024
_CONTROL = {"limit", "offset", "includefield", "fuzzymatching"}


def _json(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/dicom+json")


@router.post("/worklist", summary="Add modality worklist entries")
async def add_entries(archive: ArchiveDep, request: Request) -> Response:
    """Body: a DICOM JSON object (one scheduled procedure step) or an array of them. A first
    Scheduled Procedure Step Sequence item without Scheduled Procedure Step ID, and an entry
    without Study Instance UID, get one. An entry with the ID of an existing one replaces it.
    201 with the entries as stored; 400 naming the first entry that cannot be taken (nothing
    is stored then)."""
    body = await read_body(request, MAX_BODY, "a worklist body")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise DICOMwebHTTPError(400, f"not JSON: {e}") from None
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise DICOMwebHTTPError(400, "no worklist entry")
    entries = []
    for i, item in enumerate(items):
        try:
            entries.append(prepare(item))
        except WorklistError as e:
            raise DICOMwebHTTPError(400, f"entry {i}: {e}") from None
    await run_in_threadpool(archive.index.put_worklist, entries)
    return _json([e.json for e in entries], 201)


@router.get("/worklist", summary="Search the modality worklist")
async def search_entries(archive: ArchiveDep, request: Request) -> Response:
    """Matching keys as QIDO-RS parameters, by keyword or tag, a sequence's item key as
    ``Sequence.Key`` (``ScheduledProcedureStepSequence.ScheduledStationAETitle=CT1``,
    ``00400100.00400002=20260101-20260107``, ``PatientName=DOE*``); ``limit``, ``offset``.
    The matching entries whole, oldest first."""
    params = [(k, v) for k, v in request.query_params.multi_items() if k not in _CONTROL]
    try:
        limit = int(request.query_params.get("limit", 0) or 0)
        offset = int(request.query_params.get("offset", 0) or 0)
        keys = parse_identifier(identifier_from_params(params))
    except (WorklistError, ValueError) as e:
        raise DICOMwebHTTPError(400, str(e)) from None
    rows = await run_in_threadpool(archive.index.worklist, prefilter(keys))
    found = [r for r in rows if matches(keys, r)][offset:]
    return _json(found[:limit] if limit > 0 else found)


@router.get("/worklist/{sps_id}", summary="A modality worklist entry")
async def get_entry(archive: ArchiveDep, sps_id: str) -> Response:
    entry = await run_in_threadpool(archive.index.worklist_entry, sps_id)
    if entry is None:
        raise DICOMwebHTTPError(404, f"no worklist entry {sps_id!r}")
    return _json(entry)


@router.delete("/worklist/{sps_id}", summary="Remove a modality worklist entry")
async def delete_entry(archive: ArchiveDep, sps_id: str) -> Response:
    """204, or 404 when there is no such entry."""
    if not await run_in_threadpool(archive.index.delete_worklist, sps_id):
        raise DICOMwebHTTPError(404, f"no worklist entry {sps_id!r}")
    return Response(status_code=204)


@router.get("/mpps/{sop_uid}", summary="A modality performed procedure step")
async def get_mpps(archive: ArchiveDep, sop_uid: str) -> Response:
    """The step as the modality's N-CREATE and N-SETs left it (DICOM JSON; PS3.4 F.7.2),
    404 when there is none."""
    step = await run_in_threadpool(archive.index.mpps, sop_uid)
    if step is None:
        raise DICOMwebHTTPError(404, f"no performed procedure step {sop_uid!r}")
    return _json(step)

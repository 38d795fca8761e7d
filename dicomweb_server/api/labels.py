"""Study labels (access/filter.py, store/labels.py): put, take away and list the labels
of a study, and list the labels in use. Changing a label needs the write scope (api/auth.py),
listing the read scope. A study the caller may not see is 404, like one that does not exist."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from typing import Annotated

from ..access.filter import validate_label
from .deps import Allowed, ArchiveDep, StudyUID
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Labels"])


def _label(label: Annotated[str, PathParam(description="label: 1-64 of a-z 0-9 . _ -")]) -> str:
    try:
        return validate_label(label)
    except ValueError as e:
        raise DICOMwebHTTPError(400, str(e)) from None


def _json(value: object, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


@router.get("/studies/{study}/labels", summary="The labels of a study")
async def study_labels(archive: ArchiveDep, study: StudyUID, allowed: Allowed) -> Response:
    found = await run_in_threadpool(archive.index.labels, study, allowed)
    if found is None:
        raise DICOMwebHTTPError(404, "no such study")
    return _json(found)


async def _set(archive, study: str, label: str, present: bool, allowed) -> Response:
    changed = await run_in_threadpool(archive.index.set_label, study, label, present, allowed)
    if changed is None:
        raise DICOMwebHTTPError(404, "no such study")
    return _json(await run_in_threadpool(archive.index.labels, study, allowed))


@router.put("/studies/{study}/labels/{label}", summary="Put a label on a study")
async def put_label(archive: ArchiveDep, study: StudyUID, label: str, allowed: Allowed) -> Response:
    """Idempotent: 200 with the study's labels, whether the label was there or not. A
    restricted caller may put a label on a study it sees (it then may see it by that
    label too, when the label is one of its own)."""
    return await _set(archive, study, _label(label), True, allowed)


@router.delete("/studies/{study}/labels/{label}", summary="Take a label off a study")
async def delete_label(archive: ArchiveDep, study: StudyUID, label: str, allowed: Allowed) -> Response:
    """Idempotent: 200 with the study's labels left. A restricted caller that takes off
    the last label it may see the study by no longer sees it."""
    return await _set(archive, study, _label(label), False, allowed)


@router.get("/labels", summary="The labels in use")
async def all_labels(archive: ArchiveDep, allowed: Allowed) -> Response:
    """``{"label": number of studies}`` over the studies the caller may see."""
    return _json(await run_in_threadpool(archive.index.all_labels, allowed))

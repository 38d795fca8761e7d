"""QIDO-RS: search for studies, series and instances (PS3.18 §10.6)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ..access.filter import Filter, validate_label
from ..archive import retrieve_url
from ..dicom.attributes import Level
from ..dicom.matching import Query, parse_query
from ..dicom.media_types import negotiate_json
from ..dicom.search_results import build_result
from ..lifecycle import rejected_search
from .deps import ArchiveDep, BaseURL, SeriesUID, StudyUID, access_of, acceptable
from .errors import DICOMwebHTTPError, warning_header
from .responses import DicomJSONResponse
from .threads import run_blocking

router = APIRouter(tags=["QIDO-RS"])


async def _search(request: Request, archive, base: str, level: Level, own_levels: tuple,
                  study_uid: str | None = None, series_uid: str | None = None) -> Response:
    """Parse on the event loop (microseconds; errors are 400s), then search and build
    the answer in a worker thread: a search can scan the whole index, and the
    in-memory index holds its lock meanwhile, so it never runs on the event loop."""
    negotiate_json(acceptable(request))
    params = request.query_params.multi_items()
    allowed = with_labels(access_of(request).filter, [v for k, v in params if k == "label"])
    rejected = _include_rejected(request, [v for k, v in params if k.lower() == rejected_search.PARAMETER])
    query = parse_query(level, [(k, v) for k, v in params if k != "label" and k.lower() != rejected_search.PARAMETER],
                        study_uid=study_uid, series_uid=series_uid, max_results=archive.settings.max_results)
    scope = rejected_search.uid_scope(query) if rejected else None
    return await run_blocking(_answer, archive, base, query, own_levels, allowed, scope)


def _include_rejected(request: Request, values: list[str]) -> bool:
    """``includerejected=true`` (lifecycle/rejected_search.py): the ``write`` scope, as
    ``GET /admin/rejected``; 403 without it, 400 for a value not true/false."""
    if not values:
        return False
    if len(values) > 1 or values[0].strip().lower() not in ("true", "false"):
        raise DICOMwebHTTPError(400, f"{rejected_search.PARAMETER}: one value, true or false")
    if values[0].strip().lower() == "false":
        return False
    identity = request.scope.get("state", {}).get("identity")
    if identity is not None and "write" not in identity.scopes:
        raise DICOMwebHTTPError(403, f"{rejected_search.PARAMETER}=true needs the 'write' scope")
    return True


def with_labels(allowed: Filter, values: list[str]) -> Filter:
    """``allowed`` and the ``label`` query parameters (not a DICOM attribute: this archive's
    own; repeated or comma-separated, any of them): studies carrying one of the labels."""
    if not values:
        return allowed
    try:
        return allowed.narrow({validate_label(v.strip()) for value in values for v in value.split(",")})
    except ValueError as e:
        raise DICOMwebHTTPError(400, f"label: {e}") from None


def _answer(archive, base: str, query: Query, own_levels: tuple, allowed: Filter,
            rejected_scope: dict | None = None) -> Response:
    level = query.level
    hits = archive.index.search(query, allowed)
    results = []
    for h in hits:
        url = retrieve_url(base, h.study_uid, h.series_uid if level != "study" else None,
                           h.sop_uid if level == "instance" else None)
        results.append(build_result(query, h.study_json, h.series_json, h.instance_json, h.computed, url,
                                    own_levels))
    if rejected_scope is not None:
        results += rejected_search.rejected_entries(archive.index, query, rejected_scope, allowed)
    headers = {}
    if query.limited and len(hits) == query.limit:
        # PS3.18 §8.3.4.4: the server maximum cut the answer
        headers["Warning"] = warning_header("There are additional results that can be requested")
    return DicomJSONResponse(orjson.dumps(results), headers=headers)


@router.get("/studies", summary="Search for studies")
async def search_for_studies(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    """Study search: matching keys of the study level (PS3.18 Table 10.6.1-5)."""
    return await _search(request, archive, base, "study", ("study",))


@router.get("/series", summary="Search for series (all studies)")
async def search_for_series(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    return await _search(request, archive, base, "series", ("study", "series"))


@router.get("/studies/{study}/series", summary="Search for series of a study")
async def search_for_study_series(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID) -> Response:
    return await _search(request, archive, base, "series", ("series",), study_uid=study)


@router.get("/instances", summary="Search for instances (all studies)")
async def search_for_instances(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    return await _search(request, archive, base, "instance", ("study", "series", "instance"))


@router.get("/studies/{study}/instances", summary="Search for instances of a study")
async def search_for_study_instances(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID) -> Response:
    return await _search(request, archive, base, "instance", ("series", "instance"), study_uid=study)


@router.get("/studies/{study}/series/{series}/instances", summary="Search for instances of a series")
async def search_for_series_instances(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID,
                                series: SeriesUID) -> Response:
    return await _search(request, archive, base, "instance", ("instance",), study_uid=study, series_uid=series)

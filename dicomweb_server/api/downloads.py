"""Downloads (issue 29), outside PS3.18: a ZIP of a study, a series or the studies a
QIDO-RS query matches (PS3.10 files and a DICOMDIR, export.py), and the metadata of
the instances a QIDO-RS query matches as NDJSON. Read access as WADO-RS retrieve:
the same archive dependency and ``read`` scope (api/auth.py: a GET), the same study
and series look-up (Index.instances) with the caller's access filter in the index query
(access/filter.py: a study it may not see is one that does not exist), 404 when it finds
nothing. HEAD is answered by
the app's HTTPMethods middleware like every GET."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
from fastapi import APIRouter, Request
from starlette.concurrency import iterate_in_threadpool
from starlette.responses import Response, StreamingResponse

from .. import export, missing_data
from ..deid import download as _deid_download  # noqa: F401 - registers "basic" in export.TRANSFORMS
from ..dicom.dicomdir import TAGS as DICOMDIR_TAGS
from ..dicom.matching import parse_query
from ..access.filter import UNRESTRICTED, Filter
from ..store.base import InstanceLocation
from .deps import ArchiveDep, BaseURL, SeriesUID, StudyUID, access_of
from .errors import DICOMwebHTTPError, warning_header
from .qido import with_labels
from .threads import run_blocking
from .wado import leave_out_missing

router = APIRouter(tags=["Downloads"])

#: the most studies one ``GET /archive?<query>`` packs; a query matching more is refused (400)
ARCHIVE_MAX_STUDIES = 100
#: query parameters of these routes that are not QIDO-RS matching keys
_OWN_PARAMETERS = {"deidentify", "project", "option", "allow_burned_in", "format", "accept", "charset", "label"}
_ZIP = "application/zip"
NDJSON = "application/x-ndjson"
_WANTED = set(DICOMDIR_TAGS.values())


def _qido_params(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.query_params.multi_items() if k not in _OWN_PARAMETERS]


def _allowed(request: Request) -> Filter:
    """The caller's access filter, narrowed by ``?label=`` as QIDO-RS narrows it."""
    return with_labels(access_of(request).filter, request.query_params.getlist("label"))


def _transform(request: Request, archive) -> export.InstanceTransform | None:
    """The ``?deidentify=PROFILE[,OPTION...]`` transform (export.TRANSFORMS, given the
    request's parameters: project, option, allow_burned_in; deid/download.py), None
    without one; 400 for a profile this archive does not have or parameters it cannot
    take (never a download left as stored). Blocking (it looks the project up)."""
    spec = request.query_params.get("deidentify")
    if spec is None:
        return None
    identity = request.scope.get("state", {}).get("identity")
    if identity is not None and "write" not in identity.scopes:
        # a de-identified download records each patient's pseudonym in the project's table,
        # and beside an identified read it would pair identities with pseudonyms: the write
        # scope (a share link, which is read-only, never)
        raise DICOMwebHTTPError(403, "a de-identified download needs the 'write' scope")
    name = spec.split(",")[0].strip()
    factory = export.TRANSFORMS.get(name)
    if factory is None:
        known = ", ".join(sorted(export.TRANSFORMS)) or "none"
        raise DICOMwebHTTPError(400, f"de-identification profile {name!r} is not available (available: {known})")
    query: dict[str, list[str]] = {}
    for k, v in request.query_params.multi_items():
        query.setdefault(k, []).append(v)
    try:
        return factory(archive, spec, query)
    except ValueError as e:
        raise DICOMwebHTTPError(400, str(e)) from None


def _entries(archive, groups: list[tuple[tuple[str, str | None], list[InstanceLocation]]],
             allowed: Filter = UNRESTRICTED) -> Iterator[export.Entry]:
    """Each instance of ``groups`` ((study, series) and its instances) with the DICOMDIR's
    keys of its stored DICOM JSON: the JSON of one group at a time, looked up as the ZIP
    reaches it (in its worker thread)."""
    for (study, series), locs in groups:
        items: dict[str, dict] = {}
        for raw in archive.index.metadata(study, series, allowed=allowed):
            item = orjson.loads(raw)
            sop = (item.get("00080018") or {}).get("Value", [None])[0]
            items[sop] = {t: v for t, v in item.items() if t in _WANTED}
        for loc in locs:
            item = items.get(loc.sop_uid)
            if item is not None:  # (deleted since the first look-up: left out)
                yield export.Entry(loc, item)


def _located(archive, keys: list[tuple[str, str | None]], allowed: Filter):
    return [(key, archive.index.instances(*key, allowed=allowed)) for key in keys]


async def _zip_response(request: Request, archive, keys: list[tuple[str, str | None]], what: str,
                        filename: str) -> Response:
    transform = await run_blocking(_transform, request, archive)
    allowed = access_of(request).filter
    groups = await run_blocking(_located, archive, keys, allowed)
    locs = [loc for _, group in groups for loc in group]
    if not locs:
        raise DICOMwebHTTPError(404, f"no such {what}")
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    kept = await leave_out_missing(archive, locs, headers)  # (its Warning, or a 500)
    if len(kept) != len(locs):
        ids = {id(loc) for loc in kept}
        groups = [(key, [loc for loc in group if id(loc) in ids]) for key, group in groups]

    def missing(loc: InstanceLocation, e: Exception) -> None:
        missing_data.confirm(archive.index, loc, e)  # logged and counted (the answer has started)

    body = export.zip_stream(archive.blobs, _entries(archive, groups, allowed), transform, missing)
    return StreamingResponse(iterate_in_threadpool(body), media_type=_ZIP, headers=headers)


@router.get("/studies/{study}/archive", summary="Download a study as a ZIP with a DICOMDIR")
async def download_study(request: Request, archive: ArchiveDep, study: StudyUID) -> Response:
    """Every instance of the study as a PS3.10 file and a DICOMDIR (PS3.10 §7.2, PS3.3
    Annex F), in a ZIP streamed as it is written (export.py).
    ``?deidentify=basic&project=NAME[&option=...][&allow_burned_in=true]``: each file
    de-identified (PS3.15 Annex E; deid/download.py), the DICOMDIR naming the new UIDs
    and pseudonyms, instances with burned-in annotation left out and named in the
    member DEIDENTIFICATION.json. The ``read`` scope suffices: the answer carries no
    identities; the project must exist (an admin makes it)."""
    return await _zip_response(request, archive, [(study, None)], "study", f"study-{study}.zip")


@router.get("/studies/{study}/series/{series}/archive", summary="Download a series as a ZIP with a DICOMDIR")
async def download_series(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID) -> Response:
    return await _zip_response(request, archive, [(study, series)], "series", f"series-{series}.zip")


@router.get("/archive", summary="Download the studies a QIDO-RS query matches as a ZIP with a DICOMDIR")
async def download_studies(request: Request, archive: ArchiveDep) -> Response:
    """The studies a study-level QIDO-RS query matches (PS3.18 §10.6: the matching keys,
    ``limit`` and ``offset`` of ``GET /studies``), at most ARCHIVE_MAX_STUDIES: a query
    matching more is refused (400), to be narrowed or paged with limit/offset."""
    query = parse_query("study", _qido_params(request), max_results=ARCHIVE_MAX_STUDIES + 1)
    hits = await run_blocking(archive.index.search, query, _allowed(request))
    if len(hits) > ARCHIVE_MAX_STUDIES:
        raise DICOMwebHTTPError(400, f"the query matches more than {ARCHIVE_MAX_STUDIES} studies, the most one "
                                     "download holds: narrow it, or page with limit and offset")
    if not hits:
        raise DICOMwebHTTPError(404, "no study matches the query")
    return await _zip_response(request, archive, [(h.study_uid, None) for h in hits], "studies", "studies.zip")


def _metadata_lines(archive, hits, base: str, form: str, transform: export.InstanceTransform | None = None,
                    allowed: Filter = UNRESTRICTED) -> Iterator[bytes]:
    """One line per hit, from the stored DICOM JSON of its series (one look-up per
    series, held while its instances follow one another); through ``transform`` when
    one is given."""
    current: tuple[str, str] | None = None
    by_sop: dict[str, bytes] = {}
    for h in hits:
        if (h.study_uid, h.series_uid) != current:
            current = (h.study_uid, h.series_uid)
            by_sop = {}
            for raw in archive.index.metadata(h.study_uid, h.series_uid, allowed=allowed):
                sop = (orjson.loads(raw).get("00080018") or {}).get("Value", [None])[0]
                by_sop[sop] = raw
        raw = by_sop.get(h.sop_uid)
        if raw is None:  # (deleted since the search: left out)
            continue
        if transform is not None:
            item = transform.metadata(orjson.loads(raw))
            yield orjson.dumps(export.flat(item) if form == "flat" else item) + b"\n"
        else:
            yield from export.ndjson_lines([raw], base, form)


@router.get("/export/metadata", summary="Metadata of the instances a QIDO-RS query matches, as NDJSON")
async def export_metadata(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    """One JSON object per line (NDJSON) per instance an instance-level QIDO-RS query
    matches (``GET /instances``: its matching keys, ``limit``, ``offset``, at most the
    server's max_results, with the Warning of PS3.18 §8.3.4.4 when that cut the answer):
    the stored DICOM JSON (PS3.18 §F.2) of the instance, or with ``format=flat``
    keyword -> value (export.flat) for pandas/duckdb. ``?deidentify=PROFILE&project=NAME``
    (as the ZIP): each object de-identified as the file would be, without bulk data."""
    form = request.query_params.get("format", "dicom")
    if form not in ("dicom", "flat"):
        raise DICOMwebHTTPError(400, f"format {form!r}: 'dicom' (DICOM JSON) or 'flat' (keyword -> value)")
    transform = await run_blocking(_transform, request, archive)
    query = parse_query("instance", _qido_params(request), max_results=archive.settings.max_results)
    allowed = _allowed(request)
    hits = await run_blocking(archive.index.search, query, allowed)
    headers = {}
    if query.limited and len(hits) == query.limit:
        headers["Warning"] = warning_header("There are additional results that can be requested")
    body = iterate_in_threadpool(_metadata_lines(archive, hits, base, form, transform, allowed))
    return StreamingResponse(body, media_type=NDJSON, headers=headers)

"""The change feed: the change log (store/changes.py) read over HTTP with the routes,
parameters and entry fields of Microsoft dicom-server's change feed, so that its
consumers (its DicomWebClient, DICOM Cast, scripts polling ``offset``) work unchanged
(docs/changes.md). Not a DICOM service: PS3.18 defines no change feed.

- ``GET {prefix}/changefeed`` and ``{prefix}/v1/changefeed``: version 1. ``offset`` is
  the Sequence to read after (exclusive, default 0), ``limit`` 1-100 (default 10).
- ``GET {prefix}/v2/changefeed``: version 2. ``startTime`` (inclusive) and ``endTime``
  (exclusive) bound the Timestamp; ``offset`` is how many entries of that window to skip
  (default 0), ``limit`` 1-200 (default 100).
- ``.../changefeed/latest``: the entry with the highest Sequence (204 when the log is
  empty).
- ``includemetadata`` (default true): each entry's ``Metadata`` is the instance's DICOM
  JSON while it is current, null once deleted.

Entries come in Sequence order. Sequences are 1, 2, 3... with no gap, so without a time
window the two meanings of ``offset`` agree (the Sequence of the last entry read is
also the number of entries read). GET: the ``read`` scope (api/auth.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..access.filter import Filter
from ..dicom.instance import BASE_URL_TOKEN
from ..store.changes import Change
from .deps import ArchiveDep, BaseURL, access_of
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Change feed"])

#: (default, maximum) of ``limit`` per API version (Microsoft dicom-server's)
LIMITS = {1: (10, 100), 2: (100, 200)}


def _int(params, name: str, default: int, low: int, high: int | None = None) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise DICOMwebHTTPError(400, f"{name}: {raw!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        raise DICOMwebHTTPError(400, f"{name}: {value} is out of range ({low}-{high if high is not None else ''})")
    return value


def _bool(params, name: str, default: bool) -> bool:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise DICOMwebHTTPError(400, f"{name}: {raw!r} is not true or false")


def _time(params, name: str) -> float | None:
    """An ISO 8601 date-time (a time without offset is UTC) as seconds since the epoch."""
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        t = datetime.fromisoformat(raw.replace(" ", "+"))  # a '+' not encoded in a query arrives as a space
    except ValueError:
        raise DICOMwebHTTPError(400, f"{name}: {raw!r} is not an ISO 8601 date-time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def _params(request: Request) -> dict[str, str]:
    """Query parameters by lower-case name (ASP.NET binds them case-insensitively:
    consumers write includeMetadata, startTime, endtime)."""
    return {k.lower(): v for k, v in request.query_params.items()}


def _entries(archive, base: str, changes: list[Change], include_metadata: bool, allowed: Filter) -> list[dict]:
    out = []
    for c in changes:
        metadata = None
        if include_metadata and c.state == "current":
            found = archive.index.metadata(c.study_uid, c.series_uid, c.sop_uid, allowed)
            if found:
                metadata = orjson.Fragment(found[0].replace(BASE_URL_TOKEN.encode(), base.encode()))
        out.append(c.entry(metadata, include_metadata))
    return out


def _json(doc: object) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


async def _feed(request: Request, archive, base: str, version: int) -> Response:
    p = _params(request)
    default, most = LIMITS[version]
    limit = _int(p, "limit", default, 1, most)
    offset = _int(p, "offset", 0, 0)
    include = _bool(p, "includemetadata", True)
    if version == 1:
        after, skip, start, end = offset, 0, None, None
    else:
        after, skip, start, end = 0, offset, _time(p, "starttime"), _time(p, "endtime")
        if start is not None and end is not None and end <= start:
            raise DICOMwebHTTPError(400, "endTime must be later than startTime")

    allowed = access_of(request).filter  # the entries of the studies the reader may see (by their labels now)

    def read() -> list[dict]:
        return _entries(archive, base, archive.index.changes(after, limit, start, end, skip, allowed), include,
                        allowed)

    return _json(await run_in_threadpool(read))


async def _latest(request: Request, archive, base: str) -> Response:
    include = _bool(_params(request), "includemetadata", True)
    allowed = access_of(request).filter

    def read() -> list[dict]:
        latest = archive.index.latest_change(allowed)
        return _entries(archive, base, [latest] if latest is not None else [], include, allowed)

    found = await run_in_threadpool(read)
    return _json(found[0]) if found else Response(status_code=204)


@router.get("/changefeed", summary="Read the change feed (version 1 semantics)")
@router.get("/v1/changefeed", summary="Read the change feed (version 1)")
async def changefeed_v1(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    """Entries after Sequence ``offset``, at most ``limit`` (1-100, default 10)."""
    return await _feed(request, archive, base, 1)


@router.get("/v2/changefeed", summary="Read the change feed (version 2: time window)")
async def changefeed_v2(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    """Entries with ``startTime`` <= Timestamp < ``endTime``, ``offset`` of them skipped,
    at most ``limit`` (1-200, default 100)."""
    return await _feed(request, archive, base, 2)


@router.get("/changefeed/latest", summary="The latest change feed entry")
@router.get("/v1/changefeed/latest", summary="The latest change feed entry (version 1)")
@router.get("/v2/changefeed/latest", summary="The latest change feed entry (version 2)")
async def changefeed_latest(request: Request, archive: ArchiveDep, base: BaseURL) -> Response:
    return await _latest(request, archive, base)

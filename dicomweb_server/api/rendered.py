"""WADO-RS rendered and thumbnail resources (PS3.18 §10.4.1.1.3, §10.4.1.1.4,
§8.3.5): consumer-format pictures of images, at study, series, instance and frame
level. Negotiation here; the pixel pipeline in dicom.pixels / dicom.render."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from .. import retrieve
from ..dicom import pixels, render
from ..dicom.documents import document_media_type
from ..dicom.media_types import MULTIPART_RELATED, MediaRange, NotAcceptable, negotiate_document
from ..dicom.multipart import closing, content_type, new_boundary, part_header
from ..render_cache import RenderCache, file_version
from ..store.base import InstanceLocation
from .deps import ArchiveDep, SeriesUID, SOPInstanceUID, StudyUID, acceptable, access_of
from .errors import DICOMwebHTTPError
from .responses import multipart_response
from .threads import run_blocking
from .wado import document_response, gone_error, leave_out_missing, locate, parse_frame_list

router = APIRouter(tags=["WADO-RS rendered"])

_IMAGE_TYPES = render.RENDERED_MEDIA_TYPES


def negotiate_rendered(accept: list[MediaRange], multi: bool) -> tuple[str, bool]:
    """(media type, multipart?) for a rendered answer. ``multi``: the resource
    holds several pictures (study, series, frame list); those are only given as
    ``multipart/related; type=image/...`` (or one animated GIF for frames).

    Raises
    ------
    NotAcceptable
    """
    reason = f"rendered pictures are {', '.join(_IMAGE_TYPES)}"
    for r in accept:
        if r.type == MULTIPART_RELATED:
            t = r.params.get("type", "image/jpeg").lower()
            t = "image/jpeg" if t in ("image/*", "*/*") else t
            if t in _IMAGE_TYPES:
                return t, True
            continue
        t = "image/jpeg" if r.type in ("*/*", "image/*") else r.type
        if t not in _IMAGE_TYPES:
            continue
        if multi and r.type in ("*/*", "image/*"):
            return t, True
        if multi:
            reason = (f"this resource holds several pictures: ask for multipart/related; type=\"{t}\"")
            continue
        return t, False
    raise NotAcceptable(reason)


def _query(request: Request) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for k, v in request.query_params.multi_items():
        if k in out:
            prev = out[k]
            out[k] = (prev if isinstance(prev, list) else [prev]) + [v]
        else:
            out[k] = v
    return out


def _params(request: Request, thumbnail: bool):
    q = _query(request)
    try:
        return render.thumbnail_params(q) if thumbnail else render.RenderParams.parse(q)
    except render.InvalidRenderParameter as e:
        raise DICOMwebHTTPError(400, str(e)) from None


def _cache(request: Request) -> RenderCache:
    app = request.app
    cache = getattr(app.state, "render_cache", None)
    if cache is None:
        cache = app.state.render_cache = RenderCache(app.state.settings.render_cache_bytes)
    return cache


async def _picture(request: Request, archive, loc: InstanceLocation, frames: list[int] | None, params,
                   media_type: str, thumbnail: bool, pictures: int = 1) -> bytes:
    """One rendered picture (cached); ``pictures``: how many such pictures the answer
    holds, for the size bound (413). One hand-off to a worker thread per picture: the
    file's version, the cache look-up and the rendering all happen there."""
    try:
        return await run_blocking(_cached_picture, _cache(request), archive.blobs, loc, frames, params, media_type,
                                  thumbnail, pictures)
    except (retrieve.NotFound, FileNotFoundError) as e:  # no such frame; deleted since the look-up, or missing
        raise gone_error(archive, loc, e) from None
    except (pixels.NotAnImage, pixels.UnsupportedTransferSyntax, render.UnsupportedMediaType) as e:
        raise NotAcceptable(f"cannot render instance {loc.sop_uid}: {e}") from None
    except render.InvalidRenderParameter as e:
        raise DICOMwebHTTPError(400, str(e)) from None
    except render.RenderTooLarge as e:
        raise DICOMwebHTTPError(413, f"instance {loc.sop_uid}: {e}") from None


def _cached_picture(cache: RenderCache, blobs, loc: InstanceLocation, frames: list[int] | None, params,
                    media_type: str, thumbnail: bool, pictures: int) -> bytes:
    """In a worker thread: the cached picture, else rendered (and cached). The file's
    version is in the key (a deleted and re-stored instance is a new picture); with the
    cache off (``render_cache_bytes`` 0) there is no key and no look-up: the file is
    only opened by the rendering (a missing file: retrieve.Gone, as before)."""
    path = blobs.source(loc.path)
    key = None
    if cache.max_bytes > 0:
        key = (loc.sop_uid, file_version(path), tuple(frames) if frames else None, params, media_type, thumbnail)
        hit = cache.get(key)
        if hit is not None:
            return hit
    data = retrieve.rendered(path, loc, frames, params, media_type, thumbnail, pictures)
    if key is not None:
        cache.put(key, data)
    return data


async def _one(request: Request, archive, loc: InstanceLocation, frames: list[int] | None, thumbnail: bool) -> Response:
    multi = frames is not None and len(frames) > 1
    accept = acceptable(request)
    document = document_media_type(loc.sop_class_uid) if frames is None and not thumbnail else None
    as_document = negotiate_document(accept, document, rendered=True) if document else None
    if as_document is not None:  # an encapsulated PDF/CDA/STL/OBJ/MTL is its own rendition
        return await document_response(archive, loc, *as_document)
    media_type, as_multipart = negotiate_rendered(accept, multi)
    params = _params(request, thumbnail)
    if multi and media_type != "image/gif":
        # one part per frame, streamed; the whole answer is checked with the first picture
        n = int((loc.pixel or {}).get("number_of_frames") or 0)
        if n and max(frames) > n:  # type: ignore[arg-type]
            raise DICOMwebHTTPError(
                404, f"instance {loc.sop_uid} has {n} frame(s); no frame {retrieve.frame_name(max(frames))}")
        first = await _picture(request, archive, loc, frames[:1], params, media_type, thumbnail,
                               pictures=len(frames))  # type: ignore[index, arg-type]

        async def rest() -> AsyncIterator[bytes]:
            for k in frames[1:]:  # type: ignore[index]
                yield await _picture(request, archive, loc, [k], params, media_type, thumbnail)

        return _multipart_stream(first, rest(), media_type)
    data = await _picture(request, archive, loc, frames, params, media_type, thumbnail)
    if as_multipart:
        return multipart_response([(media_type, data)], media_type)
    return Response(data, media_type=media_type)


async def _many(request: Request, archive, locs: list[InstanceLocation], what: str, thumbnail: bool) -> Response:
    if not locs:
        raise DICOMwebHTTPError(404, f"no such {what}")
    headers: dict[str, str] = {}
    locs = await leave_out_missing(archive, locs, headers)  # named in a Warning; all missing: 500
    if not locs:
        raise DICOMwebHTTPError(404, f"no such {what}")  # deleted since the look-up
    # instances with a pixel record first; one without may still hold Float Pixel Data
    candidates = [loc for loc in locs if loc.pixel is not None] + [loc for loc in locs if loc.pixel is None]
    if thumbnail:
        # a thumbnail of a study or series is one picture: its first image that renders (documented)
        for loc in candidates:
            try:
                response = await _one(request, archive, loc, None, True)
            except NotAcceptable:
                continue
            response.headers.update(headers)
            return response
        raise NotAcceptable(f"the {what} holds no image that can be rendered")
    media_type, _ = negotiate_rendered(acceptable(request), multi=True)
    params = _params(request, thumbnail)
    pictures = _pictures(request, archive, candidates, params, media_type)
    first = await anext(pictures, None)
    if first is None:
        await pictures.aclose()
        raise NotAcceptable(f"no image of the {what} can be rendered (non-image instances are skipped)")
    return _multipart_stream(first, pictures, media_type, headers)


def _multipart_stream(first: bytes, rest: AsyncIterator[bytes], media_type: str,
                      headers: dict[str, str] | None = None) -> StreamingResponse:
    """``multipart/related; type=media_type`` of `first` and the `rest`, streamed: one
    picture in memory at a time, however many the answer holds."""
    boundary = new_boundary()

    async def body() -> AsyncIterator[bytes]:
        yield part_header(boundary, media_type)
        yield first
        async for data in rest:
            yield b"\r\n" + part_header(boundary, media_type)
            yield data
        yield closing(boundary)

    return StreamingResponse(body(), media_type=content_type(boundary, media_type), headers=headers)


async def _pictures(request: Request, archive, locs: list[InstanceLocation], params,
                    media_type: str) -> AsyncIterator[bytes]:
    for loc in locs:
        try:
            yield await _picture(request, archive, loc, None, params, media_type, False)
        except (NotAcceptable, DICOMwebHTTPError):
            continue  # non-images, undecodable, too large or deleted meanwhile: skipped


endpoints: dict[str, Callable[..., Awaitable[Response]]] = {}
"""The endpoint function of each route, by route name (``instance_rendered``,
``frames_thumbnail``...): the hot path (api/hot.py) calls the same functions."""


def _routes(suffix: str, thumbnail: bool) -> None:
    kind = "thumbnail" if thumbnail else "rendered"

    @router.get(f"/studies/{{study}}/{suffix}", summary=f"Retrieve a {kind} study", name=f"study_{kind}")
    async def study_level(request: Request, archive: ArchiveDep, study: StudyUID) -> Response:
        locs = archive.index.instances(study, None, access_of(request).filter)
        return await _many(request, archive, locs, "study", thumbnail)

    @router.get(f"/studies/{{study}}/series/{{series}}/{suffix}", summary=f"Retrieve a {kind} series",
                name=f"series_{kind}")
    async def series_level(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID) -> Response:
        locs = archive.index.instances(study, series, access_of(request).filter)
        return await _many(request, archive, locs, "series", thumbnail)

    @router.get(f"/studies/{{study}}/series/{{series}}/instances/{{instance}}/{suffix}",
                summary=f"Retrieve a {kind} instance", name=f"instance_{kind}")
    async def instance_level(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID,
                             instance: SOPInstanceUID) -> Response:
        loc = locate(archive, study, series, instance, access_of(request).filter)
        return await _one(request, archive, loc, None, thumbnail)

    @router.get(f"/studies/{{study}}/series/{{series}}/instances/{{instance}}/frames/{{frames}}/{suffix}",
                summary=f"Retrieve {kind} frames", name=f"frames_{kind}")
    async def frame_level(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID,
                          instance: SOPInstanceUID, frames: str) -> Response:
        numbers = parse_frame_list(frames)
        loc = locate(archive, study, series, instance, access_of(request).filter)
        return await _one(request, archive, loc, numbers, thumbnail)

    endpoints.update({f"study_{kind}": study_level, f"series_{kind}": series_level,
                      f"instance_{kind}": instance_level, f"frames_{kind}": frame_level})


_routes("rendered", thumbnail=False)
_routes("thumbnail", thumbnail=True)

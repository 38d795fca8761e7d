"""WADO-RS: retrieve studies, series, instances, metadata, frames and bulk data
(PS3.18 §10.4). Thin: negotiation lives in dicom.media_types, reading in
retrieve.py."""

from __future__ import annotations

import asyncio
import itertools
import mmap
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

from fastapi import APIRouter, Request
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.responses import Response, StreamingResponse

from .. import loop_read, missing_data, retrieve
from ..policy import transcode
from ..render_cache import RenderCache
from ..dicom import pixels
from ..dicom.bulkdata import bulkdata_tagpath_parse
from ..dicom.documents import ENCAPSULATED_DOCUMENT, document_media_type
from ..dicom.instance import BASE_URL_TOKEN
from ..dicom.media_types import (
    DICOM,
    OCTET_STREAM,
    Choice,
    NotAcceptable,
    negotiate_bulkdata,
    negotiate_document,
    negotiate_frames,
    negotiate_instances,
    negotiate_json,
    names_pixel_media_type,
)
from ..dicom.multipart import closing, content_type, new_boundary, part_header
from ..access.filter import Filter
from ..store.base import InstanceLocation
from .deps import ArchiveDep, BaseURL, SeriesUID, SOPInstanceUID, StudyUID, acceptable, access_of
from .errors import DICOMwebHTTPError, warning_header
from .responses import (
    DicomJSONResponse,
    FilesResponse,
    multipart_response,
    multipart_stream,
    pieces,
    requested_range,
)
from .sendfile import SENDFILE
from .threads import run_blocking

router = APIRouter(tags=["WADO-RS"])

_DEFAULT_TS_WARNING = "returned in the stored transfer syntax {ts}: it cannot be converted to Explicit VR Little Endian"


def transcoded_frames_cache(request: Request) -> RenderCache | None:
    """This worker's cache of frames transcoded to a compressed syntax (bounded by
    ``transcode_cache_bytes``; None when that is 0), made at first use."""
    app = request.app
    cache = getattr(app.state, "transcode_cache", None)
    if cache is None:
        size = app.state.settings.transcode_cache_bytes
        if not size:
            return None
        cache = app.state.transcode_cache = RenderCache(size)
    return cache


def locate(archive, study: str, series: str | None, sop: str, allowed: Filter) -> InstanceLocation:
    """The instance, of a study ``allowed`` lets through (else 404, as for none)."""
    loc = archive.index.locate(sop, allowed)
    if loc is None or loc.study_uid != study or (series is not None and loc.series_uid != series):
        raise DICOMwebHTTPError(404, f"no instance {sop} in this study/series")
    return loc


def gone_error(archive, loc: InstanceLocation, e: Exception) -> DICOMwebHTTPError:
    """The answer to a read of ``loc`` that raised ``e``: when no stored data was found
    (retrieve.Gone, FileNotFoundError) and the index still holds the row, the data is
    missing (damaged storage, missing_data.py): 500 "instance data missing" (RFC 9110
    §15.6.1: the index says the instance exists, the server cannot produce it); else
    404 (a DELETE since the look-up, no such frame or element...)."""
    if isinstance(e, (retrieve.Gone, FileNotFoundError)) and missing_data.confirm(archive.index, loc, e):
        return DICOMwebHTTPError(500, missing_data.message([loc]))
    return DICOMwebHTTPError(404, str(e))


def add_warning(headers: dict[str, str], text: str) -> None:
    """One more warning in the Warning field of ``headers`` (a list: RFC 9111 §5.5)."""
    value = warning_header(text)
    headers["Warning"] = f"{headers['Warning']}, {value}" if headers.get("Warning") else value


def account_missing(archive, locs: list[InstanceLocation], left_out: list[InstanceLocation],
                    headers: dict[str, str]) -> list[InstanceLocation]:
    """``locs`` without ``left_out`` (instances whose stored data was not found before a
    study, series or multi-instance answer started). Those the index still holds are
    missing data (missing_data.py): named in a Warning (PS3.18 §8.4.3) when others are
    sent, a 500 naming them when none is (never an empty 200); the others were deleted
    since the look-up and are left out silently."""
    if not left_out:
        return locs
    damaged = [loc for loc in left_out if missing_data.confirm(archive.index, loc, "no stored data of its size")]
    out = {id(loc) for loc in left_out}
    kept = [loc for loc in locs if id(loc) not in out]
    if damaged:
        if not kept:
            raise DICOMwebHTTPError(500, missing_data.message(damaged))
        add_warning(headers, f"{len(damaged)} instance(s) omitted: {missing_data.message(damaged)}")
    return kept


async def leave_out_missing(archive, locs: list[InstanceLocation],
                            headers: dict[str, str]) -> list[InstanceLocation]:
    """:func:`account_missing` of the instances whose stored data is not there
    (missing_data.absent), before an answer that reads them as it is sent starts; both
    in worker threads (the second, with an index look-up per instance left out, only
    when some are)."""
    left_out = await run_blocking(missing_data.absent, archive.blobs, locs)
    if not left_out:
        return locs
    return await run_blocking(account_missing, archive, locs, left_out, headers)


_NO_FRAME = retrieve.NO_FRAME  # a number of more than ten digits names no frame (retrieve.py)


def parse_frame_list(frames: str, limit: int = 10_000) -> list[int]:
    """``{frames}`` path segment: comma-separated 1-based frame numbers (PS3.18
    §10.4.1.1.2), kept in the order given. Raises 400 on anything else, checked
    before any number is converted: a number of more than ten digits (e.g. 5000) is
    not parsed but stands for a frame beyond any NumberOfFrames (404 later)."""
    items = frames.split(",")
    if len(items) > limit:
        raise DICOMwebHTTPError(400, f"at most {limit} frames per request")
    numbers = []
    for item in items:
        item = item.strip()
        if not item.isdigit() or not item.isascii():
            raise DICOMwebHTTPError(400, f"frame list: {item[:20]!r} is not a frame number")
        digits = item.lstrip("0")
        k = _NO_FRAME if len(digits) > 10 else int(digits or "0")
        if k < 1:
            raise DICOMwebHTTPError(400, "frame list: frame numbers start at 1")
        numbers.append(k)
    return numbers


# --- metadata ------------------------------------------------------------------------------


def _metadata_response(request: Request, archive, base: str, study: str, series: str | None = None,
                       sop: str | None = None) -> Response:
    negotiate_json(acceptable(request))
    items = archive.index.metadata(study, series, sop, access_of(request).filter)
    if not items:
        raise DICOMwebHTTPError(404, "no such " + ("instance" if sop else "series" if series else "study"))
    body = b"[" + b",".join(items) + b"]"
    return DicomJSONResponse(body.replace(BASE_URL_TOKEN.encode(), base.encode()))


@router.get("/studies/{study}/metadata", summary="Retrieve study metadata")
async def retrieve_study_metadata(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID) -> Response:
    """DICOM JSON of every instance of the study (PS3.18 §10.4.1.1.2), from the
    JSON computed at store time; bulk elements as BulkDataURIs."""
    return _metadata_response(request, archive, base, study)


@router.get("/studies/{study}/series/{series}/metadata", summary="Retrieve series metadata")
async def retrieve_series_metadata(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID,
                                   series: SeriesUID) -> Response:
    return _metadata_response(request, archive, base, study, series)


@router.get("/studies/{study}/series/{series}/instances/{instance}/metadata", summary="Retrieve instance metadata")
async def retrieve_instance_metadata(request: Request, archive: ArchiveDep, base: BaseURL, study: StudyUID,
                                     series: SeriesUID, instance: SOPInstanceUID) -> Response:
    return _metadata_response(request, archive, base, study, series, instance)


# --- instances -----------------------------------------------------------------------------


def _dicom_part_type(ts: str) -> str:
    return f"{DICOM}; transfer-syntax={ts}"


@router.get("/studies/{study}/series/{series}/instances/{instance}", summary="Retrieve an instance")
async def retrieve_instance(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID,
                            instance: SOPInstanceUID) -> Response:
    """One instance as ``multipart/related; type="application/dicom"`` or, when
    asked, single-part ``application/dicom`` (PS3.18 §10.4.1.1.1, §8.7.3.5).
    ``transfer-syntax=*`` returns the file as stored; 406 when the requested
    transfer syntax cannot be produced."""
    loc = locate(archive, study, series, instance, access_of(request).filter)
    choice = negotiate_instances(acceptable(request), loc.transfer_syntax_uid,
                                 retrieve.can_decode, single_part_allowed=True,
                                 can_produce=transcode.can_transcode)
    path = archive.blobs.source(loc.path)
    if not choice.transcode and loc.size > retrieve.LARGE_FILE:
        return await _stream_file(archive, path, loc, 0, loc.size, _dicom_part_type(choice.transfer_syntax),
                                  choice.multipart)
    try:
        choice, data = await _payload_or_stored(path, loc, choice, archive.blobs.loop_reads)
    except retrieve.NotFound as e:  # deleted since the look-up, or missing
        raise gone_error(archive, loc, e) from None
    except pixels.UnsupportedTransferSyntax as e:
        raise NotAcceptable(str(e)) from None
    headers = {}
    if choice.defaulted and choice.transfer_syntax != "1.2.840.10008.1.2.1":
        headers["Warning"] = warning_header(_DEFAULT_TS_WARNING.format(ts=choice.transfer_syntax))
    if not choice.multipart:
        return Response(data, media_type=_dicom_part_type(choice.transfer_syntax), headers=headers)
    return multipart_response([(_dicom_part_type(choice.transfer_syntax), data)], DICOM, headers)


async def _payload_or_stored(path, loc: InstanceLocation, choice: Choice,
                             loop_reads: bool) -> tuple[Choice, bytes | memoryview]:
    """The instance as ``choice`` says (the file as stored read on the event loop when it
    is all in memory and ``loop_reads``, loop_read.cached_file; else retrieve.instance_payload in a worker thread),
    and the choice it was sent as. When no transfer syntax was asked (``defaulted``,
    PS3.18 §8.7.3.5.2) and the stored pixels cannot be decoded (e.g. a corrupt
    codestream), the file as stored, as when no decoder exists for its syntax.

    Raises
    ------
    pixels.UnsupportedTransferSyntax
        The syntax asked for cannot be produced from this file.
    retrieve.NotFound
        Deleted since the look-up.
    """
    if not choice.transcode and loop_reads:
        data = loop_read.cached_file(path, loc)  # on the event loop when no disk read is needed
        if data is not None:
            return choice, data
    try:
        return choice, await run_blocking(retrieve.instance_payload, path, loc, choice)
    except pixels.UnsupportedTransferSyntax:
        if not choice.defaulted:
            raise
    choice = replace(choice, transfer_syntax=loc.transfer_syntax_uid, transcode=False)
    return choice, await run_blocking(retrieve.instance_payload, path, loc, choice)


async def _stream_file(archive, path, loc: InstanceLocation, offset: int, length: int, part_ctype: str,
                       multipart: bool, byte_range: tuple[int, int] | None = None) -> Response:
    """``length`` bytes of a file from ``offset``, streamed from disk in bounded pieces
    (retrieve.CHUNK), single part or as the one part of a multipart/related body.
    ``byte_range``: (first, last) of those bytes only, a 206 (RFC 9110 §15.3.7) whose
    Content-Range names them: the body, or the contents of its one part."""
    status, headers = 200, {}
    if byte_range is not None:
        first, last = byte_range
        status, headers = 206, {"Content-Range": f"bytes {first}-{last}/{length}"}
        offset, length = offset + first, last - first + 1
    try:
        chunks = iterate_in_threadpool(await run_in_threadpool(retrieve.file_chunks, path, loc, offset, length))
    except retrieve.NotFound as e:  # deleted since the look-up, or missing
        raise gone_error(archive, loc, e) from None
    if not multipart:
        return StreamingResponse(chunks, status, media_type=part_ctype,
                                 headers={**headers, "Content-Length": str(length)})
    boundary = new_boundary()
    head, tail = part_header(boundary, part_ctype), closing(boundary)

    async def body() -> AsyncIterator[bytes]:
        yield head
        async for chunk in chunks:
            yield chunk
        yield tail

    return StreamingResponse(body(), status, media_type=content_type(boundary, part_ctype.split(";")[0]),
                             headers={**headers, "Content-Length": str(len(head) + length + len(tail))})


async def _stream_instances(archive, locs: list[InstanceLocation], accept, boundary: str) -> AsyncIterator[bytes]:
    first = True
    for loc in locs:
        try:
            choice = negotiate_instances(accept, loc.transfer_syntax_uid, retrieve.can_decode, single_part_allowed=False,
                                         can_produce=transcode.can_transcode)
            path = archive.blobs.source(loc.path)
            large = not choice.transcode and loc.size > retrieve.LARGE_FILE
            if large:  # opened before its part starts; read in bounded pieces as the client reads
                chunks = await run_in_threadpool(retrieve.file_chunks, path, loc)
            else:
                choice, data = await _payload_or_stored(path, loc, choice, archive.blobs.loop_reads)
        except (NotAcceptable, pixels.UnsupportedTransferSyntax, retrieve.NotFound) as e:
            # refused before the answer started (its Warning), a syntax asked for that this
            # file's pixels cannot give, or deleted (or found missing) meanwhile: left out
            if isinstance(e, retrieve.Gone):
                missing_data.confirm(archive.index, loc, e)  # logged and counted (the answer has started)
            continue
        yield (b"" if first else b"\r\n") + part_header(boundary, _dicom_part_type(choice.transfer_syntax))
        if large:
            async for chunk in iterate_in_threadpool(chunks):
                yield chunk
        else:
            for piece in pieces(data):
                yield piece
        first = False
    yield closing(boundary)


async def _retrieve_many(request: Request, archive, locs: list[InstanceLocation], what: str) -> Response:
    if not locs:
        raise DICOMwebHTTPError(404, f"no such {what}")
    accept = acceptable(request)
    # one negotiation per transfer syntax (a study has one or a few), not per instance
    choices: dict[str, Choice | NotAcceptable] = {}
    for ts in {loc.transfer_syntax_uid for loc in locs}:
        try:
            choices[ts] = negotiate_instances(accept, ts, retrieve.can_decode, single_part_allowed=False,
                                              can_produce=transcode.can_transcode)
        except NotAcceptable as e:
            choices[ts] = e
    refused = [loc for loc in locs if isinstance(choices[loc.transfer_syntax_uid], NotAcceptable)]
    reason = str(choices[refused[-1].transfer_syntax_uid]) if refused else ""
    if len(refused) == len(locs):
        raise NotAcceptable(reason)
    headers = {}
    if refused:
        headers["Warning"] = warning_header(f"{len(refused)} instance(s) omitted: {reason}")
    boundary = new_boundary()
    if refused:
        locs = [loc for loc in locs if not isinstance(choices[loc.transfer_syntax_uid], NotAcceptable)]
    if archive.blobs.local_files and not refused and len(locs) <= retrieve.MAX_OPEN_FILES and all(
            not choice.transcode for choice in choices.values()):
        if SENDFILE in request.scope.get("extensions", ()):
            opened = await _sendfile_response(archive, locs, boundary, headers)
        else:
            opened = await _opened_files_response(archive, locs, boundary, headers)
        if opened is not None:
            return opened
    locs = await leave_out_missing(archive, locs, headers)  # before the answer starts (its Warning)
    if not locs:
        raise DICOMwebHTTPError(404, f"no such {what}")  # deleted since the look-up
    return StreamingResponse(_stream_instances(archive, locs, accept, boundary),
                             media_type=content_type(boundary, DICOM), headers=headers)


class _Opened:
    """The maps of an answer's files (retrieve.map_files), handed out in batches as
    the client reads; a map is dropped here once its last view is handed out (it is
    then freed when the transport has written that view), the rest when the body ends
    or the answer is dropped unsent."""

    def __init__(self, files: list[tuple[bytes, mmap.mmap | None, int]]) -> None:
        self.files = files  # (part header, map, size); each map counted in retrieve.DESCRIPTORS until freed
        self.at = (0, 0)  # (file, offset) of the next batch

    def close_rest(self) -> None:
        i = self.at[0]
        for k in range(i, len(self.files)):
            head, m, size = self.files[k]
            if m is not None and (k > i or self.at[1] == 0):
                m.close()  # no view handed out: unmapped (and its descriptor closed) now
            self.files[k] = (head, None, size)
        self.at = (len(self.files), 0)

    def __del__(self) -> None:
        self.close_rest()

    def next_batch(self) -> list[tuple[int, int, int, mmap.mmap | None]]:
        """The next (file, start, end, map) spans, in order: whole files while they fit
        in READ_BATCH bytes, or READ_BATCH bytes of a larger file (so an answer holds at
        most two batches of populated pages whatever its files' sizes); [] at the end."""
        i, off = self.at
        spans: list[tuple[int, int, int, mmap.mmap | None]] = []
        total = 0
        while i < len(self.files):
            head, m, size = self.files[i]
            if spans and total + size - off > retrieve.READ_BATCH:
                break  # the next batch (whole files in one batch: one send each, see _send_opened)
            end = min(size, off + retrieve.READ_BATCH)
            spans.append((i, off, end, m))
            total += end - off
            if end >= size:
                self.files[i] = (head, None, size)  # the views hold the map from here on
                i, off = i + 1, 0
            else:
                off = end
        self.at = (i, off)
        return spans


def _give_back_with(m: mmap.mmap) -> None:
    """One descriptor of retrieve.DESCRIPTORS given back when ``m`` is freed (its
    duplicate descriptor closed: retrieve.map_files)."""
    weakref.finalize(m, retrieve.DESCRIPTORS.give, 1)


async def _open_within_budget(archive, locs: list[InstanceLocation], opener) -> list | None:
    """``opener`` (retrieve.open_files or map_files) on the files of ``locs`` in a
    worker thread, with one descriptor each taken from retrieve.DESCRIPTORS first (the
    caller gives back those of files left out); None when the budget cannot hold them
    now, 503 with Retry-After when the process is out of descriptors altogether."""
    if not retrieve.DESCRIPTORS.take(len(locs)):
        return None
    try:
        resolve = archive.blobs.resolve_str
        return await run_blocking(opener, [(resolve(loc.path), loc) for loc in locs])
    except BaseException as e:
        retrieve.DESCRIPTORS.give(len(locs))
        if isinstance(e, retrieve.OutOfDescriptors):
            raise DICOMwebHTTPError(503, str(e), {"Retry-After": "5"}) from None
        raise


def _account_opened(archive, locs: list[InstanceLocation], opened: list[InstanceLocation],
                    headers: dict[str, str]) -> None:
    """:func:`account_missing` of the files that could not be opened (nothing opened when
    it raises, so nothing to close)."""
    sent = {id(loc) for loc in opened}
    kept = account_missing(archive, locs, [loc for loc in locs if id(loc) not in sent], headers)
    if not kept:
        raise DICOMwebHTTPError(404, "no such instances (deleted since the look-up)")


async def _sendfile_response(archive, locs: list[InstanceLocation], boundary: str,
                             headers: dict[str, str]) -> Response | None:
    """Every file as stored, opened before the answer starts (one thread hop) and
    sent by the kernel (api/sendfile.py), with a Content-Length; instances deleted
    before they were opened are left out. None, or 503, as _opened_files_response."""
    opened = await _open_within_budget(archive, locs, retrieve.open_files)
    if opened is None:
        return None
    retrieve.DESCRIPTORS.give(len(locs) - len(opened))  # left out: gone since the look-up, or missing
    _account_opened(archive, locs, [loc for loc, _ in opened], headers)
    body: list = []
    for i, (loc, fd) in enumerate(opened):
        body.append((b"\r\n" if i else b"") + part_header(boundary, _dicom_part_type(loc.transfer_syntax_uid)))
        body.append((fd, 0, loc.size))
    body.append(closing(boundary))
    return FilesResponse(body, content_type(boundary, DICOM), headers, retrieve.DESCRIPTORS.give)


async def _opened_files_response(archive, locs: list[InstanceLocation], boundary: str,
                                 headers: dict[str, str]) -> Response | None:
    """Every file as stored, opened and mapped before the answer starts (one thread
    hop), sent with a Content-Length; instances deleted before they were opened are
    left out. None when the process's descriptor budget (retrieve.DESCRIPTORS) cannot
    hold them now: the caller streams file by file. 503 (Retry-After) when the process
    is out of descriptors altogether."""
    opened = await _open_within_budget(archive, locs, retrieve.map_files)
    if opened is None:
        return None
    mapped = [m for _, m in opened if m is not None]
    for m in mapped:
        _give_back_with(m)
    retrieve.DESCRIPTORS.give(len(locs) - len(mapped))  # left out (gone since the look-up, or missing), or empty
    _account_opened(archive, locs, [loc for loc, _ in opened], headers)
    files = []
    for i, (loc, m) in enumerate(opened):
        head = (b"\r\n" if i else b"") + part_header(boundary, _dicom_part_type(loc.transfer_syntax_uid))
        files.append((head, m, loc.size))
    state = _Opened(files)
    tail = closing(boundary)
    headers["Content-Length"] = str(sum(len(h) + n for h, _, n in files) + len(tail))
    return StreamingResponse(_send_opened(state, tail), media_type=content_type(boundary, DICOM), headers=headers)


async def _send_opened(state: _Opened, tail: bytes) -> AsyncIterator[bytes | memoryview]:
    """The parts of mapped files, about READ_BATCH bytes read in (retrieve.populate) per
    thread hop; the next batch is read while this one is sent (so at most two batches
    are held), each sent as views of its map in pieces of at most retrieve.SEND_PIECE
    (a 512x512 CT file in one send: every piece is one ASGI send through the middleware
    and one transport.write, the largest share of a py-spy --gil profile of a study
    retrieve)."""
    def start_next() -> tuple[list, asyncio.Future] | None:
        spans = state.next_batch()
        if not spans:
            return None
        todo = [(m, a, b) for _, a, b, m in spans if m is not None]
        return spans, asyncio.ensure_future(run_blocking(retrieve.populate, todo))

    pending = start_next()
    try:
        while pending is not None:
            spans, future = pending
            await future
            pending = start_next()
            for i, start, end, m in spans:
                if start == 0:
                    yield state.files[i][0]
                if m is None:
                    continue
                view = memoryview(m)
                for at in range(start, end, retrieve.SEND_PIECE):
                    yield view[at : min(end, at + retrieve.SEND_PIECE)]
                del view
            del spans
        yield tail
    finally:
        if pending is not None:  # the answer ended early: the read finishes on its own
            pending[1].add_done_callback(lambda f: f.cancelled() or f.exception())
        state.close_rest()


@router.get("/studies/{study}", summary="Retrieve a study")
async def retrieve_study(request: Request, archive: ArchiveDep, study: StudyUID) -> Response:
    """Every instance of the study, streamed one file at a time as
    ``multipart/related; type="application/dicom"`` (PS3.18 §10.4.1.1.1).
    Single-part ``application/dicom`` is 406 for more than one instance."""
    return await _retrieve_many(request, archive, archive.index.instances(study, None, access_of(request).filter),
                                "study")


@router.get("/studies/{study}/series/{series}", summary="Retrieve a series")
async def retrieve_series(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID) -> Response:
    return await _retrieve_many(request, archive, archive.index.instances(study, series, access_of(request).filter),
                                "series")


# --- frames and bulk data ------------------------------------------------------------------


def _byte_range(request: Request, size: int) -> tuple[int, int] | None:
    """The one byte range the request asks of a ``size``-byte value (RFC 9110 §14.2,
    api.responses.requested_range), or None: the whole value, 200.

    Raises
    ------
    DICOMwebHTTPError
        416 with ``Content-Range: bytes */size`` for an unsatisfiable range (§15.5.17).
    """
    try:
        return requested_range(request.headers, size)
    except ValueError as e:
        raise DICOMwebHTTPError(416, str(e), {"Content-Range": f"bytes */{size}"}) from None


def _frame_marks(parts: Iterator[tuple[str, bytes]]) -> Iterator[bytes | None]:
    """Whole parts as :func:`multipart_stream` items (``None`` where a part starts)."""
    for _ctype, data in parts:
        yield None
        yield data


async def _first_parts(parts: Iterator[tuple[str, bytes]], k: int) -> tuple[list[tuple[str, bytes]], bool]:
    """The first ``k`` parts (read in a worker thread, so errors surface before the
    answer starts) and whether more follow."""
    def take() -> tuple[list[tuple[str, bytes]], bool]:
        head = list(itertools.islice(parts, k))
        return head, len(head) == k
    return await run_in_threadpool(take)


@router.get("/studies/{study}/series/{series}/instances/{instance}/frames/{frames}", summary="Retrieve frames")
async def retrieve_instance_frames(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID,
                                   instance: SOPInstanceUID, frames: str) -> Response:
    """Frames (1-based list, order kept, repeats allowed) as ``multipart/related``
    with ``application/octet-stream`` native pixels (compressed sources decoded) or
    the stored codestream in its media type (PS3.18 §10.4.1.1.2, Table 8.7.3-5),
    streamed one frame at a time. 400 bad list or more items than the instance has
    frames, 404 no such frame or no pixel data, 406 unproducible type."""
    numbers = parse_frame_list(frames)
    loc = locate(archive, study, series, instance, access_of(request).filter)
    if loc.pixel is None:
        raise DICOMwebHTTPError(404, f"instance {instance} has no pixel data (SOP Class {loc.sop_class_uid})")
    n = int(loc.pixel.get("number_of_frames") or 1)
    if max(numbers) > n:
        raise DICOMwebHTTPError(
            404, f"instance {instance} has {n} frame(s); no frame {retrieve.frame_name(max(numbers))}")
    if len(numbers) > n:  # bounds the answer by the size of all frames, before any work
        raise DICOMwebHTTPError(400, f"the frame list has {len(numbers)} items; instance {instance} has {n} "
                                     f"frame(s), so at most {n} items may be asked in one request")
    choice = negotiate_frames(acceptable(request), loc.transfer_syntax_uid,
                              retrieve.can_decode, transcode.can_transcode)
    return await _frames_response(request, archive, archive.blobs.source(loc.path), loc, numbers, choice)


async def _frames_response(request: Request, archive, path, loc: InstanceLocation, numbers: list[int],
                           choice: Choice) -> Response:
    """Frames ``numbers`` as ``choice`` says, one part each, produced as the client reads."""
    try:
        frames = await run_blocking(retrieve.frames_payload, path, loc, numbers, choice,
                                    transcoded_frames_cache(request))
    except retrieve.NotFound as e:
        raise gone_error(archive, loc, e) from None
    except pixels.UnsupportedTransferSyntax as e:
        raise NotAcceptable(str(e)) from None
    return multipart_stream(retrieve.frame_part_type(choice), frames, choice.media_type)


async def _transcoded_pixel_data(request: Request, archive, path, loc: InstanceLocation, accept) -> Response | None:
    """Pixel data bulk data asked in a compressed media type it is not stored in
    (PS3.18 §8.7.3.3.2, Table 8.7.3-5): every frame transcoded, one part each, as
    the frames resource does; None when that is not what the client asked for (the
    stored representation, or nothing producible: the bulk data negotiation decides)."""
    try:
        choice = negotiate_frames(accept, loc.transfer_syntax_uid, retrieve.can_decode, transcode.can_transcode)
    except NotAcceptable:
        return None
    if not (choice.transcode and choice.media_type != OCTET_STREAM):
        return None
    numbers = list(range(1, int((loc.pixel or {}).get("number_of_frames") or 1) + 1))
    return await _frames_response(request, archive, path, loc, numbers, choice)


async def document_response(archive, loc: InstanceLocation, media_type: str, multipart: bool) -> Response:
    """An encapsulated document (dicom.documents), single part or the one part of a
    multipart/related answer, in its own media type."""
    try:
        data = await run_in_threadpool(retrieve.document, archive.blobs.source(loc.path), loc)
    except retrieve.NotFound as e:
        raise DICOMwebHTTPError(404, str(e)) from None
    if multipart:
        return multipart_response([(media_type, data)], media_type)
    return Response(data, media_type=media_type)


@router.get("/studies/{study}/series/{series}/instances/{instance}/bulkdata/{tagpath:path}",
            summary="Retrieve bulk data")
async def retrieve_bulkdata(request: Request, archive: ArchiveDep, study: StudyUID, series: SeriesUID,
                            instance: SOPInstanceUID, tagpath: str) -> Response:
    """The value behind a BulkDataURI handed out in metadata (PS3.18 §10.4.1.1.5),
    as ``multipart/related; type="application/octet-stream"`` (one part), or
    single-part ``application/octet-stream`` when that alone is accepted.
    Encapsulated Pixel Data: one part per frame in its compressed media type,
    streamed one frame at a time. The Accept header is checked before any read."""
    try:
        bulkdata_tagpath_parse(tagpath)
    except ValueError as e:
        raise DICOMwebHTTPError(400, f"bulk data path {tagpath!r}: {e}") from None
    loc = locate(archive, study, series, instance, access_of(request).filter)
    accept = acceptable(request)
    document = document_media_type(loc.sop_class_uid) if tagpath.upper() == ENCAPSULATED_DOCUMENT else None
    as_document = negotiate_document(accept, document, rendered=False) if document else None
    if as_document is not None:  # the document in its own media type (PS3.18 Table 8.7.4-1)
        return await document_response(archive, loc, *as_document)
    path = archive.blobs.source(loc.path)
    if tagpath.upper() == retrieve.pixel_tag(loc) and loc.pixel is not None and names_pixel_media_type(accept):
        transcoded = await _transcoded_pixel_data(request, archive, path, loc, accept)
        if transcoded is not None:
            return transcoded
    prefer_single = negotiate_bulkdata(accept)
    span = retrieve.large_native_pixel_data(loc) if tagpath.upper() == retrieve.pixel_tag(loc) else None
    if span is not None:
        return await _stream_file(archive, path, loc, span[0], span[1],
                                  f"{OCTET_STREAM}; transfer-syntax={loc.transfer_syntax_uid}",
                                  multipart=not prefer_single, byte_range=_byte_range(request, span[1]))
    try:
        gen = await run_in_threadpool(retrieve.bulkdata, path, loc, tagpath)
        parts, more = await _first_parts(gen, 2)
    except retrieve.NotFound as e:
        raise gone_error(archive, loc, e) from None
    if more:
        # one label for every part (frames of one instance), produced one at a time in a worker thread
        return multipart_stream(parts[0][0], _frame_marks(itertools.chain(parts, gen)), parts[0][0].split(";")[0])
    status, headers = 200, {}
    if len(parts) == 1:
        # RFC 9110 §14: one byte range of a single value (the PyPI client's byte_range)
        ctype, data = parts[0]
        byte_span = _byte_range(request, len(data))
        if byte_span is not None:
            start, end = byte_span
            parts = [(ctype, data[start : end + 1])]
            status, headers = 206, {"Content-Range": f"bytes {start}-{end}/{len(data)}"}
    if prefer_single and len(parts) == 1:
        return Response(parts[0][1], status_code=status, media_type=OCTET_STREAM, headers=headers)
    part_type = parts[0][0].split(";")[0] if parts else OCTET_STREAM
    response = multipart_response(parts, part_type, headers)
    response.status_code = status
    return response

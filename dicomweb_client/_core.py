"""Request descriptions and response parsing shared by the sync and async clients.

Nothing in this module does I/O. A transaction is described as either

* a *plan*: a generator that yields :class:`RequestSpec` objects, receives
  each (fully read) ``httpx.Response`` back, and finally returns the parsed
  value (``StopIteration.value``). Searches with ``get_remaining`` send several
  requests this way; most plans send one. Or
* a :class:`StreamSpec`: one request whose ``multipart/related`` answer is
  decoded part by part, each part turned into a value by ``convert``.

The sync client (:mod:`dicomweb_client.client`) and the async client
(:mod:`dicomweb_client.aio`) each implement only three small drivers --
``_run(plan)``, ``_stream(spec)`` and ``_collect(spec)`` -- that send requests
(with retries) and feed bytes to the functions below. So every request is
built once and every answer is parsed once, for both clients.
"""
from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterable, AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping

import httpx
import orjson

from .errors import NetworkError, RequestTimeout, ResponseError, StoreError, error_for_status
from .media_type import parse_media_type
from .multipart import Part, aiter_parts, iter_parts
from .results import parse_store_response
from .stow import StowBody

logger = logging.getLogger("dicomweb_client")

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})

ACCEPT_DICOM_JSON = "application/dicom+json, application/json"


@dataclass(frozen=True)
class RequestSpec:
    """Everything needed to send one HTTP request.

    Attributes
    ----------
    method : str
        ``GET``, ``POST`` or ``DELETE``.
    url : str
        Absolute URL.
    params : tuple of (str, str)
        Query parameters (repeats allowed).
    headers : Mapping[str, str]
        Request headers (merged over the client's).
    body : StowBody or bytes or None
        Request body; a :class:`StowBody` is streamed.
    raise_for_status : bool
        If true the driver raises :class:`~dicomweb_client.errors.HTTPError`
        for 4xx/5xx; if false the plan gets the error answer to interpret.
    fallback : RequestSpec or None
        Sent instead after a 400/406 answer (a default Accept the server
        refused, see :mod:`dicomweb_client.negotiation`).
    negotiation : str or None
        Kind of resource whose default Accept this request carries.
    """

    method: str
    url: str
    params: tuple[tuple[str, str], ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    body: StowBody | bytes | None = None
    raise_for_status: bool = True
    fallback: "RequestSpec | None" = None
    negotiation: str | None = None

    @property
    def idempotent(self) -> bool:
        """Whether the request may be retried safely (RFC 9110 9.2.2)."""
        return self.method.upper() in IDEMPOTENT_METHODS


@dataclass(frozen=True)
class StreamSpec:
    """A request whose (multipart) answer is consumed part by part.

    Attributes
    ----------
    request : RequestSpec
        The request (always a GET).
    convert : callable
        ``Part -> value`` applied to each decoded part.
    what : str
        Description for error messages (``"instance"``, ``"frame"``).
    offload : bool
        ``convert`` is CPU-heavy (DICOM parsing): the async client runs it
        in a worker thread so the event loop is not blocked.
    byte_range : (int, int or None) or None
        First and last byte the request's Range header asks for (see
        :func:`range_of_whole`).
    """

    request: RequestSpec
    convert: Callable[[Part], Any]
    what: str = "part"
    offload: bool = False
    byte_range: tuple[int, int | None] | None = None


Plan = Generator[RequestSpec, Any, Any]


# --------------------------------------------------------------------------
# Response parsing (pure)
# --------------------------------------------------------------------------
def raise_for_response(response: Any, request: RequestSpec) -> None:
    """Raise the :mod:`~dicomweb_client.errors` exception for an error answer (status >= 400).

    ``response`` is a read ``httpx.Response`` (or anything with
    ``status_code``, ``headers``, ``content``, ``reason_phrase``).
    """
    if response.status_code < 400:
        return
    raise error_for_status(
        response.status_code,
        body=response.content,
        headers=dict(response.headers),
        method=request.method,
        url=request.url,
        reason=getattr(response, "reason_phrase", "") or "",
    )


def log_warnings(response: Any) -> list[str]:
    """Return (and log) the ``Warning`` headers of an answer (e.g. truncated QIDO results, PS3.18 Section 8).

    Logged on the ``dicomweb_client`` logger, which has a ``NullHandler``:
    nothing is printed unless the application configures logging.
    """
    values = response.headers.get_list("warning") if hasattr(response.headers, "get_list") else (
        [response.headers["warning"]] if "warning" in response.headers else []
    )
    for v in values:
        logger.warning("DICOMweb server warning: %s", v)
    return values


def parse_dicom_json(response: Any) -> list[dict]:
    """Parse a DICOM JSON answer (PS3.18 Annex F) into a list of data sets.

    Parameters
    ----------
    response : httpx.Response
        A read answer. 204 and an empty body mean no results (older servers).

    Returns
    -------
    list of dict
        Data sets keyed by 8-hex-digit tags. A single object is wrapped in a list.

    Raises
    ------
    ResponseError
        The body is not JSON, or not an array of objects.
    """
    content = response.content
    if response.status_code == 204 or not content or not content.strip():
        return []
    try:
        doc = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        ct = response.headers.get("content-type", "")
        raise ResponseError(f"answer is not valid DICOM JSON (Content-Type {ct!r}): {exc}") from exc
    if isinstance(doc, dict):
        return [doc]
    if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
        raise ResponseError("DICOM JSON answer must be an array of objects")
    return doc


def _cut(part: Part, byte_range: tuple[int, int | None]) -> Part:
    start, end = byte_range
    return Part(part.headers, part.content[start : None if end is None else end + 1])


def range_of_whole(parts: Iterable[Part], byte_range: tuple[int, int | None]) -> Iterator[Part]:
    """The parts of a 200 answer to a request with a Range header. A server may ignore
    Range and send the whole representation with 200 (RFC 9110 Section 14.2): when the
    answer holds one value (one part), the range asked is cut from it here, so the
    caller gets the same bytes as from a 206; several parts (frames) are returned whole."""
    it = iter(parts)
    first = next(it, None)
    if first is None:
        return
    second = next(it, None)
    if second is None:
        yield _cut(first, byte_range)
        return
    yield first
    yield second
    yield from it


async def arange_of_whole(parts: AsyncIterator[Part], byte_range: tuple[int, int | None]) -> AsyncIterator[Part]:
    """Async twin of :func:`range_of_whole`."""
    first = await anext(parts, None)
    if first is None:
        return
    second = await anext(parts, None)
    if second is None:
        yield _cut(first, byte_range)
        return
    yield first
    yield second
    async for part in parts:
        yield part


def part_content(part: Part) -> bytes:
    """The bytes of a part."""
    return part.content


def part_to_dataset(part: Part):
    """Read a PS3.10 part (``application/dicom``) as a ``pydicom.Dataset``.

    Raises
    ------
    ResponseError
        The part is not a DICOM file.
    """
    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    mt = part.media_type
    if mt and mt not in ("application/dicom", "application/octet-stream"):
        raise ResponseError(f"expected an application/dicom part, got {part.content_type!r}")
    try:
        return dcmread(io.BytesIO(part.content))
    except InvalidDicomError:
        try:
            return dcmread(io.BytesIO(part.content), force=True)
        except Exception as exc:  # pragma: no cover - pydicom raises many kinds
            raise ResponseError(f"part is not a DICOM file: {exc}") from exc
    except Exception as exc:
        raise ResponseError(f"part is not a readable DICOM file: {exc}") from exc


def _single_part(response_headers: Mapping[str, str], content: bytes) -> Part:
    headers = {}
    for name in ("content-type", "content-location", "content-id", "content-length"):
        if name in response_headers:
            headers[name] = response_headers[name]
    return Part(headers, content)


def _boundary(content_type: str) -> str | None:
    media, params = parse_media_type(content_type)
    if media.startswith("multipart/"):
        b = params.get("boundary")
        if not b:
            raise ResponseError(f"multipart answer without boundary: {content_type!r}")
        return b
    return None


def iter_response_parts(response_headers: Mapping[str, str], chunks: Iterable[bytes]) -> Iterator[Part]:
    """Decode an answer body into parts: multipart answers part by part,
    any other media type as one part (servers that answer a single instance
    as ``application/dicom`` or a single frame as ``image/jpeg``).
    """
    boundary = _boundary(response_headers.get("content-type", ""))
    if boundary is None:
        yield _single_part(response_headers, b"".join(chunks))
        return
    yield from iter_parts(chunks, boundary)


async def aiter_response_parts(
    response_headers: Mapping[str, str], chunks: AsyncIterable[bytes]
) -> AsyncIterator[Part]:
    """Async twin of :func:`iter_response_parts`."""
    boundary = _boundary(response_headers.get("content-type", ""))
    if boundary is None:
        yield _single_part(response_headers, b"".join([c async for c in chunks]))
        return
    async for part in aiter_parts(chunks, boundary):
        yield part


def exactly_one(items: list, what: str) -> Any:
    """The only item of ``items``; ResponseError if there are none or several."""
    if len(items) != 1:
        raise ResponseError(f"expected exactly one {what} in the answer, got {len(items)}")
    return items[0]


def parse_rendered(response: Any) -> bytes | list[bytes]:
    """Body of a rendered/thumbnail answer: bytes, or a list of bytes if the
    server answered ``multipart/related`` with several parts."""
    parts = list(iter_response_parts(response.headers, [response.content]))
    if len(parts) == 1:
        return parts[0].content
    return [p.content for p in parts]


# --------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------
def json_plan(spec: RequestSpec, *, single: bool = False) -> Plan:
    """GET DICOM JSON; return the list (or its only item when ``single``)."""
    response = yield spec
    log_warnings(response)
    docs = parse_dicom_json(response)
    if single:
        return exactly_one(docs, "metadata data set")
    return docs


def search_plan(
    url: str,
    params_for: Callable[[int | None], list[tuple[str, str]]],
    *,
    offset: int | None,
    limit: int | None,
    get_remaining: bool,
) -> Plan:
    """QIDO-RS search, optionally following pages (PS3.18 8.3.4 limit and offset).

    With ``get_remaining`` the search is repeated with a growing ``offset``
    until a page is empty, or shorter than ``limit`` without a ``Warning``
    that more results remain.
    """
    headers = {"Accept": ACCEPT_DICOM_JSON}
    if not get_remaining:
        response = yield RequestSpec("GET", url, tuple(params_for(offset)), headers)
        log_warnings(response)
        return parse_dicom_json(response)
    results: list[dict] = []
    current = offset or 0
    previous_first: dict | None = None
    while True:
        response = yield RequestSpec("GET", url, tuple(params_for(current)), headers)
        warnings = log_warnings(response)
        page = parse_dicom_json(response)
        if not page:
            break
        if previous_first is not None and page[0] == previous_first and current > 0:
            logger.warning("server ignored offset=%d; stopping get_remaining", current)
            break
        previous_first = page[0]
        results.extend(page)
        current += len(page)
        if limit is not None and len(page) < limit and not warnings:
            break
    return results


def rendered_plan(spec: RequestSpec) -> Plan:
    """GET a rendered/thumbnail resource; see :func:`parse_rendered`."""
    response = yield spec
    return parse_rendered(response)


def delete_plan(spec: RequestSpec) -> Plan:
    """DELETE a resource; returns None."""
    response = yield spec
    log_warnings(response)
    return None


def store_plan(spec: RequestSpec) -> Plan:
    """STOW-RS: POST the body, return a :class:`StoreResult`.

    Raises
    ------
    StoreError
        409, or any error answer that carries a Store Instances Response.
    HTTPError
        Other error answers (400, 413, 415, 5xx ...).
    """
    response = yield spec
    warnings = log_warnings(response)
    doc: Any = None
    if response.content and response.content.strip():
        try:
            doc = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            doc = None
            if response.status_code < 400:
                raise ResponseError("Store Instances Response is not DICOM JSON")
    result = parse_store_response(response.status_code, doc, warnings)
    if response.status_code < 400:
        for f in result.failed:
            logger.warning("instance %s not stored: %s", f.sop_instance_uid, f.reason)
        return result
    if response.status_code == 409 or result.failed or result.referenced:
        base = error_for_status(
            response.status_code,
            body=response.content,
            headers=dict(response.headers),
            method=spec.method,
            url=spec.url,
            reason=getattr(response, "reason_phrase", "") or "",
        )
        message = base.message
        if result.failed:
            reasons = sorted({f.reason for f in result.failed})
            message = f"{len(result.failed)} instance(s) failed: {'; '.join(reasons)}"
        # the server's Warning belongs to the exception (a library does not print)
        extra = [w for w in warnings if w not in message]
        if extra:
            message += "; server warning: " + "; ".join(extra)
        raise StoreError(
            response.status_code,
            message,
            result=result,
            body=response.content,
            method=spec.method,
            url=spec.url,
            headers=dict(response.headers),
        )
    raise_for_response(response, spec)
    return result  # pragma: no cover - raise_for_response always raises here


# --------------------------------------------------------------------------
# Retries, auth and transport errors (policy only; the drivers sleep and send)
# --------------------------------------------------------------------------
#: Transport failures after which an idempotent request is sent again.
RETRYABLE_EXCEPTIONS: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.PoolTimeout,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
)


@dataclass
class RetryPolicy:
    """When and how long to wait before sending an idempotent request again.

    Attributes
    ----------
    retries : int
        Extra attempts after the first (0 disables retrying).
    backoff_factor : float
        Delay before retry *n* (0-based) is ``backoff_factor * 2**n`` seconds.
    max_backoff : float
        Upper bound of one delay, also for a server's ``Retry-After``.
    statuses : frozenset of int
        Answers that are retried (default: 503 Service Unavailable).
    """

    retries: int = 2
    backoff_factor: float = 0.5
    max_backoff: float = 30.0
    statuses: frozenset = frozenset({503})

    def should_retry_status(self, spec: RequestSpec, status_code: int, attempt: int) -> bool:
        return spec.idempotent and attempt < self.retries and status_code in self.statuses

    def should_retry_exception(self, spec: RequestSpec, exc: Exception, attempt: int) -> bool:
        return spec.idempotent and attempt < self.retries and isinstance(exc, RETRYABLE_EXCEPTIONS)

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.max_backoff)
            except ValueError:
                pass  # an HTTP-date: fall back to exponential backoff
        return min(self.backoff_factor * (2**attempt), self.max_backoff)


class BearerAuth(httpx.Auth):
    """``Authorization: Bearer <token>`` on every request."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty bearer token")
        self.token = token

    def auth_flow(self, request: httpx.Request):
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


def wrap_transport_error(exc: Exception, spec: RequestSpec) -> NetworkError:
    """Turn an ``httpx`` transport failure into a :class:`NetworkError` / :class:`RequestTimeout`."""
    cls = RequestTimeout if isinstance(exc, httpx.TimeoutException) else NetworkError
    detail = str(exc) or type(exc).__name__
    return cls(f"{spec.method} {spec.url} failed: {detail}", method=spec.method, url=spec.url)


def merge_headers(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """Client headers overridden by request headers (case-insensitive)."""
    out = {k: v for k, v in base.items() if k.lower() not in {e.lower() for e in extra}}
    out.update(extra)
    return out

"""Exceptions raised by the DICOMweb client.

The hierarchy is small and maps one-to-one onto what can go wrong::

    DICOMwebError
    ├── HTTPError                 the origin server answered with a 4xx/5xx status
    │   ├── ClientError           4xx
    │   │   ├── BadRequest              400
    │   │   ├── Unauthorized            401
    │   │   ├── Forbidden               403
    │   │   ├── NotFound                404
    │   │   ├── MethodNotAllowed        405
    │   │   ├── NotAcceptable           406
    │   │   ├── Conflict                409
    │   │   ├── Gone                    410
    │   │   ├── PayloadTooLarge         413
    │   │   ├── UnsupportedMediaType    415
    │   │   └── TooManyRequests         429
    │   ├── ServerError           5xx
    │   │   └── ServiceUnavailable      503
    │   └── StoreError            a STOW-RS request stored nothing (carries the StoreResult)
    ├── NetworkError              no HTTP answer (connection refused, reset, DNS ...)
    │   └── RequestTimeout        the request timed out
    └── ResponseError             the answer is malformed (bad JSON, broken multipart ...)

Every :class:`HTTPError` carries the status code, a human readable message
taken from the response (JSON ``detail``/``message``, DICOM ``ErrorComment``,
``Warning`` header or plain text), the raw response body, the request method
and URL.

References
----------
PS3.18 Chapter 8 (common status codes) and Table 10.5.3-1 (STOW-RS status codes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import orjson

if TYPE_CHECKING:  # pragma: no cover
    from .results import StoreResult

__all__ = [
    "DICOMwebError",
    "HTTPError",
    "ClientError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "NotAcceptable",
    "Conflict",
    "Gone",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "TooManyRequests",
    "ServerError",
    "ServiceUnavailable",
    "StoreError",
    "NetworkError",
    "RequestTimeout",
    "ResponseError",
    "error_for_status",
]

#: How much of an error body ends up in the message (the full body stays in ``.body``).
_MAX_MESSAGE_CHARS = 2000


class DICOMwebError(Exception):
    """Base class of every exception raised by :mod:`dicomweb_client`."""


class ResponseError(DICOMwebError, ValueError):
    """The origin server's answer could not be understood.

    Raised for malformed DICOM JSON, a broken or truncated multipart body,
    an unexpected media type, or a number of parts that does not fit the
    request (e.g. two instances for a single-instance retrieve).
    """


class NetworkError(DICOMwebError):
    """No HTTP answer was received (connection refused or reset, DNS failure ...).

    The underlying :mod:`httpx` exception is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, method: str | None = None, url: str | None = None):
        super().__init__(message)
        self.method = method
        self.url = url


class RequestTimeout(NetworkError):
    """The request timed out (connect, read, write or pool timeout)."""


class HTTPError(DICOMwebError):
    """The origin server answered with an error status (4xx or 5xx).

    Parameters
    ----------
    status_code : int
        HTTP status code of the answer.
    message : str
        Human readable explanation extracted from the answer.
    body : bytes, optional
        Raw body of the answer.
    method : str, optional
        HTTP method of the request.
    url : str, optional
        URL of the request.
    headers : Mapping[str, str], optional
        Headers of the answer.

    Attributes
    ----------
    status_code, status : int
        HTTP status code (``status`` is an alias).
    message : str
        Explanation sent by the server, or the reason phrase.
    body : bytes
        Raw body of the answer.
    """

    #: Status code this class stands for (``None`` for a range).
    status: int

    def __init__(
        self,
        status_code: int,
        message: str = "",
        *,
        body: bytes = b"",
        method: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status_code = status_code
        self.status = status_code
        self.message = message
        self.body = body
        self.method = method
        self.url = url
        self.headers = dict(headers or {})
        where = f" ({method} {url})" if method and url else ""
        text = f"HTTP {status_code}{where}"
        if message:
            text += f": {message}"
        super().__init__(text)

    @property
    def response_body(self) -> bytes:
        """Raw body of the answer (alias of :attr:`body`)."""
        return self.body


class ClientError(HTTPError):
    """4xx: the request was refused."""


class BadRequest(ClientError):
    """400: malformed request (bad query parameter, bad UID, bad frame number ...)."""


class Unauthorized(ClientError):
    """401: authentication is missing or wrong."""


class Forbidden(ClientError):
    """403: authenticated, but not allowed."""


class NotFound(ClientError):
    """404: the study, series, instance, frame or bulk data does not exist."""


class MethodNotAllowed(ClientError):
    """405: the server does not offer this transaction (e.g. DELETE)."""


class NotAcceptable(ClientError):
    """406: the server cannot produce any of the accepted media types / transfer syntaxes."""


class Conflict(ClientError):
    """409: conflict (for STOW-RS see :class:`StoreError`)."""


class Gone(ClientError):
    """410: the resource existed but was removed."""


class PayloadTooLarge(ClientError):
    """413: the request body exceeds the server's limit."""


class UnsupportedMediaType(ClientError):
    """415: the server does not accept the request's Content-Type."""


class TooManyRequests(ClientError):
    """429: rate limited."""


class ServerError(HTTPError):
    """5xx: the server failed."""


class ServiceUnavailable(ServerError):
    """503: the server is temporarily unavailable (retried for idempotent requests)."""


class StoreError(HTTPError):
    """A STOW-RS request stored no instance.

    Raised for HTTP 409 (every instance failed, PS3.18 Table 10.5.3-1) and
    for other error answers to a store request that carry a Store Instances
    Response. A partial failure (HTTP 202) is *not* an exception: inspect
    :attr:`StoreResult.failed` instead.

    Attributes
    ----------
    result : dicomweb_client.results.StoreResult
        The parsed Store Instances Response (``failed`` lists each instance
        with its ``FailureReason``).
    """

    def __init__(self, status_code: int, message: str = "", *, result: "StoreResult", **kwargs) -> None:
        super().__init__(status_code, message, **kwargs)
        self.result = result


_BY_STATUS: dict[int, type[HTTPError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    406: NotAcceptable,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def _message_from_body(body: bytes, content_type: str) -> str:
    """Best-effort extraction of an explanation from an error body."""
    if not body:
        return ""
    ct = content_type.lower()
    if "json" in ct or body[:1] in (b"{", b"["):
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, list) and doc and isinstance(doc[0], dict):
            doc = doc[0]
        if isinstance(doc, dict):
            for key in ("detail", "message", "error", "errors"):
                if key in doc:
                    value = doc[key]
                    return value if isinstance(value, str) else orjson.dumps(value).decode()
            # DICOM JSON: ErrorComment (0000,0902)
            comment = doc.get("00000902")
            if isinstance(comment, dict) and comment.get("Value"):
                return str(comment["Value"][0])
    if ct.startswith("text/") or ct == "" or "json" in ct:
        text = body[:_MAX_MESSAGE_CHARS].decode("utf-8", "replace").strip()
        if ct.startswith("text/html"):
            return text[:200]
        return text
    return ""


def error_for_status(
    status_code: int,
    *,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
    url: str | None = None,
    reason: str = "",
) -> HTTPError:
    """Build the exception that stands for an error answer.

    Parameters
    ----------
    status_code : int
        HTTP status code (>= 400).
    body : bytes
        Response body.
    headers : Mapping[str, str], optional
        Response headers (``Content-Type`` and ``Warning`` are used).
    method, url : str, optional
        The request, for the message.
    reason : str
        Reason phrase used when the body explains nothing.

    Returns
    -------
    HTTPError
        An instance of the most specific subclass for ``status_code``.
    """
    headers = headers or {}
    lower = {k.lower(): v for k, v in headers.items()}
    message = _message_from_body(body, lower.get("content-type", ""))
    if not message and lower.get("warning"):
        message = lower["warning"]
    if not message:
        message = reason
    cls = _BY_STATUS.get(status_code)
    if cls is None:
        if 500 <= status_code < 600:
            cls = ServerError
        elif 400 <= status_code < 500:
            cls = ClientError
        else:
            cls = HTTPError
    return cls(status_code, message, body=body, method=method, url=url, headers=headers)

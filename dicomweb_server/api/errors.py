"""Error answers: JSON ``{"detail": message}`` plus a ``Warning: 299`` header
carrying the same text (PS3.18 §8.4.3 recommends a Warning header explaining
errors). Every handler raises :class:`DICOMwebHTTPError` (or a subclass of the
domain errors mapped here); nothing a client sends reaches a 500.

Header hygiene: messages often quote client text (UIDs, part Content-Types,
query values). :func:`warning_header` is the one place a Warning value is built
(RFC 9110 §5.5, §5.6.4): the JSON body keeps the exact text, the header carries
it as a quoted-string of visible ASCII. :func:`safe_header_value` is the last
line of defence applied to every response header (api/methods.py)."""

from __future__ import annotations

import logging
import re

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..dicom.matching import QueryError
from ..dicom.media_types import BadNegotiationParameter, NotAcceptable
from ..dicom.multipart import MultipartError, TooLarge
from ..store.base import IndexUnavailable

log = logging.getLogger("dicomweb_server.api")


class DICOMwebHTTPError(Exception):
    def __init__(self, status_code: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.headers = headers


# RFC 9110 §5.5: a field value is visible ASCII, SP and HTAB (obs-text is obsolete).
# Everything else, and "%" itself, is percent-encoded as UTF-8 (reversible).
_UNSAFE_TEXT = re.compile(r"[^\x20-\x24\x26-\x7e]")
_UNSAFE_FIELD = re.compile(rb"[^\x09\x20-\x7e]")
WARN_TEXT_MAX = 1000  # characters of the message carried in a Warning header


def _percent(m: re.Match) -> str:
    return "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass"))


def warning_header(text: str, code: int = 299) -> str:
    """A ``Warning`` field value: ``299 dicomweb-archive: "text"`` (RFC 7234 §5.5,
    referenced by PS3.18 §8.4.3). ``text`` is cut to :data:`WARN_TEXT_MAX`
    characters, characters outside visible ASCII (and ``%``) are percent-encoded
    as UTF-8, and ``"`` and ``\\`` become quoted-pairs (RFC 9110 §5.6.4), so any
    client text is safe here."""
    cut = text[:WARN_TEXT_MAX] + ("..." if len(text) > WARN_TEXT_MAX else "")
    quoted = _UNSAFE_TEXT.sub(_percent, cut).replace("\\", "\\\\").replace('"', '\\"')
    return f'{code} dicomweb-archive: "{quoted}"'


def safe_header_value(value: bytes) -> bytes:
    """``value`` with every byte outside RFC 9110 §5.5 field-value characters
    percent-encoded: no response header can break the connection or inject a line."""
    if not _UNSAFE_FIELD.search(value):
        return value
    return _UNSAFE_FIELD.sub(lambda m: b"%%%02X" % m.group()[0], value)


def error_response(status_code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps({"detail": message}), status_code=status_code, media_type="application/json",
                    headers={"Warning": warning_header(message), **(headers or {})})


_MAP: list[tuple[type[Exception], int]] = [
    (QueryError, 400),
    (BadNegotiationParameter, 400),
    (MultipartError, 400),
    (TooLarge, 413),
    (NotAcceptable, 406),
]


def install(app: FastAPI) -> None:
    @app.exception_handler(DICOMwebHTTPError)
    async def _dicomweb(_request: Request, exc: DICOMwebHTTPError) -> Response:
        return error_response(exc.status_code, exc.message, exc.headers)

    for exc_type, status in _MAP:
        def make(status: int):
            async def handler(_request: Request, exc: Exception) -> Response:
                return error_response(status, str(exc))
            return handler
        app.add_exception_handler(exc_type, make(status))

    @app.exception_handler(IndexUnavailable)
    async def _index_down(_request: Request, exc: IndexUnavailable) -> Response:
        # a temporary condition (RFC 9110 §15.6.4 503 Service Unavailable, §10.2.3 Retry-After)
        log.warning("index unavailable: %s", exc)
        return error_response(503, str(exc), {"Retry-After": "5"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), exc.headers)  # e.g. Allow of a 405

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> Response:
        msgs = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
        return error_response(400, msgs or "invalid request")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error; see the server log")

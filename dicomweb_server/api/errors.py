"""Error answers: JSON ``{"detail": message}`` plus a ``Warning: 299`` header
carrying the same text (PS3.18 §8.4.3 recommends a Warning header explaining
errors). Every handler raises :class:`DICOMwebHTTPError` (or a subclass of the
domain errors mapped here); nothing a client sends reaches a 500."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..dicom.matching import QueryError
from ..dicom.media_types import NotAcceptable
from ..dicom.multipart import MultipartError, TooLarge

log = logging.getLogger("dicomweb_server.api")


class DICOMwebHTTPError(Exception):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def error_response(status_code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    warning = "299 dicomweb-archive: " + '"' + message.replace('"', "'").replace("\r", " ").replace("\n", " ")[:400] + '"'
    return Response(orjson.dumps({"detail": message}), status_code=status_code, media_type="application/json",
                    headers={"Warning": warning.encode("latin-1", "replace").decode("latin-1"), **(headers or {})})


_MAP: list[tuple[type[Exception], int]] = [
    (QueryError, 400),
    (MultipartError, 400),
    (TooLarge, 413),
    (NotAcceptable, 406),
]


def install(app: FastAPI) -> None:
    @app.exception_handler(DICOMwebHTTPError)
    async def _dicomweb(_request: Request, exc: DICOMwebHTTPError) -> Response:
        return error_response(exc.status_code, exc.message)

    for exc_type, status in _MAP:
        def make(status: int):
            async def handler(_request: Request, exc: Exception) -> Response:
                return error_response(status, str(exc))
            return handler
        app.add_exception_handler(exc_type, make(status))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> Response:
        msgs = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
        return error_response(400, msgs or "invalid request")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error; see the server log")

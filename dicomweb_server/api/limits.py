"""Request header limit: a plain ASGI middleware (no per-request Python objects)
answering 431 when the request's headers exceed ``max_header_bytes`` (httptools,
uvicorn's parser, sets no such limit itself)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import error_response


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_header_bytes: int) -> None:
        self.app = app
        self.max = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(k) + len(v) + 4 for k, v in scope["headers"]) + len(scope.get("raw_path") or b"") \
                + len(scope.get("query_string") or b"")
            if size > self.max:
                response = error_response(431, f"request line and headers exceed {self.max} bytes")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

"""HTTP method semantics of RFC 9110 for every resource, in one plain ASGI middleware
(innermost, so that authentication and the audit log see the request as sent):

- ``HEAD`` (§9.3.2) is answered by the ``GET`` route of the same resource: same
  status and header fields, no content. Answers built in memory (metadata, QIDO,
  frames, rendered, single instances, bulk data) are computed in full so that
  ``Content-Length`` is the exact length GET sends (§8.6 forbids any other value);
  streamed answers (study, series, large files) stop after their first piece, so
  no further file is read.
- ``OPTIONS`` (§9.3.7) on a resource: ``204`` with ``Allow``, to an authenticated
  client only when authentication is configured (api/auth.py runs first). CORS
  preflights are answered before both by the CORS middleware when origins are configured.
- A method the resource does not support: ``405`` with ``Allow`` listing every
  method of that path (§15.5.6), gathered from all routes of the path (GET search
  and POST store of ``/studies`` are separate routes). A method RFC 9110 does not
  define (WebDAV's PROPFIND, ...): ``501`` (§9.1, §15.6.2).
- Every response header value is made safe (:func:`errors.safe_header_value`):
  uvicorn drops the connection on a control character in a header.
"""

from __future__ import annotations

import logging

from collections.abc import Iterable, Iterator

from starlette._utils import get_route_path
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response, safe_header_value
from .sendfile import SENDFILE

log = logging.getLogger("dicomweb_server.api")


# RFC 9110 §9.3 and PATCH (RFC 5789): recognised methods, answered 405 where not allowed
_RECOGNISED = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})


class _HeadDone(Exception):
    """Raised into a HEAD answer's body producer once the header is sent."""


def _endpoints(routes: Iterable) -> Iterator:
    """Routes with a path and methods; FastAPI (>= 0.16x) keeps included routers
    as branches (``effective_candidates``) instead of copying their routes."""
    for route in routes:
        branch = getattr(route, "effective_candidates", None)
        if callable(branch):
            yield from _endpoints(branch())
        elif getattr(route, "methods", None) and getattr(route, "path_regex", None) is not None:
            yield route  # mounts (the viewer) answer their own methods


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> list[str]:
    """Methods of every route whose path matches ``scope`` (empty: no such resource)."""
    path = get_route_path(scope)
    methods: set[str] = set()
    for route in _endpoints(routes):
        if route.path_regex.match(path):
            methods |= route.methods
    if not methods:
        return []
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods | {"OPTIONS"})


class HTTPMethods:
    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method not in _RECOGNISED:
            await error_response(501, f"method {method} is not implemented")(scope, receive, send)
            return
        if method == "OPTIONS":
            allow = allowed_methods(self.routes, scope)
            if allow:
                await send({"type": "http.response.start", "status": 204,
                            "headers": [(b"allow", ", ".join(allow).encode())]})
                await send({"type": "http.response.body", "body": b""})
                return
        head = method == "HEAD"
        if head:
            # the server (uvicorn) keeps its own scope saying HEAD and sends no body
            scope = {**scope, "method": "GET"}
        body_sent = False

        async def checked_send(message: Message) -> None:
            nonlocal body_sent
            if message["type"] == "http.response.start":
                headers = []
                for name, value in message.get("headers", ()):
                    safe = safe_header_value(value)
                    if safe is not value:
                        log.warning("response header %r held bytes outside RFC 9110 §5.5; escaped", name)
                    headers.append((name, safe))
                if message["status"] == 405:
                    allow = allowed_methods(self.routes, {**scope, "method": method})
                    if allow:
                        headers = [h for h in headers if h[0].lower() != b"allow"]
                        headers.append((b"allow", ", ".join(allow).encode()))
                message = {**message, "headers": headers}
            elif head and message["type"] in ("http.response.body", SENDFILE):
                if body_sent:
                    raise _HeadDone
                body_sent = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                if message.get("more_body", False):
                    raise _HeadDone  # stop a streamed body before it reads more
                return
            await send(message)

        try:
            await self.app(scope, receive, checked_send)
        except _HeadDone:
            pass

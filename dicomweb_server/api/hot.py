"""The hot path: the most frequent DICOMweb requests dispatched by a small ASGI router
before Starlette and FastAPI (issue 33).

Under load, FastAPI and Starlette's per-request machinery (the telemetry check, the
``ExceptionTelemetry``/``AppBodyLimit``/``ExceptionMiddleware``/``AsyncExitStackMiddleware``
layers and their send wrappers, the router's walk over ~90 routes, dependency solving) was
~14-18% of a STOW-RS's GIL time (loadtests/results/profiles/summary.txt). :class:`ArchiveApp` answers these requests itself:

- STOW-RS ``POST {prefix}/studies[/{study}]`` (PS3.18 §10.5),
- WADO-RS instance and frames, ``GET``/``HEAD {prefix}/studies/{study}/series/{series}/
  instances/{instance}[/frames/{frames}]`` (PS3.18 §10.4),
- QIDO-RS, ``GET``/``HEAD`` of the six search resources (PS3.18 §10.6),
- WADO-RS rendered and thumbnail resources, ``GET``/``HEAD {prefix}/studies/{study}
  [/series/{series}[/instances/{instance}[/frames/{frames}]]]/rendered`` and ``.../thumbnail``
  (PS3.18 §10.4.1.1.3, §10.4.1.1.4; api/rendered.py),
- the STOW-RS doors of the routes file, ``POST {prefix}/{door}/studies[/{study}]``
  (api/stow.py: a plain ASGI endpoint, called as Starlette's route calls it),

through the same middleware as every other request (request-head size, CORS,
authentication and audit, HTTP method semantics: :attr:`FastAPI.user_middleware`, each
a plain ASGI callable), composed once, around a dispatcher that resolves the endpoint's
parameters as FastAPI does (in declaration order: the archive, the base URL, each UID
path parameter checked by :func:`.deps.checked_uid`) and calls the endpoint function
of the FastAPI route itself, so the answer is the same. The app's exception handlers
(:mod:`.errors`) turn errors into answers, as Starlette's ``ExceptionMiddleware`` does
inside the middleware and its ``ServerErrorMiddleware`` (the 500 answer) outside them.

Every other request, and every other method on these paths (``OPTIONS``, ``DELETE``,
405s), goes to FastAPI as before; the hot routes remain FastAPI routes, in
``/openapi.json`` and ``/docs``. The STOW-RS doors keep their Starlette routes too (with the
hot path off, and for anything the hot router leaves to Starlette). Routes are tried in
Starlette's order: the doors, which Starlette tries before every FastAPI route, before
``POST {prefix}/studies/{study}`` (``POST /studies/studies`` is the door ``studies``, which
no routes file can name: 404 either way).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette._utils import get_route_path
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import qido, rendered, stow, wado
from .deps import base_url, checked_uid

_GET = frozenset({"GET", "HEAD"})  # HEAD: api/methods.py answers it with the GET route
_POST = frozenset({"POST"})
_UIDS = {"study": "StudyInstanceUID", "series": "SeriesInstanceUID", "instance": "SOPInstanceUID"}
_SEGMENT = "[^/]+"  # Starlette's ``str`` path convertor


def _routes(prefix: str) -> list[tuple[frozenset[str], str, Callable]]:
    """(methods, path, endpoint) in the order Starlette tries them: the FastAPI (or, for
    the doors, Starlette) route of each is the one of the same path and method
    (tests/server/test_hot_path.py checks that Starlette's router picks it)."""
    s, se, i, f = "/studies/{study}", "/series/{series}", "/instances/{instance}", "/frames/{frames}"
    pictures = [(_GET, prefix + path + "/" + kind, rendered.endpoints[f"{level}_{kind}"])
                for kind in ("rendered", "thumbnail")
                for level, path in (("study", s), ("series", s + se), ("instance", s + se + i),
                                    ("frames", s + se + i + f))]
    return [
        (_POST, prefix + "/{door}/studies", stow.store_door_instances),  # before every FastAPI route (app.py)
        (_POST, prefix + "/{door}/studies/{study}", stow.store_door_study_instances),
        (_POST, prefix + "/studies", stow.store_instances),
        (_POST, prefix + s, stow.store_study_instances),
        (_GET, prefix + "/studies", qido.search_for_studies),
        (_GET, prefix + "/series", qido.search_for_series),
        (_GET, prefix + s + "/series", qido.search_for_study_series),
        (_GET, prefix + "/instances", qido.search_for_instances),
        (_GET, prefix + s + "/instances", qido.search_for_study_instances),
        (_GET, prefix + s + se + "/instances", qido.search_for_series_instances),
        (_GET, prefix + s + se + i, wado.retrieve_instance),
        (_GET, prefix + s + se + i + f, wado.retrieve_instance_frames),
        *pictures,
    ]


def _resolver(endpoint: Callable) -> Callable[[Request, dict], Awaitable[list]] | None:
    """The endpoint's arguments, resolved as its FastAPI dependencies are (api/deps.py), in
    the order of its parameters: a bad UID is a 400 before anything after it is looked at.
    None for a plain ASGI endpoint (a STOW-RS door): it is called with the scope, as
    Starlette's ``Route`` calls it, and resolves its own."""
    if not inspect.isfunction(endpoint):
        return None
    steps = []
    for name in inspect.signature(endpoint).parameters:
        if name in ("request", "archive", "base", "frames") or name in _UIDS:
            steps.append(name)
        else:
            raise TypeError(f"{endpoint.__name__}: no hot-path resolver for parameter {name!r}")

    async def resolve(request: Request, params: dict) -> list:
        args: list = []
        for step in steps:
            if step == "request":
                args.append(request)
            elif step == "archive":
                args.append(request.app.state.archive)
            elif step == "base":
                args.append(await base_url(request))
            elif step == "frames":
                args.append(params["frames"])
            else:
                args.append(checked_uid(params[step], _UIDS[step]))
        return args
    return resolve


class HotRouter:
    """Matches a request to a hot route: ``(endpoint, resolver, path_params)`` or None."""

    def __init__(self, prefix: str) -> None:
        self._routes = []
        for methods, path, endpoint in _routes(prefix):
            regex = re.compile("^" + re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>{_SEGMENT})",
                                            re.escape(path).replace(r"\{", "{").replace(r"\}", "}")) + "$")
            self._routes.append((methods, regex, endpoint, _resolver(endpoint)))

    def match(self, scope: Scope) -> tuple | None:
        method = scope["method"]
        path = get_route_path(scope)
        for methods, regex, endpoint, resolve in self._routes:
            if method in methods:
                m = regex.match(path)
                if m is not None:
                    return endpoint, resolve, m.groupdict()
        return None


class _Dispatch:
    """Innermost: calls the matched endpoint; an exception with a handler of the app
    (:mod:`.errors`) becomes that handler's answer, as in Starlette's ExceptionMiddleware."""

    def __init__(self, handlers: dict) -> None:
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint, resolve = scope["endpoint"], scope["hot.resolve"]
        request = Request(scope, receive, send)
        started = False

        async def sender(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            if resolve is None:  # a plain ASGI endpoint (Starlette's Route calls it so)
                await endpoint(scope, receive, sender)
            else:
                response = await endpoint(*await resolve(request, scope["path_params"]))
                await response(scope, receive, sender)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            if started:
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            if inspect.iscoroutinefunction(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
            if response is not None:
                await response(scope, receive, sender)

    def _handler(self, exc: Exception):
        if isinstance(exc, HTTPException) and exc.status_code in self.handlers:
            return self.handlers[exc.status_code]
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None


class ArchiveApp(FastAPI):
    """The FastAPI app with the hot path in front (see the module docstring).
    :meth:`enable_hot_path` (with the DICOMweb prefix) turns it on."""

    hot: HotRouter | None = None
    _hot_stack: ASGIApp | None = None

    def enable_hot_path(self, prefix: str) -> None:
        self.hot = HotRouter(prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.hot is not None:
            if self.root_path:  # as FastAPI.__call__
                scope["root_path"] = self.root_path
            found = self.hot.match(scope)
            if found is not None:
                scope["app"] = self
                scope.setdefault("router", self.router)
                scope["endpoint"], scope["hot.resolve"], scope["path_params"] = found
                await (self._hot_stack or self._build_hot_stack())(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _build_hot_stack(self) -> ASGIApp:
        """The app's own middleware (api/limits.py, CORS, api/auth.py, api/methods.py), in
        the order Starlette composes them, around :class:`_Dispatch`; built once."""
        error_handler = None
        handlers = {}
        for key, value in self.exception_handlers.items():
            if key in (500, Exception):
                error_handler = value
            else:
                handlers[key] = value
        app: ASGIApp = _Dispatch(handlers)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        self._hot_stack = ServerErrorMiddleware(app, handler=error_handler, debug=self.debug)
        return self._hot_stack

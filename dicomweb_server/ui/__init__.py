"""The archive's own web pages, served from the package (no CDN: they work offline).

- ``/ui/``: the operator's page (docs/operator.md), a small static JavaScript
  app (``static/ui/``) that uses only the archive's REST API: QIDO-RS, WADO-RS
  thumbnails, STOW-RS, DELETE, the lifecycle and rejection routes, the change feed,
  ``/admin/...`` and ``/metrics``. It holds no data and changes nothing by itself; with
  auth configured it sends the credentials the operator types in (an API key as
  ``Authorization: Bearer``, or Basic), or, with ``oidc_client_id``, the access token of
  an OIDC login (authorization code + PKCE, done by the page's script; redirect URI
  ``{origin}/ui/``), with each request, and the API decides. The page renews that token
  before it expires (refresh token, else a silent request in a hidden frame that comes
  back to ``{origin}/ui/silent-callback.html``: web_login.py).
- ``/docs``: FastAPI's Swagger UI with its script and style sheet from
  ``static/swagger-ui/`` (npm ``swagger-ui-dist``, vendored unchanged, see its VERSION
  file) instead of a CDN.

Static files need no credentials (``/ui`` is open, like ``/docs`` and ``/viewer``:
api/auth.py); every request the page makes for data does.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..web_login import SILENT_CALLBACK, SILENT_CALLBACK_HEADERS, SILENT_CALLBACK_PAGE, OidcLogin

STATIC = Path(__file__).parent / "static"
MOUNT = "/ui"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
_NO_CACHE = {"Cache-Control": "no-cache"}


def _page(prefix: str, login: OidcLogin | None = None) -> bytes:
    """The page, with the DICOMweb prefix and the OIDC login (``null`` when there is none:
    the page then offers API keys and Basic only) in its ``<meta>`` elements."""
    text = (STATIC / "ui" / "index.html").read_text("utf-8")
    oidc = json.dumps(login._asdict()) if login is not None else "null"
    return (text.replace("__DICOMWEB_PREFIX__", json.dumps(prefix)[1:-1])
            .replace("__DICOMWEB_OIDC__", html.escape(oidc, quote=True)).encode("utf-8"))


def include(app, settings) -> None:
    """Mount ``/docs``, ``/ui/`` and ``/ui/static/`` on the app (FastAPI's own ``/docs``
    is off: ``docs_url=None`` in app.py)."""
    login = OidcLogin.of(settings)
    page = _page(settings.prefix, login)

    async def docs(request: Request) -> Response:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{app.title} - API documentation",
            swagger_js_url=f"{MOUNT}/static/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{MOUNT}/static/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{MOUNT}/static/swagger-ui/favicon-32x32.png",
            oauth2_redirect_url=OAUTH2_REDIRECT,
            # no call to validator.swagger.io (the default of Swagger UI for a remote spec)
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def oauth2_redirect(request: Request) -> Response:  # as FastAPI's own /docs had it (inline script)
        return get_swagger_ui_oauth2_redirect_html()

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers=_NO_CACHE)

    async def to_index(request: Request) -> Response:
        return RedirectResponse(f"{MOUNT}/", status_code=307)

    async def silent_callback(request: Request) -> Response:  # the hidden frame of a silent renewal
        return HTMLResponse(SILENT_CALLBACK_PAGE, headers=SILENT_CALLBACK_HEADERS)

    app.router.routes.extend([
        Route("/docs", docs, methods=["GET", "HEAD"], include_in_schema=False),
        Route(OAUTH2_REDIRECT, oauth2_redirect, methods=["GET", "HEAD"], include_in_schema=False),
        Route(MOUNT, to_index, methods=["GET", "HEAD"], include_in_schema=False),
        Route(f"{MOUNT}/", index, methods=["GET", "HEAD"], include_in_schema=False),
        Mount(f"{MOUNT}/static", app=StaticFiles(directory=STATIC), name="ui-static"),
    ])
    if login is not None:
        app.router.routes.append(Route(f"{MOUNT}/{SILENT_CALLBACK}", silent_callback, methods=["GET", "HEAD"],
                                       include_in_schema=False))

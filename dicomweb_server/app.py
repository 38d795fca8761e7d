"""``create_app(settings)``: the FastAPI application of one archive process."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from . import __version__
from .api import errors, qido, rendered, stow, wado
from .api.auth import AuthAuditMiddleware, Authenticator, configure_audit_file, load_json_file
from .api.limits import HeaderLimit
from .archive import Archive
from .settings import Settings


def create_app(settings: Settings | None = None, archive: Archive | None = None) -> FastAPI:
    """Build the app. The archive is opened in the lifespan unless one is given
    (tests pass their own to share it between apps)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        opened = archive is None
        app.state.archive = archive or Archive.open(settings)
        try:
            yield
        finally:
            if opened:
                app.state.archive.close()

    app = FastAPI(
        title="dicomweb-archive",
        version=__version__,
        summary="DICOMweb (PS3.18) archive: STOW-RS, QIDO-RS, WADO-RS",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    if archive is not None:
        app.state.archive = archive
    errors.install(app)
    app.router.routes.extend(stow.fast_routes(settings.prefix))  # before the FastAPI routes (stow.py)
    for module in (qido, stow, wado, rendered):
        app.include_router(module.router, prefix=settings.prefix)
    if settings.viewer:  # the OHIF viewer at /viewer, same origin (viewer.py)
        from .viewer import mount_viewer

        mount_viewer(app, settings)
    authenticator = Authenticator(
        {**load_json_file(settings.api_keys_file), **settings.api_keys},
        oidc_issuer=settings.oidc_issuer, oidc_audience=settings.oidc_audience,
        oidc_jwks_url=settings.oidc_jwks_url, basic_users=load_json_file(settings.basic_users_file),
    )
    if settings.audit_log is not None:
        configure_audit_file(settings.audit_log)
    if authenticator.enabled or settings.audit_log is not None:
        app.add_middleware(AuthAuditMiddleware, authenticator=authenticator, prefix=settings.prefix,
                           audit=settings.audit_log is not None)
    if settings.cors_origins:
        # PS3.18 does not define CORS; browser viewers need it (case H1). Added after
        # (outside) authentication so that 401/403 answers carry the CORS headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_credentials="*" not in settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["accept", "content-type", "authorization"],
            expose_headers=["Content-Type", "Content-Location", "Warning"],
        )
    app.add_middleware(HeaderLimit, max_header_bytes=settings.max_header_bytes)
    logging.getLogger("dicomweb_server").setLevel(settings.log_level.upper())
    return app


def create_app_from_env() -> FastAPI:
    """Factory for uvicorn workers: settings from ``DICOMWEB_*`` variables."""
    return create_app(Settings())

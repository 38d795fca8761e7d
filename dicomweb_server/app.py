"""``create_app(settings)``: the FastAPI application of one archive process."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from . import __version__
from .api import (admin, changefeed, deidentify, downloads, errors, jobs, labels, landing, lifecycle, qido, reject,
                  rendered, shares, stow, wado, worklist)
from .access.rules import AccessRules
from .access.audit import configure_audit_file, load_json_file
from .api.auth import AuthAuditMiddleware, Authenticator
from .api.hot import ArchiveApp
from .api.limits import HeaderLimit
from .api.methods import HTTPMethods
from .archive import Archive
from .dicom import decode_worker
from .lifecycle import reject as reject_lifecycle
from .policy import retention
from .settings import Settings
from .ui import include as include_ui


def create_app(settings: Settings | None = None, archive: Archive | None = None) -> FastAPI:
    """Build the app. The archive is opened in the lifespan unless one is given
    (tests pass their own to share it between apps)."""
    settings = settings or Settings()
    decode_worker.configure(settings.decode_processes, settings.decode_timeout)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        opened = archive is None
        app.state.archive = archive or Archive.open(settings)
        forwarder = None
        if app.state.archive.routing is not None:  # deliver the outbox from this worker (routing/)
            from .routing.forwarder import Forwarder

            forwarder = Forwarder(app.state.archive.routing, app.state.archive.blobs,
                                  lambda: app.state.archive.pseudonyms)
            await forwarder.start()
        dimse = _start_dimse_in_worker(app.state.archive, settings)
        app.state.jobs = _start_jobs(app.state.archive, settings)  # jobs/runner.py
        # the rejected instances past keep_rejected: purged at start and then hourly
        purging = asyncio.create_task(reject_lifecycle.purge_periodically(app.state.archive), name="purge-rejected")
        tasks = [purging]
        policy = app.state.archive.retention
        if policy is not None and settings.retention_interval > 0:  # policy/retention.py: off by default
            tasks.append(asyncio.create_task(retention.run_periodically(app.state.archive, policy,
                                                                        settings.retention_interval),
                                             name="retention"))
        routing = app.state.archive.routing
        if routing is not None and any(r.when == "after_ack" for r in routing.routes.store_as):
            from .policy.recompress import after_ack_periodically  # compress after the acknowledgement

            tasks.append(asyncio.create_task(after_ack_periodically(app.state.archive), name="recompress-after-ack"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if dimse is not None:
                dimse.stop()
            await asyncio.to_thread(app.state.jobs.stop)
            if forwarder is not None:
                await forwarder.stop()
            if opened:
                app.state.archive.close()

    app = ArchiveApp(
        title="dicomweb-archive",
        version=__version__,
        summary="DICOMweb (PS3.18) archive: STOW-RS, QIDO-RS, WADO-RS",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url=None,  # ui/: Swagger UI from the package, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.access = AccessRules.load(settings.access_rules, settings.access_rules_file)  # access/rules.py
    if archive is not None:
        app.state.archive = archive
    errors.install(app)
    landing.include(app, settings)  # GET /: what this archive holds, links to the viewer and docs
    include_ui(app, settings)  # /docs and the operator's page /ui/, assets from the package (ui/)
    app.router.routes.extend(stow.fast_routes(settings.prefix))  # before the FastAPI routes (stow.py)
    app.enable_hot_path(settings.prefix)  # STOW-RS, WADO-RS instance/frames, QIDO-RS before Starlette (api/hot.py)
    for module in (labels, shares, qido, stow, wado, rendered, changefeed, reject, lifecycle, downloads, worklist,
                   deidentify):
        app.include_router(module.router, prefix=settings.prefix)
    app.include_router(reject.admin_router)  # /admin/rejected
    app.include_router(admin.router)  # /admin/..., /metrics: outside the DICOMweb prefix
    app.include_router(jobs.router)  # /jobs: background jobs (jobs/runner.py)
    if settings.viewer:  # the OHIF viewer at /viewer, same origin (viewer.py)
        from .viewer import mount_viewer

        mount_viewer(app, settings)
    elif not (settings.prefix == "/viewer" or settings.prefix.startswith("/viewer/")):  # /viewer/: a page saying how to turn it on (404)
        from .viewer import viewer_off_router

        app.router.routes.extend(viewer_off_router().routes)
    app.add_middleware(HTTPMethods, routes=app.router.routes)  # innermost: HEAD, OPTIONS, 405 Allow
    authenticator = Authenticator(
        {**load_json_file(settings.api_keys_file), **settings.api_keys},
        oidc_issuer=settings.oidc_issuer, oidc_audience=settings.oidc_audience,
        oidc_jwks_url=settings.oidc_jwks_url, basic_users=load_json_file(settings.basic_users_file),
        jwks_timeout=settings.oidc_jwks_timeout, jwks_cache_seconds=settings.oidc_jwks_cache_seconds,
        labels_claim=app.state.access.claim,
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
            allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=["accept", "content-type", "authorization"],
            expose_headers=["Content-Type", "Content-Location", "Warning"],
        )
    app.add_middleware(HeaderLimit, max_header_bytes=settings.max_header_bytes)
    logging.getLogger("dicomweb_server").setLevel(settings.log_level.upper())
    return app


def _start_jobs(archive: Archive, settings: Settings):
    """This worker's runner of background jobs, on the archive's outbox (routing's, or
    one the runner opens and closes)."""
    from .jobs.runner import Runner
    from .routing import open_outbox

    def outbox():  # opened by the runner (and closed by it)
        return open_outbox(settings, archive.committer.writer)

    runner = Runner(archive, archive.routing.outbox if archive.routing is not None else outbox,
                    concurrency=settings.jobs_concurrency, lease=settings.jobs_lease, retry=settings.jobs_retry,
                    max_attempts=settings.jobs_max_attempts)
    if settings.index != "postgresql":  # a local SQLite file: opened now, the jobs are ready at once
        runner.open()
    runner.start()  # (PostgreSQL: opened by its thread: a database down now delays the jobs, not the start)
    return runner


def _start_dimse_in_worker(archive: Archive, settings: Settings):
    """The DIMSE listener inside this worker (the in-memory index: one process)."""
    if not (settings.dimse_in_worker and settings.dimse_on()):
        return None
    from .dimse.scp import DimseServer, listen_error

    server = DimseServer(archive, settings)
    try:
        server.start()
    except OSError as e:
        logging.getLogger("dicomweb_server.dimse").error("%s", listen_error(settings, e))
        return None
    return server


def create_app_from_env() -> FastAPI:
    """Factory for uvicorn workers: settings from ``DICOMWEB_*`` variables. A worker of
    ``serve --workers N`` ends with its supervisor, however that ends (lifeline.py)."""
    from .lifeline import end_worker_with_supervisor

    settings = Settings()
    end_worker_with_supervisor(settings.shutdown_timeout)
    return create_app(settings)

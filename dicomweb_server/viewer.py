"""The OHIF viewer (npm package ``@ohif/app``) served by the archive at ``/viewer``.

``@ohif/app`` ships a built viewer in ``dist/`` that expects to be served at ``/``:
its ``index.html``, CSS, webpack runtimes (``__webpack_require__.p = "/"``) and
service-worker list name files with absolute paths. The archive serves that folder,
unchanged on disk, under ``/viewer/`` and rewrites those absolute references in the
text files it sends (``"/app.bundle.js"`` -> ``"/viewer/app.bundle.js"``; only paths
whose first segment is a top-level entry of ``dist/``), so the viewer shares the
archive's origin (no CORS) and port. ``/viewer/app-config.js`` is generated: one
DICOMweb data source pointing at this archive's own DICOMweb root (``--public-url``,
else the page's origin plus ``--prefix``), OHIF's router based at ``/viewer``, the
first-visit tour and the investigational-use banner off.

With ``oidc_client_id`` (and the archive's ``oidc_issuer``/``oidc_jwks_url``) the config
also has OHIF's ``oidc`` entry: OHIF logs the user in at the issuer (authorization code +
PKCE, oidc-client-ts; redirect URI ``{origin}/viewer/callback``) and sends the access
token with every DICOMweb request, so the archive's access rules decide what the study
list shows (docs/notes/oidc.md). Without it, no login: the viewer as before.

OHIF's own routes then live under the base: the study list is ``/viewer/`` and a study
``/viewer/viewer?StudyInstanceUIDs=...``; ``/viewer?StudyInstanceUIDs=...`` redirects
there.

The package is fetched with npm, never committed::

    python -m dicomweb_server.viewer install [--dist DIR]   # npm pack @ohif/app@VERSION

``dicomweb-server --viewer`` runs the same step when the folder is missing. Any other
OHIF build can be served with ``--viewer-dir DIR`` (a folder holding ``index.html``).
``python -m dicomweb_server.viewer serve --port 3000 --dicomweb URL`` serves the viewer
alone, from its own origin, against any DICOMweb server (which then needs CORS).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import mimetypes
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route, Router

from .web_login import SILENT_CALLBACK, SILENT_CALLBACK_HEADERS, SILENT_CALLBACK_PAGE, OidcLogin

OHIF_PACKAGE = "@ohif/app"
OHIF_VERSION = "3.13.2"
MOUNT = "/viewer"

# files whose text may name other files of dist/ by absolute path
_TEXT_SUFFIXES = {".html", ".js", ".mjs", ".css", ".json", ".webapp", ".xml"}
_NO_CACHE = {"Cache-Control": "no-cache"}


class ViewerNotInstalled(RuntimeError):
    pass


def default_dist_dir(version: str = OHIF_VERSION) -> Path:
    """Where ``install`` puts ``dist/`` by default: the user's cache folder."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dicomweb-archive" / f"ohif-app-{version}" / "dist"


def dist_dir(viewer_dir: str | os.PathLike | None) -> Path:
    return Path(viewer_dir) if viewer_dir else default_dist_dir()


def is_installed(dist: Path) -> bool:
    return (dist / "index.html").is_file()


def install(dist: Path | None = None, *, version: str = OHIF_VERSION, npm: str | None = None,
            quiet: bool = False) -> Path:
    """Fetch ``@ohif/app@version`` with ``npm pack`` (the package's tarball only, none of its
    dependencies: ``dist/`` is a complete build) and unpack its ``dist/`` to ``dist``."""
    dist = Path(dist) if dist else default_dist_dir(version)
    npm = npm or shutil.which("npm")
    if not npm:
        raise ViewerNotInstalled("npm is not installed: it fetches the OHIF viewer (Debian: apt-get install npm)")
    dist.parent.mkdir(parents=True, exist_ok=True)
    spec = f"{OHIF_PACKAGE}@{version}"
    if not quiet:
        print(f"dicomweb-server: fetching {spec} with npm into {dist}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=".ohif-", dir=dist.parent) as tmp:
        try:
            subprocess.run([npm, "pack", spec, "--pack-destination", tmp, "--silent"], cwd=tmp, check=True,
                           stdout=subprocess.DEVNULL)
        except (OSError, subprocess.CalledProcessError) as e:
            raise ViewerNotInstalled(f"npm pack {spec} failed: {e}") from e
        (tgz,) = [p for p in Path(tmp).iterdir() if p.name.endswith(".tgz")]
        with tarfile.open(tgz) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith("package/dist/")]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
            tf.extractall(tmp, members=members, **safe)
        src = Path(tmp) / "package" / "dist"
        if not (src / "index.html").is_file():
            raise ViewerNotInstalled(f"{spec} has no dist/index.html")
        (src / ".ohif-version").write_text(version + "\n")
        if dist.exists():
            shutil.rmtree(dist)
        os.replace(src, dist)
    return dist


def ensure_installed(viewer_dir: str | os.PathLike | None) -> Path:
    """The viewer's folder, fetched with npm first when it is the default one and missing."""
    dist = dist_dir(viewer_dir)
    if not is_installed(dist):
        if viewer_dir:
            raise ViewerNotInstalled(f"{dist} holds no OHIF build (index.html); "
                                     "run: python -m dicomweb_server.viewer install --dist DIR")
        install(dist)
    return dist


# -- app-config.js ---------------------------------------------------------------------

_CONFIG_TEMPLATE = """\
/* Generated by dicomweb-archive (dicomweb_server/viewer.py) for OHIF __PACKAGE__. */
(function () {
  var root = __ROOT__ || (window.location.origin + __PREFIX__);
  window.config = {
    name: 'dicomweb-archive',
    routerBasename: __BASE__,
__OIDC__    extensions: [],
    modes: [],
    showStudyList: true,
    maxNumberOfWebWorkers: 3,
    showWarningMessageForCrossOrigin: false,
    showCPUFallbackMessage: true,
    showLoadingIndicator: true,
    strictZSpacingForVolumeViewport: true,
    groupEnabledModesFirst: true,
    investigationalUseDialog: { option: 'never' },
    customizationService: { global: {
      'ohif.tours': { $set: [] },
      // OHIF 3.13 has the data source's reject.series (supportsReject) but no menu item
      // that calls it: "Reject series" in the study browser's thumbnail menu (docs/rejection.md)
      'studyBrowser.thumbnailMenuItems': { $push: [{
        id: 'rejectSeries',
        label: 'Reject series',
        iconName: 'Delete',
        // OHIF's menu runs `commands` (a function is run with the thumbnail's props)
        commands: function (props) {
          var services = window.services;
          var ds = services.displaySetService.getDisplaySetByUID(props.displaySetInstanceUID);
          var source = window.extensionManager.getActiveDataSource()[0];
          if (!ds || !source.reject) { return; }
          var name = ds.SeriesDescription || ds.SeriesInstanceUID;
          if (!window.confirm('Reject series "' + name + '" (113001^DCM, Rejected for Quality Reasons)? '
                              + 'It is hidden from every search and retrieve, and can be restored.')) { return; }
          // OHIF 3.13.2's reject.series throws "getAuthrorizationHeader is not a function" (its
          // dcm4cheeReject gets the header function before the data source's initialize sets
          // it): then the same request (URL, code, 200/204 = done) with the user's header
          var post = function () {
            var url = root + '/studies/' + ds.StudyInstanceUID + '/series/' + ds.SeriesInstanceUID
                      + '/reject/113001%5EDCM';
            var auth = services.userAuthenticationService.getAuthorizationHeader() || {};
            return fetch(url, { method: 'POST', headers: auth }).then(function (r) {
              if (r.status !== 200 && r.status !== 204) { throw new Error('Unexpected status code: ' + r.status); }
              return r.text();
            });
          };
          new Promise(function (resolve) { resolve(source.reject.series(ds.StudyInstanceUID, ds.SeriesInstanceUID)); })
            .catch(function (error) { if (error instanceof TypeError) { return post(); } throw error; })
            .then(function () {
              services.displaySetService.deleteDisplaySet(ds.displaySetInstanceUID);
              services.uiNotificationService.show({ title: 'Series rejected', message: name, type: 'success' });
            }, function (error) {
              services.uiNotificationService.show({ title: 'Reject failed', message: String(error), type: 'error' });
            });
        },
      }] },
    } },
    maxNumRequests: { interaction: 100, thumbnail: 10, prefetch: 25 },
    showErrorDetails: 'always',
    defaultDataSourceName: 'archive',
    dataSources: [
      {
        namespace: '@ohif/extension-default.dataSourcesModule.dicomweb',
        sourceName: 'archive',
        configuration: {
          friendlyName: 'dicomweb-archive',
          name: 'archive',
          qidoRoot: root,
          wadoRoot: root,
          wadoUriRoot: root,
          qidoSupportsIncludeField: true,
          supportsReject: true,  // POST {wadoRoot}/studies/.../series/.../reject/113001%5EDCM (api/reject.py)
          supportsFuzzyMatching: true,
          supportsWildcard: true,
          staticWado: false,
          imageRendering: 'wadors',
          thumbnailRendering: 'thumbnail',
          thumbnailRequestStrategy: 'fetch',
          enableStudyLazyLoad: true,
          bulkDataURI: { enabled: true },
          omitQuotationForMultipartRequest: true,
          dicomUploadEnabled: true,
        },
      },
    ],
  };
})();
"""


SIGNED_OUT = "signed-out"


def _oidc_config(login: OidcLogin | None) -> str:
    """OHIF's ``oidc`` key: ``response_type: 'code'`` makes OHIF use oidc-client-ts, which
    always adds PKCE (S256). Its relative URIs are made absolute under the router's base:
    ``{origin}/viewer/callback`` is the redirect URI to register at the provider."""
    if login is None:
        return ""  # no key at all: OHIF takes even an empty list for a login
    entry = {
        "authority": login.authority,
        "client_id": login.client_id,
        "redirect_uri": "/callback",
        "silent_redirect_uri": "/" + SILENT_CALLBACK,
        # not the study list: OHIF routes the post-logout path (with its base) to a signout
        # callback, and "/viewer/" would then catch the study route /viewer/viewer
        "post_logout_redirect_uri": "/" + SIGNED_OUT,
        "response_type": "code",
        "scope": login.scope,
    }
    return f"    oidc: [{json.dumps(entry)}],\n"


def app_config_js(dicomweb_url: str | None, prefix: str = "", base: str = MOUNT,
                  login: OidcLogin | None = None) -> str:
    """The viewer's configuration: one DICOMweb data source at ``dicomweb_url``, or, when
    that is None, at the origin the page was loaded from plus ``prefix``; with ``login``,
    OHIF's OIDC login (every DICOMweb request then carries the user's access token)."""
    values = {
        "__PACKAGE__": f"{OHIF_PACKAGE}",
        "__ROOT__": json.dumps(dicomweb_url.rstrip("/") if dicomweb_url else ""),
        "__PREFIX__": json.dumps(prefix),
        "__BASE__": json.dumps(base or "/"),
        "__OIDC__": _oidc_config(login),
    }
    text = _CONFIG_TEMPLATE
    for k, v in values.items():
        text = text.replace(k, v)
    return text


# -- serving dist/ under a base path -----------------------------------------------------


class ViewerFiles:
    """``dist/`` served under ``base``. Text files naming others by absolute path are
    rewritten once and kept in memory (with their gzip); all else is sent from disk."""

    def __init__(self, dist: Path, base: str = MOUNT) -> None:
        self.dist = Path(dist).resolve()
        if not is_installed(self.dist):
            raise ViewerNotInstalled(f"{self.dist} holds no OHIF build (index.html)")
        self.base = base.rstrip("/") + "/"  # "/viewer/"
        names = sorted((re.escape(n) for n in os.listdir(self.dist) if not n.startswith(".")),
                       key=len, reverse=True)
        # "/name..." or '/name...' or `/name...` or url(/name...), name a top-level entry of dist/
        self._absolute = re.compile(r"""(?<=["'`(])/(?=(?:%s)(?:[/"'`)?#]))""" % "|".join(names))
        self._cache: dict[str, _Rewritten | None] = {}  # only rewritten files are kept
        self._lock = threading.Lock()

    def rewrite(self, text: str) -> str:
        if self.base == "/":
            return text
        text = text.replace('window.PUBLIC_URL="/"', f'window.PUBLIC_URL="{self.base}"')
        text = text.replace('__webpack_require__.p = "/"', f'__webpack_require__.p = "{self.base}"')
        return self._absolute.sub(self.base, text)

    def resolve(self, rel: str) -> Path | None:
        """A file of dist/ named by a URL path, never outside it."""
        if not rel or rel.endswith("/") or "\0" in rel:
            return None  # a NUL names no file (and os calls refuse it: ValueError)
        path = (self.dist / rel).resolve()
        if self.dist not in path.parents or not path.is_file():
            return None
        return path

    def _prepared(self, path: Path) -> _Rewritten | None:
        """The rewritten text of a file, or None when it is served as it is on disk.
        Blocking (reads, rewrites, compresses): called in a worker thread."""
        key = str(path)
        if key in self._cache:
            return self._cache[key]
        with self._lock:
            if key not in self._cache:
                raw = path.read_bytes()
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
                new = self.rewrite(text) if text is not None else None
                if new is None or new == text:
                    self._cache[key] = None
                else:
                    body = new.encode("utf-8")
                    etag = '"%s"' % hashlib.blake2b(body, digest_size=12).hexdigest()
                    self._cache[key] = _Rewritten(body, etag, gzip.compress(body, compresslevel=6, mtime=0))
        return self._cache[key]

    async def response(self, request: Request, path: Path, headers: dict[str, str] | None = None) -> Response:
        headers = dict(headers or {})
        media_type = _media_type(path)
        prepared = await run_in_threadpool(self._prepared, path) if path.suffix in _TEXT_SUFFIXES else None
        if prepared is None:
            return FileResponse(path, media_type=media_type, headers=headers)
        headers["ETag"] = prepared.etag
        headers["Vary"] = "Accept-Encoding"
        if request.headers.get("if-none-match") == prepared.etag:
            return Response(status_code=304, headers=headers)
        if "gzip" in request.headers.get("accept-encoding", ""):
            headers["Content-Encoding"] = "gzip"
            return Response(prepared.gzipped, media_type=media_type, headers=headers)
        return Response(prepared.body, media_type=media_type, headers=headers)


class _Rewritten(NamedTuple):
    body: bytes
    etag: str
    gzipped: bytes


def _media_type(path: Path) -> str:
    if path.suffix == ".wasm":
        return "application/wasm"
    if path.suffix in (".js", ".mjs"):
        return "text/javascript; charset=utf-8"
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def viewer_router(dist: Path, *, dicomweb_url: str | None, prefix: str = "", base: str = MOUNT,
                  login: OidcLogin | None = None) -> Router:
    """Routes serving the viewer at ``base`` (``/viewer`` or ``/``)."""
    files = ViewerFiles(dist, base)
    base = files.base.rstrip("/")  # "" for the root
    config = app_config_js(dicomweb_url, prefix, base or "/", login).encode()

    async def index(request: Request) -> Response:
        return await files.response(request, files.dist / "index.html", _NO_CACHE)

    async def entry(request: Request) -> Response:
        # OHIF's study route is {base}/viewer?StudyInstanceUIDs=...; keep /viewer?... working
        query = request.url.query
        target = f"{base}/viewer" if "studyinstanceuids" in query.lower() else f"{base}/"
        return RedirectResponse(target + (f"?{query}" if query else ""), status_code=307)

    async def asset(request: Request) -> Response:
        rel = request.path_params["path"]
        if rel == "app-config.js":
            return Response(config, media_type="text/javascript; charset=utf-8", headers=_NO_CACHE)
        if login is not None and rel == SILENT_CALLBACK:
            return Response(SILENT_CALLBACK_PAGE, media_type="text/html; charset=utf-8",
                            headers=SILENT_CALLBACK_HEADERS)
        if login is not None and rel == SIGNED_OUT:  # back from the provider's logout: the study list
            return RedirectResponse(f"{base}/", status_code=303)
        path = files.resolve(rel)
        if path is not None:
            if path.name == "index.html":
                return await index(request)
            return await files.response(request, path)
        if "." in rel.rsplit("/", 1)[-1]:
            return PlainTextResponse("Not Found", status_code=404)
        return await index(request)  # a route of the single-page app

    routes = [Route(f"{base}/", index, methods=["GET", "HEAD"]),
              Route(f"{base}/{{path:path}}", asset, methods=["GET", "HEAD"])]
    if base:
        routes.insert(0, Route(base, entry, methods=["GET", "HEAD"]))
    return Router(routes=routes)


def mount_viewer(app, settings) -> None:
    """Add the viewer's routes to the archive's app (``--viewer``)."""
    if settings.prefix == MOUNT or settings.prefix.startswith(MOUNT + "/"):
        raise ValueError(f"--prefix {settings.prefix} collides with the viewer at {MOUNT}")
    dist = dist_dir(settings.viewer_dir)
    router = viewer_router(dist, dicomweb_url=settings.public_url, prefix=settings.prefix,
                           login=OidcLogin.of(settings))
    for route in router.routes:
        app.router.routes.append(route)


_OFF_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>OHIF viewer: off</title>
<style>body{font-family:system-ui,sans-serif;max-width:42em;margin:2em auto;line-height:1.5}
code{background:#eee;padding:0 .2em}</style></head>
<body><h1>The OHIF viewer is off</h1>
<p>This archive serves the OHIF web viewer at <code>/viewer/</code> when it is started with
<code>--viewer</code>:</p>
<pre><code>dicomweb-server --viewer</code></pre>
<p>(or <code>DICOMWEB_VIEWER=true</code>; the first start fetches the viewer with npm, or give a
build with <code>--viewer-dir DIR</code>).</p>
<p><a href="/">What this archive holds</a></p>
</body></html>
"""


def viewer_off_router() -> Router:
    """``/viewer`` and below when the viewer is off: 404 (nothing is there), as an HTML page
    that says how to turn it on rather than ``{"detail":"Not Found"}``."""

    async def off(request: Request) -> Response:
        return Response(_OFF_PAGE, status_code=404, media_type="text/html; charset=utf-8", headers=_NO_CACHE)

    return Router(routes=[Route(MOUNT, off, methods=["GET", "HEAD"]),
                          Route(f"{MOUNT}/{{path:path}}", off, methods=["GET", "HEAD"])])


# -- python -m dicomweb_server.viewer ----------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dicomweb_server.viewer",
                                     description="the OHIF viewer for the archive")
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help=f"fetch {OHIF_PACKAGE} with npm pack, unpack its dist/")
    inst.add_argument("--dist", type=Path, help=f"target folder (default {default_dist_dir()})")
    inst.add_argument("--version", default=OHIF_VERSION)
    inst.add_argument("--force", action="store_true", help="fetch again even if present")
    srv = sub.add_parser("serve", help="serve the viewer alone on its own origin")
    srv.add_argument("--dicomweb", required=True, help="DICOMweb root URL the viewer talks to")
    srv.add_argument("--dist", type=Path, help="OHIF dist/ folder (default: the installed one)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=3000)
    srv.add_argument("--base", default="/", help="path to serve the viewer at (default /)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            dist = args.dist or default_dist_dir(args.version)
            if is_installed(dist) and not args.force:
                print(f"{OHIF_PACKAGE} already in {dist}")
                return 0
            print(install(dist, version=args.version))
            return 0
        import uvicorn
        from starlette.applications import Starlette

        dist = args.dist or ensure_installed(None)
        app = Starlette(routes=viewer_router(dist, dicomweb_url=args.dicomweb, base=args.base).routes)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        return 0
    except ViewerNotInstalled as e:
        print(f"dicomweb-server viewer: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

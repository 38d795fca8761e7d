"""``GET /``: what this archive is and where to go next.

An HTML page when a browser asks for it (``Accept`` naming ``text/html`` at least as
highly as JSON), JSON otherwise (curl, scripts): version, index kind, the numbers of
studies, series and instances and the bytes the instances take (counted and summed by the
index: no file is read, no row scanned),
where the instances are kept (the data folder, or the S3 bucket named by ``--storage``),
the use of the disk holding the data folder (with S3: spool, locks and the index), and links
to the DICOMweb root, the OpenAPI documentation, the operator's page (``/ui/``: ui/), the OHIF viewer when it is on and the
DIMSE port when it is on, and what the last `check` found (missing files: missing_data.py).
Not part of PS3.18. Under ``--prefix`` the page is also at
the prefix.
"""

from __future__ import annotations

import shutil
from html import escape

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from .. import __version__, missing_data
from .deps import access_of


def _q_values(accept: str) -> dict[str, float]:
    """Media type -> q of an Accept header (RFC 9110 §12.5.1)."""
    out: dict[str, float] = {}
    for item in accept.split(","):
        media, *params = [p.strip() for p in item.split(";")]
        q = 1.0
        for p in params:
            if p.lower().startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        if media:
            out[media.lower()] = q
    return out


def wants_html(accept: str) -> bool:
    q = _q_values(accept)
    html = q.get("text/html", 0.0)
    return html > 0 and html >= max(q.get("application/json", 0.0), q.get("application/dicom+json", 0.0))


def describe(request: Request) -> dict:
    """The landing page's content (sync: the index count runs in FastAPI's thread pool)."""
    settings = request.app.state.settings
    archive = request.app.state.archive
    counts = archive.index.counts(access_of(request).filter)  # what the caller may see (access/rules.py)
    disk = shutil.disk_usage(archive.blobs.root)
    root = str(request.base_url).rstrip("/")
    links = {"dicomweb": f"{root}{settings.prefix}/studies", "docs": f"{root}/docs",
             "openapi": f"{root}/openapi.json", "ui": f"{root}/ui/"}
    if settings.viewer:
        links["viewer"] = f"{root}/viewer/"
    dimse_port = getattr(settings, "dimse_port", None)  # the DIMSE listener, when it is on
    return {
        "name": "dicomweb-archive",
        "version": __version__,
        "index": settings.index,
        "studies": counts.studies,
        "series": counts.series,
        "instances": counts.instances,
        # the archive's own bytes: the stored instances' sizes summed by the index (no walk)
        "stored_bytes": counts.stored_bytes,
        # the file system holding the data folder (O(1): no walk over the stored files)
        "disk": {"data_dir": str(archive.blobs.root.resolve()), "used_bytes": disk.used,
                 "free_bytes": disk.free, "total_bytes": disk.total},
        "storage": _storage(archive.blobs),
        "links": links,
        "dimse_port": dimse_port,
        "dimse_tls_port": getattr(settings, "dimse_tls_port", None) or None,  # DICOM TLS (PS3.15 Annex B)
        # what `dicomweb-server check` last found (missing_data.py): None when it never ran here
        "last_check": missing_data.last_check(settings.data_dir),
    }


def _storage(blobs) -> dict:
    """Where the stored files are: the data folder, or an S3 bucket (its ``s3://`` URL and
    endpoint; never its credentials)."""
    if getattr(blobs, "local_files", True):
        return {"kind": "folder", "url": str(blobs.root.resolve())}
    endpoint = getattr(getattr(blobs.client, "meta", None), "endpoint_url", None)
    return {"kind": "s3", "url": blobs.url, "endpoint": endpoint}


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""  # pragma: no cover


def _where(storage: dict) -> str:
    if storage["kind"] == "s3":
        return f"{storage['url']} (S3{' at ' + storage['endpoint'] if storage.get('endpoint') else ''})"
    return f"{storage['url']} (folder)"


def _last_check(c: dict | None) -> str:
    if c is None:
        return "never run (dicomweb-server check)"
    return (f"{c.get('missing_files', 0):,} missing file(s), {c.get('problems', 0):,} problem(s)"
            f"{' (repaired)' if c.get('repaired') else ''} at {c.get('finished', '?')}")


def _html(d: dict) -> str:
    links = d["links"]
    items = []
    if "viewer" in links:
        items.append(f'<li><a href="{escape(links["viewer"])}">OHIF viewer</a>: browse and open the studies</li>')
    else:
        items.append("<li>OHIF viewer: off (start the archive with <code>--viewer</code>)</li>")
    items.append(f'<li><a href="{escape(links["ui"])}">Operator\'s page</a>: find, check, send, fix and watch</li>')
    items.append(f'<li><a href="{escape(links["dicomweb"])}">DICOMweb</a> (QIDO-RS, WADO-RS, STOW-RS): '
                 f'<code>{escape(links["dicomweb"])}</code></li>')
    items.append(f'<li><a href="{escape(links["docs"])}">API documentation</a> (OpenAPI: '
                 f'<a href="{escape(links["openapi"])}">openapi.json</a>)</li>')
    if d["dimse_port"]:
        items.append(f"<li>DICOM (DIMSE) on port {int(d['dimse_port'])}</li>")
    if d["dimse_tls_port"]:
        items.append(f"<li>DICOM TLS (DIMSE) on port {int(d['dimse_tls_port'])}</li>")
    disk = d["disk"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dicomweb-archive {escape(d["version"])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:42em;margin:2em auto;line-height:1.5}}
td{{padding:0 1em 0 0}}code{{background:#eee;padding:0 .2em}}</style></head>
<body><h1>dicomweb-archive {escape(d["version"])}</h1>
<table>
<tr><td>studies</td><td>{d["studies"]:,}</td></tr>
<tr><td>series</td><td>{d["series"]:,}</td></tr>
<tr><td>instances</td><td>{d["instances"]:,}</td></tr>
<tr><td>instances kept in</td><td>{escape(_where(d["storage"]))}</td></tr>
<tr><td>data folder</td><td>{escape(disk["data_dir"])}</td></tr>
<tr><td>stored</td><td>{_size(d["stored_bytes"])} ({d["instances"]:,} instances)</td></tr>
<tr><td>disk</td><td>{_size(disk["free_bytes"])} free of {_size(disk["total_bytes"])}
 (the file system of the data folder, {_size(disk["used_bytes"])} used by all its files)</td></tr>
<tr><td>index</td><td>{escape(d["index"])}</td></tr>
<tr><td>last check</td><td>{escape(_last_check(d["last_check"]))}</td></tr>
</table>
<ul>{"".join(items)}</ul>
<p>JSON of this page: <code>curl {escape(links["dicomweb"].rsplit("/studies", 1)[0])}/</code></p>
</body></html>
"""


def landing(request: Request):
    d = describe(request)
    if wants_html(request.headers.get("accept", "")):
        return HTMLResponse(_html(d))
    return Response(orjson.dumps(d), media_type="application/json")


def include(app, settings) -> None:
    """Mount ``GET /`` (and ``GET {prefix}/`` under a prefix) on the app."""
    router = APIRouter(include_in_schema=False)
    for path in ["/"] + ([settings.prefix + "/"] if settings.prefix else []):
        router.add_api_route(path, landing, methods=["GET"])
    app.include_router(router)

"""Share links (issue 28; docs/share-links.md): a link that opens one study in the
viewer and in DICOMweb, read only, until it expires or is revoked.

``POST /studies/{study}/share`` (write scope, a study the caller may see, else 404)
makes a random token (``secrets.token_urlsafe(32)``: 256 bits), keeps its SHA-256 only
(store/shares.py) and answers it once. The token is then a credential (api/auth.py
:meth:`~.auth.AuthAuditMiddleware`): as ``Authorization: Bearer`` or as the ``share``
query parameter it yields an identity with the read scope only whose filter
(access/filter.py :func:`~..access.filter.only_study`) lets the index see that one study:
any other answers as one that does not exist. ``GET /shares`` lists the links (never a
token), ``DELETE /shares/{id}`` revokes one; both need the write scope (api/auth.py).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Annotated
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Path as PathParam, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..store.shares import Share
from .deps import Allowed, ArchiveDep, BaseURL, StudyUID, read_body
from .errors import DICOMwebHTTPError

router = APIRouter(tags=["Share links"])

DEFAULT_SECONDS = 7 * 86400
#: the query parameter a share token may come in (api/auth.py)
QUERY_PARAMETER = "share"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _json(value: object, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _public(share: Share, now: float) -> dict:
    """A link as ``GET /shares`` lists it: never its token (nor the token's hash)."""
    return {"id": share.id, "study": share.study_uid, "created": _iso(share.created),
            "expires": _iso(share.expires), "creator": share.creator, "revoked": share.revoked,
            "active": share.valid(now)}


def viewer_url(request: Request, dicomweb_root: str, study: str, token: str) -> str:
    """The viewer's page of ``study`` (viewer.py: ``/viewer/viewer?StudyInstanceUIDs=``) with
    the token as OHIF's ``token`` parameter (OHIF then sends it as ``Authorization:
    Bearer`` on its DICOMweb requests). The viewer is served at the origin's ``/viewer``:
    the DICOMweb root without the archive's ``--prefix``."""
    prefix = request.app.state.settings.prefix
    origin = dicomweb_root[: -len(prefix)] if prefix and dicomweb_root.endswith(prefix) else dicomweb_root
    return f"{origin}/viewer/viewer?StudyInstanceUIDs={quote(study)}&token={quote(token)}"


async def _expires_in(request: Request) -> int:
    maximum = request.app.state.settings.share_max_seconds
    body = await read_body(request, 4096, "a share request")
    if not body.strip():
        return min(DEFAULT_SECONDS, maximum)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise DICOMwebHTTPError(400, f"the body is not JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) - {"expires_in"}:
        raise DICOMwebHTTPError(400, 'expected {"expires_in": seconds} (or no body)')
    value = doc.get("expires_in", min(DEFAULT_SECONDS, maximum))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= maximum:
        raise DICOMwebHTTPError(400, f"expires_in: a number of seconds above 0, at most {maximum} "
                                     "(share_max_seconds)")
    return value


@router.post("/studies/{study}/share", status_code=201, summary="Make a share link to a study")
async def create_share(request: Request, archive: ArchiveDep, study: StudyUID, allowed: Allowed,
                       root: BaseURL) -> Response:
    """201 ``{"id", "token", "url", "dicomweb", "expires"}``: ``url`` opens the study in the
    viewer, ``dicomweb`` is the DICOMweb root to call with ``Authorization: Bearer <token>``
    (or ``?share=<token>``). The token is shown here only."""
    expires_in = await _expires_in(request)
    if await run_in_threadpool(archive.index.labels, study, allowed) is None:
        raise DICOMwebHTTPError(404, "no such study")
    identity = request.scope.get("state", {}).get("identity")
    token, now = secrets.token_urlsafe(32), time.time()
    share = Share(secrets.token_hex(8), token_hash(token), study, now, now + expires_in,
                  identity.subject if identity is not None else None)
    await run_in_threadpool(archive.index.put_share, share)
    return _json({"id": share.id, "token": token, "url": viewer_url(request, root, study, token),
                  "dicomweb": root, "study": study, "expires": _iso(share.expires)}, 201)


async def _visible(archive, shares: list[Share], allowed) -> list[Share]:
    if allowed.unrestricted:
        return shares
    seen: dict[str, bool] = {}
    for s in shares:
        if s.study_uid not in seen:
            seen[s.study_uid] = await run_in_threadpool(archive.index.labels, s.study_uid, allowed) is not None
    return [s for s in shares if seen[s.study_uid]]


@router.get("/shares", summary="The share links")
async def list_shares(archive: ArchiveDep, allowed: Allowed) -> Response:
    """The links to the studies the caller may see, newest first, revoked and expired ones
    too (``active``: usable now); never a token."""
    now = time.time()
    shares = await _visible(archive, await run_in_threadpool(archive.index.shares), allowed)
    return _json([_public(s, now) for s in shares])


@router.delete("/shares/{share_id}", summary="Revoke a share link")
async def revoke_share(archive: ArchiveDep, allowed: Allowed,
                       share_id: Annotated[str, PathParam(description="the link's id")]) -> Response:
    """200 with the link, revoked (idempotent); 404 for an unknown id or a link to a study
    the caller may not see. The link's next use is 401."""
    share = await run_in_threadpool(archive.index.share, share_id)
    if share is None or not await _visible(archive, [share], allowed):
        raise DICOMwebHTTPError(404, "no such share link")
    await run_in_threadpool(archive.index.revoke_share, share_id)
    return _json(_public(await run_in_threadpool(archive.index.share, share_id), time.time()))

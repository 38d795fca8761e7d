"""Shared pieces of the web layer: the archive of the app, the base URL written
into RetrieveURL/BulkDataURI, and UID path parameters (validated before any use,
so no path segment a client sends can name a file)."""

from __future__ import annotations

from typing import Annotated

from urllib.parse import unquote

from fastapi import Depends, Path, Request

from ..access.filter import Filter, only_study
from ..access.rules import FULL, Access
from ..archive import Archive
from ..dicom.media_types import MediaRange, accept_parameter, charset_parameter, parse_accept
from ..dicom.uids import validate_uid
from .errors import DICOMwebHTTPError


async def get_archive(request: Request) -> Archive:
    return request.app.state.archive


async def base_url(request: Request) -> str:  # async: FastAPI runs sync dependencies in a thread
    """Absolute URL of the DICOMweb root (``--public-url``, else from the request)."""
    settings = request.app.state.settings
    if settings.public_url:
        return settings.public_url.rstrip("/")
    return str(request.base_url).rstrip("/") + settings.prefix


def acceptable(request: Request) -> list[MediaRange]:
    """The Acceptable Media Types of a request (PS3.18 §8.7.5): the ``accept`` query
    parameter's, in the place of the Accept header's, when the query has one
    (§8.3.3.1), else the Accept header's; a ``charset`` query parameter is checked
    (§8.3.3.2). The parameter names are case-sensitive; the values are percent-decoded
    as RFC 3986 says (a ``+`` is a plus sign, except next to ``;``/``,``/``=``).

    Raises
    ------
    media_types.BadNegotiationParameter
        An invalid or unsupported ``accept`` or ``charset`` value (HTTP 400).
    """
    header = request.headers.get("accept")
    raw = request.scope.get("query_string") or b""
    if b"accept=" not in raw and b"charset=" not in raw:
        return parse_accept(header)
    found: dict[str, list[str]] = {"accept": [], "charset": []}
    for item in raw.decode("latin-1").split("&"):
        name, _, value = item.partition("=")
        if name in found:
            found[name].append(unquote(value, errors="replace"))
    if found["charset"]:
        charset_parameter(found["charset"])
    if found["accept"]:
        return accept_parameter(found["accept"], header)
    return parse_accept(header)


def checked_uid(value: str, what: str) -> str:
    try:
        return validate_uid(value)
    except ValueError as e:
        raise DICOMwebHTTPError(400, f"{what}: {e}") from None


async def _study(study: Annotated[str, Path(description="StudyInstanceUID")]) -> str:
    return checked_uid(study, "StudyInstanceUID")


async def _series(series: Annotated[str, Path(description="SeriesInstanceUID")]) -> str:
    return checked_uid(series, "SeriesInstanceUID")


async def _instance(instance: Annotated[str, Path(description="SOPInstanceUID")]) -> str:
    return checked_uid(instance, "SOPInstanceUID")


def access_of(request: Request) -> Access:
    """What the request's identity may see (access/rules.py); everything when no rules
    are configured or no authentication identified anyone. A share link's identity
    (api/auth.py, api/shares.py): its one study, whatever the rules."""
    state = request.scope.get("state", {})
    identity = state.get("identity")
    if identity is not None and identity.method == "share":
        return Access(only_study(state["share"].study_uid))
    rules = getattr(request.app.state, "access", None)
    return rules.access(identity) if rules is not None else FULL


async def _allowed(request: Request) -> Filter:
    return access_of(request).filter


async def read_body(request: Request, limit: int, what: str = "the body") -> bytes:
    """The request body, read as it arrives and refused (413) once past ``limit`` bytes
    (a Content-Length above it before any is read): never held whole when too large."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise DICOMwebHTTPError(413, f"{what} is at most {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise DICOMwebHTTPError(413, f"{what} is at most {limit} bytes")
    return bytes(body)


async def _unrestricted(request: Request) -> None:
    """Resources that are not studies (the modality worklist, the list of rejected
    instances' UIDs across studies) are for callers who may see every study: a caller
    restricted by access rules, or a share link, gets 403."""
    if not access_of(request).filter.unrestricted:
        raise DICOMwebHTTPError(403, "this resource needs access to every study; these credentials are "
                                     "restricted by access rules (labels) or to one shared study")


ArchiveDep = Annotated[Archive, Depends(get_archive)]
BaseURL = Annotated[str, Depends(base_url)]
StudyUID = Annotated[str, Depends(_study)]
SeriesUID = Annotated[str, Depends(_series)]
SOPInstanceUID = Annotated[str, Depends(_instance)]
#: the studies the request may see: handed to every Index read (access/filter.py)
Allowed = Annotated[Filter, Depends(_allowed)]
#: a route for callers unrestricted by access rules (:func:`_unrestricted`)
Unrestricted = Depends(_unrestricted)


async def _visible_study(request: Request, study: StudyUID) -> str:
    """The study of the path, when the request may see it; else 404 "no such study", as for
    one that does not exist (the routes that change a study: $update, reject, export)."""
    allowed = access_of(request).filter
    if not allowed.unrestricted:
        from starlette.concurrency import run_in_threadpool

        if await run_in_threadpool(request.app.state.archive.index.labels, study, allowed) is None:
            raise DICOMwebHTTPError(404, "no such study")
    return study


#: a StudyInstanceUID of the path that the request may see (404 otherwise)
VisibleStudyUID = Annotated[str, Depends(_visible_study)]

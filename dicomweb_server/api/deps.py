"""Shared pieces of the web layer: the archive of the app, the base URL written
into RetrieveURL/BulkDataURI, and UID path parameters (validated before any use,
so no path segment a client sends can name a file)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from ..archive import Archive
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


ArchiveDep = Annotated[Archive, Depends(get_archive)]
BaseURL = Annotated[str, Depends(base_url)]
StudyUID = Annotated[str, Depends(_study)]
SeriesUID = Annotated[str, Depends(_series)]
SOPInstanceUID = Annotated[str, Depends(_instance)]

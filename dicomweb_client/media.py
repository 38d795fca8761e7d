"""Accept header values from ``media_types`` arguments (PS3.18 Section 8.7).

``media_types`` follows the PyPI ``dicomweb-client`` convention: a sequence
whose items are either a media type (``"image/jpeg"``) or a pair
``(media type, transfer syntax UID)`` (``("application/dicom", "*")``,
``("image/jpeg", "1.2.840.10008.1.2.4.50")``). A full Accept item such as
``'multipart/related; type="image/jpeg"'`` is also accepted and sent as is.
"""
from __future__ import annotations

import re
from typing import Sequence, Tuple, Union

from .media_type import parse_media_type

__all__ = [
    "DICOM",
    "DICOM_JSON",
    "OCTET_STREAM",
    "MediaTypes",
    "normalize_media_types",
    "multipart_accept",
    "plain_accept",
    "require_category",
]

DICOM = "application/dicom"
DICOM_JSON = "application/dicom+json"
OCTET_STREAM = "application/octet-stream"

#: One media type, or (media type, transfer syntax UID)
MediaTypeItem = Union[str, Tuple[str, str], Tuple[str]]
MediaTypes = Sequence[MediaTypeItem]

_MEDIA_TYPE = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9!#$&^_.+*-]*/[A-Za-z0-9*][A-Za-z0-9!#$&^_.+*-]*$")
_UID_OR_STAR = re.compile(r"^(\*|[0-9]+(\.[0-9]+)*)$")


def normalize_media_types(media_types: MediaTypes | str | None) -> list[tuple[str, str | None]]:
    """Validate ``media_types`` and return ``[(media_type, transfer_syntax or None)]``.

    Raises
    ------
    TypeError
        ``media_types`` is not a sequence (a bare string is accepted as one item).
    ValueError
        A malformed media type or transfer syntax UID.
    """
    if media_types is None:
        return []
    if isinstance(media_types, str):
        media_types = [media_types]
    if not isinstance(media_types, (list, tuple)):
        raise TypeError("media_types must be a sequence of media types or (media type, transfer syntax) pairs")
    out: list[tuple[str, str | None]] = []
    for item in media_types:
        if isinstance(item, str):
            mt, ts = item, None
        elif isinstance(item, (list, tuple)) and 1 <= len(item) <= 2 and all(isinstance(x, str) for x in item):
            mt = item[0]
            ts = item[1] if len(item) == 2 else None
        else:
            raise TypeError(f"invalid media type item {item!r}")
        mt = mt.strip()
        if ";" in mt:  # a full Accept item, e.g. 'multipart/related; type="image/jpeg"'
            base, _params = parse_media_type(mt)
            if not _MEDIA_TYPE.match(base):
                raise ValueError(f"not a valid media type: {mt!r}")
            out.append((mt, ts))
            continue
        if not _MEDIA_TYPE.match(mt):
            raise ValueError(f"not a valid media type: {mt!r}")
        if ts is not None:
            ts = ts.strip()
            if not _UID_OR_STAR.match(ts):
                raise ValueError(f"not a valid transfer syntax UID: {ts!r}")
        out.append((mt.lower(), ts))
    if not out:
        raise ValueError("media_types must not be empty")
    return out


def multipart_accept(media_types: MediaTypes | str | None, default: MediaTypes = ()) -> str:
    """Accept value asking for ``multipart/related`` with each media type.

    Parameters
    ----------
    media_types : MediaTypes or None
        Requested media types; ``default`` when None.
    default : MediaTypes
        Used when ``media_types`` is None.

    Returns
    -------
    str
        e.g. ``multipart/related; type="application/dicom"; transfer-syntax=*``
    """
    items = normalize_media_types(media_types if media_types is not None else default)
    values = []
    for mt, ts in items:
        if ";" in mt or mt.startswith("multipart/"):
            values.append(mt if ts is None else f"{mt}; transfer-syntax={ts}")
            continue
        # type= is always quoted: the '/' in a media type is a separator (RFC 9110)
        value = f'multipart/related; type="{mt}"'
        if ts is not None:
            value += f"; transfer-syntax={ts}"
        values.append(value)
    return ", ".join(values)


def plain_accept(media_types: MediaTypes | str | None, default: MediaTypes | None = None) -> str | None:
    """Accept value for single-part answers (``"image/png, image/jpeg"``); None if nothing to ask."""
    if media_types is None:
        if default is None:
            return None
        media_types = default
    values = []
    for mt, ts in normalize_media_types(media_types):
        values.append(mt if ts is None else f"{mt}; transfer-syntax={ts}")
    return ", ".join(values)


def require_category(media_types: MediaTypes | str | None, allowed: Sequence[str], what: str) -> None:
    """Raise ValueError unless every media type is one of ``allowed`` (prefixes ending with ``/`` match a family).

    Raises
    ------
    ValueError
        A media type that the resource cannot be retrieved as.
    """
    for mt, _ in normalize_media_types(media_types):
        base = parse_media_type(mt)[0] if ";" in mt else mt
        if base.startswith("multipart/"):
            base = parse_media_type(mt)[1].get("type", "").lower()
        ok = any(base == a or (a.endswith("/") and base.startswith(a)) for a in allowed)
        if not ok:
            raise ValueError(
                f"media type {mt!r} is not supported for {what}; use one of {', '.join(allowed)}"
            )

"""URLs and query strings of DICOMweb resources (PS3.18 Sections 10.4, 10.5, 10.6).

Everything here is pure string building; nothing does I/O.

Resources, relative to the service base URL (the service root of PS3.18)::

    studies                                   QIDO search / STOW store
    studies/{s}                               WADO retrieve / STOW store / DELETE
    studies/{s}/series                        QIDO
    series                                    QIDO
    studies/{s}/series/{se}                   WADO / DELETE
    studies/{s}/series/{se}/instances         QIDO
    studies/{s}/instances                     QIDO
    instances                                 QIDO
    studies/{s}/series/{se}/instances/{i}     WADO / DELETE
    .../metadata  .../rendered  .../thumbnail
    studies/{s}/series/{se}/instances/{i}/frames/{1,2,3}[/rendered|/thumbnail]

UIDs are percent-encoded as single path segments (a UID is digits and dots,
but a wrong value must never change the path's structure).
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote, urljoin, urlsplit

__all__ = [
    "SEARCH",
    "RETRIEVE",
    "STORE",
    "DELETE",
    "DICOMwebURLs",
    "uid_segment",
    "frame_list",
    "search_params",
    "rendering_params",
    "format_filter_value",
    "normalize_attribute",
    "split_resource_url",
]

SEARCH = "search"
RETRIEVE = "retrieve"
STORE = "store"
DELETE = "delete"
_TRANSACTIONS = (SEARCH, RETRIEVE, STORE, DELETE)


def uid_segment(uid: str, name: str = "UID") -> str:
    """Percent-encode a UID as one path segment.

    Parameters
    ----------
    uid : str
        The UID (``"1.2.840.10008.1.2.1"``).
    name : str
        What the UID is, for the error message.

    Returns
    -------
    str
        The encoded segment (``/`` and every reserved character escaped).

    Raises
    ------
    ValueError
        If ``uid`` is empty or None.
    TypeError
        If ``uid`` is not a string.
    """
    if uid is None or uid == "":
        raise ValueError(f"{name} is required")
    if not isinstance(uid, str):
        raise TypeError(f"{name} must be a str, not {type(uid).__name__}")
    uid = uid.strip().rstrip("\x00")
    if not uid:
        raise ValueError(f"{name} is required")
    return quote(uid, safe="")


def frame_list(frame_numbers: Iterable[int] | int) -> str:
    """Comma-separated 1-based frame numbers (PS3.18 10.4.1.1.6, pixel data resources).

    Raises
    ------
    ValueError
        Empty list, or a number below 1.
    TypeError
        A value that is not an integer.
    """
    if isinstance(frame_numbers, int):
        frame_numbers = [frame_numbers]
    out = []
    for n in frame_numbers:
        if isinstance(n, bool):
            raise TypeError(f"frame numbers must be integers, got {n!r}")
        if hasattr(n, "__index__"):  # int, numpy integers
            n = n.__index__()
        elif isinstance(n, str) and n.strip().isdigit():
            n = int(n)
        else:
            raise TypeError(f"frame numbers must be integers, got {n!r}")
        if n < 1:
            raise ValueError(f"frame numbers are 1-based, got {n}")
        out.append(str(n))
    if not out:
        raise ValueError("at least one frame number is required")
    return ",".join(out)


class DICOMwebURLs:
    """Builds the URL of every DICOMweb resource of one service.

    Parameters
    ----------
    base_url : str
        Service root, e.g. ``"http://127.0.0.1:8080"`` or
        ``"https://host/dicom-web"`` (a trailing slash is ignored).
    qido_url_prefix, wado_url_prefix, stow_url_prefix, delete_url_prefix : str, optional
        Extra path segment per transaction, for servers that split services
        (same meaning as in the PyPI ``dicomweb-client``).

    Raises
    ------
    ValueError
        If the base URL is not an absolute http(s) URL or a prefix is empty.
    """

    def __init__(
        self,
        base_url: str,
        *,
        qido_url_prefix: str | None = None,
        wado_url_prefix: str | None = None,
        stow_url_prefix: str | None = None,
        delete_url_prefix: str | None = None,
    ) -> None:
        base_url = str(base_url).strip()
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base URL must be an absolute http(s) URL, got {base_url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"base URL must not have a query or fragment: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._prefix: dict[str, str] = {}
        for transaction, prefix in (
            (SEARCH, qido_url_prefix),
            (RETRIEVE, wado_url_prefix),
            (STORE, stow_url_prefix),
            (DELETE, delete_url_prefix),
        ):
            if prefix is not None:
                prefix = prefix.strip("/")
                if not prefix:
                    raise ValueError(f"URL prefix for {transaction} must not be empty")
                self._prefix[transaction] = "/" + prefix
        self.qido_url_prefix = qido_url_prefix
        self.wado_url_prefix = wado_url_prefix
        self.stow_url_prefix = stow_url_prefix
        self.delete_url_prefix = delete_url_prefix

    def root(self, transaction: str = RETRIEVE) -> str:
        """Service root for a transaction (base URL plus its prefix, if any)."""
        if transaction not in _TRANSACTIONS:
            raise ValueError(f"unknown transaction {transaction!r}")
        return self.base_url + self._prefix.get(transaction, "")

    # Resource URLs ---------------------------------------------------------
    def studies(self, transaction: str, study_instance_uid: str | None = None) -> str:
        """``{root}/studies[/{study}]``."""
        url = self.root(transaction) + "/studies"
        if study_instance_uid is not None:
            url += "/" + uid_segment(study_instance_uid, "Study Instance UID")
        return url

    def series(
        self, transaction: str, study_instance_uid: str | None = None, series_instance_uid: str | None = None
    ) -> str:
        """``{root}/series``, ``{root}/studies/{s}/series[/{se}]``."""
        if study_instance_uid is None:
            if series_instance_uid is not None:
                raise ValueError("Series Instance UID given without Study Instance UID")
            return self.root(transaction) + "/series"
        url = self.studies(transaction, study_instance_uid) + "/series"
        if series_instance_uid is not None:
            url += "/" + uid_segment(series_instance_uid, "Series Instance UID")
        return url

    def instances(
        self,
        transaction: str,
        study_instance_uid: str | None = None,
        series_instance_uid: str | None = None,
        sop_instance_uid: str | None = None,
    ) -> str:
        """``{root}/instances``, ``.../studies/{s}/instances``, ``.../series/{se}/instances[/{i}]``."""
        if sop_instance_uid is not None and (study_instance_uid is None or series_instance_uid is None):
            raise ValueError("SOP Instance UID needs Study and Series Instance UIDs")
        if study_instance_uid is None:
            if series_instance_uid is not None:
                raise ValueError("Series Instance UID given without Study Instance UID")
            return self.root(transaction) + "/instances"
        if series_instance_uid is None:
            return self.studies(transaction, study_instance_uid) + "/instances"
        url = self.series(transaction, study_instance_uid, series_instance_uid) + "/instances"
        if sop_instance_uid is not None:
            url += "/" + uid_segment(sop_instance_uid, "SOP Instance UID")
        return url

    def study(self, study_instance_uid: str, transaction: str = RETRIEVE) -> str:
        """The study resource (WADO-RS, DELETE)."""
        return self.studies(transaction, study_instance_uid)

    def one_series(self, study_instance_uid: str, series_instance_uid: str, transaction: str = RETRIEVE) -> str:
        """The series resource (WADO-RS, DELETE); both UIDs required."""
        uid_segment(series_instance_uid, "Series Instance UID")
        return self.series(transaction, study_instance_uid, series_instance_uid)

    def instance(
        self, study_instance_uid: str, series_instance_uid: str, sop_instance_uid: str, transaction: str = RETRIEVE
    ) -> str:
        """The instance resource (WADO-RS, DELETE); all three UIDs required."""
        uid_segment(series_instance_uid, "Series Instance UID")
        uid_segment(sop_instance_uid, "SOP Instance UID")
        return self.instances(transaction, study_instance_uid, series_instance_uid, sop_instance_uid)

    def frames(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        frame_numbers: Iterable[int] | int,
    ) -> str:
        """``.../instances/{i}/frames/{1,2,3}`` (PS3.18 10.4.1.1.6)."""
        return (
            self.instance(study_instance_uid, series_instance_uid, sop_instance_uid)
            + "/frames/"
            + frame_list(frame_numbers)
        )

    def resolve(self, url: str) -> str:
        """Resolve a (possibly relative) URL, e.g. a BulkDataURI, against the WADO root."""
        if not url:
            raise ValueError("empty URL")
        if urlsplit(url).scheme:
            return url
        return urljoin(self.root(RETRIEVE) + "/", url)


# --------------------------------------------------------------------------
# Query strings
# --------------------------------------------------------------------------
def normalize_attribute(key: Any) -> str:
    """A filter/field key as sent: keywords and 8-hex-digit tags as given;
    integers, ``(group, element)`` tuples and pydicom tags as 8 upper-case hex digits.
    Dotted sequence paths (``"ReferencedSeriesSequence.SeriesInstanceUID"``) pass through.
    """
    if isinstance(key, str):
        key = key.strip()
        if not key:
            raise ValueError("empty attribute key")
        return key
    if isinstance(key, tuple) and len(key) == 2:
        return f"{int(key[0]):04X}{int(key[1]):04X}"
    if isinstance(key, int):
        return f"{key:08X}"
    raise TypeError(f"attribute keys must be keywords or tags, got {key!r}")


def format_filter_value(value: Any) -> str:
    """Format one QIDO matching value (PS3.18 8.3.4.1).

    - str: as is (wildcards ``*``/``?`` and ranges ``a-b`` are the caller's)
    - bool: ``true``/``false``
    - int/float: decimal
    - date/datetime/time: DICOM DA / DT / TM
    - (start, end) tuple of dates/times/strings (either may be None): a range ``start-end``
    - other sequences: a UID list / multiple values, comma separated
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, _dt.datetime):
        return value.strftime("%Y%m%d%H%M%S") + (f".{value.microsecond:06d}" if value.microsecond else "")
    if isinstance(value, _dt.date):
        return value.strftime("%Y%m%d")
    if isinstance(value, _dt.time):
        return value.strftime("%H%M%S") + (f".{value.microsecond:06d}" if value.microsecond else "")
    if isinstance(value, tuple) and len(value) == 2 and any(
        isinstance(v, (_dt.date, _dt.time)) or v is None for v in value
    ):
        start, end = value
        return ("" if start is None else format_filter_value(start)) + "-" + (
            "" if end is None else format_filter_value(end)
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(format_filter_value(v) for v in value)
    return str(value)


def search_params(
    *,
    search_filters: Mapping[Any, Any] | None = None,
    fields: Sequence[Any] | None = None,
    fuzzymatching: bool | None = None,
    limit: int | None = None,
    offset: int | None = None,
) -> list[tuple[str, str]]:
    """QIDO-RS query parameters (PS3.18 8.3.4), in a stable order.

    Parameters
    ----------
    search_filters : Mapping, optional
        ``{keyword or tag: value}``; see :func:`format_filter_value`.
    fields : sequence, optional
        Attributes to include; one ``includefield`` parameter each
        (``["all"]`` asks for every attribute).
    fuzzymatching : bool, optional
        ``fuzzymatching=true|false``.
    limit, offset : int, optional
        Paging. Must be >= 0 (limit > 0).

    Returns
    -------
    list of (str, str)
        Ready for ``httpx`` ``params=`` (repeats preserved).

    Raises
    ------
    ValueError
        Negative offset, non-positive limit.
    """
    params: list[tuple[str, str]] = []
    for key, value in (search_filters or {}).items():
        if value is None:
            continue
        params.append((normalize_attribute(key), format_filter_value(value)))
    if fields:
        if isinstance(fields, str):
            fields = [fields]
        seen = set()
        for f in fields:
            name = normalize_attribute(f)
            if name not in seen:
                seen.add(name)
                params.append(("includefield", name))
    if fuzzymatching is not None:
        params.append(("fuzzymatching", "true" if fuzzymatching else "false"))
    if limit is not None:
        limit = int(limit)
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        params.append(("limit", str(limit)))
    if offset is not None:
        offset = int(offset)
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        params.append(("offset", str(offset)))
    return params


def _csv(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    raise TypeError(f"{name} must be a string or a sequence, got {value!r}")


def rendering_params(
    params: Mapping[str, Any] | None = None,
    *,
    window: Any = None,
    viewport: Any = None,
    quality: int | None = None,
    annotation: Any = None,
) -> list[tuple[str, str]]:
    """Query parameters of rendered and thumbnail resources (PS3.18 8.3.5).

    Parameters
    ----------
    params : Mapping, optional
        Raw parameters (PyPI ``dicomweb-client`` style), sent as given.
    window : (center, width[, function]) or str, optional
        ``window=center,width,function`` (function: linear, linear_exact, sigmoid).
    viewport : (vw, vh[, sx, sy, sw, sh]) or str, optional
        ``viewport=...``.
    quality : int, optional
        1-100, for lossy media types.
    annotation : str or sequence, optional
        e.g. ``"patient,technique"``.

    Returns
    -------
    list of (str, str)
    """
    out: list[tuple[str, str]] = []
    for k, v in (params or {}).items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            v = ",".join(str(x) for x in v)
        out.append((str(k), str(v)))
    if window is not None:
        w = _csv(window, "window")
        if not isinstance(window, str) and len(window) == 2:
            w += ",linear"
        out.append(("window", w))
    if viewport is not None:
        out.append(("viewport", _csv(viewport, "viewport")))
    if quality is not None:
        q = int(quality)
        if not 1 <= q <= 100:
            raise ValueError(f"quality must be in 1..100, got {quality}")
        out.append(("quality", str(q)))
    if annotation is not None:
        out.append(("annotation", _csv(annotation, "annotation")))
    return out


#: the resource paths of PS3.18 §10.4-10.6 a URL may end with, by their collection names
_RESOURCE_SHAPES = (
    ("studies",), ("studies", "{study}"), ("studies", "{study}", "series"),
    ("studies", "{study}", "series", "{series}"), ("studies", "{study}", "series", "{series}", "instances"),
    ("studies", "{study}", "series", "{series}", "instances", "{instance}"), ("studies", "{study}", "instances"),
    ("series",), ("instances",),
)


def split_resource_url(url: str) -> tuple[str, dict[str, str]]:
    """The service root of ``url`` and what the resource path after it names.

    ``url`` is a service root (``http://h:8080/dicomweb``) or the URL of a resource
    under it (``.../studies``, ``.../studies/{study}/series/{series}``, ``.../instances``;
    PS3.18 §10.4, §10.6), as copied from a browser or a server's page. Returns the root
    (no trailing ``/``) and ``{"level": "studies" | "series" | "instances"}`` when the
    path ends with a collection, plus ``"study"``, ``"series"``, ``"instance"`` for the
    UIDs it names (percent-decoded). A query string or fragment is dropped. The first
    place where the rest of the path is a whole resource path is taken; a root with no
    resource path gives ``{}``.
    """
    from urllib.parse import unquote

    parts = urlsplit(url.strip())
    segments = parts.path.rstrip("/").split("/")
    if len(segments) > 2 and segments[-1] == "metadata":  # .../metadata of a resource: the resource
        segments = segments[:-1]
    for i, seg in enumerate(segments):
        if seg not in ("studies", "series", "instances"):
            continue
        rest = segments[i:]
        for shape in _RESOURCE_SHAPES:
            if len(shape) == len(rest) and all(
                    (s.startswith("{") and r) or s == r for s, r in zip(shape, rest)):
                found = {s[1:-1]: unquote(r) for s, r in zip(shape, rest) if s.startswith("{")}
                if not shape[-1].startswith("{"):
                    found["level"] = shape[-1]
                root = parts._replace(path="/".join(segments[:i]), query="", fragment="").geturl()
                return root.rstrip("/"), found
    return parts._replace(query="", fragment="").geturl().rstrip("/"), {}

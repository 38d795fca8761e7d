"""Default Accept values that every DICOMweb server serves, and the one retry.

When the caller gives no ``media_types``, the client asks for the broadly
supported forms first, ranked with q-values (RFC 9110 Section 12.5.1). Some
servers do not parse an Accept list: Orthanc's DICOMweb plugin 1.7 answers
400 to ``multipart/related; type="*/*"`` and to any list with several items.
So on a 400 or 406 answer to a default Accept, the request is sent once more
with the plainest form PS3.18 requires every origin server to support
(Section 8.7.3: ``application/dicom`` and ``application/octet-stream`` in
Explicit VR Little Endian, Tables 8.7.3-2 and 8.7.3-5; Section 8.7.4 /
10.4.1.1.3: ``image/jpeg`` for rendered resources). A client remembers
which kinds of resource needed the plain form and asks for it directly from
then on. A media type given by the caller is sent as is and never retried.

Why any 400, not only one that names the media type: Orthanc's 400 for an
Accept list on a rendered resource says only "Parameter out of range". A 400
for another reason (a bad frame number) costs one extra request and the second
answer's error is raised.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._core import RequestSpec

__all__ = ["BULKDATA", "FRAMES", "INSTANCES", "RENDERED", "RENDERED_MULTIPART", "AcceptDefault", "default_request"]

#: Status codes after which a default Accept is replaced by the plain form.
FALLBACK_STATUSES = frozenset({400, 406})


@dataclass(frozen=True)
class AcceptDefault:
    """The default Accept of one kind of resource.

    Attributes
    ----------
    kind : str
        Name of the resource kind (the unit a client remembers).
    preferred : str
        Sent first: the broadly supported forms, ranked with q-values.
    plain : str
        Sent after a 400/406: the form every server must support (PS3.18 8.7.3).
    """

    kind: str
    preferred: str
    plain: str


_OCTET_AS_STORED = 'multipart/related; type="application/octet-stream"; transfer-syntax=*'
_OCTET = 'multipart/related; type="application/octet-stream"'
_DICOM = 'multipart/related; type="application/dicom"'

#: Instances (study, series, instance): as stored, else Explicit VR Little Endian.
INSTANCES = AcceptDefault("instances", f"{_DICOM}; transfer-syntax=*, {_DICOM}; q=0.9", _DICOM)
#: Frames: as stored, else native pixels, else anything the server has.
FRAMES = AcceptDefault(
    "frames", f'{_OCTET_AS_STORED}, {_OCTET}; q=0.9, multipart/related; type="*/*"; q=0.5', _OCTET
)
#: Bulk data items (BulkDataURI): as for frames.
BULKDATA = AcceptDefault("bulkdata", FRAMES.preferred, _OCTET)
#: Rendered and thumbnail resources, one image: JPEG, PNG, else what the server renders (PDF, text).
RENDERED = AcceptDefault("rendered", "image/jpeg, image/png; q=0.9, */*; q=0.1", "image/jpeg")
#: Rendered images as ``multipart/related`` (the ``iter_*_rendered`` methods).
RENDERED_MULTIPART = AcceptDefault(
    "rendered-multipart",
    'multipart/related; type="image/jpeg", multipart/related; type="image/png"; q=0.9',
    'multipart/related; type="image/jpeg"',
)


def default_request(
    default: AcceptDefault,
    url: str,
    params: tuple[tuple[str, str], ...] = (),
    headers: Mapping[str, str] | None = None,
    *,
    plain_known: bool = False,
) -> RequestSpec:
    """A GET with ``default.preferred`` whose ``fallback`` asks for ``default.plain``.

    With ``plain_known`` (the server refused the preferred form before) the
    plain request is returned directly.
    """
    plain = RequestSpec("GET", url, params, {**(headers or {}), "Accept": default.plain})
    if plain_known:
        return plain
    headers = {**(headers or {}), "Accept": default.preferred}
    return RequestSpec("GET", url, params, headers, fallback=plain, negotiation=default.kind)


def falls_back(spec: RequestSpec, status_code: int) -> bool:
    """Whether the answer ``status_code`` to ``spec`` is retried with ``spec.fallback``."""
    return spec.fallback is not None and status_code in FALLBACK_STATUSES

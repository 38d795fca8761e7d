"""Default Accept values that every DICOMweb server serves, and the one retry.

When the caller gives no ``media_types``, the client asks for the broadly
supported forms first, ranked with q-values (RFC 9110 Section 12.5.1). Some
servers do not parse an Accept list: Orthanc's DICOMweb plugin 1.7 answers
400 to ``multipart/related; type="*/*"`` and to any list with several items.
So on a 400 or 406 answer to a default Accept, the request is sent again with
single values: for instances first the one value ``transfer-syntax=*`` (PS3.18
Section 8.7.3.5.2: the instance as stored, so that a JPEG 2000 instance is not
transcoded by a server that could), then the plainest form PS3.18 requires every
origin server to support (Section 8.7.3: ``application/dicom`` and
``application/octet-stream`` in Explicit VR Little Endian, Tables 8.7.3-2 and
8.7.3-5; Section 8.7.4 / 10.4.1.1.3: ``image/jpeg`` for rendered resources). A
client remembers, per kind of resource, the first value the server took and asks
with it directly from then on (still falling back to the plain form). A media
type given by the caller is sent as is and never retried.

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
        Sent last after 400/406 answers: the form every server must support (PS3.18 8.7.3).
    single : str or None
        One value sent after a 400/406 to ``preferred``, before ``plain`` (a server
        that refuses lists may still take it).
    """

    kind: str
    preferred: str
    plain: str
    single: str | None = None

    @property
    def steps(self) -> tuple[str, ...]:
        """The Accept values in the order they are tried."""
        return (self.preferred, self.single, self.plain) if self.single else (self.preferred, self.plain)


_OCTET_AS_STORED = 'multipart/related; type="application/octet-stream"; transfer-syntax=*'
_OCTET = 'multipart/related; type="application/octet-stream"'
_DICOM = 'multipart/related; type="application/dicom"'

#: Instances (study, series, instance): as stored, else Explicit VR Little Endian; a server
#: refusing the list gets the single value "as stored" before the plain form.
INSTANCES = AcceptDefault("instances", f"{_DICOM}; transfer-syntax=*, {_DICOM}; q=0.9", _DICOM,
                          single=f"{_DICOM}; transfer-syntax=*")
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
    known: str | None = None,
) -> RequestSpec:
    """A GET with ``default.preferred`` whose ``fallback`` chain asks for the
    following :attr:`AcceptDefault.steps` in turn.

    With ``known`` (the value of ``default.steps`` the server took before) the
    chain starts there.
    """
    steps = default.steps
    if known in steps:
        steps = steps[steps.index(known):]
    spec: RequestSpec | None = None
    for accept in reversed(steps):
        spec = RequestSpec("GET", url, params, {**(headers or {}), "Accept": accept}, fallback=spec,
                           negotiation=default.kind if spec is not None else None)
    assert spec is not None
    return spec


def falls_back(spec: RequestSpec, status_code: int) -> bool:
    """Whether the answer ``status_code`` to ``spec`` is retried with ``spec.fallback``."""
    return spec.fallback is not None and status_code in FALLBACK_STATUSES

"""Accept-header parsing and content negotiation for DICOMweb resources.

References
----------
PS3.18 §8.7 (media types, transfer syntaxes, the ``transfer-syntax`` and ``type``
parameters; Tables 8.7.3-2 and 8.7.3-5), RFC 9110 §12.5.1 (Accept, q-values),
RFC 2387 (multipart/related).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

EXPLICIT_VR_LE = "1.2.840.10008.1.2.1"
IMPLICIT_VR_LE = "1.2.840.10008.1.2"
DEFLATED_LE = "1.2.840.10008.1.2.1.99"
EXPLICIT_VR_BE = "1.2.840.10008.1.2.2"
NATIVE_LE = frozenset({EXPLICIT_VR_LE, IMPLICIT_VR_LE})
#: transfer syntaxes whose pixel data is not encapsulated
UNENCAPSULATED = frozenset({EXPLICIT_VR_LE, IMPLICIT_VR_LE, DEFLATED_LE, EXPLICIT_VR_BE})

DICOM = "application/dicom"
DICOM_JSON = "application/dicom+json"
OCTET_STREAM = "application/octet-stream"
MULTIPART_RELATED = "multipart/related"

#: PS3.18 Table 8.7.3-5: frame/bulk media types and the transfer syntaxes they carry
#: (the first one of each is the media type's default).
FRAME_MEDIA_TYPES: dict[str, tuple[str, ...]] = {
    "image/jpeg": ("1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57",
                   "1.2.840.10008.1.2.4.70"),
    "image/jls": ("1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81"),
    "image/jp2": ("1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91"),
    "image/jpx": ("1.2.840.10008.1.2.4.92", "1.2.840.10008.1.2.4.93"),
    "image/x-dicom-rle": ("1.2.840.10008.1.2.5",),
    "image/jxl": ("1.2.840.10008.1.2.4.110", "1.2.840.10008.1.2.4.111", "1.2.840.10008.1.2.4.112"),
    "video/mpeg": ("1.2.840.10008.1.2.4.100", "1.2.840.10008.1.2.4.101"),
    "video/mp4": ("1.2.840.10008.1.2.4.102", "1.2.840.10008.1.2.4.103", "1.2.840.10008.1.2.4.104",
                  "1.2.840.10008.1.2.4.105", "1.2.840.10008.1.2.4.106"),
    "video/H265": ("1.2.840.10008.1.2.4.107", "1.2.840.10008.1.2.4.108"),
}
MEDIA_TYPE_OF_TS: dict[str, str] = {ts: mt for mt, tss in FRAME_MEDIA_TYPES.items() for ts in tss}
_FRAME_TYPES_LOWER = {k.lower(): (k, v) for k, v in FRAME_MEDIA_TYPES.items()}


class NotAcceptable(Exception):
    """No representation the client accepts can be produced (HTTP 406)."""


@dataclass(frozen=True, slots=True)
class MediaRange:
    """One element of an Accept header: lower-cased type, parameters (names
    lower-cased, values unquoted) and quality."""

    type: str
    params: dict[str, str] = field(default_factory=dict)
    q: float = 1.0

    def matches(self, media_type: str) -> bool:
        if self.type == "*/*":
            return True
        if self.type.endswith("/*"):
            return media_type.lower().startswith(self.type[:-1])
        return self.type == media_type.lower()


def _split(value: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes."""
    out, cur, quoted, esc = [], [], False, False
    for ch in value:
        if esc:
            cur.append(ch)
            esc = False
        elif ch == "\\" and quoted:
            cur.append(ch)
            esc = True
        elif ch == '"':
            quoted = not quoted
            cur.append(ch)
        elif ch == sep and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] == '"':
        v = v[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return v


def parse_media_type(value: str) -> MediaRange:
    """Parse one ``type/subtype; name=value`` item (names case-insensitive,
    quoted values equal to unquoted ones)."""
    items = _split(value, ";")
    mtype = items[0].strip().lower()
    params: dict[str, str] = {}
    q = 1.0
    for item in items[1:]:
        name, eq, val = item.partition("=")
        name = name.strip().lower()
        if not name or not eq:
            continue
        val = _unquote(val)
        if name == "q":
            try:
                q = max(0.0, min(1.0, float(val)))
            except ValueError:
                q = 0.0
            continue
        params[name] = val
    return MediaRange(mtype, params, q)


def parse_accept(header: str | None) -> list[MediaRange]:
    """Parse an Accept header into media ranges, highest q first (stable).

    A missing or empty header is ``*/*``. Ranges with q=0 are dropped.
    """
    if not header or not header.strip():
        return [MediaRange("*/*")]
    ranges = [parse_media_type(item) for item in _split(header, ",") if item.strip()]
    ranges = [r for r in ranges if r.q > 0 and "/" in r.type]
    return sorted(ranges, key=lambda r: -r.q)


@dataclass(frozen=True, slots=True)
class Choice:
    """The representation chosen for a DICOMweb retrieve.

    ``media_type`` is the (part) media type, ``transfer_syntax`` the syntax the
    payload will be in, ``multipart`` whether it is wrapped in multipart/related,
    ``transcode`` whether the stored data must be converted, ``defaulted`` whether
    the client left the transfer syntax unspecified.
    """

    media_type: str
    transfer_syntax: str
    multipart: bool
    transcode: bool = False
    defaulted: bool = False


def _json_like(r: MediaRange) -> bool:
    return r.type in ("*/*", "application/*", DICOM_JSON, "application/json")


def negotiate_json(accept: list[MediaRange]) -> str:
    """QIDO-RS and metadata answers (PS3.18 §8.7.3.4): always
    ``application/dicom+json``; ``application/json`` and wildcards are accepted.

    Raises
    ------
    NotAcceptable
        Only other types (e.g. ``application/dicom+xml``, ``text/html``) are acceptable.
    """
    for r in accept:
        if _json_like(r):
            return DICOM_JSON
        if r.type == MULTIPART_RELATED and r.params.get("type", "").lower() in (DICOM_JSON,):
            return DICOM_JSON
    raise NotAcceptable("this resource is available as application/dicom+json only")


def negotiate_instances(
    accept: list[MediaRange],
    stored_ts: str,
    can_transcode: Callable[[str], bool],
    single_part_allowed: bool,
) -> Choice:
    """Choose how to return instances (PS3.18 §10.4.1.1.1, §8.7.3.5.2).

    ``transfer-syntax=*`` means as stored; a missing parameter means Explicit VR
    Little Endian (Table 8.7.3-2), which is produced from any decodable source. When
    the client did not name a syntax and the source cannot be converted, the
    instance is returned as stored (``defaulted``; the web layer adds a Warning).

    Raises
    ------
    NotAcceptable
        Nothing acceptable: a single-part ``application/dicom`` for more than one
        instance, a transfer syntax that cannot be produced, or a foreign type.
    """
    reason = f"cannot produce any of the accepted representations (stored as {stored_ts})"
    for r in accept:
        if r.type == MULTIPART_RELATED:
            part = r.params.get("type", DICOM).lower()
            if part not in (DICOM, "*/*", "application/*"):
                continue
            multipart = True
        elif r.type == DICOM:
            if not single_part_allowed:
                reason = "application/dicom (single part) is only available for one instance; " \
                         'ask for multipart/related; type="application/dicom"'
                continue
            multipart = False
        elif r.type in ("*/*", "multipart/*"):
            multipart = True
        else:
            continue
        ts = r.params.get("transfer-syntax")
        if ts is None:
            if stored_ts == EXPLICIT_VR_LE:
                return Choice(DICOM, stored_ts, multipart, defaulted=True)
            if can_transcode(stored_ts):
                return Choice(DICOM, EXPLICIT_VR_LE, multipart, transcode=True, defaulted=True)
            return Choice(DICOM, stored_ts, multipart, defaulted=True)
        if ts == "*" or ts == stored_ts:
            return Choice(DICOM, stored_ts, multipart)
        if ts == EXPLICIT_VR_LE and can_transcode(stored_ts):
            return Choice(DICOM, EXPLICIT_VR_LE, multipart, transcode=True)
        reason = f"cannot convert {stored_ts} to transfer syntax {ts}"
    raise NotAcceptable(reason)


def negotiate_frames(
    accept: list[MediaRange], stored_ts: str, can_decode: Callable[[str], bool]
) -> Choice:
    """Choose how to return frames or pixel bulk data (PS3.18 §8.7.3.3, Table 8.7.3-5).

    - ``application/octet-stream`` (default ``transfer-syntax`` Explicit VR Little
      Endian): native pixels; compressed sources are decoded (``transcode``). With
      ``transfer-syntax=*`` frames are returned as stored, their part Content-Type
      naming the real syntax.
    - ``image/jpeg``, ``image/jls``, ``image/jp2``, ...: the stored codestream when the
      stored syntax belongs to that media type (and equals the requested one, if named).
    - ``*/*`` or no Accept: octet-stream for native or decodable sources, else the
      stored compressed media type.

    Raises
    ------
    NotAcceptable
        e.g. ``image/jp2`` of a JPEG Baseline instance (no transcoding between
        compressed syntaxes).
    """
    native = stored_ts in UNENCAPSULATED
    stored_media = OCTET_STREAM if native else MEDIA_TYPE_OF_TS.get(stored_ts, OCTET_STREAM)
    for r in accept:
        mtype = r.type
        if mtype == MULTIPART_RELATED:
            mtype = r.params.get("type", OCTET_STREAM).lower()
        ts = r.params.get("transfer-syntax")
        if mtype in ("*/*", "multipart/*"):
            if native or not can_decode(stored_ts):
                return Choice(stored_media, stored_ts if not native else EXPLICIT_VR_LE, True,
                              transcode=False, defaulted=True)
            return Choice(OCTET_STREAM, EXPLICIT_VR_LE, True, transcode=True, defaulted=True)
        if mtype in (OCTET_STREAM, "application/*"):
            if ts == "*":
                return Choice(OCTET_STREAM if native else stored_media, stored_ts if not native else EXPLICIT_VR_LE, True)
            if ts in (None, EXPLICIT_VR_LE):
                if native:
                    return Choice(OCTET_STREAM, EXPLICIT_VR_LE, True, defaulted=ts is None)
                if can_decode(stored_ts):
                    return Choice(OCTET_STREAM, EXPLICIT_VR_LE, True, transcode=True, defaulted=ts is None)
            continue
        found = _FRAME_TYPES_LOWER.get(mtype)
        if found is None or native:
            continue
        name, wanted = found
        if stored_ts in wanted and (ts in (None, "*") or ts == stored_ts):
            return Choice(name, stored_ts, True)
    raise NotAcceptable(
        f"frames are stored as {stored_ts} ({stored_media}); "
        "no accepted media type and transfer syntax can be produced from it"
    )

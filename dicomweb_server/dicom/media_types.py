"""Accept-header parsing and content negotiation for DICOMweb resources.

References
----------
PS3.18 §8.7 (media types, transfer syntaxes, the ``transfer-syntax`` and ``type``
parameters; Tables 8.7.3-2 and 8.7.3-5), RFC 9110 §12.5.1 (Accept, q-values),
RFC 2387 (multipart/related).
"""

from __future__ import annotations

import codecs
import re
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

#: Encapsulated Uncompressed Explicit VR Little Endian: native pixels, one fragment per
#: frame (PS3.5 A.4.11); as stored its frames are application/octet-stream.
ENCAPSULATED_UNCOMPRESSED = "1.2.840.10008.1.2.1.98"


@dataclass(frozen=True, slots=True)
class PixelMediaType:
    """One media type of PS3.18 Table 8.7.3-5 (compressed bulk data and frames).

    ``transfer_syntaxes``: the syntaxes it carries, the table's default (D) first;
    ``aliases``: names of earlier editions still sent by clients, accepted in Accept
    headers but never used as a label; ``video``: all frames form one stream (bulk data
    returns it as one part; single frames cannot be cut from it).
    """

    media_type: str
    transfer_syntaxes: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    video: bool = False


#: PS3.18 Table 8.7.3-5 (2024d/2025): THE table. Negotiation (:func:`negotiate_frames`)
#: and part labelling (:func:`pixel_media_type`) both read it, so a syntax is either
#: served under its own media type or refused; it is never labelled octet-stream.
PIXEL_MEDIA_TYPES: tuple[PixelMediaType, ...] = (
    PixelMediaType("image/jpeg", ("1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.4.50",
                                  "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57")),
    PixelMediaType("image/dicom-rle", ("1.2.840.10008.1.2.5",), aliases=("image/x-dicom-rle",)),
    PixelMediaType("image/jls", ("1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81"), aliases=("image/x-jls",)),
    PixelMediaType("image/jp2", ("1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91")),
    PixelMediaType("image/jpx", ("1.2.840.10008.1.2.4.92", "1.2.840.10008.1.2.4.93")),
    # High-Throughput JPEG 2000: the stored codestream without a JPH box is image/jphc;
    # image/jph (with the box) is a rendered media type (PS3.18 §8.7.4), not offered here.
    PixelMediaType("image/jphc", ("1.2.840.10008.1.2.4.201", "1.2.840.10008.1.2.4.202",
                                  "1.2.840.10008.1.2.4.203")),
    PixelMediaType("image/jxl", ("1.2.840.10008.1.2.4.110", "1.2.840.10008.1.2.4.111",
                                 "1.2.840.10008.1.2.4.112")),
    PixelMediaType("video/mpeg", ("1.2.840.10008.1.2.4.100", "1.2.840.10008.1.2.4.101",
                                  "1.2.840.10008.1.2.4.100.1", "1.2.840.10008.1.2.4.101.1"), video=True),
    PixelMediaType("video/mp4", ("1.2.840.10008.1.2.4.102", "1.2.840.10008.1.2.4.103",
                                 "1.2.840.10008.1.2.4.104", "1.2.840.10008.1.2.4.105",
                                 "1.2.840.10008.1.2.4.106", "1.2.840.10008.1.2.4.102.1",
                                 "1.2.840.10008.1.2.4.103.1", "1.2.840.10008.1.2.4.104.1",
                                 "1.2.840.10008.1.2.4.105.1", "1.2.840.10008.1.2.4.106.1"), video=True),
    PixelMediaType("video/H265", ("1.2.840.10008.1.2.4.107", "1.2.840.10008.1.2.4.108"), video=True),
)
_BY_TS: dict[str, PixelMediaType] = {ts: m for m in PIXEL_MEDIA_TYPES for ts in m.transfer_syntaxes}
_BY_NAME: dict[str, PixelMediaType] = {
    name.lower(): m for m in PIXEL_MEDIA_TYPES for name in (m.media_type, *m.aliases)
}


def pixel_media_type(ts: str) -> str | None:
    """The media type that labels frames / pixel bulk data stored in ``ts`` as stored:
    ``application/octet-stream`` for native (and encapsulated uncompressed) syntaxes,
    the Table 8.7.3-5 type for compressed ones, None for a compressed syntax the table
    does not name (such frames cannot be labelled honestly: 406)."""
    if ts in UNENCAPSULATED or ts == ENCAPSULATED_UNCOMPRESSED:
        return OCTET_STREAM
    m = _BY_TS.get(ts)
    return m.media_type if m is not None else None


def is_video(ts: str) -> bool:
    """Whether ``ts`` encodes all frames as one stream (MPEG-2, MPEG-4, HEVC)."""
    m = _BY_TS.get(ts)
    return m is not None and m.video


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


class BadNegotiationParameter(ValueError):
    """An ``accept`` or ``charset`` query parameter with an invalid or unsupported value
    (HTTP 400, PS3.18 §8.3.3.1, §8.3.3.2)."""


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Rendered Media Types (PS3.18 Table 8.7.4-1) that, given with a DICOM media type in one
#: Accept query parameter, make the request a 400 (§8.3.3.1)
_RENDERED = frozenset({"image/jpeg", "image/gif", "image/png", "image/jp2", "image/jph", "image/jxl",
                       "video/mpeg", "video/mp4", "video/h265", "text/html", "text/plain", "text/xml",
                       "text/rtf", "application/pdf"})
_DICOM_TYPES = frozenset({DICOM, DICOM_JSON, "application/dicom+xml"})
#: the only character set of the archive's text answers (DICOM JSON is UTF-8, PS3.18 §F.2)
UTF8 = "utf-8"


def _plus_as_space(value: str) -> str:
    """A ``+`` next to a ``;``, ``,`` or ``=`` of a query parameter is a space written
    the HTML-form way (``multipart/related;+type=...``); one inside a name
    (``application/dicom+json``) is kept."""
    return re.sub(r"\+*([;,=])\+*", r"\1", value)


def accept_parameter(values: list[str], header: str | None) -> list[MediaRange]:
    """The Acceptable Media Types of a request with an ``accept`` query parameter
    (PS3.18 §8.3.3.1, §8.7.5): the parameter's media types, highest weight first,
    in the place of the Accept header field's. ``values``: each ``accept=`` of the
    query, percent-decoded (a ``+`` is not a space, RFC 3986).

    The parameter has the Accept header's syntax without wildcards; each media type in
    it must be compatible with a media range of the Accept header (explicitly or
    through a wildcard; no header is ``*/*``); DICOM and Rendered Media Types must not
    be mixed.

    Raises
    ------
    BadNegotiationParameter
        Any of those rules broken, or a value that is not a media type (HTTP 400).
    """
    header_ranges = parse_accept(header)
    ranges: list[MediaRange] = []
    for value in values:
        for item in _split(_plus_as_space(value), ","):
            r = parse_media_type(item)
            kind, _, sub = r.type.partition("/")
            if not _TOKEN.fullmatch(kind) or not _TOKEN.fullmatch(sub):
                raise BadNegotiationParameter(f"accept: {item.strip()[:80]!r} is not a media type")
            if "*" in r.type:
                raise BadNegotiationParameter(
                    f"accept: {r.type} is a wildcard; the accept query parameter names media types "
                    "(PS3.18 8.3.3.1)")
            if not any(h.matches(r.type) for h in header_ranges):
                raise BadNegotiationParameter(
                    f"accept: {r.type} is not compatible with the Accept header ({header}); "
                    "PS3.18 8.3.3.1 requires each to match one of its media ranges")
            ranges.append(r)
    inner = {r.params.get("type", "").lower() if r.type == MULTIPART_RELATED else r.type for r in ranges}
    if inner & _DICOM_TYPES and inner & _RENDERED:
        raise BadNegotiationParameter("accept: DICOM and rendered media types together (PS3.18 8.3.3.1)")
    return sorted((r for r in ranges if r.q > 0), key=lambda r: -r.q)


def charset_parameter(values: list[str]) -> None:
    """Check a ``charset`` query parameter (PS3.18 §8.3.3.2): a comma-separated list of
    character sets, each with an optional weight, no wildcards. The archive answers in
    UTF-8 only, so the list must accept it.

    Raises
    ------
    BadNegotiationParameter
        A value that is not a known character set, a wildcard, or a list without UTF-8
        (HTTP 400, as §8.3.3.2 requires for an invalid or unsupported value).
    """
    names = []
    for value in values:
        for item in _split(value, ","):
            name, _, params = item.partition(";")
            name = _unquote(name)
            if not name or name == "*" or not _TOKEN.fullmatch(name):
                raise BadNegotiationParameter(f"charset: {item.strip()[:80]!r} is not a character set")
            try:
                canonical = codecs.lookup(name).name
            except LookupError:
                raise BadNegotiationParameter(f"charset: {name[:80]!r} is not a known character set") from None
            q = parse_media_type("x/x;" + params).q if params else 1.0
            if q > 0:
                names.append(canonical)
    if "utf-8" not in names:
        raise BadNegotiationParameter("charset: the archive's answers are in UTF-8 only; the list does not "
                                      "accept it")


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
    can_produce: Callable[[str, str], bool] | None = None,
) -> Choice:
    """Choose how to return instances (PS3.18 §10.4.1.1.1, §8.7.3.5.2).

    ``transfer-syntax=*`` means as stored; a missing parameter means Explicit VR
    Little Endian (Table 8.7.3-2), which is produced from any decodable source. When
    the client did not name a syntax and the source cannot be converted, the
    instance is returned as stored (``defaulted``; the web layer adds a Warning).
    ``can_produce(stored, asked)``: whether another named syntax (Implicit VR LE, a
    compressed one) can be produced from the stored one (policy/transcode.py); a
    lossy syntax is only ever produced this way, named by the client.

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
        if can_produce is not None and can_produce(stored_ts, ts):
            return Choice(DICOM, ts, multipart, transcode=True)
        reason = f"cannot convert {stored_ts} to transfer syntax {ts}"
    raise NotAcceptable(reason)


def negotiate_frames(
    accept: list[MediaRange], stored_ts: str, can_decode: Callable[[str], bool],
    can_produce: Callable[[str, str], bool] | None = None,
) -> Choice:
    """Choose how to return frames or pixel bulk data (PS3.18 §8.7.3.3, Tables
    8.7.3-4 and 8.7.3-5, all through :data:`PIXEL_MEDIA_TYPES`).

    - ``application/octet-stream`` (default ``transfer-syntax`` Explicit VR Little
      Endian): native pixels; compressed sources are decoded (``transcode``). With
      ``transfer-syntax=*`` frames are returned as stored, labelled with the stored
      syntax's own media type (a compressed frame is never labelled octet-stream).
    - ``image/jpeg``, ``image/jls``, ``image/jp2``, ``image/jphc``, ``image/dicom-rle``
      (or its older name ``image/x-dicom-rle``), ``video/mp4``, ...: the stored
      codestream when the stored syntax belongs to that media type (and equals the
      requested one, if named). Without a ``transfer-syntax`` parameter the stored
      syntax of that media type is returned, named in the part's Content-Type.
    - ``*/*``, ``multipart/*``: octet-stream for native or decodable sources, else the
      stored compressed media type; ``image/*``/``video/*``: the stored media type.
    - with ``can_produce(stored, asked)`` (policy/transcode.py), a compressed media
      type the stored syntax does not belong to is produced by transcoding
      (``transcode``): the syntax named by ``transfer-syntax``, else the media type's
      default (D) of Table 8.7.3-5 (always a lossless one: lossy only when named).

    Raises
    ------
    NotAcceptable
        e.g. ``image/jp2`` of a JPEG Baseline instance (no transcoding between
        compressed syntaxes), an as-stored frame of a compressed syntax that
        Table 8.7.3-5 does not name, or any frame of a video syntax.
    """
    if is_video(stored_ts):
        raise NotAcceptable(
            f"pixel data stored as {stored_ts} is one video stream holding all frames; single frames cannot be "
            "cut from it: retrieve the Pixel Data bulk data (its BulkDataURI) in its video media type")
    native = stored_ts in UNENCAPSULATED
    stored_media = pixel_media_type(stored_ts)
    as_stored_ts = EXPLICIT_VR_LE if native else stored_ts
    for r in accept:
        mtype = r.type
        if mtype == MULTIPART_RELATED:
            mtype = r.params.get("type", OCTET_STREAM).lower()
        ts = r.params.get("transfer-syntax")
        if mtype in ("*/*", "multipart/*"):
            if not native and can_decode(stored_ts):
                return Choice(OCTET_STREAM, EXPLICIT_VR_LE, True, transcode=True, defaulted=True)
            if stored_media is not None:
                return Choice(stored_media, as_stored_ts, True, defaulted=True)
            continue
        if mtype in (OCTET_STREAM, "application/*"):
            if ts == "*" and stored_media is not None:
                return Choice(stored_media, as_stored_ts, True)
            if ts in (None, EXPLICIT_VR_LE):
                if native:
                    return Choice(OCTET_STREAM, EXPLICIT_VR_LE, True, defaulted=ts is None)
                if can_decode(stored_ts):
                    return Choice(OCTET_STREAM, EXPLICIT_VR_LE, True, transcode=True, defaulted=ts is None)
            elif ts == stored_ts and stored_media == OCTET_STREAM and not native:
                return Choice(OCTET_STREAM, stored_ts, True)  # encapsulated uncompressed, as stored
            continue
        if mtype.endswith("/*") and mtype != "application/*":
            if stored_media is not None and stored_media.lower().startswith(mtype[:-1]) and ts in (None, "*"):
                return Choice(stored_media, stored_ts, True)
            continue
        found = _BY_NAME.get(mtype)
        if found is None:
            continue
        if stored_ts in found.transfer_syntaxes and (ts in (None, "*") or ts == stored_ts):
            return Choice(found.media_type, stored_ts, True)
        if can_produce is None or found.video or ts == "*":
            continue
        target = found.transfer_syntaxes[0] if ts is None else ts
        if target in found.transfer_syntaxes and can_produce(stored_ts, target):
            return Choice(found.media_type, target, True, transcode=True)
    shown = stored_media or "a compressed syntax without a PS3.18 Table 8.7.3-5 media type"
    raise NotAcceptable(
        f"frames are stored as {stored_ts} ({shown}); "
        "no accepted media type and transfer syntax can be produced from it"
    )


def names_pixel_media_type(accept: list[MediaRange]) -> bool:
    """Whether an acceptable range names a compressed pixel media type of Table
    8.7.3-5 (``image/jp2``, ``multipart/related; type="image/jls"``...): pixel data
    bulk data is then negotiated as frames are (PS3.18 §8.7.3.3.2)."""
    for r in accept:
        mtype = r.params.get("type", "").lower() if r.type == MULTIPART_RELATED else r.type
        if mtype in _BY_NAME:
            return True
    return False


def negotiate_bulkdata(accept: list[MediaRange]) -> bool:
    """Bulk data answers (PS3.18 §10.4.1.1.5, §8.7.3.3): ``multipart/related`` (the
    parts in their own media types, see :func:`pixel_media_type`), or single-part
    ``application/octet-stream`` when that is the client's first acceptable choice.
    Returns whether a single-part answer is preferred (used when there is one part).

    Raises
    ------
    NotAcceptable
        Neither multipart/related, application/octet-stream nor a wildcard is
        acceptable (checked before any bulk data is read).
    """
    for r in accept:
        if r.type in ("*/*", "multipart/*", MULTIPART_RELATED, "application/*", OCTET_STREAM):
            return r.type == OCTET_STREAM
    raise NotAcceptable('bulk data is available as multipart/related; type="application/octet-stream" '
                        "(or the pixel data's own media type) or as single-part application/octet-stream")


def negotiate_document(accept: list[MediaRange], media_type: str, rendered: bool) -> tuple[str, bool] | None:
    """Whether to answer an encapsulated document (PDF, CDA, STL, OBJ, MTL) in its own
    ``media_type`` (PS3.18 Table 8.7.4-1): (media type, multipart?) for the first
    acceptable range that names it (``multipart/related; type=...`` for a multipart
    answer), or None when an earlier range asks for the resource's other answers.

    ``rendered``: the rendered resource, where the document is the only rendition, so
    wildcards (``*/*``, ``application/*``, ``model/*``, ``text/*``) select it too; at
    the bulk data resource they keep its default (multipart/related; type=
    "application/octet-stream": the element's value as stored).
    """
    wanted = media_type.lower()
    for r in accept:
        if r.type == MULTIPART_RELATED:
            part = r.params.get("type", "").lower()
            if part == wanted:
                return media_type, True
            if not rendered:
                return None
            continue
        if r.type == wanted or (rendered and r.matches(wanted)):
            return media_type, False
        if not rendered and r.matches(OCTET_STREAM) or r.type in ("*/*", "multipart/*"):
            return None
    return None

"""Downloads (issue 29): a streamed ZIP of PS3.10 files with a DICOMDIR, and
metadata as NDJSON. Blocking generators, run by the web layer (api/downloads.py) in
worker threads; no web code here.

The ZIP is written by Python's :mod:`zipfile` into a sink that hands each written
piece on (no seek, no temporary file): on an unseekable stream zipfile writes each
member as a local header, the data, then a data descriptor (APPNOTE §4.3.9, general
purpose flag bit 3) with the CRC-32 and sizes, and ZIP64 records where sizes or
offsets pass 4 GiB (:func:`zip_member`). Members are stored (no compression: DICOM
pixel data, often compressed already, gains little for the CPU it would cost). The
standard library suffices, so no streaming-ZIP package is added.

Each file is read from the blob store in retrieve.CHUNK pieces as the client reads
(retrieve.file_chunks), so memory holds a few pieces whatever the file's or the
archive's size; the DICOMDIR (dicom/dicomdir.py), built from the index's stored JSON
of each instance (no second read of any file), is the last member: it lists the files
actually written (one deleted meanwhile is left out of both).

De-identification hook: ``transform`` (an :class:`InstanceTransform`) rewrites each
instance's file and its DICOMDIR keys in ONE call (:meth:`InstanceTransform.apply`),
both from the one rewritten data set, so the DICOMDIR's records always name what the
files hold; it may leave an instance out (:class:`Excluded`) and add a report member
(written just before the DICOMDIR). :data:`TRANSFORMS` maps a profile name of
``?deidentify=PROFILE`` to a factory of one (filled by dicomweb_server/deid/download.py).
"""

from __future__ import annotations

import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import orjson
from pydicom.datadict import keyword_for_tag

from . import retrieve
from .dicom.dicomdir import DicomDir
from .dicom.instance import BASE_URL_TOKEN
from .store.base import InstanceLocation

#: bytes handed on per piece of the answer (several CHUNKs per worker-thread hop)
PIECE = 1024 * 1024


class Excluded(Exception):
    """Raised by :meth:`InstanceTransform.apply` to leave an instance out of the download
    (the transform records why, for its report)."""


class InstanceTransform(Protocol):
    """What ``?deidentify=PROFILE`` plugs in (one object per download, so that it may
    keep state across instances: what it left out, for its report)."""

    def apply(self, loc: InstanceLocation, item: dict, chunks: Iterator[bytes]) -> tuple[dict, Iterable[bytes]]:
        """The instance as the download holds it, from the stored file's pieces and its
        stored DICOM JSON (at least the DICOMDIR's keys): the DICOM JSON of the
        transformed data set (the DICOMDIR's keys: patient, study, series, instance
        UIDs...) and the transformed PS3.10 file in pieces. :class:`Excluded` to leave
        it out."""

    def metadata(self, item: dict) -> dict:
        """An instance's whole stored DICOM JSON as transformed (``/export/metadata``)."""

    def report(self) -> tuple[str, bytes] | None:
        """A member (name, content) written after the files, or None."""


#: profile name -> factory(archive, query parameters) of an InstanceTransform (registered
#: by the de-identification package); ValueError (a 400) for parameters it cannot take
TRANSFORMS: dict[str, Callable[..., InstanceTransform]] = {}


@dataclass(frozen=True, slots=True)
class Entry:
    """One instance to write: where it is stored, and its stored DICOM JSON."""

    loc: InstanceLocation
    item: dict


class _Sink:
    """A write-only file for zipfile: keeps what is written until :meth:`take`."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.size = 0

    def write(self, data) -> int:
        b = bytes(data)
        self.pieces.append(b)
        self.size += len(b)
        return len(b)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.pieces)
        self.pieces, self.size = [], 0
        return out


def zip_member(name: str, size: int | None, when: float) -> tuple[zipfile.ZipInfo, bool]:
    """The ZipInfo of a stored member and whether it needs ZIP64 sizes from the start
    (APPNOTE §4.5.3): its size unknown (a transformed file), or past zipfile's
    ZIP64_LIMIT (2 GiB - 1; zipfile must know before it writes the local header, and
    refuses a larger member not announced). Offsets past 4 GiB (a large study) take
    ZIP64 records in the central directory whatever the members' sizes."""
    info = zipfile.ZipInfo(name, date_time=time.gmtime(when)[:6])
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    return info, size is None or size > zipfile.ZIP64_LIMIT


def zip_stream(blobs, entries: Iterable[Entry], transform: InstanceTransform | None = None,
               on_missing: Callable[[InstanceLocation, Exception], None] | None = None) -> Iterator[bytes]:
    """The ZIP, in pieces of about :data:`PIECE` bytes: each instance's file under
    its File ID, then the DICOMDIR. An instance whose file cannot be opened (deleted
    since the look-up, or missing: ``on_missing`` is told) is left out."""
    sink = _Sink()
    directory = DicomDir()
    now = time.time()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:  # type: ignore[arg-type]
        for entry in entries:
            loc = entry.loc
            try:
                chunks = retrieve.file_chunks(blobs.source(loc.path), loc)
            except retrieve.NotFound as e:
                if on_missing is not None:
                    on_missing(loc, e)
                continue
            item = entry.item
            if transform is not None:
                try:
                    item, chunks = transform.apply(loc, item, chunks)
                except Excluded:
                    close = getattr(chunks, "close", None)
                    if close is not None:  # (the stored file, when the transform did not read it all)
                        close()
                    continue
            name = directory.add(item, loc.transfer_syntax_uid)
            info, big = zip_member(name, None if transform is not None else loc.size, now)
            with zf.open(info, "w", force_zip64=big) as member:
                for chunk in chunks:
                    member.write(chunk)
                    if sink.size >= PIECE:
                        yield sink.take()
        extra = transform.report() if transform is not None else None
        if extra is not None:
            info, _ = zip_member(extra[0], len(extra[1]), now)
            zf.writestr(info, extra[1])
        info, _ = zip_member("DICOMDIR", None, now)
        zf.writestr(info, directory.encode())
    yield sink.take()


# --- metadata as NDJSON ----------------------------------------------------------------


def with_base(raw: bytes, base: str) -> bytes:
    """Stored DICOM JSON with its BulkDataURIs made absolute (dicom.instance)."""
    return raw.replace(BASE_URL_TOKEN.encode(), base.encode())


def flat(item: dict) -> dict:
    """DICOM JSON (PS3.18 §F.2) as keyword -> value: one value as itself, several as a
    list, none as None; a person name as its Alphabetic group (the Ideographic and
    Phonetic ones, when present, under ``keyword`` + ``_Ideographic``/``_Phonetic``);
    a sequence as a list of such objects. Private or unknown tags are keyed by
    their tag (8 hex digits); bulk data (BulkDataURI, InlineBinary) is left out."""
    out: dict = {}
    for tag, element in item.items():
        if "BulkDataURI" in element or "InlineBinary" in element:
            continue
        key = keyword_for_tag(int(tag, 16)) or tag
        vr = element.get("vr")
        values = element.get("Value")
        if values is None:
            out[key] = None
            continue
        if vr == "SQ":
            values = [flat(v) for v in values]
            out[key] = values
            continue
        if vr == "PN":
            for group in ("Ideographic", "Phonetic"):
                other = [v.get(group) for v in values if isinstance(v, dict)]
                if any(other):
                    out[f"{key}_{group}"] = other[0] if len(other) == 1 else other
            values = [v.get("Alphabetic") if isinstance(v, dict) else v for v in values]
        out[key] = values[0] if len(values) == 1 else values
    return out


def ndjson_lines(items: Iterable[bytes], base: str, form: str) -> Iterator[bytes]:
    """One line per stored DICOM JSON object: as stored (``dicom``), or :func:`flat`."""
    for raw in items:
        if form == "flat":
            yield orjson.dumps(flat(orjson.loads(raw))) + b"\n"
        else:
            yield with_base(raw, base) + b"\n"

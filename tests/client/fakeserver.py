"""A small in-memory DICOMweb origin server behind ``httpx.MockTransport``.

It mimics what the archive serves at its root (QIDO-RS, WADO-RS incl.
metadata, frames, bulk data, rendered, thumbnail, STOW-RS, DELETE) closely
enough to exercise every client method, and records every request so tests
can assert URLs, query strings and headers.

It is deliberately independent of the client's code: STOW bodies are parsed
with python-multipart's ``MultipartParser`` and ``email`` header parsing, and
multipart answers are assembled by hand (with an odd, quoted boundary, a
preamble and an epilogue, streamed in small chunks).
"""
from __future__ import annotations

import email.message
import fnmatch
import io
from collections import deque
from typing import Any, Callable
from urllib.parse import unquote

import httpx
import orjson
import pydicom
from pydicom.datadict import tag_for_keyword
from pydicom.tag import Tag
from python_multipart.multipart import MultipartParser

FAKE_URL = "http://dicomweb.test"
BOUNDARY = "fake=bound.ary'x+y"

STUDY_TAGS = ["00080020", "00080030", "00080050", "00100010", "00100020", "0020000D", "00200010"]
SERIES_TAGS = ["00080060", "0020000E", "00200011"]
INSTANCE_TAGS = ["00080016", "00080018", "00200013", "00280010", "00280011"]


class ChunkedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """Response body delivered in fixed-size chunks, for sync and async clients."""

    def __init__(self, data: bytes, chunk_size: int = 997) -> None:
        self.data = data
        self.chunk_size = chunk_size

    def __iter__(self):
        for i in range(0, len(self.data), self.chunk_size):
            yield self.data[i : i + self.chunk_size]

    async def __aiter__(self):
        for i in range(0, len(self.data), self.chunk_size):
            yield self.data[i : i + self.chunk_size]


def build_multipart(parts: list[tuple[dict[str, str], bytes]], boundary: str = BOUNDARY) -> bytes:
    """Hand-made multipart body with a preamble and an epilogue."""
    out = [b"This is the preamble; ignore it.\r\n"]
    b = boundary.encode()
    for headers, content in parts:
        out.append(b"--" + b + b"\r\n")
        for k, v in headers.items():
            out.append(f"{k}: {v}\r\n".encode())
        out.append(b"\r\n")
        out.append(content)
        out.append(b"\r\n")
    out.append(b"--" + b + b"--\r\nepilogue, also ignored\r\n")
    return b"".join(out)


def parse_content_type(value: str) -> tuple[str, dict[str, str]]:
    msg = email.message.Message()
    msg["content-type"] = value
    params = {k.lower(): v for k, v in msg.get_params()[1:]} if msg.get_params() else {}
    return msg.get_content_type(), params


def parse_multipart_request(body: bytes, boundary: str) -> list[tuple[dict[str, str], bytes]]:
    """Decode a request body with python-multipart (independent of the client's decoder)."""
    parts: list[tuple[dict[str, str], bytes]] = []
    cur: dict[str, Any] = {}

    def on_part_begin():
        cur["headers"] = {}
        cur["data"] = []

    def on_header_field(data, start, end):
        cur["field"] = cur.get("field", b"") + data[start:end]

    def on_header_value(data, start, end):
        cur["value"] = cur.get("value", b"") + data[start:end]

    def on_header_end():
        cur["headers"][cur.pop("field", b"").decode().lower()] = cur.pop("value", b"").decode()

    def on_part_data(data, start, end):
        cur["data"].append(data[start:end])

    def on_part_end():
        parts.append((cur["headers"], b"".join(cur["data"])))

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    parser.write(body)
    parser.finalize()
    return parts


def _tag(key: str) -> str:
    if len(key) == 8 and all(c in "0123456789abcdefABCDEF" for c in key):
        return key.upper()
    t = tag_for_keyword(key)
    if t is None:
        raise KeyError(key)
    return f"{t:08X}"


def _json_response(status: int, doc: Any, headers: dict | None = None) -> httpx.Response:
    h = {"Content-Type": "application/dicom+json"}
    h.update(headers or {})
    return httpx.Response(status, content=orjson.dumps(doc), headers=h)


def _error(status: int, detail: str) -> httpx.Response:
    return httpx.Response(status, json={"detail": detail})


class FakeArchive:
    """In-memory DICOMweb server; ``handler`` is an ``httpx.MockTransport`` handler.

    Attributes
    ----------
    requests : list of httpx.Request
        Every request received (bodies read).
    script : deque
        Responses or exceptions to return first, one per request, before normal handling.
    max_results : int or None
        Server-side cap on QIDO answers (adds a Warning header when it truncates).
    chunk_size : int
        Chunk size of multipart answers.
    ignore_range : bool
        Answer a bulk data request with a Range header with 200 and the whole value.
    single_accept : bool
        Answer 400 to a GET whose Accept holds a list or ``type="*/*"``, as
        Orthanc's DICOMweb plugin 1.7 does; and, as it does, take an instance Accept
        without ``transfer-syntax`` as Explicit VR Little Endian (PS3.18 8.7.3.5.2:
        this fake cannot transcode, so 406 for an instance stored otherwise).
    """

    def __init__(self, base_url: str = FAKE_URL) -> None:
        self.base_url = base_url
        self.instances: dict[str, tuple[bytes, pydicom.Dataset]] = {}
        self.requests: list[httpx.Request] = []
        self.script: deque = deque()
        self.max_results: int | None = None
        self.chunk_size = 997
        self.single_part_instances = False
        self.single_accept = False
        self.ignore_range = False
        self.hooks: dict[str, Callable[[httpx.Request], httpx.Response | None]] = {}

    # ------------------------------------------------------------------ data
    def add(self, data: bytes) -> pydicom.Dataset:
        ds = pydicom.dcmread(io.BytesIO(data))
        self.instances[str(ds.SOPInstanceUID)] = (data, ds)
        return ds

    def add_file(self, path: str) -> pydicom.Dataset:
        with open(path, "rb") as fh:
            return self.add(fh.read())

    def select(self, study=None, series=None, sop=None) -> list[tuple[bytes, pydicom.Dataset]]:
        out = []
        for data, ds in self.instances.values():
            if study and ds.StudyInstanceUID != study:
                continue
            if series and ds.SeriesInstanceUID != series:
                continue
            if sop and ds.SOPInstanceUID != sop:
                continue
            out.append((data, ds))
        out.sort(key=lambda x: (str(x[1].StudyInstanceUID), str(x[1].SeriesInstanceUID), str(x[1].SOPInstanceUID)))
        return out

    def last(self) -> httpx.Request:
        return self.requests[-1]

    # --------------------------------------------------------------- routing
    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.script:
            item = self.script.popleft()
            if isinstance(item, Exception):
                raise item
            return item
        path = request.url.path
        prefix = httpx.URL(self.base_url).path.rstrip("/")
        if prefix and path.startswith(prefix):
            path = path[len(prefix) :]
        segs = [unquote(s) for s in path.strip("/").split("/") if s]
        accept = request.headers.get("accept", "")
        if self.single_accept and "json" not in accept and ("," in accept or 'type="*/*"' in accept):
            return _error(400, f"Transfer syntax is incompatible with media type: {accept}")
        for name, hook in self.hooks.items():
            if name in request.url.path:
                r = hook(request)
                if r is not None:
                    return r
        try:
            if request.method == "POST":
                return self.stow(request, segs)
            if request.method == "DELETE":
                return self.delete(segs)
            if request.method == "GET":
                return self.get(request, segs)
        except KeyError as exc:
            return _error(400, f"unknown attribute {exc}")
        return _error(405, "method not allowed")

    def get(self, request: httpx.Request, segs: list[str]) -> httpx.Response:
        # QIDO
        if segs in (["studies"], ["series"], ["instances"]):
            return self.qido(request, segs[0], None, None)
        if len(segs) == 3 and segs[0] == "studies" and segs[2] in ("series", "instances"):
            return self.qido(request, segs[2], segs[1], None)
        if len(segs) == 5 and segs[0] == "studies" and segs[2] == "series" and segs[4] == "instances":
            return self.qido(request, "instances", segs[1], segs[3])
        # WADO
        study = segs[1] if len(segs) > 1 and segs[0] == "studies" else None
        series = segs[3] if len(segs) > 3 and segs[2] == "series" else None
        sop = segs[5] if len(segs) > 5 and segs[4] == "instances" else None
        depth = 2 + (2 if series else 0) + (2 if sop else 0)
        rest = segs[depth:]
        selected = self.select(study, series, sop)
        if not selected:
            return _error(404, "no such resource")
        if not rest:
            return self.wado(request, selected, single=sop is not None)
        if rest == ["metadata"]:
            return _json_response(200, [self.metadata(ds) for _, ds in selected])
        if rest[0] in ("rendered", "thumbnail"):
            return self.rendered(request, selected, rest[0])
        if rest[0] == "frames" and sop and len(rest) in (2, 3):
            if len(rest) == 3:
                return self.rendered(request, selected, rest[2], frames=rest[1])
            return self.frames(request, selected[0][1], rest[1])
        if rest[0] == "bulk" and sop and len(rest) == 2:
            return self.bulk(request, selected[0][1], rest[1])
        return _error(404, "no such resource")

    # ------------------------------------------------------------------ QIDO
    def qido(self, request: httpx.Request, level: str, study: str | None, series: str | None) -> httpx.Response:
        accept = request.headers.get("accept", "")
        if "json" not in accept and "*/*" not in accept:
            return _error(406, "QIDO answers application/dicom+json")
        params = request.url.params
        filters: dict[str, str] = {}
        include: list[str] = []
        limit = offset = None
        for key, value in params.multi_items():
            if key == "includefield":
                include.extend(value.split(","))
            elif key == "limit":
                limit = int(value)
            elif key == "offset":
                offset = int(value)
            elif key == "fuzzymatching":
                if value not in ("true", "false"):
                    return _error(400, "fuzzymatching must be true or false")
            else:
                filters[_tag(key)] = value
        key_tags = {"studies": STUDY_TAGS, "series": SERIES_TAGS, "instances": INSTANCE_TAGS}[level]
        groups: dict[str, list[pydicom.Dataset]] = {}
        for _, ds in self.select(study, series):
            uid = {"studies": ds.StudyInstanceUID, "series": ds.SeriesInstanceUID, "instances": ds.SOPInstanceUID}[level]
            groups.setdefault(str(uid), []).append(ds)
        results = []
        for uid in sorted(groups):
            members = groups[uid]
            first = members[0]
            if not all(self._matches(members, tag, value) for tag, value in filters.items()):
                continue
            tags = set(key_tags)
            if level != "studies":
                tags.update(STUDY_TAGS if level == "series" else STUDY_TAGS + SERIES_TAGS)
            if "all" in include:
                tags.update(f"{e.tag:08X}" for e in first if e.tag.group > 2 and e.VR not in ("OB", "OW", "SQ", "UN"))
            else:
                tags.update(_tag(i) for i in include)
            full = first.to_json_dict(bulk_data_threshold=10**9)
            item = {t: full[t] for t in sorted(tags) if t in full}
            if level == "studies":
                item["00080061"] = {"vr": "CS", "Value": sorted({str(m.Modality) for m in members if "Modality" in m})}
                item["00201208"] = {"vr": "IS", "Value": [len(members)]}
                item["00081190"] = {"vr": "UR", "Value": [f"{self.base_url}/studies/{uid}"]}
            results.append(item)
        total = len(results)
        start = offset or 0
        cap = limit
        if self.max_results is not None:
            cap = self.max_results if cap is None else min(cap, self.max_results)
        page = results[start : start + cap] if cap is not None else results[start:]
        headers = {}
        remaining = total - start - len(page)
        if remaining > 0 and self.max_results is not None and (limit is None or limit > self.max_results):
            headers["Warning"] = f'299 {self.base_url}: "There are {remaining} additional results that can be requested"'
        return _json_response(200, page, headers)

    @staticmethod
    def _matches(members: list[pydicom.Dataset], tag: str, pattern: str) -> bool:
        t = Tag(int(tag, 16))
        if t == Tag(0x00080061):  # ModalitiesInStudy
            mods = {str(m.Modality) for m in members if "Modality" in m}
            return any(p in mods for p in pattern.split(","))
        values = set()
        for m in members:
            if t in m:
                values.add(str(m[t].value))
        if "," in pattern and "*" not in pattern:
            return bool(values & set(pattern.split(",")))
        return any(fnmatch.fnmatchcase(v, pattern.replace("?", "?")) for v in values)

    # ------------------------------------------------------------------ WADO
    def _accepts(self, request: httpx.Request, media: str) -> tuple[bool, str | None]:
        accept = request.headers.get("accept", "*/*")
        for item in accept.split(","):
            ct, params = parse_content_type(item.strip())
            if ct == "multipart/related" and params.get("type", "").lower() in (media, "*/*"):
                return True, params.get("transfer-syntax")
            if ct == media or ct == "*/*":
                return True, None
        return False, None

    def wado(self, request: httpx.Request, selected, single: bool) -> httpx.Response:
        ok, ts = self._accepts(request, "application/dicom")
        if not ok:
            return _error(406, "cannot produce the requested media type")
        if ts is None and self.single_accept:  # Orthanc: no transfer-syntax asks for PS3.18's default
            ts = "1.2.840.10008.1.2.1"
        if ts not in (None, "*") and any(str(ds.file_meta.TransferSyntaxUID) != ts for _, ds in selected):
            return _error(406, f"cannot transcode to {ts}")
        if single and self.single_part_instances:
            return httpx.Response(200, content=selected[0][0], headers={"Content-Type": "application/dicom"})
        parts = [
            (
                {
                    "Content-Type": f"application/dicom; transfer-syntax={ds.file_meta.TransferSyntaxUID}",
                    "Content-Location": f"{self.base_url}/studies/{ds.StudyInstanceUID}/series/"
                    f"{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}",
                },
                data,
            )
            for data, ds in selected
        ]
        return self._multipart(parts, "application/dicom")

    def _multipart(self, parts, type_: str) -> httpx.Response:
        body = build_multipart(parts)
        ct = f'multipart/related; type="{type_}"; boundary="{BOUNDARY}"'
        return httpx.Response(200, stream=ChunkedStream(body, self.chunk_size), headers={"Content-Type": ct})

    def instance_url(self, ds) -> str:
        return f"{self.base_url}/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"

    def metadata(self, ds: pydicom.Dataset) -> dict:
        url = self.instance_url(ds)
        return ds.to_json_dict(
            bulk_data_threshold=256,
            bulk_data_element_handler=lambda elem: f"{url}/bulk/{elem.tag:08X}",
        )

    def frames(self, request: httpx.Request, ds: pydicom.Dataset, frame_list: str) -> httpx.Response:
        try:
            numbers = [int(x) for x in frame_list.split(",")]
        except ValueError:
            return _error(400, "bad frame list")
        if "PixelData" not in ds:
            return _error(404, "instance has no pixel data")
        nframes = int(ds.get("NumberOfFrames", 1) or 1)
        if any(n < 1 for n in numbers):
            return _error(400, "frame numbers are 1-based")
        if any(n > nframes for n in numbers):
            return _error(404, "no such frame")
        ok, _ = self._accepts(request, "application/octet-stream")
        if not ok:
            return _error(406, "frames are served as application/octet-stream")
        size = ds.Rows * ds.Columns * ds.get("SamplesPerPixel", 1) * ds.BitsAllocated // 8
        pixels = ds.PixelData
        parts = [
            ({"Content-Type": "application/octet-stream; transfer-syntax=1.2.840.10008.1.2.1"}, pixels[(n - 1) * size : n * size])
            for n in numbers
        ]
        return self._multipart(parts, "application/octet-stream")

    def bulk(self, request: httpx.Request, ds: pydicom.Dataset, tag: str) -> httpx.Response:
        t = Tag(int(tag, 16))
        if t not in ds:
            return _error(404, "no such bulk data")
        value = ds[t].value
        rng = request.headers.get("range")
        if not rng or self.ignore_range:  # RFC 9110 Section 14.2: a server may ignore Range (200, whole)
            return self._multipart([({"Content-Type": "application/octet-stream"}, value)], "application/octet-stream")
        start, _, end = rng.removeprefix("bytes=").partition("-")
        first, last = int(start), min(int(end), len(value) - 1) if end else len(value) - 1
        r = self._multipart([({"Content-Type": "application/octet-stream"}, value[first : last + 1])],
                            "application/octet-stream")
        r.status_code = 206
        r.headers["Content-Range"] = f"bytes {first}-{last}/{len(value)}"
        return r

    def rendered(self, request: httpx.Request, selected, kind: str, frames: str | None = None) -> httpx.Response:
        accept = request.headers.get("accept", "*/*")
        ct, params = parse_content_type(accept.split(",")[0].strip())
        q = str(request.url.query, "ascii") if isinstance(request.url.query, bytes) else str(request.url.query)
        if ct == "multipart/related":
            media = params.get("type", "image/jpeg")
            parts = [
                ({"Content-Type": media}, f"{kind} {ds.SOPInstanceUID} {q}".encode()) for _, ds in selected
            ]
            return self._multipart(parts, media)
        media = ct if ct not in ("*/*", "") else "image/jpeg"
        if not media.startswith("image/"):
            return _error(406, "only images are rendered")
        ds = selected[0][1]
        return httpx.Response(
            200, content=f"{kind} {ds.SOPInstanceUID} {frames or ''} {q}".encode(), headers={"Content-Type": media}
        )

    # ------------------------------------------------------------------ STOW
    def stow(self, request: httpx.Request, segs: list[str]) -> httpx.Response:
        if segs not in (["studies"],) and not (len(segs) == 2 and segs[0] == "studies"):
            return _error(405, "STOW is POST /studies[/{study}]")
        study = segs[1] if len(segs) == 2 else None
        ct, params = parse_content_type(request.headers.get("content-type", ""))
        if ct != "multipart/related" or params.get("type", "application/dicom").lower() != "application/dicom":
            return _error(415, "expected multipart/related; type=application/dicom")
        parts = parse_multipart_request(request.content, params["boundary"])
        referenced, failed = [], []
        for headers, data in parts:
            try:
                ds = pydicom.dcmread(io.BytesIO(data))
                sop_class, sop_uid = str(ds.SOPClassUID), str(ds.SOPInstanceUID)
            except Exception:
                failed.append({"00081197": {"vr": "US", "Value": [0xC000]}})
                continue
            if study and str(ds.StudyInstanceUID) != study:
                failed.append(
                    {
                        "00081150": {"vr": "UI", "Value": [sop_class]},
                        "00081155": {"vr": "UI", "Value": [sop_uid]},
                        "00081197": {"vr": "US", "Value": [0xA900]},
                    }
                )
                continue
            self.add(data)
            referenced.append(
                {
                    "00081150": {"vr": "UI", "Value": [sop_class]},
                    "00081155": {"vr": "UI", "Value": [sop_uid]},
                    "00081190": {"vr": "UR", "Value": [self.instance_url(ds)]},
                }
            )
        doc: dict = {}
        if study:
            doc["00081190"] = {"vr": "UR", "Value": [f"{self.base_url}/studies/{study}"]}
        if failed:
            doc["00081198"] = {"vr": "SQ", "Value": failed}
        if referenced:
            doc["00081199"] = {"vr": "SQ", "Value": referenced}
        status = 200 if not failed else (202 if referenced else 409)
        return _json_response(status, doc)

    # ---------------------------------------------------------------- DELETE
    def delete(self, segs: list[str]) -> httpx.Response:
        study = segs[1] if len(segs) > 1 else None
        series = segs[3] if len(segs) > 3 else None
        sop = segs[5] if len(segs) > 5 else None
        selected = self.select(study, series, sop) if study else []
        if not selected:
            return _error(404, "nothing to delete")
        for _, ds in selected:
            del self.instances[str(ds.SOPInstanceUID)]
        return httpx.Response(204)

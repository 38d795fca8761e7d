"""WADO-RS instance and whole-study retrieve in loadtests.capacity: one full validation
of every answer the step will ask for before the wrk step, and the checks of the step's
counts (wrk/sized.lua).

wrk/sized.lua has no ``response()`` function, so wrk does not copy the bodies into Lua
(~10 MB per study answer, 130-520 KB per instance answer: that made wrk the
bottleneck, see the script's header). Instead:

* before each study step, :func:`measure` fetches every sampled study once over a raw
  socket, exactly as wrk reads it, and validates it fully (:func:`validate`): status
  200, multipart/related with one application/dicom part per instance of the study
  (PS3.18 10.4.1.1.2), every SOP Instance UID of the manifest's study present once,
  each part's Pixel Data of the manifest's length and SHA-256. It records the size of
  the whole HTTP answer (status line + headers + body) and how the body is delimited.
  For WADO-RS instance steps :func:`measure_instances` does the same for every instance
  of the data set (one part, that instance), once per server and run;
* during the step wrk frames every answer (Content-Length or chunked; a connection
  closed early is a read error) and counts status >= 400; sized.lua adds up the
  expected bytes of every request it sends;
* after the step :func:`step_errors` checks the byte count against those sizes and
  accounts for servers that end each answer by closing the connection.
"""

from __future__ import annotations

import hashlib
import socket

import httpx

from .checks import _param

PIXEL_TAG = b"\xe0\x7f\x10\x00"
#: the answer size may differ by a few bytes between two answers of the same study
#: (e.g. a Date header or a boundary of another length); allowed per answer
SIZE_SLACK = 128


class StudyAnswer:
    def __init__(self, total: int, close_delimited: bool, parts: int) -> None:
        self.total = total  # bytes of the whole HTTP answer, as wrk counts them
        self.close_delimited = close_delimited  # no Content-Length / chunked: ends at the close
        self.parts = parts


def fetch_raw(url: str, path: str, accept: str, timeout: float = 120.0) -> tuple[int, dict[str, str], bytes, int]:
    """One HTTP/1.1 GET over a plain socket: (status, headers (lower-case names),
    body, total bytes read). Bodies with Content-Length or ended by the close;
    chunked ones are decoded (their total still counts the raw bytes)."""
    u = httpx.URL(url)
    with socket.create_connection((u.host, u.port or 80), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {u.host}:{u.port}\r\nAccept: {accept}\r\n\r\n".encode())
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            b = s.recv(1 << 16)
            if not b:
                raise ValueError("connection closed inside the headers")
            buf += b
        head_len = buf.index(b"\r\n\r\n") + 4
        lines = bytes(buf[:head_len - 4]).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            want = head_len + int(headers["content-length"])
            while len(buf) < want:
                b = s.recv(1 << 20)
                if not b:
                    raise ValueError(f"closed after {len(buf) - head_len} of {want - head_len} body bytes")
                buf += b
            if len(buf) != want:
                raise ValueError(f"{len(buf) - want} bytes after the body")
            return status, headers, bytes(buf[head_len:]), len(buf)
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            buf += b
        body = bytes(buf[head_len:])
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = _dechunk(body)
        return status, headers, body, len(buf)


def _dechunk(raw: bytes) -> bytes:
    out, pos = [], 0
    while True:
        e = raw.index(b"\r\n", pos)
        n = int(raw[pos:e].split(b";")[0], 16)
        if n == 0:
            return b"".join(out)
        out.append(raw[e + 2:e + 2 + n])
        pos = e + 2 + n + 2


def validate(body: bytes, content_type: str, expected: dict[str, tuple[int, str]],
             boundary_from_body: bool = False) -> int:
    """Check a multipart WADO-RS answer (a whole study, or one instance) against the
    manifest's instances it must hold (``{SOP Instance UID: (pixel bytes, SHA-256)}``):
    every instance once, its pixel data the original. Returns the number of parts. ``boundary_from_body``: take the
    boundary from the body's first line when the Content-Type has none (nginx serving
    the stored answers as static files, whose type has no boundary parameter).

    Raises
    ------
    ValueError
        The first problem found.
    """
    from io import BytesIO

    import pydicom

    if not content_type.lower().startswith("multipart/related"):
        raise ValueError(f"Content-Type {content_type!r}")
    boundary = _param(content_type, "boundary")
    if not boundary and boundary_from_body and body.startswith(b"--"):
        boundary = body[2:body.find(b"\r\n")].decode("latin-1")
    if not boundary:
        raise ValueError("multipart answer without a boundary")
    delim = b"--" + boundary.encode()
    end = body.rfind(b"\r\n" + delim + b"--")
    if end < 0 or not body.startswith(delim):
        raise ValueError("no opening or closing boundary (truncated answer?)")
    pieces = body[len(delim):end].split(b"\r\n" + delim)
    seen: set[str] = set()
    for piece in pieces:
        h = piece.find(b"\r\n\r\n")
        if h < 0:
            raise ValueError("part headers not terminated")
        hdrs = piece[:h].decode("latin-1").lower()
        if "application/dicom" not in hdrs:
            raise ValueError(f"part is not application/dicom: {hdrs.strip()[:120]!r}")
        part = piece[h + 4:]
        ds = pydicom.dcmread(BytesIO(part), stop_before_pixels=True)
        sop = str(ds.SOPInstanceUID)
        if sop not in expected:
            raise ValueError(f"instance {sop} is not of this study")
        if sop in seen:
            raise ValueError(f"instance {sop} twice")
        seen.add(sop)
        n, sha = expected[sop]
        v = len(part) - n
        if not (part[v - 12:v - 8] == PIXEL_TAG and int.from_bytes(part[v - 4:v], "little") == n):
            raise ValueError(f"instance {sop}: no Pixel Data of the original's length ({n} B) as the last element")
        if hashlib.sha256(part[v:]).hexdigest() != sha:
            raise ValueError(f"instance {sop}: pixel data not the original (SHA-256 differs)")
    if len(seen) != len(expected):
        raise ValueError(f"{len(seen)} of {len(expected)} instances")
    return len(pieces)


def _fetched(host: str, path: str, accept: str, expected: dict[str, tuple[int, str]],
             static: bool = False) -> StudyAnswer:
    """One answer fetched as wrk reads it and validated (:func:`validate`)."""
    status, headers, body, total = fetch_raw(host, path, accept)
    if status != 200:
        raise ValueError(f"HTTP {status}")
    parts = validate(body, headers.get("content-type", ""), expected, static)
    closes = "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")
    return StudyAnswer(total, closes, parts)


def measure(host: str, studies: list[str], manifest: dict, accept: str,
            static: bool = False) -> tuple[dict[str, StudyAnswer], list[str]]:
    """Fetch and validate each study of ``studies`` (paths under the DICOMweb root
    ``host``) once. Returns ({request path: answer}, problems). ``static``: nginx's
    files (see :func:`validate`)."""
    root = httpx.URL(host).path.rstrip("/")
    by_study: dict[str, dict[str, tuple[int, str]]] = {}
    for inst in manifest["instances"]:
        sp = inst["path"].split("/series/")[0]
        by_study.setdefault(sp, {})[inst["sop"]] = (inst["pixel_bytes"], inst["sha256"])
    out, problems = {}, []
    for sp in studies:
        try:
            out[root + sp] = _fetched(host, root + sp, accept, by_study[sp], static)
        except (OSError, ValueError) as e:
            problems.append(f"study {sp}: {e}")
    return out, problems


def measure_instances(host: str, instances: list[dict], accept: str) -> tuple[dict[str, StudyAnswer], list[str]]:
    """Fetch and validate the WADO-RS answer of each manifest instance of ``instances``
    (PS3.18 10.4.1.1.1: multipart/related, one application/dicom part: that instance,
    its Pixel Data the original) once. Returns ({request path: answer}, problems)."""
    root = httpx.URL(host).path.rstrip("/")
    out, problems = {}, []
    for inst in instances:
        try:
            out[root + inst["path"]] = _fetched(host, root + inst["path"], accept,
                                                {inst["sop"]: (inst["pixel_bytes"], inst["sha256"])})
        except (OSError, ValueError) as e:  # (validate's messages name the instance)
            problems.append(str(e) if inst["sop"] in str(e) else f"instance {inst['sop']}: {e}")
    return out, problems


def step_errors(s: dict, answers: dict[str, StudyAnswer]) -> tuple[dict[str, int], dict[str, int]]:
    """(errors, notes) of one wrk/sized.lua step ``s`` (its LOAD03 summary).

    * A server whose validated answers end at the connection's close (Orthanc: no
      Content-Length for multipart answers) makes wrk count a read error per answer:
      up to ``requests`` read errors are then noted as "closed" and not errors; any
      beyond are. For a server that sends Content-Length every read error counts.
    * bytes: wrk's byte count must lie in the window the answers' sizes allow: at most
      the expected bytes of every request sent (+ SIZE_SLACK each), at least those
      minus the largest answers for the requests not completed when the step ended.
      Outside it, "bytes" = 1 (the count cannot say which answer was wrong).
    """
    errors = {k: s[k] for k in ("connect", "read", "write", "status", "timeout") if s.get(k)}
    notes: dict[str, int] = {}
    close = bool(answers) and all(a.close_delimited for a in answers.values())
    if close and errors.get("read"):
        closed = min(errors["read"], s["requests"])
        notes["closed"] = closed
        errors["read"] -= closed
        if not errors["read"]:
            del errors["read"]
    if answers:
        biggest = max(a.total for a in answers.values())
        sent, sent_bytes = int(s.get("sent", 0)), int(s.get("sent_bytes", 0))
        unfinished = max(0, sent - s["requests"])
        low = sent_bytes - unfinished * biggest - sent * SIZE_SLACK
        high = sent_bytes + sent * SIZE_SLACK
        if not low <= s["bytes"] <= high:
            errors["bytes"] = 1
            notes["bytes_expected_low"], notes["bytes_expected_high"] = low, high
    return errors, notes

"""LOAD-03 as a locustfile: QIDO-RS, WADO-RS, rendered JPEG and STOW-RS under
concurrent clients, every answer validated.

    locust -f loadtests/load03.py --host http://127.0.0.1:8080 --manifest M.json      # web UI
    locust -f loadtests/load03.py --host URL --manifest M.json --headless -u 8 -r 8 -t 15s QidoUser
    LOAD03_MANIFEST=M.json locust -f loadtests/load03.py --host URL --headless -u 32 -t 15s --processes 2

The host is the DICOMweb root (e.g. ``http://127.0.0.1:8042/dicom-web`` for Orthanc).
The manifest comes from ``python -m loadtests.dataset`` (``--manifest`` or the
``LOAD03_MANIFEST`` environment variable); the data set must be preloaded
(``python -m loadtests.preload``).

One user class per operation: ``QidoUser``, ``WadoUser``, ``RenderedUser``,
``StowUser`` (pick them on the command line or with ``--class-picker`` in the web
UI; with none named, all four run). Each task is tagged too (``qido``, ``wado``,
``rendered``, ``stow``) for ``--tags``. Users send back to back (no wait time):
N users = N concurrent clients, as in the reference test.

Validation (a failed check is a locust failure whose message says why):

* QIDO-RS: a query from the manifest's fixed mix; the answer has exactly the
  expected number of studies.
* WADO-RS instance (``Accept: multipart/related; type="application/dicom";
  transfer-syntax=*``): one part, holding a Pixel Data element of the expected
  length as its last element; for every 50th answer (per process) the SHA-256 of
  the pixel data equals the original.
* Rendered (``Accept: image/jpeg``): a complete JPEG (SOI ... EOI) that Pillow
  decodes fully, of the image's rows x columns.
* STOW-RS: a new 256x256 MR image (new SOP Instance UID each time, in a patient of
  its own); the answer is 200 and its ReferencedSOPSequence holds that UID, with no
  FailedSOPSequence.

WADO-RS and rendered requests pick an instance at random across the whole data set.

With ``LOAD03_RESULTS_DIR`` set, each locust process writes its exact latencies,
byte counts and failure reasons there when it stops (``loadtests.run`` reads them).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from locust import constant, events, tag, task
from locust.contrib.fasthttp import FastHttpUser

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run from a checkout, not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.checks import check_jpeg, dicom_part, pixel_data  # noqa: E402

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads

WADO_ACCEPT = 'multipart/related; type="application/dicom"; transfer-syntax=*'
DICOM_JSON = "application/dicom+json"
SHA_EVERY = 50

# ----------------------------------------------------------------------------- options


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--manifest", type=str, env_var="LOAD03_MANIFEST", default="",
                        help="manifest of the preloaded data set (python -m loadtests.dataset)")
    parser.add_argument("--jpeg-decode", type=str, env_var="LOAD03_JPEG_DECODE", default="full",
                        choices=["full", "draft"],
                        help="rendered check: decode every JPEG fully (default) or in DCT-scaled draft mode")


@events.init.add_listener
def _refuse_bad_start(environment, **_kw) -> None:
    """Refuse to start, with one message and exit status 2, when the run could only fail:
    no ``--host`` (the workers take theirs from the master) or no readable manifest.
    Without this locust would log an error, idle for the whole run and exit 0."""
    opts = environment.parsed_options
    if opts is None:  # used as a library
        return
    problems = []
    if not environment.host and not getattr(opts, "worker", False):
        problems.append("no --host: give the DICOMweb root, e.g. --host http://127.0.0.1:8080 "
                        "(Orthanc: http://127.0.0.1:8042/dicom-web)")
    try:
        manifest(environment)
    except (RuntimeError, OSError, ValueError, KeyError, TypeError) as e:
        problems.append(str(e) if isinstance(e, RuntimeError) else f"load03: cannot read the manifest: {e}")
    if problems:
        for p in problems:
            print(p if p.startswith("load03:") else f"load03: {p}", file=sys.stderr)
        print("load03: see docs/load-testing.md (make the data set: python -m loadtests.preload ...)", file=sys.stderr)
        raise SystemExit(2)


_lock = threading.Lock()
_manifest: dict | None = None


def manifest(environment) -> dict:
    """The manifest, read once per process."""
    global _manifest
    with _lock:
        if _manifest is None:
            opts = environment.parsed_options
            path = (getattr(opts, "manifest", "") if opts else "") or os.environ.get("LOAD03_MANIFEST", "")
            if not path:
                raise RuntimeError("load03: no manifest: pass --manifest M.json or set LOAD03_MANIFEST "
                                   "(python -m loadtests.dataset makes one)")
            with open(path, "rb") as f:
                m = _loads(f.read())
            m["_wado"] = [(i["path"], i["pixel_bytes"], i["sha256"]) for i in m["instances"]]
            m["_rendered"] = [(i["path"] + "/rendered", i["rows"], i["columns"]) for i in m["instances"]]
            _manifest = m
        return _manifest


# ----------------------------------------------------------------------------- recorder

_results_dir = os.environ.get("LOAD03_RESULTS_DIR")
_rec = {"lat": [], "bytes": 0, "ok": 0, "fail": 0, "first": None, "last": None, "reasons": Counter(),
        "names": Counter()}


@events.request.add_listener
def _record(request_type, name, response_time, response_length, exception=None, context=None, **_kw) -> None:
    if not _results_dir:
        return
    now = time.time()
    start = now - response_time / 1000.0
    r = _rec
    r["lat"].append(response_time)
    r["names"][name] += 1
    r["bytes"] += (context or {}).get("sent_bytes", response_length or 0)
    if exception is None:
        r["ok"] += 1
    else:
        r["fail"] += 1
        r["reasons"][str(exception)[:300]] += 1
    r["first"] = start if r["first"] is None else min(r["first"], start)
    r["last"] = now if r["last"] is None else max(r["last"], now)


def _dump(**_kw) -> None:
    if not _results_dir or not _rec["lat"]:
        return
    os.makedirs(_results_dir, exist_ok=True)
    out = dict(_rec, reasons=dict(_rec["reasons"]), names=dict(_rec["names"]), pid=os.getpid())
    tmp = os.path.join(_results_dir, f".proc-{os.getpid()}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, os.path.join(_results_dir, f"proc-{os.getpid()}.json"))


events.test_stop.add_listener(_dump)
events.quitting.add_listener(_dump)


_sha_counter = itertools.count(1)

# ----------------------------------------------------------------------------- users


class _Base(FastHttpUser):
    abstract = True
    wait_time = constant(0)
    network_timeout = 120.0
    connection_timeout = 30.0

    def on_start(self) -> None:
        self.m = manifest(self.environment)
        self.rnd = random.Random()


class QidoUser(_Base):
    """QIDO-RS study search from the manifest's query mix."""

    @tag("qido")
    @task
    def qido(self) -> None:
        q = self.rnd.choice(self.m["queries"])
        with self.client.get("/studies?" + q["query"], headers={"Accept": DICOM_JSON}, name="QIDO-RS /studies",
                             catch_response=True) as r:
            if r.status_code == 204 and q["expected"] == 0:
                r.success()
                return
            if r.status_code != 200:
                r.failure(f"QIDO {q['query']}: HTTP {r.status_code}")
                return
            try:
                n = len(_loads(r.content))
            except Exception as e:
                r.failure(f"QIDO {q['query']}: answer is not JSON ({e})")
                return
            if n != q["expected"]:
                r.failure(f"QIDO {q['query']}: {n} studies, expected {q['expected']}")
            else:
                r.success()


class WadoUser(_Base):
    """WADO-RS retrieval of one random instance, as stored."""

    @tag("wado")
    @task
    def wado(self) -> None:
        path, length, sha = self.rnd.choice(self.m["_wado"])
        with self.client.get(path, headers={"Accept": WADO_ACCEPT}, name="WADO-RS instance",
                             catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"WADO: HTTP {r.status_code}")
                return
            body = r.content or b""
            try:
                start, end = dicom_part(body, r.headers.get("Content-Type", ""))
                v = pixel_data(body, start, end, length)
            except ValueError as e:
                r.failure(f"WADO {path.rsplit('/', 1)[-1]}: {e}")
                return
            if next(_sha_counter) % SHA_EVERY == 0:
                if hashlib.sha256(memoryview(body)[v:v + length]).hexdigest() != sha:
                    r.failure(f"WADO {path.rsplit('/', 1)[-1]}: pixel data SHA-256 differs from the original")
                    return
            r.success()


class RenderedUser(_Base):
    """WADO-RS rendered JPEG of one random instance."""

    @tag("rendered")
    @task
    def rendered(self) -> None:
        path, rows, columns = self.rnd.choice(self.m["_rendered"])
        full = getattr(self.environment.parsed_options, "jpeg_decode", "full") != "draft"
        with self.client.get(path, headers={"Accept": "image/jpeg"}, name="WADO-RS rendered",
                             catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"rendered: HTTP {r.status_code}")
                return
            ct = r.headers.get("Content-Type", "")
            if not ct.lower().startswith("image/jpeg"):
                r.failure(f"rendered: Content-Type {ct!r}")
                return
            try:
                check_jpeg(r.content or b"", rows, columns, full)
            except ValueError as e:
                r.failure(f"rendered {path.rsplit('/', 2)[-2]}: {e}")
                return
            r.success()


class StowUser(_Base):
    """STOW-RS of a new MR image (one instance per request)."""

    def on_start(self) -> None:
        super().on_start()
        from loadtests.dataset import fixed_length_uid, stow_body_pieces

        self.uid = fixed_length_uid
        self.pieces, self.ctype = stow_body_pieces(int(self.m.get("stow", {}).get("size", 256)))

    @tag("stow")
    @task
    def stow(self) -> None:
        sop = self.uid()
        body = sop.encode().join(self.pieces)
        with self.client.post("/studies", data=body, name="STOW-RS", catch_response=True,
                              headers={"Content-Type": self.ctype, "Accept": DICOM_JSON},
                              context={"sent_bytes": len(body)}) as r:
            if r.status_code != 200:
                r.failure(f"STOW: HTTP {r.status_code} {(r.text or '')[:200]}")
                return
            try:
                ans = _loads(r.content)
                refs = ans.get("00081199", {}).get("Value", [])
                uids = {u for item in refs for u in item.get("00081155", {}).get("Value", [])}
            except Exception as e:
                r.failure(f"STOW: answer is not a DICOM JSON object ({e})")
                return
            if ans.get("00081198", {}).get("Value"):
                r.failure(f"STOW: FailedSOPSequence in the answer: {json.dumps(ans['00081198'])[:200]}")
            elif sop not in uids:
                r.failure("STOW: the image is not in the answer's ReferencedSOPSequence")
            else:
                r.success()

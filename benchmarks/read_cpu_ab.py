"""Server CPU per answer of WADO-RS instance, WADO-RS frames, WADO-RS rendered (JPEG) and
QIDO-RS, two or more builds side by side, alternating (issue 33): the read-side twin of
``stow_cpu_concurrency.py``.

Each ``--code DIR`` gets one server (``dicomweb-server serve --workers W``, sqlite, a fresh
data folder) filled with the same instances (wrk STOW-RS, the capacity runner's 256x256 MR
image: ``--fill`` seconds, then the first ``--instances`` of them are read); then, round
after round, for each operation and connection count, each code in turn (the first one alternating) gets a ``--seconds``
wrk step (``loadtests/wrk/load03.lua``, modes wado, rendered and qido; ``rendered``: the
instance's ``/rendered`` as image/jpeg, each answer checked SOI ... EOI; the render cache is
the servers' own setting, so run with ``DICOMWEB_RENDER_CACHE_BYTES=0`` to time rendering). CPU = utime+stime of the
server's processes (/proc) / answers wrk counted; the load average is read after each step.

    python benchmarks/read_cpu_ab.py --code BASE --code NEW [--conns 8,32] [--seconds 5]
        [--rounds 3] [--ops wado,frames,rendered,qido] [--output FILE.md]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.stow_cpu_concurrency import LUA, Server, snapshot, wrk  # noqa: E402
from loadtests import dataset  # noqa: E402

ACCEPT = {"wado": "multipart/related; type=\"application/dicom\"; transfer-syntax=*",
          "frames": "multipart/related; type=\"application/octet-stream\"; transfer-syntax=*",
          "rendered": "image/jpeg", "qido": "application/dicom+json"}
MODE = {"wado": "wado", "frames": "wado", "rendered": "rendered", "qido": "qido"}  # load03.lua's modes


def _paths(url: str, limit: int) -> dict[str, list[str]]:
    """Request paths of each operation, from the archive's own QIDO-RS answers."""
    get = lambda path, **q: httpx.get(url + path, params=q, headers={"Accept": "application/dicom+json"},  # noqa: E731
                                      timeout=60).json()
    out: dict[str, list[str]] = {"wado": [], "frames": [], "rendered": [], "qido": []}
    for study in get("/studies", PatientID=dataset.STOW_PATIENT_ID):
        s = study["0020000D"]["Value"][0]
        out["qido"] += [f"/studies?PatientID={dataset.STOW_PATIENT_ID}&includefield=00201208",
                        f"/studies/{s}/series", f"/studies/{s}/instances?limit=20"]
        for inst in get(f"/studies/{s}/instances", limit=str(limit)):
            se, sop = inst["0020000E"]["Value"][0], inst["00080018"]["Value"][0]
            path = f"/studies/{s}/series/{se}/instances/{sop}"
            out["wado"].append(path)
            out["frames"].append(path + "/frames/1")
            out["rendered"].append(path + "/rendered")
    return out


def read_step(srv: Server, op: str, paths: pathlib.Path, conns: int, seconds: float) -> dict:
    cmd = ["wrk", "-t", str(min(2, conns)), "-c", str(conns), "-d", f"{seconds:g}s", "--timeout", "30s",
           "-s", str(LUA), srv.url + "/", "--", MODE[op], str(paths), ACCEPT[op],
           "100"]
    s0 = snapshot(srv.proc.pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 90).stdout
    s1 = snapshot(srv.proc.pid)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    line = next((ln for ln in out.splitlines() if ln.startswith("LOAD03 ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary: {out[-1000:]}")
    w = json.loads(line[len("LOAD03 "):])
    n = max(w["requests"], 1)
    return {"op": op, "conns": conns, "answers": w["requests"], "rate": round(w["requests"] / (w["duration_us"] / 1e6), 1),
            "cpu_ms": round((s1["cpu"] - s0["cpu"]) * 1000 / n, 3), "vol_per": round((s1["vol"] - s0["vol"]) / n, 2),
            "p50_ms": round(w["p50_us"] / 1000, 2), "errors": w["status"] + w["invalid"], "load": load}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--code", type=pathlib.Path, action="append", required=True)
    p.add_argument("--conns", default="8,32")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", default="wado,frames,qido")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fill", type=float, default=2, help="seconds of STOW-RS that fill each server")
    p.add_argument("--instances", type=int, default=200)
    p.add_argument("--output", type=pathlib.Path)
    a = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="read-cpu-"))
    data, (_, _, ph_sop) = dataset.stow_template(256)
    body = work / "stow.bin"
    body.write_bytes(f"--{dataset.STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode() + data
                     + f"\r\n--{dataset.STOW_BOUNDARY}--\r\n".encode())
    servers, lists = [], {}
    rows = []
    try:
        for code in a.code:
            srv = Server(code, a.workers)
            servers.append(srv)
            wrk(srv.url, body, ph_sop, 4, a.fill)
            for op, paths in _paths(srv.url, a.instances).items():
                f = work / f"{code.name}-{op}.txt"
                f.write_text("\n".join(paths) + "\n")
                lists[code.name, op] = f
            for op in a.ops.split(","):  # warm
                read_step(srv, op, lists[code.name, op], 4, 1)
        for rnd in range(a.rounds):
            for op in a.ops.split(","):
                for c in (int(x) for x in a.conns.split(",")):
                    order = list(zip(a.code, servers))
                    for code, srv in (order[::-1] if rnd % 2 else order):  # who goes first alternates
                        r = {"round": rnd + 1, "code": code.name, **read_step(srv, op, lists[code.name, op], c,
                                                                              a.seconds)}
                        rows.append(r)
                        print(json.dumps(r), flush=True)
                        time.sleep(0.5)
    finally:
        for srv in servers:
            srv.stop()
    lines = ["| round | code | op | conns | answers | answers/s | CPU ms/answer | vol cs/answer | p50 ms | errors | load |",
             "|" + "---|" * 11]
    lines += [f"| {r['round']} | {r['code']} | {r['op']} | {r['conns']} | {r['answers']} | {r['rate']} | {r['cpu_ms']} | "
              f"{r['vol_per']} | {r['p50_ms']} | {r['errors']} | {r['load']} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.output:
        a.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Server memory held by slow readers (issue 14 §3 "slow readers").

Stores a study of 4 instances with one 15 MB frame each (2740 x 2740, 16 bit) and
one instance with 2 such frames, starts the archive (one worker, sqlite) as the CLI
does, then opens N connections that ask for the study (retrieve as stored) or for
frames 1,2, read 64 KiB and then stop reading. Prints the server's RSS before and
with the N readers. ``--code DIR`` runs the server from another checkout (e.g. a
``git archive`` of an older commit) to compare.

    python benchmarks/slow_readers.py [--readers 8] [--code DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import socket
import sys
import tempfile
import time

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tests.helpers import make_dataset, multipart, serve_process, to_bytes

SIDE = 2740  # 2740 * 2740 * 2 bytes = 15.0 MB per frame


def _instance(study: str, series: str, frames: int) -> bytes:
    ds = make_dataset(study=study, series=series, rows=SIDE, columns=SIDE, frames=1)
    one = (np.arange(SIDE * SIDE, dtype=np.uint16) % 4096).tobytes()
    ds.PixelData = one * frames
    if frames > 1:
        ds.NumberOfFrames = frames
    return to_bytes(ds), ds


def _rss(pid: int) -> int:
    p = psutil.Process(pid)
    return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))


def _slow_reader(port: int, path: str, accept: str) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n".encode())
    got = 0
    while got < 64 * 1024:
        got += len(s.recv(65536))
    return s


def _measure(code: str, case: str, readers: int) -> str:
    data = pathlib.Path(tempfile.mkdtemp()) / "data"
    proc, url = serve_process(data, code)
    port = int(url.rsplit(":", 1)[1])
    try:
        study = "1.2.826.0.1.3680043.8.498.1"
        if case == "study":  # 4 instances of one 15 MB frame, retrieved as stored
            items = [_instance(study, "1.2.826.0.1.3680043.8.498.2", 1) for _ in range(4)]
        else:  # frames 1,2 of an instance of two 15 MB frames
            items = [_instance(study, "1.2.826.0.1.3680043.8.498.3", 2)]
        body, ctype = multipart([b for b, _ in items])
        r = httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=300)
        assert r.status_code == 200, r.text
        ds = items[0][1]
        path, accept = {
            "study": (f"/studies/{study}", 'multipart/related; type="application/dicom"; transfer-syntax=*'),
            "frames": (f"/studies/{study}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}/frames/1,2",
                       'multipart/related; type="application/octet-stream"'),
        }[case]
        del body, items
        assert len(httpx.get(url + path, headers={"Accept": accept}, timeout=300).content) > 30_000_000
        time.sleep(1)
        before = _rss(proc.pid)
        socks = [_slow_reader(port, path, accept) for _ in range(readers)]
        time.sleep(3)
        held = _rss(proc.pid)
        for s in socks:
            s.close()
        return (f"{case}: RSS {before / 1e6:.1f} MB after one full read, {held / 1e6:.1f} MB with {readers} "
                f"slow readers ({(held - before) / readers / 1e6:.1f} MB each)")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--code", default=str(pathlib.Path(__file__).resolve().parents[1]))
    args = ap.parse_args()
    for case in ("study", "frames"):
        print(_measure(args.code, case, args.readers), flush=True)


if __name__ == "__main__":
    main()

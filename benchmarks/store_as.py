"""Compress on ingest per ``store_as`` (issue 30): bytes saved, and the STOW-RS and
C-STORE ingest rate, on the LOAD-01 reference mix and on the real CT/MR images of the
pydicom corpus; and the encode cost of HTJ2K lossless against JPEG 2000 lossless.

    python benchmarks/store_as.py [--rounds 2] [--load01 50] [--copies 4] [--repeat 5]

Each ``store_as`` value gets a real server (``dicomweb-server serve``, one web worker,
one DIMSE process, SQLite, a routes file with one catch-all ``[[store_as]]`` rule) and
a fresh data folder; STOW-RS sends one instance per request (httpx, sequential), C-STORE
one association of DCMTK's ``storescu`` with every file; then the bytes of the stored
files are summed. Values are run in turn within a round (alternated), rounds repeated:
the machine is shared, so compare the ratio to "as received" of the same round.

Data (all Explicit VR Little Endian, as a modality sends them):
- LOAD-01 mix: loadtests/load01.py's generator (60 % CT 512x512, 37 % MR 256x256,
  1.5 % CR 2500x2000, 1.3 % DX 3000x3000, 0.2 % XA; 12 bits of uniform noise: the
  worst case for a lossless coder).
- pydicom CT/MR: CT_small (128x128), MR_small (64x64), examples_overlay (MR 300x484,
  12-bit), J2K_pixelrep_mismatch and 693_J2KI (CT 512x512, signed), decoded, each
  ``--copies`` times under new UIDs. No downloads (get_testdata_file's bundled files).
Prints Markdown.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dicomweb_server.policy import transcode  # noqa: E402
from tests.helpers import free_port, multipart, to_bytes  # noqa: E402

VALUES = [None, "jpeg-ls-lossless", "j2k-lossless", "htj2k-lossless", "htj2k-rpcl-lossless", "rle-lossless",
          "j2k-lossy", "htj2k-lossy"]
LOSSY = {"j2k-lossy", "htj2k-lossy"}
CORPUS = ["CT_small.dcm", "MR_small.dcm", "examples_overlay.dcm", "J2K_pixelrep_mismatch.dcm", "693_J2KI.dcm"]


def load01_mix(images: int) -> list:
    from loadtests import load01

    pixels = np.random.default_rng(7).integers(0, 4096, size=load01._max_pixels(1.0) // 2, dtype=np.uint16).tobytes()
    return [load01._dataset("30", job, 1.0, pixels) for job in load01.plan(images)]


def corpus(copies: int) -> list:
    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    out = []
    for name in CORPUS:
        src = pydicom.dcmread(get_testdata_file(name))
        arr = src.pixel_array
        for k in range(copies):
            ds = pydicom.dcmread(get_testdata_file(name))
            ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
            ds.PixelData = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
            ds["PixelData"].VR = "OW" if ds.BitsAllocated > 8 else "OB"
            ds["PixelData"].is_undefined_length = False
            for kw in ("LossyImageCompression", "LossyImageCompressionRatio", "LossyImageCompressionMethod"):
                if kw in ds and name != "693_J2KI.dcm":
                    delattr(ds, kw)
            ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
            if k == 0:
                assert np.array_equal(pydicom.dcmread(io.BytesIO(to_bytes(ds))).pixel_array, arr)
            out.append(ds)
    return out


def start(data: Path, routes: Path | None) -> tuple[subprocess.Popen, str, int]:
    port, dimse = free_port(), free_port()
    cmd = [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data), "--workers", "1",
           "--port", str(port), "--dimse-port", str(dimse), "--dimse-processes", "1"]
    if routes is not None:
        cmd += ["--routes", str(routes)]
    proc = subprocess.Popen(cmd, env={**os.environ, "DICOMWEB_LOG_LEVEL": "error"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            httpx.get(url + "/studies?limit=1", timeout=1)
            if subprocess.run(["/usr/bin/echoscu", "-aec", "DICOMWEB", "127.0.0.1", str(dimse)],
                              capture_output=True).returncode == 0:
                return proc, url, dimse
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


def stored_bytes(data: Path) -> int:
    return sum(f.stat().st_size for f in (data / "blobs").rglob("*.dcm"))


def run(value: str | None, bodies: list[bytes], files: list[Path], warm: bytes) -> dict:
    """One store_as value: STOW-RS of every instance (one per request), then C-STORE of
    the same files into a second, fresh archive. Seconds and bytes stored."""
    out = {}
    for door in ("stow", "cstore"):
        work = Path(tempfile.mkdtemp(prefix="store_as-"))
        routes = None
        if value:
            routes = work / "routes.toml"
            routes.write_text(f'[[store_as]]\nstore_as = "{value}"\n' + ("lossy = true\n" if value in LOSSY else ""))
        proc, url, dimse = start(work / "data", routes)
        try:
            with httpx.Client(base_url=url, timeout=600) as c:
                body, ctype = multipart([warm])
                assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
                base = stored_bytes(work / "data")  # the warm-up instance (decode workers started)
                t = time.perf_counter()
                if door == "stow":
                    for raw in bodies:
                        body, ctype = multipart([raw])
                        r = c.post("/studies", content=body, headers={"Content-Type": ctype})
                        assert r.status_code == 200, r.text
                else:
                    r = subprocess.run(["/usr/bin/storescu", "-aec", "DICOMWEB", "127.0.0.1", str(dimse),
                                        *map(str, files)], capture_output=True, text=True)
                    assert r.returncode == 0, r.stderr[-2000:]
                out[door] = time.perf_counter() - t
                out[door + "_bytes"] = stored_bytes(work / "data") - base
        finally:
            proc.terminate()
            proc.wait()
            subprocess.run(["rm", "-rf", str(work)])
    return out


def encode_costs(datasets: list, repeat: int) -> list[tuple[str, str, float, int]]:
    """encode_native_frame in this process (the encoder alone), median of ``repeat``:
    (image, syntax, ms, bytes)."""
    from pydicom.uid import HTJ2KLossless, HTJ2KLosslessRPCL, JPEG2000Lossless

    rows = []
    for label, ds in datasets:
        desc = {"Rows": ds.Rows, "Columns": ds.Columns, "SamplesPerPixel": 1, "BitsAllocated": ds.BitsAllocated,
                "BitsStored": ds.BitsStored, "PixelRepresentation": ds.PixelRepresentation,
                "PhotometricInterpretation": ds.PhotometricInterpretation, "PlanarConfiguration": 0}
        native = bytes(ds.PixelData[: ds.Rows * ds.Columns * ds.BitsAllocated // 8])
        for ts in (JPEG2000Lossless, HTJ2KLossless, HTJ2KLosslessRPCL):
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                data, _ = transcode.encode_native_frame(native, desc, ts)
                times.append(time.perf_counter() - t)
            rows.append((label, ts.name, statistics.median(times) * 1000, len(data)))
    return rows


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load01", type=int, default=50, help="images of the LOAD-01 mix")
    ap.add_argument("--copies", type=int, default=4, help="copies of each pydicom CT/MR")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--values", default=",".join(v or "as-received" for v in VALUES))
    args = ap.parse_args()
    values = [None if v == "as-received" else v for v in args.values.split(",")]

    print(f"uptime at start: `{uptime()}`\n")
    sets = {"LOAD-01 mix": load01_mix(args.load01), "pydicom CT/MR": corpus(args.copies)}
    tmp = Path(tempfile.mkdtemp(prefix="store_as-files-"))
    prepared = {}
    for name, items in sets.items():
        files = []
        for i, ds in enumerate(items):
            p = tmp / f"{name[:4].strip()}-{i}.dcm"
            p.write_bytes(to_bytes(ds))
            files.append(p)
        prepared[name] = ([p.read_bytes() for p in files], files, sum(p.stat().st_size for p in files))
    import pydicom
    from pydicom.uid import generate_uid

    w = pydicom.dcmread(prepared["pydicom CT/MR"][1][0])  # the warm-up instance: a copy, its own UID
    w.SOPInstanceUID = w.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    warm = to_bytes(w)

    results: dict = {}
    for rnd in range(args.rounds):
        for name, (bodies, files, _) in prepared.items():
            order = values if rnd % 2 == 0 else list(reversed(values))  # alternate the order per round
            for value in order:
                r = run(value, bodies, files, warm)
                results.setdefault((name, value), []).append(r)
                print(f"<!-- round {rnd + 1} {name} {value or 'as received'}: {r}  load {uptime()} -->",
                      flush=True)
    for name, (bodies, files, sent) in prepared.items():
        n = len(files)
        print(f"\n## {name}: {n} instances, {sent:,} bytes as sent\n")
        print("| store_as | bytes stored | of sent | STOW-RS inst/s | vs as received | C-STORE inst/s "
              "| vs as received |")
        print("|---|---|---|---|---|---|---|")
        for value in values:
            rs = results[(name, value)]
            size = rs[-1]["stow_bytes"]
            stow = [n / r["stow"] for r in rs]
            cst = [n / r["cstore"] for r in rs]
            base = results[(name, None)] if (name, None) in results else None
            rel_s = rel_c = "-"
            if base:
                rel_s = "/".join(f"{n / r['stow'] / (n / b['stow']):.2f}" for r, b in zip(rs, base))
                rel_c = "/".join(f"{n / r['cstore'] / (n / b['cstore']):.2f}" for r, b in zip(rs, base))
            print(f"| {value or 'as received'} | {size:,} | {size / sent:.0%} | "
                  f"{'/'.join(f'{x:.1f}' for x in stow)} | {rel_s} | {'/'.join(f'{x:.1f}' for x in cst)} "
                  f"| {rel_c} |")

    print(f"\n## Encode cost of one frame, encoder alone (median of {args.repeat})\n")
    picks = [("LOAD-01 CT 512x512 (noise)", sets["LOAD-01 mix"][[d.Modality for d in sets["LOAD-01 mix"]].index("CT")]),
             ("CT 512x512 (J2K_pixelrep_mismatch)", sets["pydicom CT/MR"][3 * args.copies]),
             ("MR 300x484 (examples_overlay)", sets["pydicom CT/MR"][2 * args.copies])]
    print("| image | syntax | ms | bytes |")
    print("|---|---|---|---|")
    for label, ts, ms, size in encode_costs(picks, args.repeat):
        print(f"| {label} | {ts} | {ms:.1f} | {size:,} |")
    print(f"\nuptime at end: `{uptime()}`")
    subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()

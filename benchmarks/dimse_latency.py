"""One-image association latency of a DIMSE Storage SCP, split by phase, seen from clients
that cost (almost) nothing themselves.

    python -m benchmarks.dimse_latency --port 11112 [--ae-title DICOMWEB] [-n 200] [--clients raw,pynetdicom,storescu]

Clients:

- ``raw``: a replay SCU on a plain socket (TCP_NODELAY on). The PDUs are encoded once
  by hand from PS3.8 §9.3 (A-ASSOCIATE-RQ, P-DATA-TF, A-RELEASE-RQ) and PS3.7 §9.3.1.1
  (C-STORE-RQ command set), so each association is connect + three ``sendall``/reads
  and the times are the server's (plus loopback): associate (RQ sent -> AC read),
  C-STORE (P-DATA sent -> C-STORE-RSP read), release (RQ sent -> RP read).
  Hand-written, not pynetdicom, because a pynetdicom SCU is itself the slow side of
  this measurement (two threads per association, its own reactors).
- ``pynetdicom``: ``AE.associate`` + ``send_c_store`` + ``release`` (the load01 SCU), as is,
  and with :func:`loadtests.load01.fast_scu` applied (``pynetdicom-fast``).
- ``storescu`` / ``echoscu``: DCMTK processes (process start included; measured alone as
  ``echoscu --version``), with ``TCP_NODELAY=1`` (DCMTK >= 3.6.2 leaves Nagle on by default).

The data set: one 512x512 16-bit CT (524,288 bytes of pixel data, Explicit VR Little Endian).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset

CT = "1.2.840.10008.5.1.4.1.1.2"
EXPLICIT_LE = "1.2.840.10008.1.2.1"
IMPLICIT_LE = "1.2.840.10008.1.2"
APP_CONTEXT = "1.2.840.10008.3.1.1.1"
IMPL_CLASS = "1.2.826.0.1.3680043.8.498.1"
ROOT = "1.2.826.0.1.3680043.8.498.78"


def _item(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", kind, 0, len(payload)) + payload


def _uid(u: str) -> bytes:
    return u.encode()  # PS3.8 §9.3.2.2: UIDs in items are not padded


def associate_rq(called: str, calling: str, max_pdu: int = 0) -> bytes:
    """A-ASSOCIATE-RQ (PS3.8 §9.3.2) proposing CT Image Storage, Explicit VR LE."""
    pc = bytes([1, 0, 0, 0]) + _item(0x30, _uid(CT)) + _item(0x40, _uid(EXPLICIT_LE))
    user = _item(0x51, struct.pack(">I", max_pdu)) + _item(0x52, _uid(IMPL_CLASS))
    body = (struct.pack(">HH", 1, 0) + called.ljust(16).encode() + calling.ljust(16).encode() + bytes(32)
            + _item(0x10, _uid(APP_CONTEXT)) + _item(0x20, pc) + _item(0x50, user))
    return struct.pack(">BBI", 0x01, 0, len(body)) + body


def _implicit(ds: Dataset) -> bytes:
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, True
    write_dataset(fp, ds)
    return fp.getvalue()


def c_store_rq(sop_uid: str, message_id: int) -> bytes:
    """C-STORE-RQ command set (PS3.7 §9.3.1.1), Implicit VR LE with its group length."""
    cmd = Dataset()
    cmd.AffectedSOPClassUID = CT
    cmd.CommandField = 0x0001
    cmd.MessageID = message_id
    cmd.Priority = 0
    cmd.CommandDataSetType = 0x0000
    cmd.AffectedSOPInstanceUID = sop_uid
    body = _implicit(cmd)
    group = Dataset()
    group.CommandGroupLength = len(body)
    return _implicit(group) + body


def p_data(payload: bytes, command: bool, max_pdu: int) -> list[bytes]:
    """P-DATA-TF PDUs (PS3.8 §9.3.5) carrying ``payload`` on presentation context 1,
    fragmented to the acceptor's Maximum Length."""
    step = (max_pdu - 6) if max_pdu else len(payload) or 1
    out = []
    for i in range(0, max(len(payload), 1), step):
        frag = payload[i:i + step]
        last = i + step >= len(payload)
        pdv = struct.pack(">IBB", len(frag) + 2, 1, (1 if command else 0) | (2 if last else 0)) + frag
        out.append(struct.pack(">BBI", 0x04, 0, len(pdv)) + pdv)
    return out


def ct_dataset(sop_uid: str, pixels: bytes) -> bytes:
    """The data set as sent (Explicit VR LE, no file meta)."""
    ds = Dataset()
    ds.SOPClassUID = CT
    ds.SOPInstanceUID = sop_uid
    ds.StudyInstanceUID = f"{ROOT}.1"
    ds.SeriesInstanceUID = f"{ROOT}.1.1"
    ds.PatientID = "LATENCY"
    ds.PatientName = "LATENCY^RAW"
    ds.Modality = "CT"
    ds.Rows = ds.Columns = 512
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = pixels
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_dataset(fp, ds)
    return fp.getvalue()


def _read_pdu(sock: socket.socket) -> tuple[int, bytes]:
    head = _read_exact(sock, 6)
    kind, _, length = struct.unpack(">BBI", head)
    return kind, _read_exact(sock, length)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    return bytes(buf)


def _acceptor_max_pdu(ac: bytes) -> int:
    """Maximum Length sub-item (0x51) of an A-ASSOCIATE-AC's user information."""
    at = 68  # after the fixed fields (PS3.8 Table 9-17)
    while at < len(ac):
        kind, _, n = struct.unpack(">BBH", ac[at:at + 4])
        if kind == 0x50:
            sub = at + 4
            while sub < at + 4 + n:
                k, _, m = struct.unpack(">BBH", ac[sub:sub + 4])
                if k == 0x51:
                    return struct.unpack(">I", ac[sub + 4:sub + 8])[0]
                sub += 4 + m
        at += 4 + n
    return 0


def raw_once(host: str, port: int, called: str, sop_uid: str, data_set: bytes, rq: bytes) -> tuple[float, ...]:
    """One association; seconds (associate, C-STORE, release, total)."""
    t0 = time.perf_counter()
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s.sendall(rq)
        kind, ac = _read_pdu(s)
        if kind != 0x02:
            raise RuntimeError(f"association not accepted (PDU type {kind:#x})")
        if ac[68 + 4 + len(APP_CONTEXT) + 4 + 2] != 0:  # presentation context result (PS3.8 §9.3.3.2)
            raise RuntimeError("presentation context refused")
        t1 = time.perf_counter()
        max_pdu = _acceptor_max_pdu(ac)
        s.sendall(b"".join(p_data(c_store_rq(sop_uid, 1), True, max_pdu) + p_data(data_set, False, max_pdu)))
        kind, rsp = _read_pdu(s)
        if kind != 0x04:
            raise RuntimeError(f"no C-STORE-RSP (PDU type {kind:#x})")
        status_at = rsp.find(b"\x00\x00\x00\x09\x02\x00\x00\x00")  # (0000,0900) Status, US
        status = struct.unpack("<H", rsp[status_at + 8:status_at + 10])[0] if status_at >= 0 else None
        if status != 0:
            raise RuntimeError(f"C-STORE status {status}")
        t2 = time.perf_counter()
        s.sendall(struct.pack(">BBI", 0x05, 0, 4) + bytes(4))
        kind, _ = _read_pdu(s)
        if kind != 0x06:
            raise RuntimeError(f"no A-RELEASE-RP (PDU type {kind:#x})")
    finally:
        s.close()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t3 - t0


def _stats(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"p50_ms": round(1000 * statistics.median(s), 2), "p99_ms": round(1000 * s[min(len(s) - 1, int(0.99 * len(s)))], 2),
            "n": len(s)}


def run_raw(host, port, called, n, pixels, tag="1") -> dict:
    rq = associate_rq(called, "RAWSCU")
    phases: list[list[float]] = [[], [], [], []]
    for i in range(n):
        sop = f"{ROOT}.{tag}.{os.getpid()}.{i + 1}"
        for k, t in enumerate(raw_once(host, port, called, sop, ct_dataset(sop, pixels), rq)):
            phases[k].append(t)
    return {name: _stats(p) for name, p in zip(("associate", "c_store", "release", "total"), phases)}


def run_pynetdicom(host, port, called, n, pixels, fast: bool) -> dict:
    from pydicom import dcmread
    from pydicom.dataset import FileMetaDataset
    from pynetdicom import AE

    if fast:
        from loadtests.load01 import fast_scu

        fast_scu()
    ae = AE(ae_title="PYSCU")
    ae.add_requested_context(CT, [EXPLICIT_LE])
    ae.maximum_pdu_size = 0
    phases: list[list[float]] = [[], [], [], []]
    for i in range(n):
        sop = f"{ROOT}.{'3' if fast else '2'}.{os.getpid()}.{i + 1}"
        ds = dcmread(DicomBytesIO(ct_dataset(sop, pixels)), force=True)
        ds.file_meta = FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = EXPLICIT_LE
        t0 = time.perf_counter()
        assoc = ae.associate(host, port, ae_title=called)
        t1 = time.perf_counter()
        st = assoc.send_c_store(ds).get("Status") if assoc.is_established else None
        t2 = time.perf_counter()
        if assoc.is_established:
            assoc.release()
        t3 = time.perf_counter()
        if st != 0:
            raise RuntimeError(f"C-STORE status {st}")
        for k, t in enumerate((t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            phases[k].append(t)
    return {name: _stats(p) for name, p in zip(("associate", "c_store", "release", "total"), phases)}


def run_dcmtk(host, port, called, n, pixels) -> dict:
    from pydicom import dcmread
    from pydicom.dataset import FileMetaDataset

    env = dict(os.environ, TCP_NODELAY="1")
    out = {}
    with tempfile.TemporaryDirectory(prefix="dimse-latency-") as tmp:
        files = []
        for i in range(n):
            sop = f"{ROOT}.4.{os.getpid()}.{i + 1}"
            ds = dcmread(DicomBytesIO(ct_dataset(sop, pixels)), force=True)
            ds.file_meta = FileMetaDataset()
            ds.file_meta.TransferSyntaxUID = EXPLICIT_LE
            ds.file_meta.MediaStorageSOPClassUID = CT
            ds.file_meta.MediaStorageSOPInstanceUID = sop
            p = Path(tmp) / f"{i}.dcm"
            ds.save_as(p, enforce_file_format=True)
            files.append(p)
        for name, cmds in (("process start (echoscu --version)", [["/usr/bin/echoscu", "--version"]] * n),
                           ("echoscu", [["/usr/bin/echoscu", "-aec", called, host, str(port)]] * n),
                           ("storescu (CT only proposed)", [["/usr/bin/storescu", "-aec", called, "-R", host, str(port), str(f)]
                                                             for f in files])):
            ts = []
            for cmd in cmds:
                t0 = time.perf_counter()
                r = subprocess.run(cmd, env=env, capture_output=True)
                ts.append(time.perf_counter() - t0)
                if r.returncode:
                    raise RuntimeError(f"{cmd[0]} failed: {r.stderr.decode()[-300:]}")
            out[name] = _stats(ts)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dimse_latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11112)
    p.add_argument("--ae-title", default="DICOMWEB")
    p.add_argument("-n", type=int, default=100)
    p.add_argument("--clients", default="raw,pynetdicom,pynetdicom-fast,dcmtk")
    args = p.parse_args(argv)
    pixels = np.random.default_rng(3).integers(0, 4096, size=512 * 512, dtype=np.uint16).tobytes()
    print(f"load average {os.getloadavg()[0]:.2f}; 512x512 16-bit CT, {len(pixels)} B pixel data; n={args.n}")
    for client in args.clients.split(","):
        if client == "raw":
            res = run_raw(args.host, args.port, args.ae_title, args.n, pixels)
        elif client in ("pynetdicom", "pynetdicom-fast"):
            res = run_pynetdicom(args.host, args.port, args.ae_title, args.n, pixels, client.endswith("fast"))
        elif client == "dcmtk":
            res = run_dcmtk(args.host, args.port, args.ae_title, args.n, pixels)
        else:
            raise SystemExit(f"unknown client {client}")
        for phase, s in res.items():
            print(f"{client:16} {phase:36} p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms  (n={s['n']})")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

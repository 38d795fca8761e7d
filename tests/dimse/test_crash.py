"""SIGKILL of the DIMSE listener process during C-STOREs: every instance that got
Success is retrievable afterwards with its pixel data, and everything searchable is
retrievable (nothing half-written visible). The approach of tests/reliability/test_crash.py."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pydicom
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage, Verification

from tests.helpers import LiveServer, free_port, make_dataset

ANY_TS = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}


def _listener(data, port) -> subprocess.Popen:
    env = {**os.environ, "DICOMWEB_DATA_DIR": str(data), "DICOMWEB_INDEX": "sqlite",
           "DICOMWEB_DIMSE_PORT": str(port), "DICOMWEB_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.dimse"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ae = AE()
    ae.add_requested_context(Verification)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assoc = ae.associate("127.0.0.1", port)
        if assoc.is_established:
            assoc.release()
            return proc
        assert proc.poll() is None, "listener exited"
        time.sleep(0.1)
    raise RuntimeError("listener did not start")


def _storer(port: int, acked: dict, stop: threading.Event, seed: int) -> None:
    ae = AE(ae_title=f"CRASH{seed}")
    ae.dimse_timeout = ae.network_timeout = ae.acse_timeout = 5
    ae.add_requested_context(CTImageStorage)
    assoc = ae.associate("127.0.0.1", port)
    if not assoc.is_established:
        return
    for _ in range(300):  # bounded
        if stop.is_set() or not assoc.is_established:
            break
        ds = make_dataset(rows=128, columns=128, PatientID=f"crash{seed}")
        try:
            rsp = assoc.send_c_store(ds)
        except Exception:
            break
        if rsp.get("Status") == 0:
            acked[ds.SOPInstanceUID] = ds
    if assoc.is_established:
        assoc.abort()


def test_sigkill_during_c_store(tmp_path):
    data = tmp_path / "data"
    port = free_port()
    proc = _listener(data, port)
    acked: dict[str, pydicom.Dataset] = {}
    stop = threading.Event()
    threads = [threading.Thread(target=_storer, args=(port, acked, stop, i)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(acked) < 15 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    stop.set()
    for t in threads:
        t.join(30)
    assert len(acked) >= 15
    srv = LiveServer(data, "sqlite", dimse_port=0).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            listed = c.get("/instances", params={"limit": 1000}).json()
            listed_sops = {i["00080018"]["Value"][0] for i in listed}
            assert set(acked) <= listed_sops
            for item in listed:  # every searchable instance is whole
                study, series, sop = (item[t]["Value"][0] for t in ("0020000D", "0020000E", "00080018"))
                r = c.get(f"/studies/{study}/series/{series}/instances/{sop}", headers=ANY_TS)
                assert r.status_code == 200, sop
                got = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"DICM") - 128:]))
                if sop in acked:
                    assert got.PixelData == acked[sop].PixelData
                else:
                    assert len(got.PixelData) == 128 * 128 * 2
    finally:
        srv.stop()

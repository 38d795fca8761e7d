"""Crash safety (issue #6): SIGKILL the server while several clients store, at each
step of the write path and at random moments; after a restart every acknowledged
instance comes back byte-identical, everything QIDO lists can be retrieved, and no
spool or partial file is left visible."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pydicom
import pytest

from loadtests.common import wait_http
from tests.helpers import free_port, make_dataset, multipart, to_bytes, spool_files
from tests.s3server import instance_keys, instance_object

CLIENTS = 4


class Server:
    def __init__(self, data: Path, index: str, fault: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}
        env.pop("DICOMWEB_FAULT", None)
        if fault:
            env["DICOMWEB_FAULT"] = fault
        self.proc = subprocess.Popen(
            # no DIMSE listener (none of its users needs one): each serve started by the tests
            # would bind the default port 11112 beside the others (SO_REUSEPORT)
            [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(data), "--index", index,
             "--workers", "1", "--port", str(self.port), "--dimse-port", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:  # a bound, not a measurement: a loaded machine starts slowly
            wait_http(self.url + "/studies?limit=1", timeout=120, proc=self.proc)
        except RuntimeError as e:  # it exited (the code is in e), or is alive past the deadline
            self.proc.kill()  # its stderr ends only when it does (a read hung here)
            raise RuntimeError(f"the server did not answer ({e}): {self.proc.communicate()[1].decode()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def _storer(url: str, seed: int, acked: dict[str, bytes], stop: threading.Event) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=10) as c:
        for _ in range(200):  # bounded
            if stop.is_set():
                return
            batch = [make_dataset(rows=64, columns=64, PatientID=f"crash{seed}") for _ in range(rng.choice((1, 1, 3)))]
            datas = {ds.SOPInstanceUID: to_bytes(ds) for ds in batch}
            body, ctype = multipart(list(datas.values()))
            try:
                r = c.post("/studies", content=body, headers={"Content-Type": ctype})
            except httpx.HTTPError:
                return  # the server died: this request was never acknowledged
            if r.status_code in (200, 202):
                for item in r.json().get("00081199", {}).get("Value", []):
                    sop = item["00081155"]["Value"][0]
                    acked[sop] = datas[sop]


def _verify(data: Path, index: str, acked: dict[str, bytes]) -> None:
    srv = Server(data, index)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            listed = c.get("/instances", params={"limit": 1000}).json()
            listed_sops = set()
            for item in listed:
                url = item["00081190"]["Value"][0]
                r = c.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"})
                assert r.status_code == 200, url  # listed => retrievable
                ds = pydicom.dcmread(__import__("io").BytesIO(r.content))
                listed_sops.add(ds.SOPInstanceUID)
            for sop, original in acked.items():
                assert sop in listed_sops, f"acknowledged instance {sop} lost"
                (hit,) = [x for x in listed if x["00080018"]["Value"][0] == sop]
                r = c.get(hit["00081190"]["Value"][0], headers={"Accept": "application/dicom; transfer-syntax=*"})
                assert r.content == original, f"acknowledged instance {sop} changed"
        assert spool_files(data) == []  # spool files of the crash were removed at start-up
        # every visible file is a complete instance (orphans of unacknowledged requests included)
        storage = _object_storage()
        if storage is not None:
            for key in instance_keys(storage):  # objects: complete, under their own UIDs
                ds = pydicom.dcmread(io.BytesIO(instance_object(storage, key)))
                ds.PixelData  # parses to the end
                assert key == f"{ds.StudyInstanceUID}/{ds.SeriesInstanceUID}/{ds.SOPInstanceUID}.dcm"
        for path in (data / "blobs").rglob("*"):
            assert path.is_dir() or path.suffix == ".dcm", path
            if path.is_file():
                pydicom.dcmread(path).PixelData  # parses to the end
    finally:
        srv.kill()


def _run(tmp_path: Path, index: str, fault: str | None, kill_after: float | None) -> dict[str, bytes]:
    data = tmp_path / "data"
    acked: dict[str, bytes] = {}
    srv = Server(data, index, fault)
    stop = threading.Event()
    threads = [threading.Thread(target=_storer, args=(srv.url, i, acked, stop)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    if kill_after is not None:
        time.sleep(kill_after)
        srv.kill()
    else:
        srv.proc.wait(60)  # the injected fault kills it
        assert srv.proc.returncode == -signal.SIGKILL
    stop.set()
    for t in threads:
        t.join(30)
    srv.kill()
    _verify(data, index, acked)
    return acked


def _database(request, monkeypatch, index: str) -> str:
    """PostgreSQL: the server processes find a new, empty schema in DICOMWEB_DATABASE_URL;
    ``+s3``: a new, empty bucket of the local S3 server in DICOMWEB_STORAGE. Returns the index."""
    index, _, storage = index.partition("+")
    if index == "postgresql":
        monkeypatch.setenv("DICOMWEB_DATABASE_URL", request.getfixturevalue("postgres").fresh_url())
    if storage:
        settings = request.getfixturevalue("s3_storage")
        monkeypatch.setenv("DICOMWEB_STORAGE", settings["storage"])
        monkeypatch.setenv("DICOMWEB_S3_ENDPOINT_URL", settings["s3_endpoint_url"])
    return index


def _object_storage() -> dict | None:
    if not os.environ.get("DICOMWEB_STORAGE"):
        return None
    return {"storage": os.environ["DICOMWEB_STORAGE"], "s3_endpoint_url": os.environ["DICOMWEB_S3_ENDPOINT_URL"]}


@pytest.mark.parametrize("index", ["sqlite", "memory", "postgresql", "sqlite+s3"])
@pytest.mark.parametrize("fault", ["spooled:6", "fsynced:6", "linked:6", "placed:6", "indexed:6"])
def test_kill_at_each_step_of_the_write_path(tmp_path, index, fault, request, monkeypatch):
    index = _database(request, monkeypatch, index)
    acked = _run(tmp_path, index, fault, None)
    assert len(acked) >= 1  # requests before the 6th reached the step and were acknowledged


@pytest.mark.parametrize("index", ["sqlite", "memory", "postgresql", "sqlite+s3"])
def test_kill_at_random_moments(tmp_path, index, request, monkeypatch):
    rng = random.Random(7)
    total = 0
    for round_ in range(3):
        bare = _database(request, monkeypatch, index)  # each round has its own data folder (and bucket)
        acked = _run(tmp_path / str(round_), bare, None, rng.uniform(0.3, 1.2))
        total += len(acked)
    assert total > 0

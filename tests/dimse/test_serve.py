"""``dicomweb-server serve --dimse-port``: the listener beside the uvicorn workers
(its own process with SQLite; inside the one worker with the in-memory index)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage

from tests.helpers import free_port, make_dataset


@pytest.mark.parametrize("index", ["sqlite", "memory"])
def test_serve_with_dimse(tmp_path, index):
    port, dport = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"), "--index", index,
         "--port", str(port), "--dimse-port", str(dport), "--ae-title", "ARCHIVE1", "--workers", "1"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ae = AE(ae_title="SERVESCU")
        ae.add_requested_context(CTImageStorage)
        deadline = time.monotonic() + 30
        while True:
            assoc = ae.associate("127.0.0.1", dport, ae_title="ARCHIVE1")
            if assoc.is_established:
                break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        ds = make_dataset(PatientID="SERVE1")
        assert assoc.send_c_store(ds).Status == 0
        assoc.release()
        while True:
            try:
                hits = httpx.get(f"http://127.0.0.1:{port}/instances", params={"PatientID": "SERVE1"}).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert [h["00080018"]["Value"][0] for h in hits] == [ds.SOPInstanceUID]
        # counted in /metrics, whichever process stored it (with SQLite the DIMSE listener is
        # its own process: it was missing from the one worker's /metrics)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines()
        assert "dicomweb_instances_stored_total 1.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_port_taken_names_the_way_out(tmp_path, caplog):
    """The README's first command starts DIMSE on 11112; when another program holds the
    port, the log names the port, the reason and the flag to use (HTTP goes on)."""
    import logging
    import socket
    import threading

    from dicomweb_server.dimse.scp import run_forever
    from dicomweb_server.settings import Settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        settings = Settings(data_dir=tmp_path / "d", dimse_port=port)
        with caplog.at_level(logging.ERROR, logger="dicomweb_server.dimse"):
            assert run_forever(settings, threading.Event()) == 1
    [msg] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"127.0.0.1:{port}" in msg and "Address already in use" in msg
    assert "--dimse-port PORT" in msg and "--dimse-port 0" in msg


def test_serve_starts_listener_processes_that_share_the_port(tmp_path):
    """--dimse-processes 2: two listener processes bound to one port (SO_REUSEPORT), the
    kernel spreading associations over them; every C-STORE lands in the one archive."""
    import psutil

    port, dport = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--port", str(port), "--dimse-port", str(dport), "--workers", "1", "--dimse-processes", "2"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            # (a socket psutil finds in /proc/net/tcp before it finds the descriptor of a
            # process starting has pid None: psutil.Process(None) is this process; CI saw it)
            listeners = {c.pid for c in psutil.net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == dport
                         and c.pid is not None}
            if len(listeners) == 2:
                break
            assert proc.poll() is None and time.monotonic() < deadline, listeners
            time.sleep(0.2)
        parents = {p: psutil.Process(p).ppid() for p in listeners}
        assert set(parents.values()) == {proc.pid}, (proc.pid, parents)
        ae = AE(ae_title="SERVESCU")
        ae.add_requested_context(CTImageStorage)
        sent = []
        for i in range(8):  # one association each: the kernel picks a listener per connection
            assoc = ae.associate("127.0.0.1", dport, ae_title="DICOMWEB")
            assert assoc.is_established
            ds = make_dataset(PatientID="SHARED", InstanceNumber=i + 1)
            assert assoc.send_c_store(ds).Status == 0
            assoc.release()
            sent.append(ds.SOPInstanceUID)
        while True:
            try:
                hits = httpx.get(f"http://127.0.0.1:{port}/instances", params={"PatientID": "SHARED"}).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert sorted(h["00080018"]["Value"][0] for h in hits) == sorted(sent)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_one_info_line_per_association_and_no_warning_at_start(tmp_path):
    """Issue 26 item 7: the listener's start was a WARNING, and each association logged five
    lines (pynetdicom's, ours twice, the audit JSON without --audit-log): INFO is
    information, one line per association (its end), WARNING is something to act on."""
    from pynetdicom.sop_class import Verification

    port, dport = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"),
                             "--port", str(port), "--dimse-port", str(dport), "--workers", "1",
                             "--dimse-processes", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "DIMSE DICOMWEB at" in line:
                break
        ae = AE(ae_title="ECHOER")
        ae.add_requested_context(Verification)
        deadline = time.monotonic() + 30
        for _ in range(2):
            while not (assoc := ae.associate("127.0.0.1", dport, ae_title="DICOMWEB")).is_established:
                assert proc.poll() is None and time.monotonic() < deadline  # a refused connection: no log line
                time.sleep(0.1)
            assert assoc.send_c_echo().Status == 0
            assoc.release()
        time.sleep(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        lines += proc.communicate(timeout=30)[1].splitlines(keepends=True)
    about = [line for line in lines if ("ECHOER" in line or "ssociation" in line)
             and not line.startswith("dicomweb-server: DIMSE DICOMWEB at")]  # the start line names the limits
    assert len(about) == 2 and all(line.startswith("INFO: dicomweb_server.dimse: association released: ECHOER -> "
                                                   "DICOMWEB from 127.0.0.1:") for line in about), about
    assert not [line for line in lines if line.startswith("WARNING") or '"protocol":"DIMSE"' in line], lines


@pytest.mark.parametrize(("cores", "expected"), [(1, 2), (2, 4), (3, 6), (4, 8), (16, 8), (None, 2)])
def test_listener_processes_by_default_two_per_core(cores, expected, monkeypatch):
    """dimse_processes 0: two per core, at least 2, at most 8 (an association mostly waits for
    its syncs while another process's Python runs: docs/dimse.md, "How it uses the cores")."""
    from dicomweb_server.dimse import listeners
    from dicomweb_server.settings import Settings

    monkeypatch.setattr(listeners.os, "cpu_count", lambda: cores)
    assert listeners.dimse_processes(Settings(dimse_processes=0)) == expected
    assert listeners.dimse_processes(Settings(dimse_processes=3)) == 3

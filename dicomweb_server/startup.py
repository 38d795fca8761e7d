"""What ``dicomweb-server serve`` says at start-up: the addresses, once they accept
connections, and a warning when run as root on a non-loopback address.

The HTTP port is bound by uvicorn (after the application's start-up with one worker,
before the workers start with several) and the DIMSE port by the listener processes
(or the one worker of the in-memory index): serve prints each address when a TCP
connection to it succeeds, so that a user who copies the address finds it answering
(the connection is closed at once: no HTTP request, no association; nothing is logged
for it by uvicorn or the DIMSE listener).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

#: seconds between attempts to connect to a port that does not accept yet
PROBE_EVERY = 0.05


def _probe_host(host: str) -> str:
    """The address to connect to for a listener bound to ``host`` (any address: loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds now (closed at once)."""
    try:
        with socket.create_connection((_probe_host(host), port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_then_print(host: str, port: int, lines: list[str], stop: threading.Event | None = None) -> None:
    """Print ``lines`` to stderr once ``host:port`` accepts connections (port 0: at once,
    the port is not known here)."""
    while port and not accepts(host, port):
        if stop is not None and stop.wait(PROBE_EVERY):
            return
        if stop is None:
            time.sleep(PROBE_EVERY)
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def announce_when_listening(settings, workers: int, dimse_processes: int) -> threading.Thread:
    """A daemon thread printing the DICOMweb (and viewer) address when the HTTP port
    accepts, then the DIMSE address when that port does (``dimse_processes`` 0: the
    listener runs in the worker)."""
    # port 0: the kernel picks the port when a worker binds it, after this line is made; an
    # address ending in ":0" is one no client can use
    base = f"http://{settings.host}:{settings.port or '<port>'}"
    picked = " (--port 0: a port the kernel picked; `ss -ltnp` shows it)" if not settings.port else ""
    http = [f"dicomweb-server: DICOMweb at {base}{settings.prefix}/ ({settings.index} index, data in "
            f"{Path(settings.data_dir).resolve()}, {workers} worker(s)){picked}"]
    if settings.viewer:
        http.append(f"dicomweb-server: OHIF viewer at {base}/viewer/")

    def run() -> None:
        wait_then_print(settings.host, settings.port, http)
        if settings.dimse_on():
            from .dimse.slots import per_peer_limit

            where = f"{dimse_processes} listener process(es)" if dimse_processes else "in the worker"
            where += (f", {settings.dimse_max_associations} associations, {per_peer_limit(settings)} per peer")
            for label, port in (("DIMSE", settings.dimse_port), ("DICOM TLS", settings.dimse_tls_port)):
                if port:  # the same listener processes and slots serve both (dimse/scp.py)
                    wait_then_print(settings.host, port,
                                    [f"dicomweb-server: {label} {settings.ae_title} at {settings.host}:{port} "
                                     f"({where})"])

    thread = threading.Thread(target=run, name="announce", daemon=True)
    thread.start()
    return thread


def warn_if_root(host: str, loopback: bool) -> None:
    """A WARNING line when serve runs as root and listens beyond loopback: it needs no
    privilege (ports above 1023), and a flaw in any library it parses DICOM with would
    then be root's. docs: a systemd unit with its own user (docs/dicomweb-server.service)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not loopback:
        print(f"dicomweb-server: WARNING: running as root and listening on {host}: run the archive as its "
              "own unprivileged user (see docs/dicomweb-server.service)", file=sys.stderr, flush=True)

"""``python -m dicomweb_server.dimse``: the DIMSE listener as its own process, with
settings from the ``DICOMWEB_*`` environment (started by ``dicomweb-server serve``
beside the uvicorn workers; it stops on SIGTERM/SIGINT)."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from ..settings import Settings
from .scp import run_forever


def main() -> int:
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s: %(name)s: %(message)s")
    logging.getLogger("pynetdicom").setLevel(logging.WARNING)
    if settings.audit_log is not None:
        from ..api.auth import configure_audit_file  # the same JSON-lines audit file as HTTP

        configure_audit_file(settings.audit_log)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run_forever(settings, stop)


if __name__ == "__main__":
    sys.exit(main())

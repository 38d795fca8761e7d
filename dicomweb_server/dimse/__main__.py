"""``python -m dicomweb_server.dimse [--parent-fd FD] [--slots-fd FD]``: the DIMSE listener as its own
process, with settings from the ``DICOMWEB_*`` environment (started by ``dicomweb-server
serve`` beside the uvicorn workers). It stops on SIGTERM/SIGINT, or when the pipe ``FD``
(whose write end only ``serve`` holds) reaches end-of-file: ``serve`` is gone. The end is
bounded (:mod:`.shutdown`). ``--slots-fd``: the association slot table the listeners of one
``serve`` share (:mod:`.slots`)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ..settings import Settings
from .scp import run_forever
from .shutdown import stop_on_signals_and_parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dicomweb_server.dimse")
    parser.add_argument("--parent-fd", type=int, help="stop when this pipe reaches end-of-file")
    parser.add_argument("--slots-fd", type=int, help="the node's association slot table (slots.py; from serve)")
    args = parser.parse_args(argv)
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s: %(name)s: %(message)s")
    if settings.audit_log is not None:
        from ..access.audit import configure_audit_file  # the same JSON-lines audit file as HTTP

        configure_audit_file(settings.audit_log)
    stop = threading.Event()

    # a second signal changes nothing: Ctrl-C reaches serve and its listeners at once, and
    # serve then sends SIGTERM; the end is bounded anyway (run_forever's watchdog)
    stop_on_signals_and_parent(stop, (signal.SIGTERM, signal.SIGINT), args.parent_fd)
    return run_forever(settings, stop, args.slots_fd)


if __name__ == "__main__":
    sys.exit(main())

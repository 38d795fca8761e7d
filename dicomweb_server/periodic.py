"""Housekeeping on the server's event loop: a blocking job run in a worker thread every
``interval`` seconds (the first one ``interval`` after start), its failures logged and
tried again at the next interval, cancelled with the app (app.py's lifespan)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


async def every(interval: float, work: Callable[[], object], what: str, log: logging.Logger) -> None:
    """Run ``work()`` in a thread every ``interval`` seconds until cancelled; an exception
    is logged as ``what``'s warning and the loop goes on."""
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(work)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - housekeeping: tried again at the next interval
            log.warning("%s: %s", what, e)

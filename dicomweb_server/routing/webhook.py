"""Webhooks: a destination of kind ``webhook`` is told of every change of the change
log (store/changes.py): each create and delete, one ``POST`` per change, whose JSON body
is the change feed entry (api/changefeed.py, Microsoft dicom-server's fields, without
``Metadata``; ``State`` is the instance's state when the request is sent)::

    [[destinations]]
    name = "events"
    webhook = { url = "https://hooks.example/dicom", secret = "s3cret" }
    headers = { Authorization = "Bearer ..." }     # optional, sent with every request

Delivery is the outbox's (routing/outbox.py): a row per (change, webhook), written by an
index change hook in the transaction that logs the change, claimed under a lease, retried
with backoff, dead-lettered after ``max_attempts``/``max_age``. At least once: a receiver
may see a change twice (after a crash between its answer and the settlement) and out of
order across changes (concurrent lanes, retries); ``Sequence`` orders and deduplicates.

- Delivered: any 2xx answer. Anything else (another status, a timeout, a refused
  connection) is retried.
- With ``secret``: header ``X-DICOMweb-Signature: sha256=<hex>``, the HMAC-SHA256
  (RFC 2104) of the exact body bytes under the secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Callable

import httpx
import orjson

from ..store.changes import Change
from .destinations import Verdict
from .outbox import Row
from .rules import Destination

SIGNATURE = "X-DICOMweb-Signature"


def signature(secret: str, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookSender:
    """POSTs the changes of claimed outbox rows, one request per change, in Sequence
    order within a batch. ``lookup(sequence)`` reads a change-log row (a blocking
    index read: run in a thread)."""

    def __init__(self, destination: Destination, timeout: float, lookup: Callable[[int], Change | None]) -> None:
        assert destination.webhook is not None
        self.destination = destination
        self.webhook = destination.webhook
        self.lookup = lookup
        self.client = httpx.AsyncClient(timeout=timeout, headers=destination.headers)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, rows: list[Row], within: float) -> list[tuple[Verdict, str | None]]:
        """Send the change of each row (the caller bounds the time: ``within``)."""
        deadline = time.monotonic() + within
        changes = await asyncio.to_thread(lambda: [self.lookup(r.change) if r.change else None for r in rows])
        out: list[tuple[Verdict, str | None]] = []
        for change in changes:
            if change is None:
                out.append((Verdict.FAILED, "not a change of the change log"))
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                out.append((Verdict.RETRY, "batch took too long; the rest is sent later"))
                continue
            out.append(await self._post(change, left))
        return out

    async def _post(self, change: Change, within: float) -> tuple[Verdict, str | None]:
        body = orjson.dumps(change.entry())
        headers = {"Content-Type": "application/json"}
        if self.webhook.secret is not None:
            headers[SIGNATURE] = signature(self.webhook.secret, body)
        try:
            async with asyncio.timeout(within):
                r = await self.client.post(self.webhook.url, content=body, headers=headers)
        except TimeoutError:
            return Verdict.RETRY, f"no answer within {within:g} s"
        except (httpx.HTTPError, OSError) as e:
            return Verdict.RETRY, f"{type(e).__name__}: {e}"
        if 200 <= r.status_code < 300:
            return Verdict.DELIVERED, None
        return Verdict.RETRY, f"HTTP {r.status_code}"

"""Webhooks: a destination of kind ``webhook`` is told of every change of the change
log (store/changes.py): each create and delete, one ``POST`` per change, whose JSON body
is the change feed entry (api/changefeed.py, Microsoft dicom-server's fields, without
``Metadata``; ``State`` is the instance's state when the request is sent)::

    [[destinations]]
    name = "events"
    webhook = { url = "https://hooks.example/dicom", secret = "s3cret" }
    headers = { Authorization = "Bearer ..." }     # optional, sent with every request

With ``stable_after = N`` in the ``webhook`` table the webhook is also told when a study
has been stable: N seconds after the last new instance of a study (each new instance
pushes the moment back), one ``POST`` of ``{"Action": "stable", "StudyInstanceUid": ...,
"Timestamp": ..., "NumberOfStudyRelatedInstances": n}`` (no Sequence: it is not a change
of the log). Nothing is sent for a study deleted meanwhile. It is an outbox row too (due
later), so it survives restarts; a study that receives an instance while its event is
being sent gets another one later.

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
from typing import TYPE_CHECKING

import httpx
import orjson

from ..store.changes import Change, iso
from .destinations import Verdict
from .outbox import Row
from .rules import Destination

if TYPE_CHECKING:
    from . import Routing

SIGNATURE = "X-DICOMweb-Signature"


def signature(secret: str, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookSender:
    """POSTs the changes of claimed outbox rows, one request per change, in the
    rows' order. ``routing`` reads change-log rows and study sizes (blocking index
    reads: run in a thread)."""

    def __init__(self, destination: Destination, timeout: float, routing: Routing) -> None:
        assert destination.webhook is not None
        self.destination = destination
        self.webhook = destination.webhook
        self.routing = routing
        self.client = httpx.AsyncClient(timeout=timeout, headers=destination.headers)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, rows: list[Row], within: float) -> list[tuple[Verdict, str | None]]:
        """Send the change of each row (the caller bounds the time: ``within``)."""
        deadline = time.monotonic() + within
        bodies = await asyncio.to_thread(lambda: [self._body(r) for r in rows])
        out: list[tuple[Verdict, str | None]] = []
        for body in bodies:
            if body is None or isinstance(body, str):
                out.append((Verdict.DELIVERED, None) if body is None else (Verdict.FAILED, body))
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                out.append((Verdict.RETRY, "batch took too long; the rest is sent later"))
                continue
            out.append(await self._post(body, left))
        return out

    def _body(self, row: Row) -> bytes | str | None:
        """What to send for ``row``: the JSON body, None when nothing is owed (a study
        deleted before it was stable), an error message for a row that names no change."""
        if row.change == 0:
            n = self.routing.study_size(row.study_uid)
            if not n:
                return None
            return orjson.dumps({"Action": "stable", "StudyInstanceUid": row.study_uid,
                                 "Timestamp": iso(time.time()), "NumberOfStudyRelatedInstances": n})
        change: Change | None = self.routing.change(row.change) if row.change is not None else None
        return orjson.dumps(change.entry()) if change is not None else "not a change of the change log"

    async def _post(self, body: bytes, within: float) -> tuple[Verdict, str | None]:
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

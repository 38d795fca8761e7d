"""Sending a batch of stored instances to one destination: STOW-RS (PS3.18 §10.5)
with httpx, or C-STORE (PS3.4 Annex B, PS3.7 §9.1.1) with pynetdicom's SCU.

Each sender answers, per instance, one :class:`Verdict`:
``DELIVERED`` (only when the destination said it stored that instance: named in the
ReferencedSOPSequence of a STOW-RS response, or a C-STORE Success or Warning status);
``RETRY`` (the destination or the network may get better: 5xx, 408,
429, timeouts, refused connections, out-of-resources statuses, or a configuration
the operator may fix such as 401/403/404); ``FAILED`` (the destination refused this
instance for good: a FailureReason or C-STORE status other than out of resources,
or 400/409 for a batch of one); ``SOLO`` (the destination refused a batch as a whole
without saying which instance: each is sent alone next, so one bad instance cannot
block the others).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import httpx
import orjson

from ..dimse import tls
from .rules import Destination

CHUNK = 1 << 20
#: the most of a destination's answer that is read (a Store Instances Response for a
#: batch is a few KiB): a longer answer is a failed delivery, the rest never read
MAX_ANSWER = 1 << 20
#: how much of an answer that is not a Store Instances Response the error keeps
ANSWER_SHOWN = 200


class Verdict(str, Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    SOLO = "solo"


@dataclass(frozen=True, slots=True)
class Item:
    sop_uid: str
    path: Path  # absolute
    size: int


def retryable_reason(code: int) -> bool:
    """FailureReason / C-STORE status worth retrying: out of resources (PS3.4 B.2.3
    A7xx) and processing failure (PS3.7 C.4 0110). Others are permanent."""
    return 0xA700 <= code <= 0xA7FF or code == 0x0110


class StowSender:
    """STOW-RS ``POST {root}/studies``, one PS3.10 file per part, streamed from
    disk (file reads run in a thread, never on the event loop)."""

    def __init__(self, destination: Destination, timeout: float) -> None:
        self.destination = destination
        self.url = f"{destination.stow_url}/studies"
        self.client = httpx.AsyncClient(timeout=timeout, headers=destination.headers)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, items: list[Item], within: float) -> list[tuple[Verdict, str | None]]:
        """Send ``items`` in one request (the caller bounds the time: ``within``)."""
        boundary = uuid.uuid4().hex
        head = f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        tail = f"--{boundary}--\r\n".encode()
        length = sum(len(head) + it.size + 2 for it in items) + len(tail)

        async def body() -> AsyncIterator[bytes]:
            for it in items:
                yield head
                f = await asyncio.to_thread(open, it.path, "rb")
                try:
                    sent = 0
                    while chunk := await asyncio.to_thread(f.read, CHUNK):
                        sent += len(chunk)
                        yield chunk
                finally:
                    f.close()
                if sent != it.size:  # changed under us: the Content-Length would lie
                    raise OSError(f"{it.path} changed size while being sent")
                yield b"\r\n"
            yield tail

        headers = {"Content-Type": f'multipart/related; type="application/dicom"; boundary={boundary}',
                   "Content-Length": str(length), "Accept": "application/dicom+json"}
        try:
            async with asyncio.timeout(within):
                async with self.client.stream("POST", self.url, content=body(), headers=headers) as r:
                    answer = await read_bounded(r, MAX_ANSWER)
        except TimeoutError:
            return [(Verdict.RETRY, f"the request took longer than {within:g} s (half the lease)")] * len(items)
        except (httpx.HTTPError, OSError) as e:
            return [(Verdict.RETRY, f"{type(e).__name__}: {e}")] * len(items)
        if answer is None:
            return [(Verdict.RETRY, f"HTTP {r.status_code}: the answer is longer than {MAX_ANSWER} bytes "
                                    "(not a Store Instances Response; the rest was not read)")] * len(items)
        return stow_verdicts(r.status_code, answer, [it.sop_uid for it in items],
                             r.headers.get("warning", ""), r.headers.get("content-type", ""))


async def read_bounded(response: httpx.Response, limit: int) -> bytes | None:
    """The body of a streamed ``response``, or None as soon as it is longer than
    ``limit`` bytes (announced or read; decoded, so a compressed answer counts at its
    inflated size): what is left is never read (leaving the stream closes it)."""
    announced = response.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > limit:
        return None
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _shown(body: bytes) -> str:
    """The start of an answer, for the error a row keeps."""
    text = body[:ANSWER_SHOWN].decode("utf-8", "replace")
    return repr(text + ("..." if len(body) > ANSWER_SHOWN else "")) if body else "an empty body"


#: Content-Types of a Store Instances Response read as DICOM JSON: the standard's
#: (PS3.18 Annex F, the DICOM JSON Model) and ``application/json``, which some servers
#: send for the same body (what counts is the ReferencedSOPSequence inside, not the label)
STORE_RESPONSE_TYPES = ("application/dicom+json", "application/json")


def stow_verdicts(status: int, body: bytes, sops: list[str], warning: str = "", content_type: str = ""
                  ) -> list[tuple[Verdict, str | None]]:
    """Per-instance verdicts from a Store Instances Response (PS3.18 §10.5.3, Table
    10.5.3-1), DICOM JSON (PS3.18 Annex F) labelled ``application/dicom+json`` or, as
    some servers label it, ``application/json`` (:data:`STORE_RESPONSE_TYPES`): an
    instance is delivered only when an item of ReferencedSOPSequence (0008,1199) names
    it (ReferencedSOPInstanceUID 0008,1155). FailedSOPSequence (0008,1198) items name
    the instances that failed and why (FailureReason 0008,1197). A 200 or 202 that
    names neither (an empty body, an HTML page of a login portal, ``{}``, whatever its
    Content-Type) is retried, and in the end dead-lettered, with the start of the
    answer as the error."""
    failed: dict[str, int] = {}
    stored: set[str] = set()
    doc = None
    if content_type.split(";")[0].strip().lower() in STORE_RESPONSE_TYPES:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
    if isinstance(doc, dict):
        try:
            for item in (doc.get("00081198") or {}).get("Value", []):
                sop = item.get("00081155", {}).get("Value", [None])[0]
                reason = item.get("00081197", {}).get("Value", [0x0110])[0]
                if sop:
                    failed[sop] = int(reason)
            for item in (doc.get("00081199") or {}).get("Value", []):
                sop = item.get("00081155", {}).get("Value", [None])[0]
                if isinstance(sop, str):
                    stored.add(sop)
        except (AttributeError, TypeError, ValueError, IndexError):
            failed, stored, doc = {}, set(), None
    detail = f"HTTP {status}" + (f": {warning[:300]}" if warning else "")
    if status in (200, 202) or (status == 409 and failed):
        if doc is None:
            why = (f"{detail}; the answer is {content_type or 'without a Content-Type'}, not a Store Instances "
                   f"Response (DICOM JSON: application/dicom+json or application/json): {_shown(body)}")
        else:
            why = f"{detail}; not named in ReferencedSOPSequence (0008,1199): {_shown(body)}"
        out = []
        for sop in sops:
            code = failed.get(sop)
            if code is not None:
                v = Verdict.RETRY if retryable_reason(code) else Verdict.FAILED
                out.append((v, f"{detail}; FailureReason 0x{code:04X}"))
            elif sop in stored and status != 409:
                out.append((Verdict.DELIVERED, None))
            else:
                out.append((Verdict.RETRY, why))
        return out
    if status in (400, 409, 413):  # the request as a whole refused: find the culprit alone
        return [(Verdict.SOLO if len(sops) > 1 else Verdict.FAILED, detail)] * len(sops)
    return [(Verdict.RETRY, detail)] * len(sops)


class DimseSender:
    """C-STORE SCU (pynetdicom): one association per batch, the presentation
    contexts of the batch's SOP classes and transfer syntaxes (read from the files'
    meta information), one C-STORE per instance; over DICOM TLS with ``tls = true``
    (PS3.15 Annex B, dimse/tls.py). Runs in a thread."""

    def __init__(self, destination: Destination, timeout: float) -> None:
        assert destination.dimse is not None
        self.destination = destination
        self.address = destination.dimse
        self.timeout = timeout

    async def aclose(self) -> None:
        return None

    async def send(self, items: list[Item], within: float) -> list[tuple[Verdict, str | None]]:
        """Send ``items`` on one association; no C-STORE starts after ``within``
        seconds (a thread cannot be cancelled: the caller's timeout would not stop it)."""
        return await asyncio.to_thread(self._send, items, time.monotonic() + within * 0.8)

    def _send(self, items: list[Item], deadline: float) -> list[tuple[Verdict, str | None]]:
        from pydicom import dcmread
        from pynetdicom import AE

        a = self.address
        contexts: dict[str, set[str]] = {}
        metas = []
        for it in items:
            try:
                meta = dcmread(it.path, stop_before_pixels=True, specific_tags=["SOPClassUID"]).file_meta
                metas.append((str(meta.MediaStorageSOPClassUID), str(meta.TransferSyntaxUID)))
            except Exception:  # noqa: BLE001 - an unreadable stored file fails that instance only
                metas.append(None)
                continue
            contexts.setdefault(metas[-1][0], set()).add(metas[-1][1])
        ae = AE(ae_title=a.calling_ae_title)
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = self.timeout
        for sop_class, syntaxes in contexts.items():
            for ts in sorted(syntaxes):  # one context per (class, syntax): the SCP answers each
                ae.add_requested_context(sop_class, [ts])
        try:
            tls_args = tls.tls_args(a.tls, a.host)  # DICOM TLS (PS3.15 Annex B)
        except tls.TlsError as e:  # a file changed since start: the operator may fix it
            return [(Verdict.RETRY, str(e))] * len(items)
        assoc = ae.associate(a.host, a.port, ae_title=a.ae_title, tls_args=tls_args)
        if not assoc.is_established:
            why = "rejected" if assoc.is_rejected else "aborted" if assoc.is_aborted else "not established"
            return [(Verdict.RETRY, f"association with {a.ae_title}@{a.host}:{a.port} {why}")] * len(items)
        out: list[tuple[Verdict, str | None]] = []
        try:
            for it, meta in zip(items, metas):
                if meta is None:
                    out.append((Verdict.FAILED, "the stored file cannot be read"))
                    continue
                if not assoc.is_established:
                    out.append((Verdict.RETRY, "association released or aborted"))
                    continue
                if time.monotonic() > deadline:
                    out.append((Verdict.RETRY, "batch took too long; the rest is sent later"))
                    continue
                try:
                    status = assoc.send_c_store(os.fspath(it.path))
                except ValueError as e:  # no accepted presentation context for this class/syntax
                    out.append((Verdict.FAILED, f"not accepted by {a.ae_title}: {e}"))
                    continue
                code = getattr(status, "Status", None)
                if code is None:
                    out.append((Verdict.RETRY, "no C-STORE response (timeout or abort)"))
                elif code in (0x0000, 0x0001) or 0xB000 <= code <= 0xBFFF:  # success or warning (PS3.4 B.2.3)
                    out.append((Verdict.DELIVERED, None))
                else:
                    out.append((Verdict.RETRY if retryable_reason(code) else Verdict.FAILED,
                                f"C-STORE status 0x{code:04X}"))
        finally:
            if assoc.is_established:
                assoc.release()
        return out


def sender_for(destination: Destination, timeout: float) -> StowSender | DimseSender:
    return StowSender(destination, timeout) if destination.stow_url else DimseSender(destination, timeout)


def item_for(path: Path, sop_uid: str) -> Item | None:
    """The item to send, or None when the file is gone."""
    try:
        return Item(sop_uid, path, os.stat(path).st_size)
    except FileNotFoundError:
        return None

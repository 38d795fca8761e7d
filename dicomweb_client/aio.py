"""Asynchronous DICOMweb client on ``httpx.AsyncClient``.

The methods are the same objects as in :class:`~dicomweb_client.DICOMwebClient`
(defined once in :mod:`dicomweb_client._api`); here the three drivers are
coroutines / async generators, so every method returns an awaitable and every
``iter_*`` method an async iterator::

    async with AsyncDICOMwebClient("http://127.0.0.1:8080") as client:
        studies = await client.search_for_studies(limit=10)
        async for ds in client.iter_series(study_uid, series_uid):
            ...
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Iterator, Mapping

import anyio
import anyio.to_thread
import httpx

from . import _core, negotiation
from ._api import UNSET, _DICOMwebAPI
from ._core import RequestSpec, StreamSpec
from .stow import DEFAULT_CHUNK_SIZE, StowBody

__all__ = ["AsyncDICOMwebClient"]

_END = object()


async def _aiter_body(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Produce a (sync) STOW body in a worker thread: file reads and
    ``dcmwrite`` of Datasets must not block the event loop."""
    it = iter(chunks)
    while True:
        chunk = await anyio.to_thread.run_sync(next, it, _END)
        if chunk is _END:
            return
        yield chunk


class AsyncDICOMwebClient(_DICOMwebAPI):
    """Client of a DICOMweb service for asyncio (or trio) programs.

    Same parameters as :class:`~dicomweb_client.DICOMwebClient`, with
    ``client`` an ``httpx.AsyncClient`` and ``transport`` an
    ``httpx.AsyncBaseTransport``. Every method is awaited; ``iter_*``
    methods are used with ``async for``. Close with :meth:`aclose` or
    ``async with``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        auth: Any = None,
        token: str | None = None,
        timeout: Any = UNSET,
        retries: int = 2,
        backoff_factor: float = 0.5,
        headers: Mapping[str, str] | None = None,
        qido_url_prefix: str | None = None,
        wado_url_prefix: str | None = None,
        stow_url_prefix: str | None = None,
        delete_url_prefix: str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http: httpx.AsyncClient = self._configure(
            url,
            client,
            httpx.AsyncClient,
            auth=auth,
            token=token,
            timeout=timeout,
            retries=retries,
            backoff_factor=backoff_factor,
            headers=headers,
            qido_url_prefix=qido_url_prefix,
            wado_url_prefix=wado_url_prefix,
            stow_url_prefix=stow_url_prefix,
            delete_url_prefix=delete_url_prefix,
            chunk_size=chunk_size,
            transport=transport,
        )

    # Lifecycle -------------------------------------------------------------
    @property
    def http(self) -> httpx.AsyncClient:
        """The underlying ``httpx.AsyncClient``."""
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP connections (only if this object created the httpx client)."""
        if self._owns_http:
            await self._http.aclose()

    close = aclose

    async def __aenter__(self) -> "AsyncDICOMwebClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncDICOMwebClient({self.base_url!r})"

    # I/O -------------------------------------------------------------------
    async def _send(self, spec: RequestSpec, *, stream: bool) -> httpx.Response:
        """Send ``spec``; after a refused default Accept send ``spec.fallback``, and so on
        down its chain (:mod:`dicomweb_client.negotiation`)."""
        first = spec
        response = await self._send_with_retries(spec, stream=stream)
        while negotiation.falls_back(spec, response.status_code):
            await response.aread()
            await response.aclose()
            retried = await self._send_with_retries(spec.fallback, stream=stream)
            self._fell_back(first, spec, response, retried)
            spec, response = spec.fallback, retried
        return response

    async def _send_with_retries(self, spec: RequestSpec, *, stream: bool) -> httpx.Response:
        """Send ``spec``; retry idempotent requests on connection errors and retryable statuses."""
        attempt = 0
        auth = self._auth if self._auth is not None else httpx.USE_CLIENT_DEFAULT
        while True:
            body = spec.body
            content = _aiter_body(iter(body)) if isinstance(body, StowBody) else body
            request = self._http.build_request(spec.method, spec.url, content=content, **self._build_kwargs(spec))
            try:
                response = await self._http.send(request, stream=stream, auth=auth)
            except httpx.TransportError as exc:
                if self._retry.should_retry_exception(spec, exc, attempt):
                    await anyio.sleep(self._retry.delay(attempt))
                    attempt += 1
                    continue
                raise _core.wrap_transport_error(exc, spec) from exc
            if self._retry.should_retry_status(spec, response.status_code, attempt):
                retry_after = response.headers.get("retry-after")
                await response.aclose()
                await anyio.sleep(self._retry.delay(attempt, retry_after))
                attempt += 1
                continue
            return response

    async def _run(self, plan: _core.Plan) -> Any:
        try:
            spec = next(plan)
            while True:
                response = await self._send(spec, stream=False)
                if spec.raise_for_status:
                    _core.raise_for_response(response, spec)
                spec = plan.send(response)
        except StopIteration as stop:
            return stop.value
        finally:
            plan.close()

    async def _stream(self, spec: StreamSpec) -> AsyncIterator[Any]:
        response = await self._send(spec.request, stream=True)
        try:
            try:
                if response.status_code >= 400:
                    await response.aread()
                    _core.raise_for_response(response, spec.request)
                parts = _core.aiter_response_parts(response.headers, response.aiter_bytes())
                if spec.byte_range is not None and response.status_code == 200:  # Range ignored: the whole value
                    parts = _core.arange_of_whole(parts, spec.byte_range)
                async for part in parts:
                    if spec.offload:
                        yield await anyio.to_thread.run_sync(spec.convert, part)
                    else:
                        yield spec.convert(part)
            except httpx.TransportError as exc:
                raise _core.wrap_transport_error(exc, spec.request) from exc
        finally:
            await response.aclose()

    async def _collect(self, spec: StreamSpec, one: bool = False) -> Any:
        items = [item async for item in self._stream(spec)]
        if one:
            return _core.exactly_one(items, spec.what)
        return items

"""Synchronous DICOMweb client on ``httpx.Client``.

Only I/O lives here: sending requests (with retries) and reading answers.
Request building and answer parsing are shared with the async client
(:mod:`dicomweb_client._api`, :mod:`dicomweb_client._core`).
"""
from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

import httpx

from . import _core, negotiation
from ._api import UNSET, _DICOMwebAPI
from ._core import RequestSpec, StreamSpec
from .stow import DEFAULT_CHUNK_SIZE, StowBody

__all__ = ["DICOMwebClient"]


class DICOMwebClient(_DICOMwebAPI):
    """Client of a DICOMweb service (QIDO-RS, WADO-RS, STOW-RS, DELETE), blocking.

    Method names and parameters follow the PyPI ``dicomweb-client``
    (``search_for_studies``, ``retrieve_instance_frames``, ``store_instances`` ...);
    every ``retrieve_*`` that returns several items has a streaming ``iter_*`` twin.

    Parameters
    ----------
    url : str, optional
        Service root, e.g. ``"http://127.0.0.1:8080"`` or ``"https://host/dicom-web"``.
        Optional when ``client`` has a ``base_url``.
    client : httpx.Client, optional
        An existing client (its transport, proxies, TLS settings, auth and
        headers are used; it is not closed by :meth:`close`).
    auth : httpx.Auth or (str, str), optional
        Any httpx authentication; a ``(user, password)`` tuple is HTTP Basic.
    token : str, optional
        Bearer token (``Authorization: Bearer ...``). Exclusive with ``auth``.
    timeout : float or httpx.Timeout or None, optional
        Seconds; None disables timeouts. Default 30 s (or the given client's).
    retries : int
        Extra attempts for idempotent requests (GET, DELETE) after a
        connection error or a 503 answer. Default 2. STOW is never retried.
    backoff_factor : float
        Delay before retry *n* is ``backoff_factor * 2**n`` seconds (a
        ``Retry-After`` header wins, capped at 30 s).
    headers : Mapping[str, str], optional
        Extra headers on every request.
    qido_url_prefix, wado_url_prefix, stow_url_prefix, delete_url_prefix : str, optional
        Path segment per service, for servers that split them.
    chunk_size : int
        Size of file reads for STOW (bytes). Default 1 MiB.
    transport : httpx.BaseTransport, optional
        Transport of the internal client (e.g. ``httpx.MockTransport`` in tests).

    Raises
    ------
    ValueError
        Invalid URL, both ``auth`` and ``token``, negative ``retries``.

    Notes
    -----
    Methods (each documented where it is defined, :mod:`dicomweb_client._api`):

    - QIDO-RS: ``search_for_studies``, ``search_for_series``, ``search_for_instances``
    - WADO-RS: ``retrieve_study`` / ``iter_study``, ``retrieve_series`` / ``iter_series``,
      ``retrieve_instance``, ``retrieve_{study,series,instance}_metadata``,
      ``retrieve_instance_frames`` / ``iter_instance_frames``,
      ``retrieve_bulkdata`` / ``iter_bulkdata``,
      ``retrieve_{study,series,instance,instance_frames}_rendered`` / ``iter_*_rendered``,
      ``retrieve_{study,series,instance,instance_frames}_thumbnail``
    - STOW-RS: ``store_instances`` -> :class:`~dicomweb_client.results.StoreResult`
    - ``delete_study``, ``delete_series``, ``delete_instance``
    - ``set_http_retry_params``, ``set_chunk_size``, ``lookup_keyword``, ``lookup_tag``

    Examples
    --------
    >>> with DICOMwebClient("http://127.0.0.1:8080") as client:  # doctest: +SKIP
    ...     studies = client.search_for_studies(search_filters={"PatientID": "P1"})
    ...     for ds in client.iter_study(studies[0]["0020000D"]["Value"][0]):
    ...         print(ds.SOPInstanceUID)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: httpx.Client | None = None,
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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http: httpx.Client = self._configure(
            url,
            client,
            httpx.Client,
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
    def http(self) -> httpx.Client:
        """The underlying ``httpx.Client``."""
        return self._http

    def close(self) -> None:
        """Close the HTTP connections (only if this object created the httpx client)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> "DICOMwebClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DICOMwebClient({self.base_url!r})"

    # I/O -------------------------------------------------------------------
    def _send(self, spec: RequestSpec, *, stream: bool) -> httpx.Response:
        """Send ``spec``; after a refused default Accept send ``spec.fallback``, and so on
        down its chain (:mod:`dicomweb_client.negotiation`)."""
        first = spec
        response = self._send_with_retries(spec, stream=stream)
        while negotiation.falls_back(spec, response.status_code):
            response.read()
            response.close()
            retried = self._send_with_retries(spec.fallback, stream=stream)
            self._fell_back(first, spec, response, retried)
            spec, response = spec.fallback, retried
        return response

    def _send_with_retries(self, spec: RequestSpec, *, stream: bool) -> httpx.Response:
        """Send ``spec``; retry idempotent requests on connection errors and retryable statuses."""
        attempt = 0
        auth = self._auth if self._auth is not None else httpx.USE_CLIENT_DEFAULT
        while True:
            body = spec.body
            content = iter(body) if isinstance(body, StowBody) else body
            request = self._http.build_request(spec.method, spec.url, content=content, **self._build_kwargs(spec))
            try:
                response = self._http.send(request, stream=stream, auth=auth)
            except httpx.TransportError as exc:
                if self._retry.should_retry_exception(spec, exc, attempt):
                    time.sleep(self._retry.delay(attempt))
                    attempt += 1
                    continue
                raise _core.wrap_transport_error(exc, spec) from exc
            if self._retry.should_retry_status(spec, response.status_code, attempt):
                retry_after = response.headers.get("retry-after")
                response.close()
                time.sleep(self._retry.delay(attempt, retry_after))
                attempt += 1
                continue
            return response

    def _run(self, plan: _core.Plan) -> Any:
        try:
            spec = next(plan)
            while True:
                response = self._send(spec, stream=False)
                if spec.raise_for_status:
                    _core.raise_for_response(response, spec)
                spec = plan.send(response)
        except StopIteration as stop:
            return stop.value
        finally:
            plan.close()

    def _stream(self, spec: StreamSpec) -> Iterator[Any]:
        response = self._send(spec.request, stream=True)
        try:
            try:
                if response.status_code >= 400:
                    response.read()
                    _core.raise_for_response(response, spec.request)
                parts = _core.iter_response_parts(response.headers, response.iter_bytes())
                if spec.byte_range is not None and response.status_code == 200:  # Range ignored: the whole value
                    parts = _core.range_of_whole(parts, spec.byte_range)
                for part in parts:
                    yield spec.convert(part)
            except httpx.TransportError as exc:
                raise _core.wrap_transport_error(exc, spec.request) from exc
        finally:
            response.close()

    def _collect(self, spec: StreamSpec, one: bool = False) -> Any:
        items = list(self._stream(spec))
        if one:
            return _core.exactly_one(items, spec.what)
        return items

"""The public DICOMweb methods, written once for both clients.

QIDO-RS, STOW-RS and DELETE are here; WADO-RS retrieval is in
:mod:`dicomweb_client._wado` and rendered resources in
:mod:`dicomweb_client._rendered` (mixins of :class:`_DICOMwebAPI`).

Each method builds its request(s) with :mod:`dicomweb_client.urls` /
:mod:`dicomweb_client.media` and hands a plan or a stream description
(:mod:`dicomweb_client._core`) to the client's driver:

* ``self._run(plan)``      -> value               (async client: awaitable)
* ``self._stream(spec)``   -> iterator of values  (async client: async iterator)
* ``self._collect(spec, one=False)`` -> list / one value (async client: awaitable)

:class:`~dicomweb_client.client.DICOMwebClient` implements the drivers with
``httpx.Client``, :class:`~dicomweb_client.aio.AsyncDICOMwebClient` with
``httpx.AsyncClient``. In the async client every method below returns an
awaitable and every ``iter_*`` method an async iterator.

Names and parameters follow the PyPI ``dicomweb-client`` package
(``dicomweb_client.api.DICOMwebClient``) so that code can switch with a
one-line change of the import and constructor.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

from . import _core, negotiation, urls
from ._core import RequestSpec, StreamSpec
from ._rendered import _RenderedMixin
from ._wado import _WADOMixin
from .stow import DEFAULT_CHUNK_SIZE, _is_dataset, stow_body
from .urls import DELETE, SEARCH, STORE


class _Unset:
    def __repr__(self) -> str:  # pragma: no cover
        return "<unset>"


UNSET: Any = _Unset()
DEFAULT_TIMEOUT = 30.0
USER_AGENT = "dicomweb-archive-client/0.1"


class _DICOMwebAPI(_WADOMixin, _RenderedMixin):
    """Shared implementation of every DICOMweb transaction (see module docstring)."""

    _urls: urls.DICOMwebURLs
    _chunk_size: int = DEFAULT_CHUNK_SIZE
    _retry: _core.RetryPolicy
    _headers: dict
    _auth: Any
    _timeout: Any
    _owns_http: bool

    def _configure(
        self,
        url: str | None,
        client: Any,
        client_class: type,
        *,
        auth: Any,
        token: str | None,
        timeout: Any,
        retries: int,
        backoff_factor: float,
        headers: Mapping[str, str] | None,
        qido_url_prefix: str | None,
        wado_url_prefix: str | None,
        stow_url_prefix: str | None,
        delete_url_prefix: str | None,
        chunk_size: int,
        transport: Any,
    ) -> Any:
        """Validate constructor arguments; return the httpx client to use."""
        if auth is not None and token is not None:
            raise ValueError("give either auth= or token=, not both")
        if token is not None:
            auth = _core.BearerAuth(token)
        if url is None:
            if client is None or not str(client.base_url):
                raise ValueError("url is required (or a client= with a base_url)")
            url = str(client.base_url)
        self._urls = urls.DICOMwebURLs(
            url,
            qido_url_prefix=qido_url_prefix,
            wado_url_prefix=wado_url_prefix,
            stow_url_prefix=stow_url_prefix,
            delete_url_prefix=delete_url_prefix,
        )
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self._retry = _core.RetryPolicy(retries=int(retries), backoff_factor=float(backoff_factor))
        self.set_chunk_size(chunk_size)
        self._headers = dict(headers or {})
        self._known_accept: dict[str, str] = {}  # kind -> the fallback Accept the server took
        if client is not None:
            if transport is not None:
                raise ValueError("give either client= or transport=, not both")
            if not isinstance(client, client_class):
                raise TypeError(f"client must be an {client_class.__module__}.{client_class.__name__}")
            self._owns_http = False
            self._auth = auth  # per request; None = the client's own auth
            self._timeout = timeout  # UNSET = the client's own timeout
            return client
        self._owns_http = True
        self._auth = None
        self._timeout = UNSET
        return client_class(
            auth=auth,
            headers={"User-Agent": USER_AGENT},
            timeout=DEFAULT_TIMEOUT if timeout is UNSET else timeout,
            transport=transport,
            follow_redirects=True,
        )

    def set_http_retry_params(
        self,
        retry: bool = True,
        max_attempts: int = 5,
        wait_exponential_multiplier: int = 1000,
        retriable_error_codes: Sequence[int] = (429, 408, 503, 504),
    ) -> None:
        """Configure retries the way the PyPI ``dicomweb-client`` does.

        Parameters
        ----------
        retry : bool
            Whether to retry at all.
        max_attempts : int
            Total attempts (first one included).
        wait_exponential_multiplier : int
            Base delay in milliseconds (doubled after each attempt).
        retriable_error_codes : sequence of int
            HTTP statuses that are retried.

        Only idempotent requests (GET, DELETE) are retried; STOW never is.
        """
        self._retry = _core.RetryPolicy(
            retries=max(0, int(max_attempts) - 1) if retry else 0,
            backoff_factor=wait_exponential_multiplier / 1000.0,
            statuses=frozenset(int(c) for c in retriable_error_codes),
        )

    @property
    def retry_policy(self) -> _core.RetryPolicy:
        """The :class:`~dicomweb_client._core.RetryPolicy` in use (mutable)."""
        return self._retry

    def _build_kwargs(self, spec: RequestSpec) -> dict:
        """Keyword arguments of ``httpx.Client.build_request`` for ``spec`` (body excluded)."""
        kwargs: dict[str, Any] = {
            "params": spec.params or None,
            "headers": _core.merge_headers(self._headers, spec.headers),
        }
        if self._timeout is not UNSET:
            kwargs["timeout"] = self._timeout
        return kwargs

    def _default_request(
        self,
        default: negotiation.AcceptDefault,
        url: str,
        params: tuple[tuple[str, str], ...] = (),
        headers: dict | None = None,
    ) -> RequestSpec:
        """A GET with ``default``'s Accept (from the fallback the server took, once it refused the preferred one)."""
        return negotiation.default_request(default, url, params, headers, known=self._known_accept.get(default.kind))

    def _fell_back(self, first: RequestSpec, spec: RequestSpec, refused: Any, response: Any) -> None:
        """Note that ``spec``'s Accept was refused (``refused``) and its fallback answered
        ``response``; ``first``: the request of the chain (its ``negotiation`` names the kind)."""
        _core.logger.debug(
            "%s %s: HTTP %d for Accept %r (%r); sent %r instead (HTTP %d)",
            spec.method, spec.url, refused.status_code, spec.headers.get("Accept"), refused.content[:200],
            spec.fallback.headers.get("Accept"), response.status_code,
        )
        if response.status_code < 400 and first.negotiation:
            self._known_accept[first.negotiation] = spec.fallback.headers["Accept"]

    # Drivers, implemented by the sync and async clients --------------------
    def _run(self, plan: _core.Plan) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _stream(self, spec: StreamSpec) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _collect(self, spec: StreamSpec, one: bool = False) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # Attributes of the PyPI client ------------------------------------------
    @property
    def base_url(self) -> str:
        """Service root URL (without trailing slash)."""
        return self._urls.base_url

    @property
    def url_prefix(self) -> str:
        """Path part of :attr:`base_url`."""
        from urllib.parse import urlsplit

        return urlsplit(self._urls.base_url).path

    @property
    def qido_url_prefix(self) -> str | None:
        return self._urls.qido_url_prefix

    @property
    def wado_url_prefix(self) -> str | None:
        return self._urls.wado_url_prefix

    @property
    def stow_url_prefix(self) -> str | None:
        return self._urls.stow_url_prefix

    @property
    def delete_url_prefix(self) -> str | None:
        return self._urls.delete_url_prefix

    def set_chunk_size(self, chunk_size: int) -> None:
        """Set the size of the pieces read from files and from the network (bytes)."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self._chunk_size = int(chunk_size)

    @staticmethod
    def lookup_keyword(tag: Any) -> str:
        """Keyword of a DICOM attribute tag (``"00080018"`` -> ``"SOPInstanceUID"``).

        Raises
        ------
        KeyError
            Unknown tag.
        """
        from pydicom.datadict import keyword_for_tag
        from pydicom.tag import Tag

        if isinstance(tag, str):
            tag = int(tag, 16)
        keyword = keyword_for_tag(Tag(tag))
        if not keyword:
            raise KeyError(f"no keyword for tag {tag}")
        return keyword

    @staticmethod
    def lookup_tag(keyword: str) -> str:
        """Tag of a DICOM keyword as 8 upper-case hex digits (``"SOPInstanceUID"`` -> ``"00080018"``).

        Raises
        ------
        KeyError
            Unknown keyword.
        """
        from pydicom.datadict import tag_for_keyword

        tag = tag_for_keyword(keyword)
        if tag is None:
            raise KeyError(f"no tag for keyword {keyword!r}")
        return f"{tag:08X}"

    # ---------------------------------------------------------------- QIDO-RS
    def _search(
        self,
        url: str,
        fuzzymatching: bool | None,
        limit: int | None,
        offset: int | None,
        fields: Sequence[str] | None,
        search_filters: Mapping[str, Any] | None,
        get_remaining: bool,
    ) -> Any:
        def params_for(off: int | None) -> list[tuple[str, str]]:
            return urls.search_params(
                search_filters=search_filters,
                fields=fields,
                fuzzymatching=fuzzymatching,
                limit=limit,
                offset=off,
            )

        params_for(offset)  # validate arguments before any I/O
        return self._run(
            _core.search_plan(url, params_for, offset=offset, limit=limit, get_remaining=get_remaining)
        )

    def search_for_studies(
        self,
        fuzzymatching: bool | None = None,
        limit: int | None = None,
        offset: int | None = None,
        fields: Sequence[str] | None = None,
        search_filters: Mapping[str, Any] | None = None,
        get_remaining: bool = False,
    ) -> list[dict]:
        """Search for studies (QIDO-RS, ``GET {root}/studies``).

        Parameters
        ----------
        fuzzymatching : bool, optional
            Ask for fuzzy semantic matching of person names.
        limit : int, optional
            Maximum number of results per request.
        offset : int, optional
            Number of results to skip.
        fields : sequence of str, optional
            Attributes to include (keywords or tags), sent as repeated
            ``includefield``; ``["all"]`` asks for all attributes.
        search_filters : dict, optional
            ``{keyword or tag: value}``. Values: str (wildcards ``*``/``?``,
            ranges ``20200101-``), numbers, ``datetime.date``/``datetime``
            (formatted as DA/DT), ``(start, end)`` tuples of dates (range), or
            lists (UID list matching, comma separated).
        get_remaining : bool
            Repeat the search with a growing ``offset`` until every result is
            fetched (the server may cap each answer).

        Returns
        -------
        list of dict
            One DICOM JSON data set per study (attributes of PS3.18 Section 10.6.3).

        Raises
        ------
        BadRequest
            Invalid query parameter.
        HTTPError, NetworkError, ResponseError
            Other failures.

        References
        ----------
        PS3.18 Section 10.6 (Search Transaction), 8.3.4 (query parameters).
        """
        return self._search(
            self._urls.studies(SEARCH), fuzzymatching, limit, offset, fields, search_filters, get_remaining
        )

    def search_for_series(
        self,
        study_instance_uid: str | None = None,
        fuzzymatching: bool | None = None,
        limit: int | None = None,
        offset: int | None = None,
        fields: Sequence[str] | None = None,
        search_filters: Mapping[str, Any] | None = None,
        get_remaining: bool = False,
    ) -> list[dict]:
        """Search for series (``GET {root}/series`` or ``{root}/studies/{study}/series``).

        Parameters
        ----------
        study_instance_uid : str, optional
            Restrict the search to one study.
        fuzzymatching, limit, offset, fields, search_filters, get_remaining
            As in :meth:`search_for_studies`.

        Returns
        -------
        list of dict
            One DICOM JSON data set per series.

        Raises
        ------
        BadRequest, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.6.
        """
        return self._search(
            self._urls.series(SEARCH, study_instance_uid),
            fuzzymatching,
            limit,
            offset,
            fields,
            search_filters,
            get_remaining,
        )

    def search_for_instances(
        self,
        study_instance_uid: str | None = None,
        series_instance_uid: str | None = None,
        fuzzymatching: bool | None = None,
        limit: int | None = None,
        offset: int | None = None,
        fields: Sequence[str] | None = None,
        search_filters: Mapping[str, Any] | None = None,
        get_remaining: bool = False,
    ) -> list[dict]:
        """Search for instances (``{root}/instances``, ``/studies/{s}/instances``,
        ``/studies/{s}/series/{se}/instances``).

        Parameters
        ----------
        study_instance_uid : str, optional
            Restrict to one study.
        series_instance_uid : str, optional
            Restrict to one series (needs ``study_instance_uid``).
        fuzzymatching, limit, offset, fields, search_filters, get_remaining
            As in :meth:`search_for_studies`.

        Returns
        -------
        list of dict
            One DICOM JSON data set per instance.

        Raises
        ------
        ValueError
            ``series_instance_uid`` without ``study_instance_uid``.
        BadRequest, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.6.
        """
        return self._search(
            self._urls.instances(SEARCH, study_instance_uid, series_instance_uid),
            fuzzymatching,
            limit,
            offset,
            fields,
            search_filters,
            get_remaining,
        )

    # ---------------------------------------------------------------- STOW-RS
    def store_instances(
        self,
        datasets: Iterable[Any],
        study_instance_uid: str | None = None,
    ) -> Any:
        """Store instances (STOW-RS, ``POST {root}/studies[/{study}]``).

        The body is ``multipart/related; type="application/dicom"`` built while
        it is sent: files are streamed from disk in ``chunk_size`` pieces and
        Datasets are written one at a time, so memory stays at one instance
        (none for files). The request is never retried (not idempotent).

        Parameters
        ----------
        datasets : iterable
            ``pydicom.Dataset`` objects (file meta added when missing), paths
            to DICOM files (str or PathLike), PS3.10 bytes, or binary file
            objects; may be mixed, may be a generator.
        study_instance_uid : str, optional
            POST to ``/studies/{study}``: the server rejects instances of other studies.

        Returns
        -------
        StoreResult
            ``referenced`` (SOP Class UID, SOP Instance UID, RetrieveURL),
            ``failed`` (SOP Class UID, SOP Instance UID, FailureReason),
            ``warnings``, ``raw`` DICOM JSON. HTTP 202 (partial failure) is
            returned, not raised: check ``result.failed``.

        Raises
        ------
        StoreError
            HTTP 409: no instance stored (``exc.result`` lists the failures).
        PayloadTooLarge, UnsupportedMediaType, BadRequest, HTTPError, NetworkError
            Other failures.

        References
        ----------
        PS3.18 Section 10.5 (Store Transaction), Table 10.5.3-1 (status codes).
        """
        if isinstance(datasets, (str, bytes, os.PathLike)) or hasattr(datasets, "read") or _is_dataset(datasets):
            datasets = [datasets]
        url = self._urls.studies(STORE, study_instance_uid)
        body = stow_body(datasets, chunk_size=self._chunk_size)
        headers = {"Content-Type": body.content_type, "Accept": _core.ACCEPT_DICOM_JSON}
        if body.length is not None:
            headers["Content-Length"] = str(body.length)
        spec = RequestSpec("POST", url, (), headers, body, raise_for_status=False)
        return self._run(_core.store_plan(spec))

    # ----------------------------------------------------------------- DELETE
    def delete_study(self, study_instance_uid: str) -> None:
        """Delete a study (``DELETE {root}/studies/{s}``).

        Not part of PS3.18, but offered by this archive and most others.

        Raises
        ------
        NotFound, MethodNotAllowed, HTTPError, NetworkError
        """
        url = self._urls.studies(DELETE, study_instance_uid)
        return self._run(_core.delete_plan(RequestSpec("DELETE", url)))

    def delete_series(self, study_instance_uid: str, series_instance_uid: str) -> None:
        """Delete a series (``DELETE .../studies/{s}/series/{se}``).

        Raises
        ------
        NotFound, MethodNotAllowed, HTTPError, NetworkError
        """
        urls.uid_segment(series_instance_uid, "Series Instance UID")
        url = self._urls.series(DELETE, study_instance_uid, series_instance_uid)
        return self._run(_core.delete_plan(RequestSpec("DELETE", url)))

    def delete_instance(self, study_instance_uid: str, series_instance_uid: str, sop_instance_uid: str) -> None:
        """Delete an instance (``DELETE .../instances/{i}``).

        Raises
        ------
        NotFound, MethodNotAllowed, HTTPError, NetworkError
        """
        url = self._urls.instance(study_instance_uid, series_instance_uid, sop_instance_uid, transaction=DELETE)
        return self._run(_core.delete_plan(RequestSpec("DELETE", url)))


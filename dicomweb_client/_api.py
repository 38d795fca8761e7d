"""The public DICOMweb methods, written once for both clients.

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
from typing import Any, Iterable, Iterator, Mapping, Sequence

from . import _core, media, urls
from ._core import RequestSpec, StreamSpec
from .stow import DEFAULT_CHUNK_SIZE, _is_dataset, stow_body
from .urls import DELETE, SEARCH, STORE

#: Default Accept for study/series/instance retrieval: as stored, no transcoding.
DEFAULT_DICOM_MEDIA_TYPES = ((media.DICOM, "*"),)
#: Default Accept for frames and bulk data (the PyPI client's default).
DEFAULT_BULK_MEDIA_TYPES = ("*/*",)
#: Default Accept for multipart rendered answers.
DEFAULT_RENDERED_MULTIPART = ("image/jpeg",)

_DICOM_CATEGORY = (media.DICOM,)
_RENDERED_CATEGORY = ("image/", "video/", "text/", "application/pdf", "*/")


class _Unset:
    def __repr__(self) -> str:  # pragma: no cover
        return "<unset>"


UNSET: Any = _Unset()
DEFAULT_TIMEOUT = 30.0
USER_AGENT = "dicomweb-archive-client/0.1"


class _DICOMwebAPI:
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

    # ---------------------------------------------------------------- WADO-RS
    def _dicom_spec(self, url: str, media_types: Any, raw: bool, what: str) -> StreamSpec:
        if media_types is not None:
            media.require_category(media_types, _DICOM_CATEGORY, f"retrieval of {what}s")
        accept = media.multipart_accept(media_types, DEFAULT_DICOM_MEDIA_TYPES)
        convert = _core.part_content if raw else _core.part_to_dataset
        return StreamSpec(RequestSpec("GET", url, (), {"Accept": accept}), convert, what, offload=not raw)

    def retrieve_study(
        self,
        study_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        *,
        raw: bool = False,
    ) -> list:
        """Retrieve every instance of a study (``GET {root}/studies/{study}``).

        Parameters
        ----------
        study_instance_uid : str
            Study Instance UID.
        media_types : sequence, optional
            Acceptable media types with optional transfer syntax, e.g.
            ``(("application/dicom", "1.2.840.10008.1.2.1"),)``. Default
            ``(("application/dicom", "*"),)``: each instance as stored.
        raw : bool
            Return each instance's PS3.10 bytes instead of a Dataset.

        Returns
        -------
        list of pydicom.Dataset, or list of bytes if ``raw``
            One item per instance, in the server's order. Memory: all
            instances; use :meth:`iter_study` to stream.

        Raises
        ------
        NotFound
            Unknown study.
        NotAcceptable
            The server cannot produce the requested transfer syntax.
        ValueError
            A media type other than ``application/dicom``.
        HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4 (Retrieve Transaction), 8.7.3 (media types and transfer syntaxes).
        """
        return self._collect(self._dicom_spec(self._urls.study(study_instance_uid), media_types, raw, "instance"))

    def iter_study(
        self,
        study_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        *,
        raw: bool = False,
    ) -> Iterator:
        """Stream the instances of a study, one at a time (bounded memory).

        Same parameters and errors as :meth:`retrieve_study`; yields one
        ``pydicom.Dataset`` (or bytes if ``raw``) per instance as its part
        arrives. Errors of the request are raised at the first iteration.
        """
        return self._stream(self._dicom_spec(self._urls.study(study_instance_uid), media_types, raw, "instance"))

    def retrieve_series(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        *,
        raw: bool = False,
    ) -> list:
        """Retrieve every instance of a series (``GET {root}/studies/{s}/series/{se}``).

        Parameters
        ----------
        study_instance_uid, series_instance_uid : str
            UIDs of the series.
        media_types : sequence, optional
            As in :meth:`retrieve_study`.
        raw : bool
            Return PS3.10 bytes instead of Datasets.

        Returns
        -------
        list of pydicom.Dataset, or list of bytes if ``raw``

        Raises
        ------
        NotFound, NotAcceptable, ValueError, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4.
        """
        url = self._urls.one_series(study_instance_uid, series_instance_uid)
        return self._collect(self._dicom_spec(url, media_types, raw, "instance"))

    def iter_series(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        *,
        raw: bool = False,
    ) -> Iterator:
        """Stream the instances of a series (see :meth:`retrieve_series`)."""
        url = self._urls.one_series(study_instance_uid, series_instance_uid)
        return self._stream(self._dicom_spec(url, media_types, raw, "instance"))

    def retrieve_instance(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        *,
        raw: bool = False,
    ) -> Any:
        """Retrieve one instance (``GET .../studies/{s}/series/{se}/instances/{i}``).

        Parameters
        ----------
        study_instance_uid, series_instance_uid, sop_instance_uid : str
            UIDs of the instance.
        media_types : sequence, optional
            As in :meth:`retrieve_study`.
        raw : bool
            Return the PS3.10 bytes instead of a Dataset.

        Returns
        -------
        pydicom.Dataset, or bytes if ``raw``

        Raises
        ------
        NotFound, NotAcceptable, ValueError, HTTPError, NetworkError
        ResponseError
            The answer holds no instance or more than one.

        References
        ----------
        PS3.18 Section 10.4.
        """
        url = self._urls.instance(study_instance_uid, series_instance_uid, sop_instance_uid)
        return self._collect(self._dicom_spec(url, media_types, raw, "instance"), one=True)

    def retrieve_study_metadata(self, study_instance_uid: str) -> list[dict]:
        """Metadata of every instance of a study (``GET .../studies/{s}/metadata``).

        Returns
        -------
        list of dict
            One DICOM JSON data set per instance; large values are
            ``BulkDataURI`` references (fetch with :meth:`retrieve_bulkdata`).

        Raises
        ------
        NotFound, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4.1.1.2 (metadata resources), Annex F (DICOM JSON).
        """
        url = self._urls.study(study_instance_uid) + "/metadata"
        return self._run(_core.json_plan(RequestSpec("GET", url, (), {"Accept": _core.ACCEPT_DICOM_JSON})))

    def retrieve_series_metadata(self, study_instance_uid: str, series_instance_uid: str) -> list[dict]:
        """Metadata of every instance of a series (``.../series/{se}/metadata``).

        Returns
        -------
        list of dict
            One DICOM JSON data set per instance.

        Raises
        ------
        NotFound, HTTPError, NetworkError, ResponseError
        """
        url = self._urls.one_series(study_instance_uid, series_instance_uid) + "/metadata"
        return self._run(_core.json_plan(RequestSpec("GET", url, (), {"Accept": _core.ACCEPT_DICOM_JSON})))

    def retrieve_instance_metadata(
        self, study_instance_uid: str, series_instance_uid: str, sop_instance_uid: str
    ) -> dict:
        """Metadata of one instance (``.../instances/{i}/metadata``).

        Returns
        -------
        dict
            The instance's DICOM JSON data set.

        Raises
        ------
        NotFound, HTTPError, NetworkError
        ResponseError
            The answer does not hold exactly one data set.
        """
        url = self._urls.instance(study_instance_uid, series_instance_uid, sop_instance_uid) + "/metadata"
        return self._run(
            _core.json_plan(RequestSpec("GET", url, (), {"Accept": _core.ACCEPT_DICOM_JSON}), single=True)
        )

    def _frames_spec(self, url: str, media_types: Any) -> StreamSpec:
        if media_types is not None:
            for mt, _ts in media.normalize_media_types(media_types):
                if mt == media.DICOM:
                    raise ValueError("frames cannot be retrieved as application/dicom")
        accept = media.multipart_accept(media_types, DEFAULT_BULK_MEDIA_TYPES)
        return StreamSpec(RequestSpec("GET", url, (), {"Accept": accept}), _core.part_content, "frame")

    def retrieve_instance_frames(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        frame_numbers: Sequence[int],
        media_types: Sequence[Any] | None = None,
    ) -> list[bytes]:
        """Retrieve frames of an image instance (``.../instances/{i}/frames/{1,2,...}``).

        Parameters
        ----------
        study_instance_uid, series_instance_uid, sop_instance_uid : str
            UIDs of the instance.
        frame_numbers : sequence of int
            1-based frame numbers, answered in this order.
        media_types : sequence, optional
            e.g. ``("application/octet-stream",)`` for native pixels
            (Rows*Columns*SamplesPerPixel*BitsAllocated/8 bytes per frame),
            ``(("image/jpeg", "1.2.840.10008.1.2.4.50"),)`` for JPEG codestreams.
            Default ``("*/*",)``: whatever the server stores.

        Returns
        -------
        list of bytes
            One item per requested frame.

        Raises
        ------
        ValueError
            Empty list or a frame number below 1; ``application/dicom``.
        BadRequest, NotFound, NotAcceptable, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4.1.1.6 (pixel data resources: frames), 8.7.3 (bulk data media types).
        """
        url = self._urls.frames(study_instance_uid, series_instance_uid, sop_instance_uid, frame_numbers)
        return self._collect(self._frames_spec(url, media_types))

    def iter_instance_frames(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        frame_numbers: Sequence[int],
        media_types: Sequence[Any] | None = None,
    ) -> Iterator[bytes]:
        """Stream frames one at a time (see :meth:`retrieve_instance_frames`)."""
        url = self._urls.frames(study_instance_uid, series_instance_uid, sop_instance_uid, frame_numbers)
        return self._stream(self._frames_spec(url, media_types))

    def _bulkdata_spec(self, url: str, media_types: Any, byte_range: tuple[int, int] | None) -> StreamSpec:
        accept = media.multipart_accept(media_types, DEFAULT_BULK_MEDIA_TYPES)
        headers = {"Accept": accept}
        if byte_range is not None:
            start, *rest = byte_range
            end = rest[0] if rest and rest[0] is not None else ""
            headers["Range"] = f"bytes={int(start)}-{end}"
        return StreamSpec(RequestSpec("GET", self._urls.resolve(url), (), headers), _core.part_content, "bulk data item")

    def retrieve_bulkdata(
        self,
        url: str,
        media_types: Sequence[Any] | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> list[bytes]:
        """Retrieve bulk data at a BulkDataURI from metadata.

        Parameters
        ----------
        url : str
            Absolute BulkDataURI, or relative to the service root.
        media_types : sequence, optional
            Default ``("*/*",)``.
        byte_range : (int, int), optional
            First and last byte (``Range: bytes=start-end``).

        Returns
        -------
        list of bytes
            Usually one item (several for encapsulated pixel data frames).

        Raises
        ------
        NotFound, NotAcceptable, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4.1.1.5 (bulk data), Annex F (BulkDataURI).
        """
        return self._collect(self._bulkdata_spec(url, media_types, byte_range))

    def iter_bulkdata(
        self,
        url: str,
        media_types: Sequence[Any] | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> Iterator[bytes]:
        """Stream the bulk data items at ``url`` (see :meth:`retrieve_bulkdata`)."""
        return self._stream(self._bulkdata_spec(url, media_types, byte_range))

    # ------------------------------------------------- rendered and thumbnail
    def _rendered_request(
        self,
        url: str,
        media_types: Any,
        params: Mapping[str, Any] | None,
        window: Any,
        viewport: Any,
        quality: int | None,
        multipart: bool,
    ) -> RequestSpec:
        if media_types is not None:
            media.require_category(media_types, _RENDERED_CATEGORY, "rendered resources")
        query = tuple(urls.rendering_params(params, window=window, viewport=viewport, quality=quality))
        headers: dict[str, str] = {}
        if multipart:
            headers["Accept"] = media.multipart_accept(media_types, DEFAULT_RENDERED_MULTIPART)
        else:
            accept = media.plain_accept(media_types)
            if accept:
                headers["Accept"] = accept
        return RequestSpec("GET", url, query, headers)

    def _rendered(self, url, media_types, params, window, viewport, quality) -> Any:
        spec = self._rendered_request(url, media_types, params, window, viewport, quality, False)
        return self._run(_core.rendered_plan(spec))

    def _iter_rendered(self, url, media_types, params, window, viewport, quality) -> Any:
        spec = self._rendered_request(url, media_types, params, window, viewport, quality, True)
        return self._stream(StreamSpec(spec, _core.part_content, "rendered image"))

    def retrieve_study_rendered(
        self,
        study_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> bytes | list[bytes]:
        """Rendered study (``GET .../studies/{s}/rendered``).

        Parameters
        ----------
        study_instance_uid : str
            Study Instance UID.
        media_types : sequence, optional
            e.g. ``("image/png",)``; by default the server's default (JPEG).
        params : dict, optional
            Raw query parameters, e.g. ``{"quality": 90}``.
        window : (center, width[, function]) or str, optional
            VOI window; function ``linear`` (default), ``linear_exact`` or ``sigmoid``.
        viewport : (vw, vh[, sx, sy, sw, sh]) or str, optional
            Output size and source region.
        quality : int, optional
            1-100, for lossy media types.

        Returns
        -------
        bytes, or list of bytes
            The image; a list when the server answers ``multipart/related``
            with several images (use :meth:`iter_study_rendered` to ask for that).

        Raises
        ------
        BadRequest
            Invalid rendering parameter.
        NotFound, NotAcceptable, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4.1.1.3 (rendered resources), 8.3.5 (rendering parameters).
        """
        return self._rendered(self._urls.study(study_instance_uid) + "/rendered", media_types, params, window, viewport, quality)

    def iter_study_rendered(
        self,
        study_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> Iterator[bytes]:
        """Stream the rendered images of a study, asked as ``multipart/related``
        (default ``type="image/jpeg"``); one bytes item per image."""
        return self._iter_rendered(self._urls.study(study_instance_uid) + "/rendered", media_types, params, window, viewport, quality)

    def retrieve_series_rendered(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> bytes | list[bytes]:
        """Rendered series (``.../series/{se}/rendered``); see :meth:`retrieve_study_rendered`."""
        url = self._urls.one_series(study_instance_uid, series_instance_uid) + "/rendered"
        return self._rendered(url, media_types, params, window, viewport, quality)

    def iter_series_rendered(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> Iterator[bytes]:
        """Stream the rendered images of a series (multipart); see :meth:`iter_study_rendered`."""
        url = self._urls.one_series(study_instance_uid, series_instance_uid) + "/rendered"
        return self._iter_rendered(url, media_types, params, window, viewport, quality)

    def retrieve_instance_rendered(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> bytes | list[bytes]:
        """Rendered instance (``.../instances/{i}/rendered``); see :meth:`retrieve_study_rendered`."""
        url = self._urls.instance(study_instance_uid, series_instance_uid, sop_instance_uid) + "/rendered"
        return self._rendered(url, media_types, params, window, viewport, quality)

    def iter_instance_rendered(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> Iterator[bytes]:
        """Stream a rendered multi-frame instance as multipart, one image per frame."""
        url = self._urls.instance(study_instance_uid, series_instance_uid, sop_instance_uid) + "/rendered"
        return self._iter_rendered(url, media_types, params, window, viewport, quality)

    def retrieve_instance_frames_rendered(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        frame_numbers: Sequence[int],
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> bytes | list[bytes]:
        """Rendered frames (``.../frames/{list}/rendered``); see :meth:`retrieve_study_rendered`."""
        url = self._urls.frames(study_instance_uid, series_instance_uid, sop_instance_uid, frame_numbers) + "/rendered"
        return self._rendered(url, media_types, params, window, viewport, quality)

    def iter_instance_frames_rendered(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        frame_numbers: Sequence[int],
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        window: Any = None,
        viewport: Any = None,
        quality: int | None = None,
    ) -> Iterator[bytes]:
        """Stream rendered frames as multipart, one image per frame."""
        url = self._urls.frames(study_instance_uid, series_instance_uid, sop_instance_uid, frame_numbers) + "/rendered"
        return self._iter_rendered(url, media_types, params, window, viewport, quality)

    def retrieve_study_thumbnail(
        self,
        study_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        viewport: Any = None,
    ) -> bytes | list[bytes]:
        """Thumbnail of a study (``GET .../studies/{s}/thumbnail``).

        Parameters
        ----------
        study_instance_uid : str
            Study Instance UID.
        media_types : sequence, optional
            e.g. ``("image/png",)``.
        params : dict, optional
            Raw query parameters.
        viewport : (vw, vh) or str, optional
            Thumbnail size.

        Returns
        -------
        bytes
            The image.

        Raises
        ------
        NotFound, NotAcceptable, HTTPError, NetworkError, ResponseError

        References
        ----------
        PS3.18 Section 10.4.1.1.4 (thumbnail resources).
        """
        return self._rendered(self._urls.study(study_instance_uid) + "/thumbnail", media_types, params, None, viewport, None)

    def retrieve_series_thumbnail(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        viewport: Any = None,
    ) -> bytes | list[bytes]:
        """Thumbnail of a series (``.../series/{se}/thumbnail``); see :meth:`retrieve_study_thumbnail`."""
        url = self._urls.one_series(study_instance_uid, series_instance_uid) + "/thumbnail"
        return self._rendered(url, media_types, params, None, viewport, None)

    def retrieve_instance_thumbnail(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        viewport: Any = None,
    ) -> bytes | list[bytes]:
        """Thumbnail of an instance (``.../instances/{i}/thumbnail``); see :meth:`retrieve_study_thumbnail`."""
        url = self._urls.instance(study_instance_uid, series_instance_uid, sop_instance_uid) + "/thumbnail"
        return self._rendered(url, media_types, params, None, viewport, None)

    def retrieve_instance_frames_thumbnail(
        self,
        study_instance_uid: str,
        series_instance_uid: str,
        sop_instance_uid: str,
        frame_numbers: Sequence[int],
        media_types: Sequence[Any] | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        viewport: Any = None,
    ) -> bytes | list[bytes]:
        """Thumbnail of frames (``.../frames/{list}/thumbnail``); see :meth:`retrieve_study_thumbnail`."""
        url = self._urls.frames(study_instance_uid, series_instance_uid, sop_instance_uid, frame_numbers) + "/thumbnail"
        return self._rendered(url, media_types, params, None, viewport, None)

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


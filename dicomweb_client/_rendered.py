"""WADO-RS rendered and thumbnail resources (PS3.18 Sections 10.4.1.1.3-4, 8.3.5).

A mixin of :class:`dicomweb_client._api._DICOMwebAPI`. Without
``media_types`` the requests carry the defaults of
:mod:`dicomweb_client.negotiation` (JPEG first).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from . import _core, media, negotiation, urls
from ._core import RequestSpec, StreamSpec

_RENDERED_CATEGORY = ("image/", "video/", "text/", "application/pdf", "*/")


class _RenderedMixin:
    """Rendered images and thumbnails of studies, series, instances and frames."""

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
        query = tuple(urls.rendering_params(params, window=window, viewport=viewport, quality=quality))
        if media_types is None:
            default = negotiation.RENDERED_MULTIPART if multipart else negotiation.RENDERED
            return self._default_request(default, url, query)
        media.require_category(media_types, _RENDERED_CATEGORY, "rendered resources")
        accept = media.multipart_accept(media_types) if multipart else media.plain_accept(media_types)
        return RequestSpec("GET", url, query, {"Accept": accept})

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
            e.g. ``("image/png",)``; default JPEG, else PNG, else what the
            server renders (:data:`dicomweb_client.negotiation.RENDERED`).
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


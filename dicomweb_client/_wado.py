"""WADO-RS retrieval of instances, metadata, frames and bulk data (PS3.18 Section 10.4).

A mixin of :class:`dicomweb_client._api._DICOMwebAPI`: the methods use its
drivers (``_run``, ``_stream``, ``_collect``) and ``_default_request``.
Without ``media_types`` each request carries the defaults of
:mod:`dicomweb_client.negotiation`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import _core, media, negotiation
from ._core import RequestSpec, StreamSpec

_DICOM_CATEGORY = (media.DICOM,)


class _WADOMixin:
    """Instances, metadata, frames and bulk data."""

    def _dicom_spec(self, url: str, media_types: Any, raw: bool, what: str) -> StreamSpec:
        if media_types is None:
            request = self._default_request(negotiation.INSTANCES, url)
        else:
            media.require_category(media_types, _DICOM_CATEGORY, f"retrieval of {what}s")
            request = RequestSpec("GET", url, (), {"Accept": media.multipart_accept(media_types)})
        convert = _core.part_content if raw else _core.part_to_dataset
        return StreamSpec(request, convert, what, offload=not raw)

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
            ``(("application/dicom", "1.2.840.10008.1.2.1"),)``. Default: each
            instance as stored, else Explicit VR Little Endian
            (:data:`dicomweb_client.negotiation.INSTANCES`).
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
        if media_types is None:
            return StreamSpec(self._default_request(negotiation.FRAMES, url), _core.part_content, "frame")
        for mt, _ts in media.normalize_media_types(media_types):
            if mt == media.DICOM:
                raise ValueError("frames cannot be retrieved as application/dicom")
        accept = media.multipart_accept(media_types)
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
            Default: as stored, else native pixels
            (:data:`dicomweb_client.negotiation.FRAMES`).

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
        headers = {}
        asked = None
        if byte_range is not None:
            start, *rest = byte_range
            last = int(rest[0]) if rest and rest[0] is not None else None
            headers["Range"] = f"bytes={int(start)}-{'' if last is None else last}"
            asked = (int(start), last)
        url = self._urls.resolve(url)
        if media_types is None:
            request = self._default_request(negotiation.BULKDATA, url, (), headers)
        else:
            headers["Accept"] = media.multipart_accept(media_types)
            request = RequestSpec("GET", url, (), headers)
        return StreamSpec(request, _core.part_content, "bulk data item", byte_range=asked)

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
            Default: :data:`dicomweb_client.negotiation.BULKDATA`.
        byte_range : (int, int), optional
            First and last byte (``Range: bytes=start-end``). A server that ignores
            Range (200, the whole value) gets the range cut by the client when its
            answer holds one value (RFC 9110 Section 14.2).

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


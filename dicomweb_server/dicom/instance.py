"""Turn one received PS3.10 file into everything the archive keeps about it:
validated UIDs, QIDO column values per level, the DICOM JSON metadata (bulk
elements as BulkDataURIs) and the pixel-data layout. Runs once per stored
instance, so that no read path ever parses a DICOM file for metadata or search.

References
----------
PS3.10 §7.1 (file meta information), PS3.18 §10.5.1 (STOW-RS request: each part a
PS3.10 file), PS3.18 Annex F (JSON model), PS3.4 B.2.3 (failure statuses).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError

from . import lean
from .attributes import SERIES_LEVEL_TAGS, STUDY_LEVEL_TAGS
from .frames import (
    FrameCountMismatch,
    PixelLayout,
    Truncated,
    check_frame_count,
    native_frame_length,
    native_pixel_bytes,
)
from .json_model import _PAD, dataset_to_json, level_attributes
from .matching import level_values
from .patient import PatientIdentity, patient_identity
from .media_types import DEFLATED_LE, is_video
from .reading import Unacceptable, file_meta_uids, read_instance
from .status import FailureReason, InstanceError
from .uids import validate_uid

_UID_TAGS = frozenset({0x00080016, 0x00080018, 0x0020000D, 0x0020000E})
#: Placeholder for the archive's base URL inside stored JSON; replaced per response.
BASE_URL_TOKEN = "@@BASE@@"


@dataclass(slots=True)
class InstanceRecord:
    """What the index keeps about one instance (values normalised for matching)."""

    study_uid: str
    series_uid: str
    sop_uid: str
    sop_class_uid: str
    transfer_syntax_uid: str
    study: dict[str, object]  # keyword -> value, for STORED["study"]; items of SEQUENCES_OF["study"]
    series: dict[str, object]
    instance: dict[str, object]
    study_json: bytes  # study-level attributes (DICOM JSON object)
    series_json: bytes
    metadata: bytes  # the whole instance (DICOM JSON object), BASE_URL_TOKEN in URIs
    pixel: dict | None  # PixelLayout.to_json() + frame_length, number_of_frames
    size: int
    patient: PatientIdentity  # whose study this is (dicom/patient.py)
    path: str = ""  # relative to the blob root, set when the file is placed
    #: where it came from, set by the archive's store (archive.py): ``dimse:`` + the calling AE
    #: title, ``stow:`` + the authenticated user or the client's address, ``import``; "" unknown
    source: str = ""
    # labels on arrival (access/labels_in.py): put on its study by the Index.add that
    # indexes it as new, in that add's transaction (store/labels.py); not kept per instance
    labels: tuple[str, ...] = ()


def instance_path(study_uid: str, series_uid: str, sop_uid: str) -> str:
    """Relative path of an instance's file; built from validated UIDs only."""
    return f"{study_uid}/{series_uid}/{sop_uid}.dcm"


def instance_url(study_uid: str, series_uid: str, sop_uid: str) -> str:
    return f"/studies/{study_uid}/series/{series_uid}/instances/{sop_uid}"


def _uid(ds: Dataset, keyword: str, sop_class: str | None, sop_uid: str | None) -> str:
    value = ds.get(keyword)
    try:
        return validate_uid(str(value) if value is not None else "")
    except ValueError as e:
        raise InstanceError(
            FailureReason.DATASET_MISMATCH, f"{keyword}: {e}", sop_class, sop_uid
        ) from None


def describe_instance(path: Path, *, bulk_threshold: int = 1024, expected_study_uid: str | None = None,
                      data: bytes | None = None) -> InstanceRecord:
    """Read and validate a received file.

    Parameters
    ----------
    path
        A PS3.10 file (128-byte preamble, ``DICM``, file meta information).
    bulk_threshold
        Binary values longer than this become BulkDataURIs in the metadata.
    expected_study_uid
        The study named by the STOW-RS URL (``POST /studies/{study}``), if any.
    data
        The file's bytes when the caller has them (parsed from memory, not re-read).

    Raises
    ------
    InstanceError
        0xC000 not a PS3.10 file / truncated / unreadable; 0xA900 a required UID is
        missing or invalid; 0xC409 StudyInstanceUID differs from ``expected_study_uid``.
    """
    if data is not None:
        try:
            return _describe_lean(data, bulk_threshold, expected_study_uid)
        except lean.Decline:
            pass  # not the common case: pydicom reads it, errors come from there
    size = os.path.getsize(path) if data is None else len(data)
    try:
        ds, ts, layout = read_instance(path, data)
    except (Unacceptable, Truncated) as e:
        raise InstanceError(FailureReason.CANNOT_UNDERSTAND, str(e), *file_meta_uids(path, data)) from None
    except InvalidDicomError as e:
        why = str(e).replace(" Use force=True to force reading.", "")  # pydicom's hint is for its callers
        raise InstanceError(FailureReason.CANNOT_UNDERSTAND,
                            f"not a PS3.10 DICOM file (preamble and 'DICM' prefix required): {why}") from None
    except Exception as e:  # pydicom raises many types on garbage input
        raise InstanceError(FailureReason.CANNOT_UNDERSTAND, f"cannot parse the DICOM file: {e}",
                            *file_meta_uids(path, data)) from None
    try:
        return _describe_dataset(ds, ts, layout, size, bulk_threshold, expected_study_uid)
    except InstanceError:
        raise
    except Exception as e:  # noqa: BLE001 - a value pydicom cannot convert when asked (an odd-length UN as US)
        raise InstanceError(FailureReason.CANNOT_UNDERSTAND, f"cannot read the DICOM file: {e}",
                            *file_meta_uids(path, data)) from None


def _describe_dataset(ds: Dataset, ts: str, layout, size: int, bulk_threshold: int,
                      expected_study_uid: str | None) -> InstanceRecord:
    """:func:`describe_instance` after the file is read (the pydicom path)."""
    deflated = ts == DEFLATED_LE

    sop_class_raw = str(ds.get("SOPClassUID", "") or "") or None
    sop_uid_raw = str(ds.get("SOPInstanceUID", "") or "") or None
    sop_class = _uid(ds, "SOPClassUID", sop_class_raw, sop_uid_raw)
    sop_uid = _uid(ds, "SOPInstanceUID", sop_class_raw, sop_uid_raw)
    study_uid = _uid(ds, "StudyInstanceUID", sop_class, sop_uid)
    series_uid = _uid(ds, "SeriesInstanceUID", sop_class, sop_uid)
    if expected_study_uid is not None and study_uid != expected_study_uid:
        raise InstanceError(
            FailureReason.STUDY_UID_MISMATCH,
            f"StudyInstanceUID {study_uid} differs from the study {expected_study_uid} named in the request URL",
            sop_class, sop_uid,
        )

    prefix = BASE_URL_TOKEN + instance_url(study_uid, series_uid, sop_uid) + "/bulkdata"
    try:
        meta_json = dataset_to_json(ds, prefix, bulk_threshold=bulk_threshold)
    except Exception as e:
        raise InstanceError(FailureReason.CANNOT_UNDERSTAND, f"cannot convert to DICOM JSON: {e}",
                            sop_class, sop_uid) from None
    pixel = None
    if layout is not None:
        pixel = pixel_record(ds, ts, layout, sop_class, sop_uid)
        vr = layout.vr if layout.vr in ("OB", "OW", "OF", "OD") else "OW"
        meta_json[layout.keyword_tag] = {"vr": vr, "BulkDataURI": f"{prefix}/{layout.keyword_tag}"}
        if deflated:  # offsets of the inflated stream mean nothing in the stored file
            pixel = {k: pixel[k] for k in ("tag", "vr", "number_of_frames", "frame_length")} | {"deflated": True}
    return _record(meta_json, study_uid, series_uid, sop_uid, sop_class, ts, pixel, size)


def _describe_lean(data: bytes, bulk_threshold: int, expected_study_uid: str | None) -> InstanceRecord:
    """:func:`describe_instance` through :mod:`.lean` (no pydicom Dataset): the same
    record, or :class:`.lean.Decline` (also for every failure, which the pydicom
    path then reports)."""
    ts, start = lean.transfer_syntax_and_start(data)
    elements, pos = lean.walk(data, start)
    sop_class, sop_uid, study_uid, series_uid = _lean_uids(elements)
    if expected_study_uid is not None and study_uid != expected_study_uid:
        raise lean.Decline
    prefix = BASE_URL_TOKEN + instance_url(study_uid, series_uid, sop_uid) + "/bulkdata"
    meta_json = lean.to_json(elements, prefix, bulk_threshold, lean._encoding(elements))
    frames = lean.first_value(meta_json, "00280008", int, 1)
    layout = lean.pixel_layout(data, pos, frames)
    pixel = None
    if layout is not None:
        get = lean.first_value
        try:
            pixel = _pixel_dict(ts, layout, get(meta_json, "00280010", int, 0), get(meta_json, "00280011", int, 0),
                                get(meta_json, "00280002", int, 1), get(meta_json, "00280100", int, 8), frames)
        except FrameCountMismatch:
            raise lean.Decline from None
        vr = layout.vr if layout.vr in ("OB", "OW", "OF", "OD") else "OW"
        meta_json[layout.keyword_tag] = {"vr": vr, "BulkDataURI": f"{prefix}/{layout.keyword_tag}"}
    return _record(meta_json, study_uid, series_uid, sop_uid, sop_class, ts, pixel, len(data))


def _lean_uids(elements: list[tuple[int, str, bytes]]) -> list[str]:
    """SOP Class, SOP Instance, Study and Series Instance UID of the walked ``elements``,
    decoded as :func:`.lean.to_json` decodes a UI (PS3.5 §6.2: Latin-1, trailing NUL and
    spaces dropped) and validated; :class:`.lean.Decline` for anything else (missing, empty,
    multi-valued, invalid, another VR: the pydicom path then names the fault). Read from
    the element bytes, not through a DICOM JSON object of them made only to be read back
    (~3 % of the DIMSE listener's GIL time per stored instance, issue 33)."""
    found = {tag: (vr, value) for tag, vr, value in elements if tag in _UID_TAGS}
    uids = []
    for tag in (0x00080016, 0x00080018, 0x0020000D, 0x0020000E):
        vr, value = found.get(tag, ("UI", b""))
        if vr != "UI":
            raise lean.Decline
        try:
            uids.append(validate_uid(value.decode("latin-1").rstrip(_PAD)))
        except ValueError:
            raise lean.Decline from None
    return uids


def _record(meta_json: dict, study_uid: str, series_uid: str, sop_uid: str, sop_class: str, ts: str,
            pixel: dict | None, size: int) -> InstanceRecord:
    meta_json = dict(sorted(meta_json.items()))
    return InstanceRecord(
        study_uid=study_uid,
        series_uid=series_uid,
        sop_uid=sop_uid,
        sop_class_uid=sop_class,
        transfer_syntax_uid=ts,
        study=level_values(meta_json, "study"),
        series=level_values(meta_json, "series"),
        instance=level_values(meta_json, "instance"),
        study_json=dumps(level_attributes(meta_json, STUDY_LEVEL_TAGS)),
        series_json=dumps(level_attributes(meta_json, SERIES_LEVEL_TAGS)),
        metadata=dumps(meta_json),
        pixel=pixel,
        size=size,
        patient=patient_identity(meta_json),
        path=instance_path(study_uid, series_uid, sop_uid),
    )


def pixel_record(ds: Dataset, ts: str, layout: PixelLayout, sop_class: str, sop_uid: str) -> dict:
    """What reads need about the pixel data (``InstanceLocation.pixel``): the layout
    (:meth:`PixelLayout.to_json`: ``tag``, ``vr``, ``offset``, ``length``, ``end``,
    ``fragments``, ``frames``) plus ``number_of_frames`` and ``frame_length`` (bytes
    of one native frame, None when bit-packed). The frame count is checked against
    the pixel data here, so reads may trust it.

    Raises
    ------
    InstanceError
        0xC000: NumberOfFrames below 1 or more frames than the pixel data holds.
    """
    rows, columns = _int(ds.get("Rows"), 0), _int(ds.get("Columns"), 0)
    samples, bits = _int(ds.get("SamplesPerPixel"), 1), _int(ds.get("BitsAllocated"), 8)
    nframes = _int(ds.get("NumberOfFrames"), 1)
    try:
        return _pixel_dict(ts, layout, rows, columns, samples, bits, nframes)
    except FrameCountMismatch as e:
        raise InstanceError(FailureReason.CANNOT_UNDERSTAND, str(e), sop_class, sop_uid) from None


def _pixel_dict(ts: str, layout: PixelLayout, rows: int, columns: int, samples: int, bits: int,
                nframes: int) -> dict:
    """Raises FrameCountMismatch."""
    check_frame_count(layout, nframes, native_pixel_bytes(rows, columns, samples, bits, nframes), is_video(ts))
    pixel = layout.to_json()
    pixel["number_of_frames"] = nframes
    pixel["frame_length"] = native_frame_length(rows, columns, samples, bits)
    return pixel


def dumps(obj: object) -> bytes:
    """orjson bytes copied to an exact-size object: orjson's result keeps its
    growth buffer (4 KiB or more even for 100 bytes), which an index holding
    thousands of these would pay for."""
    return memoryview(orjson.dumps(obj)).tobytes()


def _int(value: object, default: int) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default

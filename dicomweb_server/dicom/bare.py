"""A bare data set (no PS3.10 header) made into a PS3.10 file, for ``dicomweb-server import``.

Old folders hold files that are a data set alone: no 128-byte preamble, no ``DICM``
prefix, no file meta information (PS3.10 §7.1), as some modalities and tools wrote
them before PS3.10 (and as a DIMSE data set is on the wire). Their transfer syntax is
not written down but can be inferred from the first element, as pydicom's
``dcmread(force=True)`` does: a valid VR after the tag means Explicit VR Little Endian,
anything else Implicit VR Little Endian (PS3.5 §7.1.2 and §7.1.3; Annex A.1, A.2).
Such a file becomes a PS3.10 file by putting a header in front of its bytes: the
preamble, ``DICM`` and file meta information built from the data set
(Media Storage SOP Class and Instance UID from its SOP Class and Instance UID, the
inferred Transfer Syntax UID, this archive's Implementation Class UID). The data set
bytes are kept as they are, element for element.

Only ``import`` does this. STOW-RS keeps refusing such parts: PS3.18 §10.5.1 (and
§8.7.3.5.1, application/dicom) requires each part to be a PS3.10 file.
"""

from __future__ import annotations

import io
import shutil
import struct
from pathlib import Path

from pydicom.dataset import FileMetaDataset
from pydicom.filereader import _read_command_set_elements, _read_file_meta_info, read_dataset
from pydicom.filewriter import write_file_meta_info
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian
from pydicom.values import converters

from .uids import IMPLEMENTATION_CLASS_UID, IMPLEMENTATION_VERSION_NAME, validate_uid

#: why_not_bare's words for a file that is no DICOM at all
NOT_DICOM = "not DICOM: neither a PS3.10 file (preamble, 'DICM', file meta) nor a data set"

#: bytes read to learn the SOP Class and Instance UID (group 0008 comes first)
_HEAD_BYTES = 64 * 1024


def is_ps310(path: Path) -> bool:
    """Whether the file at ``path`` starts as a PS3.10 file (preamble then ``DICM``)."""
    with open(path, "rb") as f:
        head = f.read(132)
    return len(head) == 132 and head[128:] == b"DICM"


class NotBare(Exception):
    """``src`` cannot be given a PS3.10 header; ``str(e)`` says why, for the import report."""


def wrap_bare_data_set(src: Path, dst: Path) -> str | None:
    """Write ``src``, a bare data set, as a PS3.10 file to ``dst`` and return its inferred
    Transfer Syntax UID; None (nothing written) when ``src`` is a PS3.10 file already, or
    no data set whose transfer syntax can be inferred: the archive then refuses it as it
    is (:func:`why_not_bare` says why). A group 0002 (file meta without a preamble) or 0000
    (a command set) at the start of ``src`` is left out of the data set; a Transfer Syntax
    UID in that group 0002 is kept when it names one of the two syntaxes (else nothing is
    inferred)."""
    try:
        return _wrap(src, dst)
    except NotBare:
        return None


def why_not_bare(src: Path) -> str | None:
    """Why ``src``, a file without a PS3.10 header, cannot be given one (None: it can, or it
    has a header). The store's own refusal says "preamble and 'DICM' prefix required",
    which tells an ``import`` user nothing: import takes bare data sets (getting-started.md)."""
    try:
        _wrap(src, None)
    except NotBare as e:
        return str(e)
    return None


def _wrap(src: Path, dst: Path | None) -> str | None:
    """:func:`wrap_bare_data_set`, raising :class:`NotBare` with the reason; ``dst`` None
    writes nothing. None: ``src`` is a PS3.10 file."""
    not_dicom = NOT_DICOM
    with open(src, "rb") as fp:
        head = fp.read(132)
        if len(head) == 132 and head[128:] == b"DICM":
            return None
        if len(head) < 8:
            raise NotBare(f"{not_dicom} ({len(head)} bytes)")
        fp.seek(0)
        try:
            meta = _read_file_meta_info(fp)
            _read_command_set_elements(fp)
        except Exception:  # noqa: BLE001 - garbage: not a data set
            raise NotBare(not_dicom) from None
        start = fp.tell()
        first = fp.read(6)
        if len(first) < 6:
            raise NotBare(f"{not_dicom} (no element after its group 0002)")
        group, _element, vr = struct.unpack("<HH2s", first)
        named = str(meta.get("TransferSyntaxUID", "") or "").rstrip("\0 ")
        if named:
            if named not in (ImplicitVRLittleEndian, ExplicitVRLittleEndian):
                raise NotBare(f"file meta without a preamble, naming transfer syntax {named}: import gives a "
                              "header to Implicit and Explicit VR Little Endian data sets only")
            ts = named
        else:
            explicit = vr.decode("latin-1") in converters
            if explicit and group >= 1024:  # big endian (retired, PS3.5 A.3): not inferred
                raise NotBare("a big endian data set without PS3.10 header (Explicit VR Big Endian, retired: "
                              "PS3.5 A.3): import gives a header to Little Endian data sets only")
            ts = ExplicitVRLittleEndian if explicit else ImplicitVRLittleEndian
        if group < 0x0008:  # a data set starts at group 0008 or later (0002, 0000: read above)
            raise NotBare(not_dicom)
        fp.seek(start)
        uids = _sop_uids(fp.read(_HEAD_BYTES), ts == ImplicitVRLittleEndian)
        if dst is None:
            return ts
        meta_out = FileMetaDataset()
        meta_out.MediaStorageSOPClassUID, meta_out.MediaStorageSOPInstanceUID = uids
        meta_out.TransferSyntaxUID = ts
        meta_out.ImplementationClassUID = IMPLEMENTATION_CLASS_UID
        meta_out.ImplementationVersionName = IMPLEMENTATION_VERSION_NAME
        fp.seek(start)
        with open(dst, "wb") as out:
            out.write(b"\0" * 128 + b"DICM")
            write_file_meta_info(out, meta_out, enforce_standard=True)  # adds group length and version
            shutil.copyfileobj(fp, out, 1024 * 1024)
    return ts


def _sop_uids(head: bytes, implicit: bool) -> tuple[str, str]:
    """SOP Class UID and SOP Instance UID (0008,0016), (0008,0018) of the data set that
    starts ``head``, both valid (PS3.5 §9.1); else :class:`NotBare`: not a data set at all
    (no element up to (0008,0018): text, an archive, bytes out of step), or one without
    those UIDs."""
    try:
        ds = read_dataset(io.BytesIO(head), implicit, True, stop_when=lambda tag, vr, length: tag > 0x00080018)
    except Exception:  # noqa: BLE001 - any failure: not a data set this module can complete
        ds = None
    if not ds:
        raise NotBare(NOT_DICOM)
    try:
        values = [str(ds.get(k, "") or "") for k in ("SOPClassUID", "SOPInstanceUID")]
        return validate_uid(values[0]), validate_uid(values[1])
    except Exception:  # noqa: BLE001 - missing, empty or not a UID
        raise NotBare("a data set without PS3.10 header and without valid SOP Class and SOP Instance UIDs "
                      "(0008,0016), (0008,0018), from which import makes one") from None

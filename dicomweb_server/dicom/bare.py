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

#: bytes read to learn the SOP Class and Instance UID (group 0008 comes first)
_HEAD_BYTES = 64 * 1024


def is_ps310(path: Path) -> bool:
    """Whether the file at ``path`` starts as a PS3.10 file (preamble then ``DICM``)."""
    with open(path, "rb") as f:
        head = f.read(132)
    return len(head) == 132 and head[128:] == b"DICM"


def wrap_bare_data_set(src: Path, dst: Path) -> str | None:
    """Write ``src``, a bare data set, as a PS3.10 file to ``dst`` and return its inferred
    Transfer Syntax UID; None (nothing written) when ``src`` is a PS3.10 file already, or
    no data set whose transfer syntax can be inferred: the archive then refuses it as it
    is. A group 0002 (file meta without a preamble) or 0000 (a command set) at the start
    of ``src`` is left out of the data set; a Transfer Syntax UID in that group 0002 is
    kept when it names one of the two syntaxes (else nothing is inferred)."""
    with open(src, "rb") as fp:
        head = fp.read(132)
        if len(head) < 8 or (len(head) == 132 and head[128:] == b"DICM"):
            return None
        fp.seek(0)
        try:
            meta = _read_file_meta_info(fp)
            _read_command_set_elements(fp)
        except Exception:  # noqa: BLE001 - garbage: not a data set
            return None
        start = fp.tell()
        first = fp.read(6)
        if len(first) < 6:
            return None
        group, _element, vr = struct.unpack("<HH2s", first)
        named = str(meta.get("TransferSyntaxUID", "") or "").rstrip("\0 ")
        if named:
            if named not in (ImplicitVRLittleEndian, ExplicitVRLittleEndian):
                return None
            ts = named
        else:
            explicit = vr.decode("latin-1") in converters
            if explicit and group >= 1024:  # big endian (retired, PS3.5 A.3): not inferred
                return None
            ts = ExplicitVRLittleEndian if explicit else ImplicitVRLittleEndian
        if group < 0x0008:  # a data set starts at group 0008 or later (0002, 0000: read above)
            return None
        fp.seek(start)
        uids = _sop_uids(fp.read(_HEAD_BYTES), ts == ImplicitVRLittleEndian)
        if uids is None:
            return None
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


def _sop_uids(head: bytes, implicit: bool) -> tuple[str, str] | None:
    """SOP Class UID and SOP Instance UID (0008,0016), (0008,0018) of the data set that
    starts ``head``, both valid (PS3.5 §9.1), else None."""
    try:
        ds = read_dataset(io.BytesIO(head), implicit, True, stop_when=lambda tag, vr, length: tag > 0x00080018)
        values = [str(ds.get(k, "") or "") for k in ("SOPClassUID", "SOPInstanceUID")]
        return validate_uid(values[0]), validate_uid(values[1])
    except Exception:  # noqa: BLE001 - any failure: not a data set this module can complete
        return None


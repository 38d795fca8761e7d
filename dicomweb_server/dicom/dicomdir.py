"""A DICOMDIR (PS3.10 §7.2, §8; PS3.3 Annex F) for a File-set whose files the archive
writes elsewhere (the ZIP of api/downloads.py): built from the stored DICOM JSON of
each instance, so no file is read a second time.

- File IDs (PS3.10 §8.2, §8.5; PS3.12): at most 8 components of at most 8 characters
  from A-Z, 0-9 and ``_``; here ``DICOM/Pnnnnnnn/Snnnnnnn/SEnnnnnn/Innnnnnn`` (one
  folder per patient, study and series, numbered in the order first met).
- Records (PS3.3 §F.5): PATIENT (Patient ID, Patient's Name), STUDY (Study Date, Study
  Time, Study Description, Study Instance UID, Study ID, Accession Number), SERIES
  (Modality, Series Instance UID, Series Number), and one IMAGE record per instance
  (Instance Number, Referenced File ID, Referenced SOP Class/Instance UID in File,
  Referenced Transfer Syntax UID in File, §F.3.2.2 Table F.3-3). Every file is listed
  under an IMAGE record, whatever its SOP Class (SR, presentation states and such
  have record types of their own, with more Type 1 keys: not written here).
- A Type 1 key the instance lacks gets a stand-in value (:data:`STAND_INS`: e.g.
  Study ID from the Study Instance UID's last digits; instances without a Patient ID
  all under one PATIENT record ``UNKNOWN``), so that an archive's download
  never fails for a key the modality left out; a Type 2 key is written empty.
- The records are written in the order of a depth-first walk; offsets (Offset of
  the Next Directory Record, of the Referenced Lower-Level Directory Entity, of the
  First/Last Root Record) are byte positions from the first byte of the file
  (PS3.3 §F.3.2.1). Each record is encoded once, when made (PATIENT, STUDY, SERIES by
  pydicom; IMAGE, one per file, by :func:`image_record`, byte-identical and a few
  hundred times faster); at the end the offsets, fixed-size UL values at fixed places,
  are written into those bytes. The sequence and its items have defined lengths, as
  pydicom's FileSet writes them.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import dcmwrite, write_dataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

MEDIA_STORAGE_DIRECTORY = "1.2.840.10008.1.3.10"  # Media Storage Directory Storage (PS3.4 Annex I)
ROOT = "DICOM"

#: stand-ins for Type 1 record keys an instance does not have (PS3.3 §F.5)
STAND_INS = {"PatientID": "UNKNOWN", "StudyDate": "19000101", "StudyTime": "000000", "Modality": "OT", "SeriesNumber": 0,
             "InstanceNumber": 0}

TAGS = {  # keyword -> DICOM JSON tag of the instance attributes the records copy
    "SpecificCharacterSet": "00080005", "PatientName": "00100010", "PatientID": "00100020",
    "StudyDate": "00080020", "StudyTime": "00080030", "StudyDescription": "00081030",
    "StudyInstanceUID": "0020000D", "StudyID": "00200010", "AccessionNumber": "00080050",
    "Modality": "00080060", "SeriesInstanceUID": "0020000E", "SeriesNumber": "00200011",
    "InstanceNumber": "00200013", "SOPClassUID": "00080016", "SOPInstanceUID": "00080018",
}


def json_value(item: dict, keyword: str):
    """The first value of ``keyword`` in a DICOM JSON object (PS3.18 §F.2), None when
    absent or empty; a person name as its Alphabetic group."""
    value = (item.get(TAGS[keyword]) or {}).get("Value")
    if not value:
        return None
    first = value[0]
    if isinstance(first, dict):  # PN (PS3.18 §F.2.2)
        return first.get("Alphabetic")
    return first


def _component(prefix: str, n: int) -> str:
    """A File ID component: ``prefix`` and ``n`` zero-padded to 8 characters (§8.2)."""
    digits = 8 - len(prefix)
    if n >= 10**digits:
        raise ValueError(f"more than {10**digits - 1} entries under one {prefix} folder")
    return f"{prefix}{n:0{digits}d}"


@dataclass(slots=True)
class _Node:
    name: str
    raw: bytearray = field(default_factory=bytearray)  # the record, encoded (its offsets patched in encode())
    children: list[_Node] = field(default_factory=list)
    by_key: dict[str, _Node] = field(default_factory=dict)
    offset: int = 0


def _record(kind: str, item: dict | None = None, charset: bool = False) -> Dataset:
    r = Dataset()
    r.OffsetOfTheNextDirectoryRecord = 0
    r.RecordInUseFlag = 0xFFFF
    r.OffsetOfReferencedLowerLevelDirectoryEntity = 0
    r.DirectoryRecordType = kind
    if charset and item is not None:
        chars = (item.get(TAGS["SpecificCharacterSet"]) or {}).get("Value")
        if chars and chars != ["ISO_IR 6"]:  # 1C: required when another set than the default is used
            r.SpecificCharacterSet = chars
    return r


# a record's first elements, Explicit VR Little Endian: (0004,1400) UL at byte 0, its value
# at 8; (0004,1410) US at 12; (0004,1420) UL at 22, its value at 30
_NEXT_TAG, _NEXT_AT = b"\x04\x00\x00\x14", 8
_LOWER_TAG, _LOWER_AT = b"\x04\x00\x20\x14", 30


def _encoded(record: Dataset) -> bytearray:
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_dataset(fp, record)
    raw = bytearray(fp.getvalue())
    assert raw[0:4] == _NEXT_TAG and raw[22:26] == _LOWER_TAG
    return raw


def _element(group: int, element: int, vr: bytes, value: bytes) -> bytes:
    """One data element of a short-length VR, Explicit VR Little Endian (PS3.5 §7.1.2)."""
    if len(value) % 2:
        value += b"\x00" if vr == b"UI" else b" "  # even length: UI padded with NUL, strings with space (§6.2)
    return struct.pack("<HH2sH", group, element, vr, len(value)) + value


def image_record(file_id: list[str], sop_class_uid: str, sop_uid: str, transfer_syntax_uid: str,
                 instance_number: int | str) -> bytearray:
    """An IMAGE record (PS3.3 §F.5.5 and Table F.3-3), encoded: the same bytes as
    pydicom's encoding of the same record (tests/dicom), written out here because
    there is one per file: pydicom's Dataset and writer take about 1 ms a record
    (its value validation), this a few microseconds."""
    return bytearray(b"".join((
        _element(0x0004, 0x1400, b"UL", b"\x00\x00\x00\x00"),  # Offset of the Next Directory Record
        _element(0x0004, 0x1410, b"US", b"\xff\xff"),  # Record In-use Flag
        _element(0x0004, 0x1420, b"UL", b"\x00\x00\x00\x00"),  # Offset of Referenced Lower-Level Entity
        _element(0x0004, 0x1430, b"CS", b"IMAGE"),  # Directory Record Type
        _element(0x0004, 0x1500, b"CS", "\\".join(file_id).encode("ascii")),  # Referenced File ID
        _element(0x0004, 0x1510, b"UI", sop_class_uid.encode("ascii")),  # Referenced SOP Class UID in File
        _element(0x0004, 0x1511, b"UI", sop_uid.encode("ascii")),  # Referenced SOP Instance UID in File
        _element(0x0004, 0x1512, b"UI", transfer_syntax_uid.encode("ascii")),  # Ref. Transfer Syntax UID in File
        _element(0x0020, 0x0013, b"IS", str(instance_number).encode("ascii")),  # Instance Number
    )))


class DicomDir:
    """The File-set under construction: :meth:`add` each instance (its stored DICOM
    JSON and transfer syntax) in the order its file is written, taking the File ID
    to write it under; :meth:`encode` at the end. Each record is encoded when made
    (about 230 bytes held per instance); only its offsets are written in at the end."""

    def __init__(self) -> None:
        self.root = _Node("")
        self.files = 0

    def add(self, item: dict, transfer_syntax_uid: str) -> str:
        """Record one instance; its File ID as a ZIP member name (``/`` between
        components). The file must be written under that name."""
        patient_id = json_value(item, "PatientID") or STAND_INS["PatientID"]
        patient = self.root.by_key.get(patient_id)
        if patient is None:
            patient = self._child(self.root, patient_id, "P")
            r = _record("PATIENT", item, charset=True)
            r.PatientName = json_value(item, "PatientName") or ""
            r.PatientID = patient_id  # (instances without one: all under one stand-in)
            patient.raw = _encoded(r)
        study_uid = json_value(item, "StudyInstanceUID")
        study = patient.by_key.get(study_uid)
        if study is None:
            study = self._child(patient, study_uid, "S")
            r = _record("STUDY", item, charset=True)
            r.StudyDate = json_value(item, "StudyDate") or STAND_INS["StudyDate"]
            r.StudyTime = json_value(item, "StudyTime") or STAND_INS["StudyTime"]
            r.StudyDescription = json_value(item, "StudyDescription") or ""
            r.StudyInstanceUID = study_uid
            r.StudyID = json_value(item, "StudyID") or study_uid.replace(".", "")[-16:]  # SH: 16 characters
            r.AccessionNumber = json_value(item, "AccessionNumber") or ""
            study.raw = _encoded(r)
        series_uid = json_value(item, "SeriesInstanceUID")
        series = study.by_key.get(series_uid)
        if series is None:
            series = self._child(study, series_uid, "SE")
            r = _record("SERIES", item)
            r.Modality = json_value(item, "Modality") or STAND_INS["Modality"]
            r.SeriesInstanceUID = series_uid
            number = json_value(item, "SeriesNumber")
            r.SeriesNumber = number if number is not None else STAND_INS["SeriesNumber"]
            series.raw = _encoded(r)
        image = self._child(series, None, "I")
        number = json_value(item, "InstanceNumber")
        file_id = [ROOT, patient.name, study.name, series.name, image.name]
        image.raw = image_record(file_id, json_value(item, "SOPClassUID"), json_value(item, "SOPInstanceUID"),
                                 transfer_syntax_uid, number if number is not None else STAND_INS["InstanceNumber"])
        self.files += 1
        return "/".join(file_id)

    @staticmethod
    def _child(parent: _Node, key: str | None, prefix: str) -> _Node:
        node = _Node(_component(prefix, len(parent.children) + 1))
        parent.children.append(node)
        if key is not None:  # (instances are not looked up)
            parent.by_key[key] = node
        return node

    def _walk(self, node: _Node):
        for child in node.children:
            yield child
            yield from self._walk(child)

    def encode(self, file_set_id: str = "") -> bytes:
        """The DICOMDIR file (PS3.10 §7: preamble, File Meta Information, Explicit VR
        Little Endian), its offsets filled in: the records in depth-first order as the
        items (defined length) of the Directory Record Sequence, the last element."""
        ds = Dataset()
        ds.file_meta = FileMetaDataset()
        ds.file_meta.MediaStorageSOPClassUID = MEDIA_STORAGE_DIRECTORY
        ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.FileSetID = file_set_id  # Type 2 (PS3.3 §F.3.2.1)
        ds.OffsetOfTheFirstDirectoryRecordOfTheRootDirectoryEntity = 0
        ds.OffsetOfTheLastDirectoryRecordOfTheRootDirectoryEntity = 0
        ds.FileSetConsistencyFlag = 0x0000
        nodes = list(self._walk(self.root))
        # the first item starts after what precedes the sequence (whose length does not
        # depend on the offsets' values) and the sequence's tag, VR, reserved bytes, length
        offset = len(_file(ds)) + 12
        for n in nodes:
            n.offset = offset
            offset += 8 + len(n.raw)  # the item's tag and length, then the record
        for parent in [self.root, *nodes]:
            kids = parent.children
            if parent is not self.root and kids:
                struct.pack_into("<I", parent.raw, _LOWER_AT, kids[0].offset)
            for a, b in zip(kids, kids[1:]):
                struct.pack_into("<I", a.raw, _NEXT_AT, b.offset)
        if self.root.children:
            ds.OffsetOfTheFirstDirectoryRecordOfTheRootDirectoryEntity = self.root.children[0].offset
            ds.OffsetOfTheLastDirectoryRecordOfTheRootDirectoryEntity = self.root.children[-1].offset
        out = [_file(ds)]
        length = sum(8 + len(n.raw) for n in nodes)
        out.append(b"\x04\x00\x20\x12SQ\x00\x00" + struct.pack("<I", length))  # (0004,1220) SQ, PS3.5 §7.1.2
        for n in nodes:
            out.append(b"\xfe\xff\x00\xe0" + struct.pack("<I", len(n.raw)))  # Item (FFFE,E000), PS3.5 §7.5
            out.append(bytes(n.raw))
        return b"".join(out)


def _file(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    dcmwrite(buf, ds, enforce_file_format=True)
    return buf.getvalue()

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
  (PS3.3 §F.3.2.1), found by encoding the records once (their lengths do not change
  when the offsets, UL values, are filled in). The sequence and its items have
  defined lengths, as pydicom's FileSet writes them.
"""

from __future__ import annotations

import io
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


@dataclass
class _Node:
    record: Dataset
    children: list[_Node] = field(default_factory=list)
    by_key: dict[str, _Node] = field(default_factory=dict)
    name: str = ""
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


class DicomDir:
    """The File-set under construction: :meth:`add` each instance (its stored DICOM
    JSON and transfer syntax) in the order its file is written, taking the File ID
    to write it under; :meth:`encode` at the end."""

    def __init__(self) -> None:
        self.root = _Node(Dataset())
        self.files = 0

    def add(self, item: dict, transfer_syntax_uid: str) -> str:
        """Record one instance; its File ID as a ZIP member name (``/`` between
        components). The file must be written under that name."""
        patient_id = json_value(item, "PatientID") or STAND_INS["PatientID"]
        patient = self.root.by_key.get(patient_id)
        if patient is None:
            r = _record("PATIENT", item, charset=True)
            r.PatientName = json_value(item, "PatientName") or ""
            r.PatientID = patient_id  # (instances without one: all under one stand-in)
            patient = self._child(self.root, patient_id, r, "P")
        study_uid = json_value(item, "StudyInstanceUID")
        study = patient.by_key.get(study_uid)
        if study is None:
            r = _record("STUDY", item, charset=True)
            r.StudyDate = json_value(item, "StudyDate") or STAND_INS["StudyDate"]
            r.StudyTime = json_value(item, "StudyTime") or STAND_INS["StudyTime"]
            r.StudyDescription = json_value(item, "StudyDescription") or ""
            r.StudyInstanceUID = study_uid
            r.StudyID = json_value(item, "StudyID") or study_uid.replace(".", "")[-16:]  # SH: 16 characters
            r.AccessionNumber = json_value(item, "AccessionNumber") or ""
            study = self._child(patient, study_uid, r, "S")
        series_uid = json_value(item, "SeriesInstanceUID")
        series = study.by_key.get(series_uid)
        if series is None:
            r = _record("SERIES", item)
            r.Modality = json_value(item, "Modality") or STAND_INS["Modality"]
            r.SeriesInstanceUID = series_uid
            number = json_value(item, "SeriesNumber")
            r.SeriesNumber = number if number is not None else STAND_INS["SeriesNumber"]
            series = self._child(study, series_uid, r, "SE")
        r = _record("IMAGE", item)
        number = json_value(item, "InstanceNumber")
        r.InstanceNumber = number if number is not None else STAND_INS["InstanceNumber"]
        sop_uid = json_value(item, "SOPInstanceUID")
        image = self._child(series, sop_uid, r, "I")
        file_id = [ROOT, patient.name, study.name, series.name, image.name]
        r.ReferencedFileID = file_id
        r.ReferencedSOPClassUIDInFile = json_value(item, "SOPClassUID")
        r.ReferencedSOPInstanceUIDInFile = sop_uid
        r.ReferencedTransferSyntaxUIDInFile = transfer_syntax_uid
        self.files += 1
        return "/".join(file_id)

    @staticmethod
    def _child(parent: _Node, key: str, record: Dataset, prefix: str) -> _Node:
        node = _Node(record, name=_component(prefix, len(parent.children) + 1))
        parent.children.append(node)
        parent.by_key[key] = node
        return node

    def _walk(self, node: _Node):
        for child in node.children:
            yield child
            yield from self._walk(child)

    def encode(self, file_set_id: str = "") -> bytes:
        """The DICOMDIR file (PS3.10 §7: preamble, File Meta Information, Explicit VR
        Little Endian), its offsets filled in."""
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
        ds.DirectoryRecordSequence = [n.record for n in nodes]
        # where the sequence's first item starts: everything before it, plus the sequence's
        # own tag, VR, reserved bytes and length (12 bytes, explicit VR)
        head = io.BytesIO()
        probe = Dataset()
        probe.file_meta = ds.file_meta
        for elem in ds[:0x00041220]:
            probe.add(elem)
        dcmwrite(head, probe, enforce_file_format=True)
        offset = len(head.getvalue()) + 12
        for n in nodes:
            n.offset = offset
            offset += 8 + _encoded_length(n.record)  # item tag and length, then the record
        for parent in [self.root, *nodes]:
            kids = parent.children
            if parent is not self.root and kids:
                parent.record.OffsetOfReferencedLowerLevelDirectoryEntity = kids[0].offset
            for a, b in zip(kids, kids[1:]):
                a.record.OffsetOfTheNextDirectoryRecord = b.offset
        if self.root.children:
            ds.OffsetOfTheFirstDirectoryRecordOfTheRootDirectoryEntity = self.root.children[0].offset
            ds.OffsetOfTheLastDirectoryRecordOfTheRootDirectoryEntity = self.root.children[-1].offset
        out = io.BytesIO()
        dcmwrite(out, ds, enforce_file_format=True)
        return out.getvalue()


def _encoded_length(record: Dataset) -> int:
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_dataset(fp, record)
    return len(fp.getvalue())

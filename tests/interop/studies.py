"""Test data for the interop tests: one study holding a CT series and an MR series,
made with pydicom (phantoms with real geometry, so a viewer can stack and window them)."""

from __future__ import annotations

import io

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"


# modified Shepp-Logan head phantom: (intensity, semi-axis a, semi-axis b, x0, y0, angle in degrees)
_ELLIPSES = [(1.0, .69, .92, 0, 0, 0), (-.8, .6624, .874, 0, -.0184, 0), (-.2, .11, .31, .22, 0, -18),
             (-.2, .16, .41, -.22, 0, 18), (.1, .21, .25, 0, .35, 0), (.1, .046, .046, 0, .1, 0),
             (.1, .046, .046, 0, -.1, 0), (.1, .046, .023, -.08, -.605, 0), (.1, .023, .023, 0, -.606, 0),
             (.1, .023, .046, .06, -.605, 0)]


def _phantom(size: int, z: int, slices: int) -> tuple[np.ndarray, np.ndarray]:
    """A head phantom whose ellipses shrink away from the middle slice, as in a volume:
    (values in 0..1, mask of the head). Never a blank picture."""
    t = (z - (slices - 1) / 2) / max(slices, 2) * 1.2  # -0.6 .. 0.6
    shrink = np.sqrt(max(1 - t * t, 0.2))
    yy, xx = np.mgrid[1:-1:size * 1j, -1:1:size * 1j]
    img = np.zeros((size, size), np.float32)
    head = None
    for value, a, b, x0, y0, deg in _ELLIPSES:
        th = np.deg2rad(deg)
        xr = (xx - x0) * np.cos(th) + (yy - y0) * np.sin(th)
        yr = -(xx - x0) * np.sin(th) + (yy - y0) * np.cos(th)
        inside = (xr / (a * shrink)) ** 2 + (yr / (b * shrink)) ** 2 <= 1
        img[inside] += value
        if head is None:
            head = inside
    return img, head


def _instance(study: Dataset, *, modality: str, sop_class: str, series_uid: str, series_number: int,
              description: str, index: int, slices: int, size: int) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    for k in ("StudyInstanceUID", "PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyDate",
              "StudyTime", "AccessionNumber", "StudyID", "StudyDescription", "ReferringPhysicianName"):
        setattr(ds, k, getattr(study, k))
    ds.SeriesInstanceUID = series_uid
    ds.SeriesNumber = series_number
    ds.SeriesDescription = description
    ds.Modality = modality
    ds.SeriesDate, ds.SeriesTime = study.StudyDate, study.StudyTime
    ds.InstanceNumber = index + 1
    ds.FrameOfReferenceUID = study.FrameOfReferenceUID
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.ImagePositionPatient = [-100.0, -100.0, float(index * 5)]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing = [200 / size, 200 / size]
    ds.SliceThickness = 5
    ds.SliceLocation = float(index * 5)
    ds.Rows = ds.Columns = size
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
    img, head = _phantom(size, index, slices)
    if modality == "CT":
        ds.PixelRepresentation = 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = -1024, 1, "HU"
        ds.WindowCenter, ds.WindowWidth = 40, 400
        ds.KVP = 120
        hu = np.where(img > 0.5, 1000 * img, 20 + (img - 0.2) * 400)  # bone; brain 20 HU, CSF -60
        arr = (np.where(head, hu, -1000) + 1024).astype(np.int16)
    else:
        ds.PixelRepresentation = 0
        ds.WindowCenter, ds.WindowWidth = 500, 1000
        ds.MagneticFieldStrength = 1.5
        ds.EchoTime, ds.RepetitionTime = 90, 3000
        ds.ScanningSequence, ds.SequenceVariant = "SE", "NONE"
        t2 = np.where(img > 0.5, 80, np.where(img < 0.1, 950, 400 + (img - 0.2) * 2500))  # T2: CSF bright
        arr = np.where(head, t2, 0).astype(np.uint16)
    ds.PixelData = arr.tobytes()
    return ds


def make_study(*, slices: int = 8, size: int = 128, patient: str = "Interop^Viewer",
               patient_id: str = "INTEROP1") -> list[Dataset]:
    """A CT series and an MR series of one study (``slices`` images each)."""
    study = Dataset()
    study.StudyInstanceUID = generate_uid()
    study.FrameOfReferenceUID = generate_uid()
    study.PatientName, study.PatientID = patient, patient_id
    study.PatientBirthDate, study.PatientSex = "19700101", "O"
    study.StudyDate, study.StudyTime = "20240315", "101500"
    study.AccessionNumber, study.StudyID = "ACC-INTEROP", "1"
    study.StudyDescription = "Interop CT and MR"
    study.ReferringPhysicianName = "Doe^Referrer"
    out: list[Dataset] = []
    for n, (modality, sop_class, desc) in enumerate(
            [("CT", CT_IMAGE_STORAGE, "CT phantom"), ("MR", MR_IMAGE_STORAGE, "MR phantom")], start=1):
        series_uid = generate_uid()
        for i in range(slices):
            out.append(_instance(study, modality=modality, sop_class=sop_class, series_uid=series_uid,
                                 series_number=n, description=desc, index=i, slices=slices, size=size))
    return out


def to_bytes(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def stow_body(datasets: list[Dataset], boundary: str = "interop-boundary") -> tuple[bytes, str]:
    parts = [f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + to_bytes(ds) + b"\r\n"
             for ds in datasets]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), \
        f'multipart/related; type="application/dicom"; boundary={boundary}'

"""The LOAD-03 data set, made deterministically from a seed, and its manifest.

    python -m loadtests.dataset --manifest loadtests/data/manifest.json \
        [--seed 3] [--studies 400] [--instances 10000] [--ct-size 512] [--mr-size 256] [--out DIR]

Default: 400 studies, 10,000 images, CT 512x512 and MR 256x256, 16 bits allocated
(12 stored), Explicit VR Little Endian, with realistic headers (patients with 1-5
studies, dates 2019-2024, study and series descriptions, series numbers, slice
geometry, window centre/width, rescale for CT). About 60 % of the studies are CT.

Nothing is kept in memory but one series at a time: the data set is a pure
function of (seed, sizes), so :func:`iter_instances` can make any study again
(``loadtests.preload`` does, instead of reading files). ``--out`` also writes the
PS3.10 files (``DIR/<study>/<series>/<sop>.dcm``).

The manifest (JSON) is what the locustfile and the runners read:

* ``queries``: the fixed QIDO-RS study-search mix (PatientID, StudyDate range,
  ModalitiesInStudy + date range, PatientName wildcard), each with the number of
  studies it must return;
* ``instances``: per instance its WADO-RS path, study/series/SOP UIDs, rows and
  columns, pixel-data length and the SHA-256 of the pixel data;
* ``studies``: instances per study (preload checks them with QIDO-RS);
* ``stow``: the patient that STOW-RS load goes to; no query of the mix matches it,
  so reruns still validate the counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian

CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"
MANIFEST_VERSION = 1
DEFAULT_SEED = 3

#: The patient every STOW-RS load image goes to (never matched by the query mix).
STOW_PATIENT_ID = "ZZLOADTEST-STOW"
STOW_PATIENT_NAME = "ZZLOADTEST^STOW"
STOW_STUDY_DATE = "20250615"  # outside the data set's 2019-2024 window

FAMILY_NAMES = [
    "SMITH", "JOHNSON", "WILLIAMS", "BROWN", "JONES", "GARCIA", "MILLER", "DAVIS", "RODRIGUEZ",
    "MARTINEZ", "HERNANDEZ", "LOPEZ", "GONZALEZ", "WILSON", "ANDERSON", "THOMAS", "TAYLOR", "MOORE",
    "JACKSON", "MARTIN", "LEE", "PEREZ", "THOMPSON", "WHITE", "HARRIS", "SANCHEZ", "CLARK", "RAMIREZ",
    "LEWIS", "ROBINSON", "WALKER", "YOUNG", "ALLEN", "KING", "WRIGHT", "SCOTT", "TORRES", "NGUYEN",
    "HILL", "FLORES", "GREEN", "ADAMS", "NELSON", "BAKER", "HALL", "RIVERA", "CAMPBELL", "MITCHELL",
    "CARTER", "ROBERTS", "MUELLER", "SCHMIDT", "SCHNEIDER", "FISCHER", "WEBER", "MEYER", "WAGNER",
    "BECKER", "DUBOIS", "LAURENT", "BERNARD", "PETIT", "ROSSI", "RUSSO", "FERRARI", "ESPOSITO",
    "BIANCHI", "ROMANO", "JANSEN", "DE VRIES", "VAN DIJK", "NOWAK", "KOWALSKI", "NIELSEN", "HANSEN",
    "JOHANSSON", "LARSSON", "VIRTANEN", "SATO", "SUZUKI", "TANAKA", "KIM", "PARK", "CHEN", "WANG",
]
GIVEN_NAMES = {
    "M": ["JOHN", "JAMES", "ROBERT", "MICHAEL", "WILLIAM", "DAVID", "RICHARD", "JOSEPH", "THOMAS",
          "CHARLES", "CARLOS", "LUCA", "PIERRE", "HANS", "JAN", "LARS", "HIROSHI", "MIN-JUN", "WEI",
          "AHMED", "OMAR", "PAUL", "PETER", "MARK", "GEORGE"],
    "F": ["MARY", "PATRICIA", "JENNIFER", "LINDA", "ELIZABETH", "BARBARA", "SUSAN", "JESSICA",
          "SARAH", "KAREN", "MARIA", "SOFIA", "ANNA", "EMMA", "CLAIRE", "GIULIA", "INGRID", "YUKI",
          "JI-WOO", "MEI", "FATIMA", "LAURA", "JULIA", "ELENA", "HANNAH"],
}
PHYSICIANS = ["HOUSE^GREGORY", "GREY^MEREDITH", "ROSS^DOUG", "CARTER^JOHN", "WEAVER^KERRY",
              "BAILEY^MIRANDA", "SHEPHERD^DEREK", "KOVAC^LUKA"]
INSTITUTIONS = ["GENERAL HOSPITAL", "ST MARY MEDICAL CENTER", "UNIVERSITY CLINIC", "CITY IMAGING CENTER"]

# (study description, body part, [(series description, slice thickness mm)])
CT_PROTOCOLS = [
    ("CT CHEST W/O CONTRAST", "CHEST", [("AXIAL 5MM", 5.0), ("AXIAL 1.25MM LUNG", 1.25), ("CORONAL MPR", 3.0)]),
    ("CT ABDOMEN PELVIS W CONTRAST", "ABDOMEN", [("PORTAL VENOUS 5MM", 5.0), ("DELAYED 5MM", 5.0),
                                                 ("CORONAL MPR", 3.0), ("SAGITTAL MPR", 3.0)]),
    ("CT HEAD W/O CONTRAST", "HEAD", [("AXIAL 5MM BRAIN", 5.0), ("AXIAL 2.5MM BONE", 2.5)]),
    ("CT CHEST ABDOMEN PELVIS W CONTRAST", "CHEST", [("AXIAL 5MM", 5.0), ("AXIAL 2MM", 2.0), ("CORONAL MPR", 3.0)]),
    ("CTA NECK", "NECK", [("ARTERIAL 1MM", 1.0), ("MIP AXIAL", 3.0)]),
]
MR_PROTOCOLS = [
    ("MR BRAIN W/O CONTRAST", "HEAD", [("SAG T1", 5.0), ("AX T2 FSE", 5.0), ("AX FLAIR", 5.0), ("AX DWI", 5.0)]),
    ("MR LUMBAR SPINE W/O CONTRAST", "LSPINE", [("SAG T1", 4.0), ("SAG T2", 4.0), ("AX T2", 4.0)]),
    ("MR KNEE LEFT W/O CONTRAST", "KNEE", [("COR PD FS", 3.0), ("SAG PD", 3.0), ("AX T2 FS", 3.0)]),
    ("MR SHOULDER RIGHT", "SHOULDER", [("COR T1", 3.5), ("COR T2 FS", 3.5)]),
]
CT_FRACTION = 0.6
DATE_FIRST = dt.date(2019, 1, 1)
DATE_LAST = dt.date(2024, 12, 31)
NOISE_POOL = 1 << 20


# --------------------------------------------------------------------------- the plan


@dataclass
class SeriesPlan:
    uid: str
    number: int
    description: str
    thickness: float
    count: int
    sop_uids: list[str] = field(default_factory=list)


@dataclass
class StudyPlan:
    index: int
    uid: str
    patient_id: str
    patient_name: str
    birth_date: str
    sex: str
    date: str
    time: str
    modality: str
    description: str
    body_part: str
    accession: str
    physician: str
    institution: str
    series: list[SeriesPlan]

    @property
    def count(self) -> int:
        return sum(s.count for s in self.series)


@dataclass(frozen=True)
class Spec:
    seed: int = DEFAULT_SEED
    studies: int = 400
    instances: int = 10_000
    ct_size: int = 512
    mr_size: int = 256

    def size(self, modality: str) -> int:
        return self.ct_size if modality == "CT" else self.mr_size


def _uid(seed: int, *parts: object) -> str:
    """A deterministic 2.25 UID (a 128-bit integer, PS3.5 B.2) from the seed and parts
    (pydicom's ``generate_uid(prefix=None)`` ignores its entropy sources)."""
    digest = hashlib.sha256("/".join(["loadtests", str(seed), *map(str, parts)]).encode()).digest()
    return f"2.25.{int.from_bytes(digest[:16], 'big')}"


def _split(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` into len(weights) positive integers proportional to weights
    (largest remainder)."""
    n = len(weights)
    if total < n:
        raise ValueError(f"cannot split {total} instances over {n} parts (one each at least)")
    spare = total - n
    s = sum(weights)
    raw = [spare * w / s for w in weights]
    out = [1 + int(r) for r in raw]
    rest = total - sum(out)
    for i in sorted(range(n), key=lambda i: raw[i] - int(raw[i]), reverse=True)[:rest]:
        out[i] += 1
    return out


def plan(spec: Spec) -> list[StudyPlan]:
    """Patients, studies, series and UIDs: everything but the pixels (cheap)."""
    if spec.studies < 1 or spec.instances < spec.studies:
        raise ValueError("need at least one study and at least one instance per study")
    rng = random.Random(spec.seed)
    n_patients = max(1, round(spec.studies / 2.6))
    patients = []
    used_names: set[str] = set()
    for p in range(n_patients):
        while True:
            sex = rng.choice("MF")
            name = f"{rng.choice(FAMILY_NAMES)}^{rng.choice(GIVEN_NAMES[sex])}"
            if name not in used_names or len(used_names) > 1500:
                break
        used_names.add(name)
        birth = dt.date(1935, 1, 1) + dt.timedelta(days=rng.randrange(0, 365 * 70))
        patients.append((f"PID{spec.seed % 1000:03d}{p:05d}", name, birth.strftime("%Y%m%d"), sex))
    # every patient gets one study, the rest go to random patients (1-5 studies each, typically)
    owners = list(range(n_patients)) + [rng.randrange(n_patients) for _ in range(spec.studies - n_patients)]
    owners = owners[: spec.studies]
    rng.shuffle(owners)
    modalities = ["CT" if rng.random() < CT_FRACTION else "MR" for _ in range(spec.studies)]
    weights = [(1.3 if m == "CT" else 0.8) * rng.uniform(0.6, 1.4) for m in modalities]
    counts = _split(spec.instances, weights)
    days = (DATE_LAST - DATE_FIRST).days
    studies = []
    for i in range(spec.studies):
        pid, pname, birth, sex = patients[owners[i]]
        modality = modalities[i]
        desc, body, series_menu = rng.choice(CT_PROTOCOLS if modality == "CT" else MR_PROTOCOLS)
        n_series = max(1, min(len(series_menu), counts[i], rng.randint(1, len(series_menu))))
        chosen = series_menu[:n_series]
        per_series = _split(counts[i], [rng.uniform(0.5, 1.5) for _ in chosen])
        date = DATE_FIRST + dt.timedelta(days=rng.randrange(days + 1))
        t = f"{rng.randrange(7, 20):02d}{rng.randrange(60):02d}{rng.randrange(60):02d}"
        study_uid = _uid(spec.seed, "study", i)
        series = []
        for k, ((sdesc, thick), n) in enumerate(zip(chosen, per_series)):
            number = (k + 1) if modality == "MR" else (k + 2)  # CT series 1 is usually the scout
            se = SeriesPlan(_uid(spec.seed, "series", i, k), number, sdesc, thick, n)
            se.sop_uids = [_uid(spec.seed, "sop", i, k, j) for j in range(n)]
            series.append(se)
        studies.append(StudyPlan(
            index=i, uid=study_uid, patient_id=pid, patient_name=pname, birth_date=birth, sex=sex,
            date=date.strftime("%Y%m%d"), time=t, modality=modality, description=desc, body_part=body,
            accession=f"A{spec.seed % 100:02d}{i:06d}", physician=rng.choice(PHYSICIANS),
            institution=rng.choice(INSTITUTIONS), series=series))
    return studies


# --------------------------------------------------------------------------- queries


def _matches(study: StudyPlan, q: dict[str, str]) -> bool:
    for key, value in q.items():
        if key == "PatientID" and study.patient_id != value:
            return False
        if key == "StudyDate":
            lo, _, hi = value.partition("-")
            if (lo and study.date < lo) or (hi and study.date > hi):
                return False
        if key == "ModalitiesInStudy" and study.modality != value:
            return False
        if key == "PatientName":
            name = study.patient_name.upper()
            if value.endswith("*") and "*" not in value[:-1]:
                if not name.startswith(value[:-1].upper()):
                    return False
            elif name != value.upper():
                return False
    return True


def _stow_matches(q: dict[str, str]) -> bool:
    fake = StudyPlan(-1, "", STOW_PATIENT_ID, STOW_PATIENT_NAME, "", "O", STOW_STUDY_DATE, "", "MR", "", "",
                     "", "", "", [])
    return _matches(fake, q)


def make_queries(spec: Spec, studies: list[StudyPlan], n: int = 200) -> list[dict]:
    """The fixed QIDO-RS mix: 40 % PatientID, 20 % StudyDate range (30 days),
    20 % ModalitiesInStudy with a 90-day range, 20 % PatientName prefix wildcard.
    Values use only characters that need no percent-encoding (the peer does not
    decode them), so one query string serves every server."""
    rng = random.Random(spec.seed * 7919 + 1)
    days = (DATE_LAST - DATE_FIRST).days
    family = sorted({s.patient_name.split("^")[0] for s in studies if s.patient_name.split("^")[0].isalpha()})
    out = []
    for k in range(n):
        r = k % 10
        if r < 4:
            q = {"PatientID": rng.choice(studies).patient_id}
        elif r < 6:
            a = DATE_FIRST + dt.timedelta(days=rng.randrange(days - 30))
            q = {"StudyDate": f"{a:%Y%m%d}-{a + dt.timedelta(days=29):%Y%m%d}"}
        elif r < 8:
            a = DATE_FIRST + dt.timedelta(days=rng.randrange(days - 90))
            q = {"ModalitiesInStudy": rng.choice(["CT", "MR"]),
                 "StudyDate": f"{a:%Y%m%d}-{a + dt.timedelta(days=89):%Y%m%d}"}
        else:
            q = {"PatientName": rng.choice(family)[: rng.choice([2, 3, 4])] + "*"}
        if _stow_matches(q):  # never true for the mix above; kept as a guard
            continue
        expected = sum(1 for s in studies if _matches(s, q))
        out.append({"query": "&".join(f"{k}={v}" for k, v in q.items()), "params": q, "expected": expected})
    return out


# --------------------------------------------------------------------------- pixels


class _Pixels:
    """Phantom images: a body outline with structures, a structure whose size
    changes from slice to slice, and noise from a seeded pool (cheap)."""

    def __init__(self, seed: int) -> None:
        self.noise = np.random.default_rng([seed, 99]).integers(0, 40, NOISE_POOL, dtype=np.uint16)
        self._grids: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def grid(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if size not in self._grids:
            y, x = np.mgrid[0:size, 0:size].astype(np.float32)
            self._grids[size] = (y / size, x / size)
        return self._grids[size]

    def series_base(self, modality: str, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(base image, squared distance from the varying structure's centre)."""
        y, x = self.grid(size)
        cy, cx = 0.5 + rng.uniform(-0.03, 0.03), 0.5 + rng.uniform(-0.03, 0.03)
        img = np.zeros((size, size), dtype=np.uint16)
        if modality == "CT":  # stored values, rescale intercept -1024: 0 = air, 1064 = 40 HU
            body = ((y - cy) / 0.33) ** 2 + ((x - cx) / 0.43) ** 2 < 1
            img[body] = 1064
            for sx in (-0.17, 0.17):  # lungs
                img[((y - cy + 0.02) / 0.2) ** 2 + ((x - cx - sx) / 0.12) ** 2 < 1] = 200
            img[((y - cy - 0.2) ** 2 + (x - cx) ** 2) < 0.035 ** 2] = 2200  # spine
            img[((y - cy - 0.08) ** 2 + (x - cx + 0.02) ** 2) < 0.03 ** 2] = 1300  # aorta
        else:  # MR head-like, arbitrary units
            head = ((y - cy) / 0.42) ** 2 + ((x - cx) / 0.35) ** 2 < 1
            img[head] = 300
            img[((y - cy) / 0.38) ** 2 + ((x - cx) / 0.31) ** 2 < 1] = 650
            img[((y - cy) / 0.08) ** 2 + ((x - cx) / 0.03) ** 2 < 1] = 1100  # ventricles
        d2 = (y - cy + 0.05) ** 2 + (x - cx - 0.08) ** 2
        return img, d2

    def image(self, base: np.ndarray, d2: np.ndarray, modality: str, frac: float,
              rng: np.random.Generator) -> np.ndarray:
        img = base.copy()
        r = 0.02 + 0.08 * np.sin(np.pi * frac)  # a structure growing then shrinking along the series
        img[d2 < r * r] = 1150 if modality == "CT" else 900
        n = img.size
        off = int(rng.integers(0, NOISE_POOL - n))
        img += self.noise[off: off + n].reshape(img.shape)
        return img


# --------------------------------------------------------------------------- instances


@dataclass
class Instance:
    study: StudyPlan
    series: SeriesPlan
    number: int  # 1-based InstanceNumber
    sop_uid: str
    rows: int
    columns: int
    pixels: np.ndarray

    @property
    def pixel_bytes(self) -> bytes:
        return self.pixels.tobytes()

    @property
    def path(self) -> str:
        return f"/studies/{self.study.uid}/series/{self.series.uid}/instances/{self.sop_uid}"


def _series_dataset(spec: Spec, st: StudyPlan, se: SeriesPlan, size: int) -> Dataset:
    """Header of a series; the per-instance attributes are set by :func:`to_dicom`."""
    sop_class = CT_IMAGE_STORAGE if st.modality == "CT" else MR_IMAGE_STORAGE
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.ImplementationVersionName = "LOADTESTS_1"
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"] if st.modality == "CT" else ["ORIGINAL", "PRIMARY", "M", "ND"]
    ds.SOPClassUID = sop_class
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = st.date
    ds.StudyTime = st.time
    ds.SeriesTime = ds.ContentTime = f"{st.time[:4]}{(int(st.time[4:6]) // 2 + se.number) % 60:02d}"
    ds.AccessionNumber = st.accession
    ds.Modality = st.modality
    ds.Manufacturer = "LOADTESTS" if st.modality == "CT" else "LOADTESTS MR"
    ds.InstitutionName = st.institution
    ds.ReferringPhysicianName = st.physician
    ds.StationName = f"{st.modality}SCAN{st.index % 3 + 1}"
    ds.StudyDescription = st.description
    ds.SeriesDescription = se.description
    ds.ManufacturerModelName = "PHANTOM 2000"
    ds.PatientName = st.patient_name
    ds.PatientID = st.patient_id
    ds.IssuerOfPatientID = "LOADTESTS"
    ds.PatientBirthDate = st.birth_date
    ds.PatientSex = st.sex
    ds.PatientAge = f"{min(999, int(st.date[:4]) - int(st.birth_date[:4])):03d}Y"
    ds.BodyPartExamined = st.body_part
    ds.SliceThickness = f"{se.thickness:g}"
    if st.modality == "CT":
        ds.KVP = "120"
        ds.XRayTubeCurrent = 200
        ds.ConvolutionKernel = "STANDARD"
    else:
        ds.MagneticFieldStrength = "1.5"
        ds.RepetitionTime = "2500"
        ds.EchoTime = "90"
        ds.ScanningSequence = "SE"
        ds.SequenceVariant = "SK"
    ds.PatientPosition = "HFS"
    ds.StudyInstanceUID = st.uid
    ds.SeriesInstanceUID = se.uid
    ds.StudyID = str(st.index + 1)
    ds.SeriesNumber = se.number
    ds.FrameOfReferenceUID = _uid(spec.seed, "for", st.index)
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows = ds.Columns = size
    spacing = (350.0 if st.modality == "CT" else 230.0) / size
    ds.PixelSpacing = [f"{spacing:.6g}", f"{spacing:.6g}"]
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    if st.modality == "CT":
        ds.WindowCenter, ds.WindowWidth = ["40", "-600"], ["400", "1500"]
        ds.WindowCenterWidthExplanation = ["SOFT TISSUE", "LUNG"]
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = "-1024", "1", "HU"
    else:
        ds.WindowCenter, ds.WindowWidth = "600", "1200"
    return ds


def to_dicom(spec: Spec, inst: Instance, ds: Dataset | None = None) -> bytes:
    """PS3.10 bytes of an instance (``ds``: the series header to reuse)."""
    st, se = inst.study, inst.series
    ds = ds if ds is not None else _series_dataset(spec, st, se, inst.rows)
    ds.file_meta.MediaStorageSOPInstanceUID = inst.sop_uid
    ds.SOPInstanceUID = inst.sop_uid
    ds.InstanceNumber = inst.number
    z = -0.5 * se.count * se.thickness + (inst.number - 1) * se.thickness
    ds.ImagePositionPatient = [f"{-ds.PixelSpacing[0] * inst.columns / 2:.4f}",
                               f"{-ds.PixelSpacing[1] * inst.rows / 2:.4f}", f"{z:.2f}"]
    ds.SliceLocation = f"{z:.2f}"
    ds.PixelData = inst.pixel_bytes
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def iter_instances(spec: Spec, studies: list[StudyPlan] | None = None,
                   only: set[str] | None = None, encode: bool = True) -> Iterator[tuple[Instance, bytes | None]]:
    """Every instance (study by study, series by series), with its PS3.10 bytes
    when ``encode``. ``only``: study UIDs to make (others are skipped). Each series
    depends on the seed and its position only, so any subset comes out the same."""
    studies = plan(spec) if studies is None else studies
    px = _Pixels(spec.seed)
    for st in studies:
        if only is not None and st.uid not in only:
            continue
        size = spec.size(st.modality)
        for k, se in enumerate(st.series):
            rng = np.random.default_rng([spec.seed, st.index, k])
            base, d2 = px.series_base(st.modality, size, rng)
            ds = _series_dataset(spec, st, se, size) if encode else None
            for j, sop in enumerate(se.sop_uids):
                img = px.image(base, d2, st.modality, (j + 0.5) / se.count, rng)
                inst = Instance(st, se, j + 1, sop, size, size, img)
                yield inst, (to_dicom(spec, inst, ds) if encode else None)


def stow_template(size: int = 256, placeholders: tuple[str, str, str] | None = None) -> tuple[bytes, tuple[str, str, str]]:
    """PS3.10 bytes of the MR image that STOW-RS load sends, with fixed-length
    placeholder Study/Series/SOP Instance UIDs (44 characters, even, so that a
    byte-for-byte replacement keeps the file valid). Returns (bytes, placeholders)."""
    ph = placeholders or ("2.25.1" + "1" * 38, "2.25.1" + "2" * 38, "2.25.1" + "3" * 38)
    st = StudyPlan(0, ph[0], STOW_PATIENT_ID, STOW_PATIENT_NAME, "19700101", "O", STOW_STUDY_DATE, "120000",
                   "MR", "LOADTESTS STOW", "HEAD", "STOW", "", "LOADTESTS", [])
    se = SeriesPlan(ph[1], 99, "STOW LOAD", 5.0, 1, [ph[2]])
    st.series.append(se)
    spec = Spec(seed=0, mr_size=size)
    px = _Pixels(0)
    rng = np.random.default_rng([0, 1])
    base, d2 = px.series_base("MR", size, rng)
    inst = Instance(st, se, 1, ph[2], size, size, px.image(base, d2, "MR", 0.5, rng))
    data = to_dicom(spec, inst)
    for p in ph:
        assert len(p) == 44 and data.count(p.encode()) >= 1
    return data, ph


STOW_BOUNDARY = "load03-stow-boundary-7d1f0c"


def stow_body_pieces(size: int = 256) -> tuple[list[bytes], str]:
    """The STOW-RS multipart/related body of one load image, split around its SOP
    Instance UID (join the pieces with a new :func:`fixed_length_uid`), with a new
    Study and Series Instance UID filled in; and its Content-Type."""
    data, (ph_study, ph_series, ph_sop) = stow_template(size)
    data = data.replace(ph_study.encode(), fixed_length_uid().encode())
    data = data.replace(ph_series.encode(), fixed_length_uid().encode())
    head = f"--{STOW_BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    tail = f"\r\n--{STOW_BOUNDARY}--\r\n".encode()
    pieces = (head + data + tail).split(ph_sop.encode())
    return pieces, f'multipart/related; type="application/dicom"; boundary={STOW_BOUNDARY}'


def fixed_length_uid(rnd: random.Random | None = None) -> str:
    """A random 2.25 UID of exactly 44 characters (fits the STOW placeholders)."""
    rnd = rnd or random.SystemRandom()
    return "2.25." + str(10**38 + rnd.randrange(2 * 10**38))


# --------------------------------------------------------------------------- manifest


def build_manifest(spec: Spec, out: Path | None = None, progress: bool = True) -> dict:
    """Make the data set once (pixels only, unless ``out`` is given) and return the manifest."""
    from tqdm import tqdm

    studies = plan(spec)
    queries = make_queries(spec, studies)
    instances = []
    total_bytes = 0
    bar = tqdm(total=spec.instances, unit="img", desc="dataset", disable=not progress, file=sys.stderr)
    for inst, data in iter_instances(spec, studies, encode=out is not None):
        pix = inst.pixel_bytes
        if out is not None and data is not None:
            d = out / inst.study.uid / inst.series.uid
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{inst.sop_uid}.dcm").write_bytes(data)
        total_bytes += len(pix)
        instances.append({
            "path": inst.path, "study": inst.study.uid, "series": inst.series.uid, "sop": inst.sop_uid,
            "modality": inst.study.modality, "rows": inst.rows, "columns": inst.columns,
            "pixel_bytes": len(pix), "sha256": hashlib.sha256(pix).hexdigest(),
        })
        bar.update(1)
    bar.close()
    modalities = {m: sum(1 for i in instances if i["modality"] == m) for m in ("CT", "MR")}
    return {
        "version": MANIFEST_VERSION,
        "spec": {"seed": spec.seed, "studies": spec.studies, "instances": spec.instances,
                 "ct_size": spec.ct_size, "mr_size": spec.mr_size},
        "summary": {"patients": len({s.patient_id for s in studies}), "studies": len(studies),
                    "instances": len(instances), "by_modality": modalities,
                    "pixel_bytes": total_bytes,
                    "object_sizes": {"CT": f"{spec.ct_size}x{spec.ct_size}x16 bit, {spec.ct_size ** 2 * 2} B pixel data",
                                     "MR": f"{spec.mr_size}x{spec.mr_size}x16 bit, {spec.mr_size ** 2 * 2} B pixel data"}},
        "stow": {"PatientID": STOW_PATIENT_ID, "PatientName": STOW_PATIENT_NAME, "StudyDate": STOW_STUDY_DATE,
                 "size": spec.mr_size},
        "queries": queries,
        "studies": [{"uid": s.uid, "instances": s.count, "modality": s.modality} for s in studies],
        "instances": instances,
    }


def load_manifest(path: str | Path) -> dict:
    with open(path, "rb") as f:
        m = json.load(f)
    if m.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{path}: manifest version {m.get('version')} (expected {MANIFEST_VERSION}); "
                         "make it again with python -m loadtests.dataset")
    return m


def spec_of(manifest: dict) -> Spec:
    return Spec(**manifest["spec"])


def ensure_manifest(path: Path, spec: Spec, progress: bool = True) -> dict:
    """The manifest at ``path`` if it describes ``spec``; else make it again."""
    if path.exists():
        try:
            m = load_manifest(path)
            if spec_of(m) == spec:
                return m
        except (ValueError, KeyError, json.JSONDecodeError):
            pass
    t0 = time.monotonic()
    m = build_manifest(spec, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(m, separators=(",", ":")))
    tmp.replace(path)
    if progress:
        print(f"manifest {path}: {spec.studies} studies, {spec.instances} instances "
              f"({m['summary']['pixel_bytes'] / 1e9:.2f} GB pixel data) in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
    return m


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="data set seed (default %(default)s)")
    p.add_argument("--studies", type=int, default=400, help="studies (default %(default)s)")
    p.add_argument("--instances", type=int, default=10_000, help="images in all (default %(default)s)")
    p.add_argument("--ct-size", type=int, default=512, help="CT rows = columns (default %(default)s)")
    p.add_argument("--mr-size", type=int, default=256, help="MR rows = columns (default %(default)s)")


def spec_from_args(a: argparse.Namespace) -> Spec:
    return Spec(seed=a.seed, studies=a.studies, instances=a.instances, ct_size=a.ct_size, mr_size=a.mr_size)


def default_manifest_path(spec: Spec) -> Path:
    return Path(__file__).resolve().parent / "data" / (f"manifest-s{spec.seed}-{spec.studies}x{spec.instances}"
                                     f"-ct{spec.ct_size}-mr{spec.mr_size}.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.dataset", description=__doc__.split("\n\n")[0])
    add_spec_args(p)
    p.add_argument("--manifest", type=Path, help="manifest to write (default loadtests/data/manifest-<sizes>.json)")
    p.add_argument("--out", type=Path, help="also write the PS3.10 files under this folder")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    spec = spec_from_args(a)
    path = a.manifest or default_manifest_path(spec)
    t0 = time.monotonic()
    m = build_manifest(spec, out=a.out, progress=not a.quiet)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(m, separators=(",", ":")))
    s = m["summary"]
    print(f"{path}: {s['patients']} patients, {s['studies']} studies, {s['instances']} instances "
          f"(CT {s['by_modality']['CT']}, MR {s['by_modality']['MR']}), "
          f"{s['pixel_bytes'] / 1e9:.2f} GB pixel data, {len(m['queries'])} queries; {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DICOM JSON Model (PS3.18 Annex F) of stored instances: cases J1 and J2,
pydicom's bundled test files and bulk data resolution (tag paths: test_bulkdata.py)."""

from __future__ import annotations

import base64
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pydicom
import pytest
from pydicom import Dataset, dcmread
from pydicom.data import get_testdata_file
from pydicom.dataelem import RawDataElement
from pydicom.encaps import encapsulate
from pydicom.sequence import Sequence
from pydicom.uid import (
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEGBaseline8Bit,
)

from dicomweb_server.dicom.bulkdata import (
    is_encapsulated_pixel_data,
    resolve_bulkdata,
    resolve_pixel_data_frames,
)
from dicomweb_server.dicom.json_model import dataset_to_json, level_attributes

from .json_helpers import (
    PREFIX,
    SC_IMAGE,
    assert_json_safe,
    b64,
    jpeg,
    model_tags,
    new_dataset,
    put_raw,
    read,
    save,
    walk,
)


# --------------------------------------------------------------------------
# J1: DS / IS values, valid and not
# --------------------------------------------------------------------------
J1_RAW = {
    0x00180050: (b"1.0e-3 ", "DS"),  # SliceThickness
    0x00280030: (b"0.5\\0.5 ", "DS"),  # PixelSpacing
    0x00101030: (b"5.e-002 ", "DS"),  # PatientWeight
    0x00101020: (b"@1.7", "DS"),  # PatientSize
    0x00200013: (b"2.0 ", "IS"),  # InstanceNumber
    0x00200011: (b" 007", "IS"),  # SeriesNumber
    0x00281053: (b"NaN ", "DS"),  # RescaleSlope: a DS NaN
    0x00281050: (b"", "DS"),  # WindowCenter, empty
}

J1_EXPECTED = {
    "00101020": {"vr": "DS", "Value": ["@1.7"]},
    "00101030": {"vr": "DS", "Value": [0.05]},
    "00180050": {"vr": "DS", "Value": [0.001]},
    "00200011": {"vr": "IS", "Value": [7]},
    "00200013": {"vr": "IS", "Value": ["2.0"]},
    "00280030": {"vr": "DS", "Value": [0.5, 0.5]},
    "00281050": {"vr": "DS"},
    "00281053": {"vr": "DS", "Value": ["NaN"]},
}


def j1_bytes() -> bytes:
    ds = new_dataset(ExplicitVRLittleEndian)
    ds.PatientID = "J1"
    for tag, (value, vr) in J1_RAW.items():
        put_raw(ds, tag, vr, value)
    return save(ds)


def test_j1_raw_bytes_are_in_the_file() -> None:
    ds = read(j1_bytes())
    for tag, (value, _) in J1_RAW.items():
        assert (ds.get_item(tag).value or b"") == value  # exact bytes, padding included


def test_j1_ds_is_values() -> None:
    j = dataset_to_json(read(j1_bytes()), PREFIX)
    for key, expected in J1_EXPECTED.items():
        assert j[key] == expected, key
    # the other elements are there too: one bad element never empties the response
    assert j["00100020"] == {"vr": "LO", "Value": ["J1"]}
    assert j["00080018"] == {"vr": "UI", "Value": ["1.2.3.4.5"]}
    # numbers are JSON numbers of the right kind, bad values JSON strings
    assert type(j["00200011"]["Value"][0]) is int
    assert type(j["00180050"]["Value"][0]) is float
    assert_json_safe(j)
    text = orjson.dumps(j)
    assert b'"00200011":{"vr":"IS","Value":[7]}' in text
    assert b'"00280030":{"vr":"DS","Value":[0.5,0.5]}' in text
    assert b'"00281053":{"vr":"DS","Value":["NaN"]}' in text
    assert b"NaN," not in text and b"Infinity" not in text


def test_j1_same_json_after_pydicom_converted_the_values() -> None:
    """Elements pydicom already decoded (DSfloat, IS, str) give the same JSON."""
    raw_first = dataset_to_json(read(j1_bytes()), PREFIX)
    ds = read(j1_bytes())
    for elem in ds:  # converts every element (warns about the invalid ones)
        pass
    assert not any(isinstance(ds.get_item(t), RawDataElement) for t in ds.keys())
    assert dataset_to_json(ds, PREFIX) == raw_first


DS_CASES = [
    ("0.5", 0.5),
    ("1", 1),
    ("-1024", -1024),
    ("+1.5", 1.5),
    (".5", 0.5),
    ("5.", 5.0),
    ("-0.0", -0.0),
    ("1e3", 1000.0),
    ("1E+03", 1000.0),
    ("  12.5 ", 12.5),
    ("0.1", 0.1),
    ("0.683594", 0.683594),
    ("1.234567890123456", 1.234567890123456),  # 16 digits, exact as a double
    ("12345678901234567", 12345678901234567),
    ("3.14159265358979323846", "3.14159265358979323846"),  # not exact: kept as text
    ("1e-400", "1e-400"),  # underflows to 0.0: kept as text
    ("1e999", "1e999"),  # overflows: kept as text
    ("NaN", "NaN"),
    ("nan", "nan"),
    ("Inf", "Inf"),
    ("-Infinity", "-Infinity"),
    ("@1.7", "@1.7"),
    ("1,5", "1,5"),
    ("0x10", "0x10"),
    ("1_000", "1_000"),
    ("1.5.2", "1.5.2"),
]


@pytest.mark.parametrize(("text", "expected"), DS_CASES, ids=[c[0] for c in DS_CASES])
def test_ds_values(text: str, expected: Any) -> None:
    ds = new_dataset(ExplicitVRLittleEndian)
    value = text.encode()
    put_raw(ds, 0x00281052, "DS", value + b" " * (len(value) % 2))
    attr = dataset_to_json(read(save(ds)), PREFIX)["00281052"]
    assert attr == {"vr": "DS", "Value": [expected]}
    assert type(attr["Value"][0]) is type(expected)
    if isinstance(expected, float):
        assert math.copysign(1, attr["Value"][0]) == math.copysign(1, expected)
    assert_json_safe({"00281052": attr})


IS_CASES = [
    ("007", 7),
    ("+5", 5),
    ("-12", -12),
    (" 42 ", 42),
    ("-2147483648", -2147483648),
    ("2147483647", 2147483647),
    ("2147483648", "2147483648"),  # outside the IS range
    ("2.0", "2.0"),
    ("1e3", "1e3"),
    ("NaN", "NaN"),
    ("12a", "12a"),
]


@pytest.mark.parametrize(("text", "expected"), IS_CASES, ids=[c[0] for c in IS_CASES])
def test_is_values(text: str, expected: Any) -> None:
    ds = new_dataset(ExplicitVRLittleEndian)
    value = text.encode()
    put_raw(ds, 0x00200013, "IS", value + b" " * (len(value) % 2))
    attr = dataset_to_json(read(save(ds)), PREFIX)["00200013"]
    assert attr == {"vr": "IS", "Value": [expected]}
    assert type(attr["Value"][0]) is type(expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"1.5\\\\2.5 ", [1.5, None, 2.5]),
        (b"\\1", [None, 1]),
        (b"  ", None),  # only padding: empty
        (b"", None),
    ],
)
def test_ds_multi_and_empty(raw: bytes, expected: list | None) -> None:
    ds = new_dataset(ExplicitVRLittleEndian)
    put_raw(ds, 0x00281050, "DS", raw)
    attr = dataset_to_json(read(save(ds)), PREFIX)["00281050"]
    assert attr == ({"vr": "DS"} if expected is None else {"vr": "DS", "Value": expected})


# --------------------------------------------------------------------------
# J2: empties, sequences, private and binary (implicit VR file)
# --------------------------------------------------------------------------
J2_PRIVATE_OB = bytes(range(256)) * 8  # 2 KB
J2_SEQ_OB = bytes((i * 7) % 256 for i in range(5 * 1024))  # 5 KB
J2_OVERLAY = bytes((i * 13) % 256 for i in range(64 * 64 // 8))  # 512 bytes
J2_UNCREATED = b"\x01\x02\x03\x04\x05\x06"
J2_JPEG = jpeg(2)


def j2_bytes() -> bytes:
    ds = new_dataset(ImplicitVRLittleEndian, SC_IMAGE)
    ds.ImageType = ["ORIGINAL", "", "AXIAL"]
    ds.InstitutionAddress = ""  # empty ST
    ds.StudyDescription = ""  # empty LO
    ds.ReferencedStudySequence = Sequence()  # zero items
    ds.ReferencedImageSequence = Sequence([Dataset()])  # one empty item
    # private block whose creator pydicom does not know
    ds.add_new(0x00090010, "LO", "ACME 1.0")
    ds.add_new(0x00091010, "LO", "hello")
    ds.add_new(0x00091011, "OB", J2_PRIVATE_OB)
    # private block whose creator is in the private dictionary: LO and 2 KB OB
    ds.add_new(0x00290010, "LO", "SIEMENS CSA HEADER")
    ds.add_new(0x00291009, "LO", "20100114")
    ds.add_new(0x00291010, "OB", J2_PRIVATE_OB)
    # a private element without creator
    ds.add_new(0x00111010, "OB", J2_UNCREATED)
    # an SQ item holding a 5 KB OB (item 1; item 0 is small)
    first = Dataset()
    first.RequestedProcedureID = "RP1"
    second = Dataset()
    second.add_new(0x00420011, "OB", J2_SEQ_OB)  # EncapsulatedDocument
    ds.RequestAttributesSequence = Sequence([first, second])
    # image + overlay
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows = ds.Columns = 64
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.add_new(0x60000010, "US", 64)  # OverlayRows
    ds.add_new(0x60000011, "US", 64)  # OverlayColumns
    ds.add_new(0x60000040, "CS", "G")  # OverlayType
    ds.add_new(0x60000050, "SS", [1, 1])  # OverlayOrigin
    ds.add_new(0x60000100, "US", 1)  # OverlayBitsAllocated
    ds.add_new(0x60000102, "US", 0)  # OverlayBitPosition
    ds.add_new(0x60003000, "OW", J2_OVERLAY)
    # JPEG-compressed Pixel Data, as the case asks, in the implicit VR file
    encapsulated = encapsulate([J2_JPEG])
    ds.PixelData = encapsulated
    data = save(ds, implicit=True)
    # pydicom writes Pixel Data with a defined length for an implicit VR
    # transfer syntax; make it undefined length + Sequence Delimitation Item
    pos = len(data) - len(encapsulated) - 8
    assert data[pos : pos + 4] == b"\xe0\x7f\x10\x00"
    return data[: pos + 4] + b"\xff\xff\xff\xff" + data[pos + 8 :] + b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"


J2_EXPECTED = {
    "00080008": {"vr": "CS", "Value": ["ORIGINAL", None, "AXIAL"]},
    "00080081": {"vr": "ST"},
    "00081030": {"vr": "LO"},
    "00081110": {"vr": "SQ"},
    "00081140": {"vr": "SQ", "Value": [{}]},
    "00090010": {"vr": "LO", "Value": ["ACME 1.0"]},
    "00091010": {"vr": "UN", "InlineBinary": b64(b"hello ")},
    "00091011": {"vr": "UN", "BulkDataURI": f"{PREFIX}/00091011"},
    "00111010": {"vr": "UN", "InlineBinary": b64(J2_UNCREATED)},
    "00290010": {"vr": "LO", "Value": ["SIEMENS CSA HEADER"]},
    "00291009": {"vr": "LO", "Value": ["20100114"]},
    "00291010": {"vr": "OB", "BulkDataURI": f"{PREFIX}/00291010"},
    "00400275": {
        "vr": "SQ",
        "Value": [
            {"00401001": {"vr": "SH", "Value": ["RP1"]}},
            {"00420011": {"vr": "OB", "BulkDataURI": f"{PREFIX}/00400275/1/00420011"}},
        ],
    },
    "60000050": {"vr": "SS", "Value": [1, 1]},
    "60003000": {"vr": "OW", "InlineBinary": b64(J2_OVERLAY)},
    "7FE00010": {"vr": "OB", "BulkDataURI": f"{PREFIX}/7FE00010"},
}

J2_BULK = {
    "00091011": J2_PRIVATE_OB,
    "00291010": J2_PRIVATE_OB,
    "00400275/1/00420011": J2_SEQ_OB,
}


@pytest.fixture(scope="module")
def j2() -> bytes:
    return j2_bytes()


def test_j2_file_is_implicit_vr(j2: bytes) -> None:
    ds = read(j2)
    assert ds.file_meta.TransferSyntaxUID == ImplicitVRLittleEndian
    assert ds.get_item(0x00091011).VR is None  # no VR in the file
    assert ds.get_item(0x7FE00010).length == 0xFFFFFFFF


def test_j2_json(j2: bytes) -> None:
    j = dataset_to_json(read(j2), PREFIX)
    for key, expected in J2_EXPECTED.items():
        assert j[key] == expected, key
    assert list(j) == sorted(j)  # keys ascending (F.2.2)
    assert set(j) == model_tags(read(j2))
    assert_json_safe(j)
    # no huge inline base64
    for path, attr in walk(j):
        if "InlineBinary" in attr:
            assert len(base64.b64decode(attr["InlineBinary"])) <= 1024, path


def test_j2_bulkdata_resolves_to_the_written_bytes(j2: bytes) -> None:
    ds = read(j2)
    j = dataset_to_json(ds, PREFIX)
    uris = {p: a["BulkDataURI"] for p, a in walk(j) if "BulkDataURI" in a}
    assert set(uris) == set(J2_BULK) | {"7FE00010"}
    for path, uri in uris.items():
        assert uri == f"{PREFIX}/{path}"  # prefix used verbatim
    for path, expected in J2_BULK.items():
        assert resolve_bulkdata(ds, path) == expected, path
    # inline binary decodes to the written bytes too
    assert resolve_bulkdata(ds, "60003000") == J2_OVERLAY
    assert resolve_bulkdata(ds, "00111010") == J2_UNCREATED


def test_j2_encapsulated_pixel_data(j2: bytes) -> None:
    ds = read(j2)
    assert is_encapsulated_pixel_data(ds)
    assert resolve_pixel_data_frames(ds) == [J2_JPEG]
    assert resolve_bulkdata(ds, "7FE00010") == encapsulate([J2_JPEG])


def test_j2_same_json_after_pydicom_converted_everything(j2: bytes) -> None:
    raw_first = dataset_to_json(read(j2), PREFIX)
    ds = read(j2)
    ds.walk(lambda d, e: None)  # converts every element, recursively
    assert dataset_to_json(ds, PREFIX) == raw_first
    for path, expected in J2_BULK.items():
        assert resolve_bulkdata(ds, path) == expected, path
    assert resolve_pixel_data_frames(ds) == [J2_JPEG]


def test_j2_bulk_threshold(j2: bytes) -> None:
    ds = read(j2)
    big = dataset_to_json(ds, PREFIX, bulk_threshold=10_000)
    assert big["00291010"] == {"vr": "OB", "InlineBinary": b64(J2_PRIVATE_OB)}
    assert big["00400275"]["Value"][1]["00420011"] == {"vr": "OB", "InlineBinary": b64(J2_SEQ_OB)}
    assert big["7FE00010"] == {"vr": "OB", "BulkDataURI": f"{PREFIX}/7FE00010"}  # always
    small = dataset_to_json(ds, "P", bulk_threshold=0)
    assert small["60003000"] == {"vr": "OW", "BulkDataURI": "P/60003000"}
    assert small["00091010"] == {"vr": "UN", "BulkDataURI": "P/00091010"}
    assert resolve_bulkdata(ds, "60003000") == J2_OVERLAY
    # exactly at the threshold stays inline ("longer than" the threshold)
    assert "InlineBinary" in dataset_to_json(ds, "P", bulk_threshold=len(J2_OVERLAY))["60003000"]


@pytest.mark.parametrize(
    "path",
    [
        "00100010",  # absent
        "00080018",  # a UI, not bulk data
        "00080008",  # a CS
        "00081110",  # a sequence
        "00081140/0/00420011",  # empty item
        "00400275/0/00420011",  # item without that element
        "00400275/2/00420011",  # no item 2
        "00080008/0/00080008",  # index after a non-sequence
        "00020010",  # file meta is not part of the model
        "00080000",  # group length
        "00400275/1/00420011/0/00420011",  # deeper than the data
    ],
)
def test_resolve_bulkdata_missing_is_keyerror(j2: bytes, path: str) -> None:
    with pytest.raises(KeyError):
        resolve_bulkdata(read(j2), path)


def test_resolve_bulkdata_bad_path_is_valueerror(j2: bytes) -> None:
    with pytest.raises(ValueError):
        resolve_bulkdata(read(j2), "7FE0001")


def test_pixel_frames_errors(j2: bytes) -> None:
    ds = read(j2)
    with pytest.raises(KeyError):
        resolve_pixel_data_frames(ds, "00291010")  # not Pixel Data
    ct = read(ct_512_bytes())
    assert not is_encapsulated_pixel_data(ct)
    with pytest.raises(ValueError):
        resolve_pixel_data_frames(ct)
    no_pixels = read(j1_bytes())
    with pytest.raises(KeyError):
        resolve_pixel_data_frames(no_pixels)


# --------------------------------------------------------------------------
# JPEG Baseline multi-frame (explicit VR, conformant) and native pixel data
# --------------------------------------------------------------------------
def odd_and_even_jpegs() -> list[bytes]:
    """Two different codestreams, one of odd length (padded when encapsulated)."""
    odd = next(j for j in map(jpeg, range(10, 60)) if len(j) % 2)
    even = next(j for j in map(jpeg, range(10, 60)) if len(j) % 2 == 0)
    return [odd, even]


@pytest.mark.parametrize("has_bot", [True, False])
def test_jpeg_baseline_frames(has_bot: bool) -> None:
    frames = odd_and_even_jpegs()
    ds = new_dataset(JPEGBaseline8Bit, SC_IMAGE)
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows = ds.Columns = 64
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.NumberOfFrames = 2
    ds.add_new(0x7FE00010, "OB", encapsulate(frames, has_bot=has_bot))
    ds = read(save(ds))
    j = dataset_to_json(ds, PREFIX)
    assert j["7FE00010"] == {"vr": "OB", "BulkDataURI": f"{PREFIX}/7FE00010"}
    assert j["00280008"] == {"vr": "IS", "Value": [2]}
    assert is_encapsulated_pixel_data(ds)
    assert resolve_pixel_data_frames(ds) == frames  # codestreams byte for byte
    assert resolve_pixel_data_frames(ds, "7FE00010") == frames


def ct_512_bytes(pixel: bytes | None = None) -> bytes:
    """A typical 512x512 CT header (~70 elements) with native pixel data."""
    ds = new_dataset(ExplicitVRLittleEndian)
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.InstanceCreationDate = ds.StudyDate = ds.SeriesDate = "20240101"
    ds.AcquisitionDate = ds.ContentDate = "20240101"
    ds.InstanceCreationTime = ds.StudyTime = ds.SeriesTime = ds.ContentTime = "101010"
    ds.AcquisitionTime = "101010.123"
    ds.AccessionNumber = "A12345"
    ds.Modality = "CT"
    ds.Manufacturer = "ACME"
    ds.InstitutionName = "Hôpital Général"
    ds.ReferringPhysicianName = "Doe^Jane"
    ds.StationName = "CT01"
    ds.StudyDescription = "CT CHEST"
    ds.SeriesDescription = "AXIAL 1.0"
    ds.ManufacturerModelName = "Scanner 9000"
    ds.PatientName = "Müller^Hans"
    ds.PatientID = "P0001"
    ds.PatientBirthDate = "19700101"
    ds.PatientSex = "O"
    ds.PatientAge = "054Y"
    ds.PatientWeight = "70"
    ds.BodyPartExamined = "CHEST"
    ds.SliceThickness = "1.0"
    ds.KVP = "120"
    ds.DataCollectionDiameter = "500"
    ds.SoftwareVersions = "1.0"
    ds.ReconstructionDiameter = "350"
    ds.GantryDetectorTilt = "0"
    ds.TableHeight = "150"
    ds.RotationDirection = "CW"
    ds.ExposureTime = "500"
    ds.XRayTubeCurrent = "200"
    ds.Exposure = "100"
    ds.ConvolutionKernel = "STANDARD"
    ds.PatientPosition = "HFS"
    ds.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.2"
    ds.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.3"
    ds.StudyID = "1"
    ds.SeriesNumber = "2"
    ds.AcquisitionNumber = "1"
    ds.InstanceNumber = "42"
    ds.ImagePositionPatient = ["-175.0", "-175.0", "-100.5"]
    ds.ImageOrientationPatient = ["1", "0", "0", "0", "1", "0"]
    ds.FrameOfReferenceUID = "1.2.826.0.1.3680043.8.498.4"
    ds.PositionReferenceIndicator = ""
    ds.SliceLocation = "-100.5"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows = ds.Columns = 512
    ds.PixelSpacing = ["0.683594", "0.683594"]
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    ds.WindowCenter = ["40", "400"]
    ds.WindowWidth = ["400", "1500"]
    ds.RescaleIntercept = "-1024"
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.add_new(0x7FE00010, "OW", pixel if pixel is not None else bytes(512 * 512 * 2))
    return save(ds)


def test_native_pixel_data() -> None:
    pixels = np.arange(512 * 512, dtype=np.uint16).tobytes()
    ds = read(ct_512_bytes(pixels))
    j = dataset_to_json(ds, PREFIX)
    assert j["7FE00010"] == {"vr": "OW", "BulkDataURI": f"{PREFIX}/7FE00010"}
    assert resolve_bulkdata(ds, "7FE00010") == pixels
    assert j["00100010"] == {"vr": "PN", "Value": [{"Alphabetic": "Müller^Hans"}]}
    assert j["00080080"] == {"vr": "LO", "Value": ["Hôpital Général"]}
    assert j["00200032"] == {"vr": "DS", "Value": [-175.0, -175.0, -100.5]}
    assert j["00200037"] == {"vr": "DS", "Value": [1, 0, 0, 0, 1, 0]}
    assert j["00281052"] == {"vr": "DS", "Value": [-1024]}
    assert j["00280010"] == {"vr": "US", "Value": [512]}
    assert_json_safe(j)


def test_tiny_native_pixel_data_is_still_bulk() -> None:
    ds = new_dataset(ExplicitVRLittleEndian)
    ds.Rows = ds.Columns = 2
    ds.BitsAllocated = 8
    ds.add_new(0x7FE00010, "OB", b"\x01\x02\x03\x04")
    ds = read(save(ds))
    assert dataset_to_json(ds, "P")["7FE00010"] == {"vr": "OB", "BulkDataURI": "P/7FE00010"}
    assert resolve_bulkdata(ds, "7FE00010") == b"\x01\x02\x03\x04"


def test_big_endian_binary_is_little_endian() -> None:
    """OW values of a big-endian file are served little endian (PS3.18 8.7.3.3.1)."""
    ds = new_dataset(ExplicitVRBigEndian)
    ds.add_new(0x00281201, "OW", b"\x00\x01\x00\x02")  # RedPaletteColorLookupTableData
    put_raw(ds, 0x00280010, "US", b"\x01\x02", little=False)
    data = read(save(ds, little=False))
    j = dataset_to_json(data, "P")
    assert j["00281201"] == {"vr": "OW", "InlineBinary": b64(b"\x01\x00\x02\x00")}
    assert j["00280010"] == {"vr": "US", "Value": [0x0102]}
    assert resolve_bulkdata(data, "00281201") == b"\x01\x00\x02\x00"

    bigend = dcmread(get_testdata_file("MR_small_bigendian.dcm"))
    arr = bigend.pixel_array
    assert resolve_bulkdata(bigend, "7FE00010") == arr.astype(arr.dtype.newbyteorder("<")).tobytes()


# --------------------------------------------------------------------------
# other VRs, private elements in explicit files, bad elements
# --------------------------------------------------------------------------
def test_other_vrs_and_bad_elements() -> None:
    ds = new_dataset(ExplicitVRLittleEndian)
    ds.SpecificCharacterSet = "ISO_IR 192"
    ds.PatientName = "Yamada^Tarou=山田^太郎=やまだ^たろう"
    put_raw(ds, 0x00101001, "PN", b"Doe^John\\\\=Smith")  # OtherPatientNames
    ds.add_new(0x00280009, "AT", [0x00181063, 0x00181065])  # FrameIncrementPointer
    put_raw(ds, 0x00189089, "FD", struct.pack("<3d", math.nan, math.inf, -math.inf))
    put_raw(ds, 0x00189087, "FD", struct.pack("<d", 1000.5))
    put_raw(ds, 0x00280010, "US", b"\x01\x02\x03")  # wrong length for US
    ds.TextValue = "a\\b  "  # UT: no value splitting
    ds.RetrieveURL = "http://example.com/x "
    put_raw(ds, 0x00091010, "UN", b"\x00\x01\x02\x03")  # explicit UN private stays UN
    put_raw(ds, 0x00080070, "UN", b"ACME")  # explicit UN public stays UN
    ds.add_new(0x00190010, "LO", "ACME 1.0")  # unknown creator in an explicit file
    ds.add_new(0x00191010, "LO", "kept as LO")
    ds.add_new(0x00191011, "OB", bytes(2000))
    ds.add_new(0x00191012, "SQ", Sequence([Dataset()]))
    ds.ReferencedImageSequence = Sequence([Dataset(), Dataset()])
    ds.ReferencedImageSequence[1].add_new(0x00091010, "OB", bytes(3000))
    ds = read(save(ds))
    j = dataset_to_json(ds, "P")
    assert j["00100010"] == {
        "vr": "PN",
        "Value": [{"Alphabetic": "Yamada^Tarou", "Ideographic": "山田^太郎", "Phonetic": "やまだ^たろう"}],
    }
    assert j["00101001"] == {"vr": "PN", "Value": [{"Alphabetic": "Doe^John"}, None, {"Ideographic": "Smith"}]}
    assert j["00280009"] == {"vr": "AT", "Value": ["00181063", "00181065"]}
    assert j["00189089"] == {"vr": "FD", "Value": ["NaN", "Infinity", "-Infinity"]}
    assert j["00189087"] == {"vr": "FD", "Value": [1000.5]}
    assert j["00280010"] == {"vr": "UN", "InlineBinary": b64(b"\x01\x02\x03")}
    assert j["0040A160"] == {"vr": "UT", "Value": ["a\\b"]}
    assert j["00081190"] == {"vr": "UR", "Value": ["http://example.com/x"]}
    assert j["00091010"] == {"vr": "UN", "InlineBinary": b64(b"\x00\x01\x02\x03")}
    assert j["00080070"] == {"vr": "UN", "InlineBinary": b64(b"ACME")}
    assert j["00191010"] == {"vr": "LO", "Value": ["kept as LO"]}
    assert j["00191011"] == {"vr": "OB", "BulkDataURI": "P/00191011"}
    assert j["00191012"] == {"vr": "SQ", "Value": [{}]}
    assert j["00081140"] == {
        "vr": "SQ",
        "Value": [{}, {"00091010": {"vr": "OB", "BulkDataURI": "P/00081140/1/00091010"}}],
    }
    assert resolve_bulkdata(ds, "00081140/1/00091010") == bytes(3000)
    assert resolve_bulkdata(ds, "00280010") == b"\x01\x02\x03"  # the UN fallback
    assert_json_safe(j)


def test_ambiguous_vr_in_implicit_file() -> None:
    ds = new_dataset(ImplicitVRLittleEndian)
    ds.PixelRepresentation = 1
    ds.add_new(0x00280106, "SS", -5)  # SmallestImagePixelValue, 'US or SS'
    j = dataset_to_json(read(save(ds, implicit=True)), "P")
    assert j["00280106"] == {"vr": "SS", "Value": [-5]}


def test_unknown_public_tag_in_implicit_file_is_un() -> None:
    ds = new_dataset(ImplicitVRLittleEndian)
    put_raw(ds, 0x00080001, None, b"\x01\x02")  # not in the dictionary
    j = dataset_to_json(read(save(ds, implicit=True)), "P")
    assert j["00080001"] == {"vr": "UN", "InlineBinary": b64(b"\x01\x02")}


def test_independent_of_reading_validation_mode(j2: bytes) -> None:
    """Strict reading (RAISE) must not make invalid DS/IS or odd elements fail."""
    normal = {"j1": dataset_to_json(read(j1_bytes()), PREFIX), "j2": dataset_to_json(read(j2), PREFIX)}
    with pydicom.config.strict_reading():
        assert dataset_to_json(read(j1_bytes()), PREFIX) == normal["j1"]
        assert dataset_to_json(read(j2), PREFIX) == normal["j2"]
        assert resolve_bulkdata(read(j2), "00400275/1/00420011") == J2_SEQ_OB


def test_deferred_read_values(tmp_path: Path) -> None:
    """Values dcmread deferred (defer_size) are read when needed."""
    path = tmp_path / "ct.dcm"
    pixels = np.arange(512 * 512, dtype=np.uint16).tobytes()
    path.write_bytes(ct_512_bytes(pixels))
    eager = dataset_to_json(dcmread(path), PREFIX)
    deferred = dcmread(path, defer_size=64)
    assert deferred.get_item(0x7FE00010, keep_deferred=True).value is None
    assert dataset_to_json(deferred, PREFIX) == eager
    assert resolve_bulkdata(dcmread(path, defer_size=64), "7FE00010") == pixels


def test_level_attributes() -> None:
    j = dataset_to_json(read(j1_bytes()), PREFIX)
    study = level_attributes(j, frozenset({"00100020", "00200011", "0020000D"}))
    assert study == {"00100020": j["00100020"], "00200011": j["00200011"]}
    assert list(study) == sorted(study)
    assert level_attributes(j, frozenset()) == {}


def test_not_a_dataset() -> None:
    with pytest.raises(TypeError):
        dataset_to_json({"00100010": {}}, "P")  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# pydicom's bundled test files
# --------------------------------------------------------------------------
DATA_DIR = Path(pydicom.__file__).parent / "data"
TEST_FILES_DIR = DATA_DIR / "test_files"
def _readable(path: Path) -> bool:
    try:
        dcmread(path)
    except Exception:
        return False
    return True


# every bundled file dcmread reads (those it refuses are not DICOM: .txt, .json, .gz, ...)
TEST_FILES = [p for p in sorted(p for p in TEST_FILES_DIR.rglob("*") if p.is_file()) + sorted(
    p for p in (DATA_DIR / "charset_files").rglob("*.dcm") if p.is_file()
) if _readable(p)]


def explicit_un(ds: Dataset, tag: int) -> bool:
    """An element the file itself calls UN (explicit VR): stays UN in the model."""
    raw = ds.get_item(tag)
    return isinstance(raw, RawDataElement) and raw.VR == "UN"


def _all_model_tags(ds: Dataset, path: str = "") -> set[str]:
    tags = set()
    for t in ds.keys():
        if t.element == 0 or t.group == 2:
            continue
        key = f"{path}{t:08X}"
        tags.add(key)
        if explicit_un(ds, t):
            continue  # kept as UN bytes, not parsed (pydicom would parse it)
        elem = ds[t]
        if elem.VR == "SQ":
            for i, item in enumerate(elem.value):
                tags |= _all_model_tags(item, f"{key}/{i}/")
    return tags


@pytest.mark.parametrize("path", TEST_FILES, ids=[str(p.relative_to(DATA_DIR)) for p in TEST_FILES])
def test_pydicom_test_files(path: Path) -> None:
    ds = dcmread(path)
    j = dataset_to_json(ds, PREFIX)
    assert_json_safe(j)
    assert set(j) == model_tags(ds)  # every top-level element but 0002 and group lengths
    assert {p for p, _ in walk(j)} == _all_model_tags(dcmread(path))  # and nested ones
    for p, attr in walk(j):
        assert attr["vr"] and len(attr["vr"]) == 2 and type(attr["vr"]) is str
        assert len([k for k in ("Value", "InlineBinary", "BulkDataURI") if k in attr]) <= 1
        if "BulkDataURI" in attr:
            assert attr["BulkDataURI"] == f"{PREFIX}/{p}"
            data = resolve_bulkdata(ds, p)
            assert len(data) > 1024 or p.endswith("7FE00010"), p
        if "InlineBinary" in attr:
            assert len(base64.b64decode(attr["InlineBinary"])) <= 1024
    if "7FE00010" in j and is_encapsulated_pixel_data(ds):
        frames = resolve_pixel_data_frames(ds)
        assert frames and all(isinstance(f, bytes) and f for f in frames)


# --------------------------------------------------------------------------
# round trip against pydicom's own values (CT_small.dcm)
# --------------------------------------------------------------------------
def _same(vr: str, got: Any, want: Any) -> bool:
    if want is None or want == "":
        return got is None
    if vr == "DS":
        return got == float(want) if not isinstance(got, str) else got == str(want).strip()
    if vr == "IS":
        return got == int(want) if not isinstance(got, str) else got == str(want).strip()
    if vr == "PN":
        comps = dict(zip(("Alphabetic", "Ideographic", "Phonetic"), want.components))
        return got == {k: v for k, v in comps.items() if v}
    if vr == "AT":
        return got == f"{want:08X}"
    if vr in ("FL", "FD"):
        return got == want or (math.isnan(want) and got == "NaN")
    if isinstance(want, str):
        return got == want.rstrip(" \x00")
    return got == want


def _compare(ds: Dataset, j: dict, path: str = "") -> int:
    checked = 0
    for t in ds.keys():
        if t.element == 0:
            continue
        key = f"{t:08X}"
        attr = j[key]
        if explicit_un(ds, t):  # kept as UN with the file's bytes
            assert attr["vr"] == "UN"
            value = ds.get_item(t).value
            if "InlineBinary" in attr:
                assert base64.b64decode(attr["InlineBinary"]) == value
            checked += 1
            continue
        elem = ds[t]
        assert attr["vr"] == elem.VR, (path + key, attr["vr"], elem.VR)
        if elem.VR == "SQ":
            assert len(attr.get("Value", [])) == len(elem.value)
            for i, item in enumerate(elem.value):
                checked += _compare(item, attr["Value"][i], f"{path}{key}/{i}/")
            continue
        if "BulkDataURI" in attr:
            continue  # bulk: checked against resolve_bulkdata elsewhere
        if "InlineBinary" in attr:
            assert base64.b64decode(attr["InlineBinary"]) == elem.value
        elif elem.is_empty:
            assert "Value" not in attr, path + key
        else:
            want = list(elem.value) if elem.VM > 1 else [elem.value]
            assert len(attr["Value"]) == len(want), path + key
            for got, w in zip(attr["Value"], want):
                assert _same(elem.VR, got, w), (path + key, got, w)
        checked += 1
    return checked


ROUND_TRIP_FILES = [
    "CT_small.dcm",
    "MR_small.dcm",
    "MR_small_bigendian.dcm",
    "rtplan.dcm",
    "chrH31.dcm",
    "chrX1.dcm",
    "chrJapMulti.dcm",
    "chrSQEncoding.dcm",
]


@pytest.mark.parametrize("name", ROUND_TRIP_FILES)
def test_round_trip_against_pydicom(name: str) -> None:
    """Every non-bulk element's JSON value equals pydicom's value."""
    path = get_testdata_file(name) or DATA_DIR / "charset_files" / name
    j = dataset_to_json(dcmread(path), PREFIX)
    ds = dcmread(path)
    checked = _compare(ds, j)
    assert checked > (50 if name == "CT_small.dcm" else 5)
    if "7FE00010" in j and ds.is_little_endian:
        assert resolve_bulkdata(dcmread(path), "7FE00010") == ds.PixelData

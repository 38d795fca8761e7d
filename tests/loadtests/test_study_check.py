"""loadtests.study: the full validation of a whole-study answer before a wrk step, and
the accounting of the step's counts (answers ended by the connection's close are not
errors; read errors of a server that sends Content-Length are; bytes out of the window
the validated sizes allow are)."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pydicom
import pytest
from pydicom.dataset import FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage

from loadtests import study

BOUNDARY = "b0undary"
CT = f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'


def _instance(sop: str, value: int) -> tuple[bytes, bytes]:
    ds = pydicom.Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = MRImageStorage
    ds.file_meta.MediaStorageSOPInstanceUID = sop
    ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, sop
    ds.Rows = ds.Columns = 4
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    pix = np.full((4, 4), value, dtype="<u2").tobytes()
    ds.PixelData = pix
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue(), pix


def _answer(parts: list[bytes], boundary: str = BOUNDARY) -> bytes:
    d = f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
    return d + (b"\r\n" + d).join(parts) + f"\r\n--{boundary}--\r\n".encode()


@pytest.fixture
def two():
    (a, pa), (b, pb) = _instance("1.2.3.1", 7), _instance("1.2.3.2", 9)
    expected = {"1.2.3.1": (len(pa), hashlib.sha256(pa).hexdigest()),
                "1.2.3.2": (len(pb), hashlib.sha256(pb).hexdigest())}
    return a, b, expected


def test_validate_whole_study(two):
    a, b, expected = two
    assert study.validate(_answer([a, b]), CT, expected) == 2


def test_validate_refuses_missing_twice_and_other_pixels(two):
    a, b, expected = two
    with pytest.raises(ValueError, match="1 of 2 instances"):
        study.validate(_answer([a]), CT, expected)
    with pytest.raises(ValueError, match="twice"):
        study.validate(_answer([a, a]), CT, expected)
    other, _ = _instance("1.2.3.2", 10)  # same instance, other pixel values
    with pytest.raises(ValueError, match=r"instance 1\.2\.3\.2: pixel data not the original \(SHA-256 differs\)"):
        study.validate(_answer([a, other]), CT, expected)
    longer = {**expected, "1.2.3.2": (expected["1.2.3.2"][0] + 2, expected["1.2.3.2"][1])}
    with pytest.raises(ValueError, match=r"1\.2\.3\.2: no Pixel Data of the original's length \(34 B\)"):
        study.validate(_answer([a, b]), CT, longer)
    with pytest.raises(ValueError, match="closing boundary"):
        study.validate(_answer([a, b])[:-40], CT, expected)


def test_validate_boundary_from_body_only_when_asked(two):
    a, b, expected = two
    no_param = 'multipart/related; type="application/dicom"'
    with pytest.raises(ValueError, match="without a boundary"):
        study.validate(_answer([a, b]), no_param, expected)
    assert study.validate(_answer([a, b]), no_param, expected, boundary_from_body=True) == 2


def _summary(requests: int, read: int, sent: int, nbytes: int, size: int) -> dict:
    return {"requests": requests, "bytes": nbytes, "connect": 0, "read": read, "write": 0, "status": 0,
            "timeout": 0, "invalid": 0, "sent": sent, "sent_bytes": sent * size}


def test_close_delimited_answers_are_not_errors_but_extra_read_errors_are():
    size = 10_000_000
    answers = {"/studies/1": study.StudyAnswer(size, True, 25)}
    s = _summary(100, 100, 108, 100 * size + 3 * size // 2, size)  # 8 in flight at the end
    assert study.step_errors(s, answers) == ({}, {"closed": 100})
    errors, notes = study.step_errors({**s, "read": 103}, answers)
    assert errors == {"read": 3} and notes["closed"] == 100


def test_read_errors_count_when_the_server_sends_content_length():
    size = 10_000_000
    answers = {"/studies/1": study.StudyAnswer(size, False, 25)}
    s = _summary(100, 2, 108, 100 * size, size)
    assert study.step_errors(s, answers)[0] == {"read": 2}


def test_bytes_outside_the_window_are_an_error():
    size = 10_000_000
    answers = {"/studies/1": study.StudyAnswer(size, False, 25)}
    short = _summary(100, 0, 108, 100 * size - 10 * size, size)  # answers short of ~10 studies
    errors, notes = study.step_errors(short, answers)
    assert errors == {"bytes": 1} and notes["bytes_expected_low"] == 108 * size - 8 * size - 108 * study.SIZE_SLACK
    long = _summary(100, 0, 108, 109 * size, size)  # more than every request sent can explain
    assert study.step_errors(long, answers)[0] == {"bytes": 1}

"""An instance whose stored pixels cannot be decoded (a corrupt JPEG 2000 codestream,
as in pydicom's sample set) and a client that names no transfer syntax: the instance
comes back as stored (PS3.18 §8.7.3.5.2: Explicit VR Little Endian is only the
default), in a single-instance answer and in a study/series answer alike. A study
retrieve by the PyPI dicomweb-client got 1 of the 2 instances of such a study, with
no Warning. A client that asks for Explicit VR Little Endian explicitly cannot get it
from that file: the instance is left out of a study answer (406 alone)."""

from __future__ import annotations

import struct

import pytest
from pydicom.encaps import encapsulate

from tests.helpers import make_dataset, multipart, to_bytes

J2K = "1.2.840.10008.1.2.4.91"
MULTI = 'multipart/related; type="application/dicom"'
EXPLICIT = MULTI + "; transfer-syntax=1.2.840.10008.1.2.1"


def _corrupt_j2k_codestream() -> bytes:
    """SOC, a SIZ whose width (0xDDDDDDDD) is not the data set's 8, EOC."""
    siz = struct.pack(">HHIIIIIIIIHBBB", 41, 0, 0xDDDDDDDD, 8, 0, 0, 8, 8, 0, 0, 1, 15, 1, 1)
    return b"\xff\x4f\xff\x51" + siz + b"\xff\xd9"


@pytest.fixture
def client(app_client):  # tests/server/conftest.py
    return app_client


def _parts(r) -> list[tuple[str, bytes]]:
    boundary = r.headers["content-type"].split("boundary=")[1].split(";")[0].strip('"')
    out = []
    for chunk in r.content.split(b"--" + boundary.encode())[1:-1]:
        head, body = chunk.split(b"\r\n\r\n", 1)
        out.append((head.decode().lower(), body[:-2]))
    return out


def test_undecodable_instance_comes_back_as_stored_when_no_syntax_was_asked(client):
    good = make_dataset(rows=8, columns=8)
    bad = make_dataset(study=good.StudyInstanceUID, series=good.SeriesInstanceUID, rows=8, columns=8,
                       transfer_syntax=J2K, pixels=False, Rows=8, Columns=8, SamplesPerPixel=1,
                       PhotometricInterpretation="MONOCHROME2", BitsAllocated=16, BitsStored=16,
                       HighBit=15, PixelRepresentation=0)
    bad.PixelData = encapsulate([_corrupt_j2k_codestream()])
    bad["PixelData"].VR = "OB"
    bad_file = to_bytes(bad)
    body, ctype = multipart([to_bytes(good), bad_file])
    assert client.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
    study, series = good.StudyInstanceUID, good.SeriesInstanceUID

    for url in (f"/studies/{study}", f"/studies/{study}/series/{series}"):
        r = client.get(url, headers={"Accept": MULTI})
        assert r.status_code == 200
        parts = _parts(r)
        assert len(parts) == 2
        assert next(p for p in parts if f"transfer-syntax={J2K}" in p[0])[1] == bad_file

    one = client.get(f"/studies/{study}/series/{series}/instances/{bad.SOPInstanceUID}", headers={"Accept": MULTI})
    assert one.status_code == 200 and "cannot be converted" in one.headers["warning"]
    assert _parts(one)[0][1] == bad_file

    asked = client.get(f"/studies/{study}", headers={"Accept": EXPLICIT})
    assert asked.status_code == 200 and len(_parts(asked)) == 1
    assert client.get(f"/studies/{study}/series/{series}/instances/{bad.SOPInstanceUID}",
                      headers={"Accept": EXPLICIT}).status_code == 406

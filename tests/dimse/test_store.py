"""C-ECHO and C-STORE (PS3.4 Annexes A, B): one write path with STOW-RS."""

from __future__ import annotations

import io

import pydicom

from dicomweb_server.dimse import status as S
from tests.helpers import make_dataset


def test_echo(dimse):
    assoc = dimse.associate()
    assert assoc.send_c_echo().Status == S.SUCCESS
    assoc.release()


def test_store_then_qido_and_wado(dimse):
    ds = make_dataset(rows=16, columns=16, PatientID="DIMSE1")
    assert dimse.store([ds]) == [S.SUCCESS]
    found = dimse.http.get("/instances", params={"PatientID": "DIMSE1"}).json()
    assert [f["00080018"]["Value"][0] for f in found] == [ds.SOPInstanceUID]
    r = dimse.http.get(f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}",
                       headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
    assert r.status_code == 200
    got = pydicom.dcmread(io.BytesIO(r.content[r.content.index(b"DICM") - 128:]))
    assert got.PixelData == ds.PixelData
    assert got.file_meta.SourceApplicationEntityTitle == "TESTSCU"
    assert got.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID

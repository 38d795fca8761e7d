"""Encapsulated documents (PDF, CDA, STL, OBJ, MTL): metadata gives Encapsulated
Document (0042,0011) as a BulkDataURI whatever its size; that bulk data and the
instance's rendered resource answer the document in its own media type (PS3.18 Table
8.7.4-1), byte for byte: the padding byte PS3.5 adds to an odd-length value is cut
(Encapsulated Document Length, 0042,0015, where present)."""

from __future__ import annotations

import struct

import pydicom
import pytest

from dicomweb_server.dicom.documents import DOCUMENT_MEDIA_TYPES, document_bytes
from tests.helpers import make_dataset, to_bytes
from tests.server.conftest import stored

PDF_CLASS = "1.2.840.10008.5.1.4.1.1.104.1"
STL_CLASS = "1.2.840.10008.5.1.4.1.1.104.3"
#: a minimal PDF of odd length (PS3.5 pads it with one 0x00 in the file)
PDF = (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj 2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\n"
       b"trailer<</Root 1 0 R>>\n%%EOF\n")
#: a binary STL of one triangle: 84 + 50 bytes, ending with its 0x0000 attribute byte count
STL = b"solid-less binary STL".ljust(80, b"\x00") + struct.pack("<I", 1) + struct.pack("<12f", *range(12)) + b"\0\0"


def _document(sop_class: str, data: bytes, mime: str, with_length: bool = True):
    ds = make_dataset(pixels=False, sop_class=sop_class, modality="DOC", MIMETypeOfEncapsulatedDocument=mime,
                      BurnedInAnnotation="NO", DocumentTitle="test")
    ds.EncapsulatedDocument = data
    if with_length:
        ds.EncapsulatedDocumentLength = len(data)
    return ds


@pytest.fixture
def pdf(app_client):
    assert len(PDF) % 2 == 1
    ds = _document(PDF_CLASS, PDF, "application/pdf")
    assert pydicom.dcmread(__import__("io").BytesIO(to_bytes(ds))).EncapsulatedDocument == PDF + b"\x00"  # padded
    return stored(app_client, ds)


def test_metadata_gives_a_bulkdata_uri(app_client, pdf):
    item = app_client.get(pdf + "/metadata").json()[0]["00420011"]
    assert item["vr"] == "OB"
    assert item["BulkDataURI"].endswith(pdf + "/bulkdata/00420011")  # 113 bytes: was InlineBinary
    assert "InlineBinary" not in item


def test_pdf_bulkdata_in_its_media_type(app_client, pdf):
    r = app_client.get(pdf + "/bulkdata/00420011", headers={"Accept": "application/pdf"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/pdf"
    assert r.content == PDF
    r = app_client.get(pdf + "/bulkdata/00420011", headers={"Accept": 'multipart/related; type="application/pdf"'})
    assert r.status_code == 200 and 'type="application/pdf"' in r.headers["content-type"]
    assert b"Content-Type: application/pdf\r\n\r\n" + PDF + b"\r\n--" in r.content
    # the accept query parameter does the same
    r = app_client.get(pdf + "/bulkdata/00420011?accept=application/pdf")
    assert r.headers["content-type"] == "application/pdf" and r.content == PDF
    # application/octet-stream keeps giving the element's value as stored
    r = app_client.get(pdf + "/bulkdata/00420011", headers={"Accept": "application/octet-stream"})
    assert r.headers["content-type"] == "application/octet-stream" and r.content == PDF + b"\x00"


def test_pdf_rendered_is_the_pdf(app_client, pdf):
    for accept in ("application/pdf", "*/*", "application/*"):
        r = app_client.get(pdf + "/rendered", headers={"Accept": accept})
        assert r.status_code == 200, (accept, r.text)
        assert r.headers["content-type"] == "application/pdf"
        assert r.content == PDF
    assert app_client.get(pdf + "/rendered", headers={"Accept": "image/jpeg"}).status_code == 406


def test_stl_exact_bytes(app_client):
    url = stored(app_client, _document(STL_CLASS, STL, "model/stl", with_length=False))
    for resource in ("/bulkdata/00420011", "/rendered"):
        r = app_client.get(url + resource, headers={"Accept": "model/stl"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "model/stl"
        assert r.content == STL  # its trailing 0x0000 is data, not padding


@pytest.mark.parametrize("sop_class,media_type", sorted(DOCUMENT_MEDIA_TYPES.items()))
def test_every_document_class(app_client, sop_class, media_type):
    data = b"document body of odd length"
    url = stored(app_client, _document(sop_class, data, media_type, with_length=False))
    r = app_client.get(url + "/bulkdata/00420011", headers={"Accept": media_type})
    assert r.status_code == 200 and r.headers["content-type"].split(";")[0] == media_type
    assert r.content == data  # the padding 0x00 cut without Encapsulated Document Length too
    assert app_client.get(url + "/rendered", headers={"Accept": "image/png"}).status_code == 406


def test_document_bytes_unit():
    ds = _document(PDF_CLASS, PDF + b"\x00", "application/pdf", with_length=False)
    ds.EncapsulatedDocumentLength = len(PDF)
    assert document_bytes(ds) == PDF
    del ds.EncapsulatedDocumentLength
    assert document_bytes(ds) == PDF
    stl = _document(STL_CLASS, STL, "model/stl", with_length=False)
    assert document_bytes(stl) == STL

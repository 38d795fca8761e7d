"""Encapsulated documents (PS3.3 A.45, A.85, C.24.2): PDF, CDA, STL, OBJ and MTL held in
Encapsulated Document (0042,0011), answered in their own media type by the bulk data and
rendered resources (PS3.18 Table 8.7.4-1, §10.4.1.1.3, §10.4.1.1.5)."""

from __future__ import annotations

from pydicom.dataset import Dataset

#: the element that holds the document, as a bulk data tag path
ENCAPSULATED_DOCUMENT = "00420011"

#: SOP Class UID -> the document's media type (PS3.18 Table 8.7.4-1; PS3.3 C.24.2.1:
#: MIME Type of Encapsulated Document)
DOCUMENT_MEDIA_TYPES: dict[str, str] = {
    "1.2.840.10008.5.1.4.1.1.104.1": "application/pdf",  # Encapsulated PDF Storage
    "1.2.840.10008.5.1.4.1.1.104.2": "text/xml",  # Encapsulated CDA Storage
    "1.2.840.10008.5.1.4.1.1.104.3": "model/stl",  # Encapsulated STL Storage
    "1.2.840.10008.5.1.4.1.1.104.4": "model/obj",  # Encapsulated OBJ Storage
    "1.2.840.10008.5.1.4.1.1.104.5": "model/mtl",  # Encapsulated MTL Storage
}


def _binary_stl(value: bytes) -> bool:
    """Whether ``value`` is exactly a binary STL: an 80-byte header, a triangle count n
    and n 50-byte triangles. Such a file may end with 0x00 (its last attribute byte
    count) and is always of even length, so never padded."""
    return len(value) >= 84 and len(value) == 84 + 50 * int.from_bytes(value[80:84], "little")


def document_media_type(sop_class_uid: str | None) -> str | None:
    """The media type of the document an instance of ``sop_class_uid`` encapsulates, or
    None for other SOP classes."""
    return DOCUMENT_MEDIA_TYPES.get(sop_class_uid or "")


def document_bytes(ds: Dataset) -> bytes:
    """The encapsulated document, byte for byte: the value of Encapsulated Document cut
    to Encapsulated Document Length (0042,0015) where present (PS3.3 C.24.2.1: the
    value is padded to even length), else without one trailing 0x00: PDF, CDA, OBJ,
    MTL and ASCII STL never end with one of their own (PS3.5 §7.1.1 padding); a binary
    STL is returned as stored.

    Raises
    ------
    KeyError
        The data set has no Encapsulated Document.
    """
    if "EncapsulatedDocument" not in ds:
        raise KeyError("no Encapsulated Document (0042,0011)")
    value = bytes(ds.EncapsulatedDocument or b"")
    length = ds.get("EncapsulatedDocumentLength")
    if isinstance(length, int) and 0 <= length <= len(value):
        return value[:length]
    if len(value) % 2 == 0 and value.endswith(b"\x00") and not _binary_stl(value):
        return value[:-1]
    return value

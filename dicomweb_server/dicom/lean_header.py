"""The header of a stored file (everything before its pixel data) as the pydicom
Dataset ``pydicom.dcmread(fp, stop_before_pixels=True)`` reads, built from the bytes in
memory by the lean walker (:mod:`.lean`), for reading pixels: rendering (PS3.18
§10.4.1.1.3, §8.3.5) and decoding.

Why: on a rendered request with the render cache off, pydicom's read of a 53-element
CT header was ~350 us of the ~1.2 ms a worker thread spends on the picture (the
rest: windowing ~0.2 ms, JPEG encoding ~0.5 ms), ~30% of it; its element generator
reads each element through Python file calls and builds objects per element. Here the
elements are found with ``struct.unpack_from`` on the bytes and handed to pydicom as
the very ``RawDataElement`` tuples its generator yields (tag, VR, length, value, little
endian, explicit VR): pydicom converts each value on first access exactly as it does
after ``dcmread``, so every value the renderer reads comes from one converter.

Only what the walker covers exactly is read here (:func:`.lean.walk` with
``sequences``: Explicit VR Little Endian data sets, defined lengths, ascending tags,
sequences of defined length kept as their encoded items, which pydicom parses when
first read, as it does for such a sequence in a file); anything else *declines*
(:class:`.lean.Decline`) and the caller reads the file with pydicom.
``tests/dicom/test_lean_header.py`` proves the Dataset equal to pydicom's for pydicom's
test corpus, or a decline.
"""

from __future__ import annotations

from pydicom.charset import convert_encodings, default_encoding
from pydicom.dataelem import RawDataElement, convert_raw_data_element
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.tag import BaseTag

from .lean import Decline, transfer_syntax_and_start, walk

__all__ = ["Decline", "header_dataset"]

_CHARSET = BaseTag(0x00080005)


def header_dataset(data: bytes, pixel_start: int | None = None) -> Dataset:
    """The data set of the PS3.10 file ``data`` (its bytes up to the pixel data, or the
    whole file) without the pixel data, with a ``file_meta`` holding the Transfer Syntax
    UID; the values as pydicom converts them. ``pixel_start``: where the walk must stop
    (the pixel data element's start): elsewhere, ``data`` is not the header up to the
    pixel data (e.g. a wrong offset, or another file), and it declines.

    Raises
    ------
    lean.Decline
        Not a file the walker reads exactly (read it with pydicom), or the walk did not
        stop at ``pixel_start``.
    """
    ts, pos = transfer_syntax_and_start(data)
    elements, stop = walk(data, pos, sequences=True)
    if pixel_start is not None and stop != pixel_start:
        raise Decline
    raw = {}
    for tag, vr, value in elements:
        t = BaseTag(tag)
        raw[t] = RawDataElement(t, vr, len(value), value, 0, False, True)
    # pydicom.filereader.read_dataset: the data set's encoding from its Specific Character Set
    encoding = default_encoding
    if _CHARSET in raw:
        try:
            encoding = convert_encodings(convert_raw_data_element(raw[_CHARSET]).value)
        except Exception:  # noqa: BLE001 - pydicom warns or refuses in its own way: let it
            raise Decline from None
    ds = Dataset(raw)
    ds.set_original_encoding(False, True, encoding)
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ts
    return ds

"""dicom.reading.same_data_set: the duplicate policy's "same instance" (PS3.10 §7.1
file meta and the Data Set Trailing Padding of §7 set aside, every other byte compared)."""

from __future__ import annotations

import io

import pydicom
import pytest

from dicomweb_server.dicom.reading import _CHUNK, same_data_set
from tests.helpers import make_dataset, to_bytes

EXPLICIT, IMPLICIT = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2"


def _variant(data: bytes, **change) -> bytes:
    ds = pydicom.dcmread(io.BytesIO(data))
    for k, v in change.items():
        setattr(ds.file_meta if k in ("SourceApplicationEntityTitle", "ImplementationVersionName") else ds, k, v)
    return to_bytes(ds)


@pytest.mark.parametrize("ts", [EXPLICIT, IMPLICIT])
@pytest.mark.parametrize("rows", [8, 1024])  # 2 MiB of pixel data: the comparison crosses _CHUNK
def test_same_data_set(tmp_path, ts, rows):
    ds = make_dataset(rows=rows, columns=rows)
    ds.file_meta.TransferSyntaxUID = ts
    base = to_bytes(ds)
    assert rows < 1024 or len(base) > 2 * _CHUNK
    files = {
        "base": base,
        "meta": _variant(base, SourceApplicationEntityTitle="MODALITY", ImplementationVersionName="OTHER"),
        "padded": _variant(base, DataSetTrailingPadding=b"\0" * 138),
        "other": _variant(base, PatientID="other"),
        "padded-other-length": _variant(base, DataSetTrailingPadding=b"\0" * 10),
        "one-more-byte": base + b"\0",
        "cut": base[:-2],
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    # padding on one side only; two paddings of other lengths are taken as other content
    # (conservative: the boundary between data set and padding is not looked for)
    same = {("base", "meta"), ("base", "padded"), ("meta", "padded"), ("base", "padded-other-length"),
            ("meta", "padded-other-length")}
    for x in files:
        for y in files:
            expected = x == y or (x, y) in same or (y, x) in same
            assert same_data_set(paths[x], paths[y]) is expected, (x, y)


def test_other_transfer_syntax_or_not_dicom_is_different(tmp_path):
    ds = make_dataset()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(to_bytes(ds))
    ds.file_meta.TransferSyntaxUID = IMPLICIT
    b.write_bytes(to_bytes(ds))
    c.write_bytes(b"not dicom at all")
    assert not same_data_set(a, b)
    assert not same_data_set(a, c) and not same_data_set(c, c)
    assert not same_data_set(a, tmp_path / "gone")

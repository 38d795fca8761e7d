"""Helpers shared by the DICOM JSON Model and bulk data tests: build small data sets with
pydicom, write them as PS3.10 bytes, walk the JSON model."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
from PIL import Image
from pydicom import Dataset, dcmread
from pydicom.dataelem import RawDataElement
from pydicom.dataset import FileMetaDataset
from pydicom.tag import Tag

PREFIX = "@@BASE@@/studies/1.2/series/3.4/instances/5.6/bulkdata"
CT_IMAGE = "1.2.840.10008.5.1.4.1.1.2"
SC_IMAGE = "1.2.840.10008.5.1.4.1.1.7"


def new_dataset(ts: str, sop_class: str = CT_IMAGE, sop_uid: str = "1.2.3.4.5") -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ts
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.file_meta.MediaStorageSOPInstanceUID = sop_uid
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = sop_uid
    return ds


def put_raw(ds: Dataset, tag: int, vr: str | None, value: bytes, *, little: bool = True) -> None:
    """Store `value` as the element's exact bytes (no validation, no padding)."""
    t = Tag(tag)
    ds._dict[t] = RawDataElement(t, vr, len(value), value, 0, vr is None, little)


def save(ds: Dataset, *, implicit: bool = False, little: bool = True) -> bytes:
    """PS3.10 bytes; raw elements are written as they are."""
    ds.set_original_encoding(implicit, little, ds._character_set)
    out = io.BytesIO()
    ds.save_as(out, implicit_vr=implicit, little_endian=little, enforce_file_format=True)
    return out.getvalue()


def read(data: bytes) -> Dataset:
    return dcmread(io.BytesIO(data))


def jpeg(seed: int, size: int = 64) -> bytes:
    rng = np.random.default_rng(seed)
    arr = (np.add.outer(np.arange(size), np.arange(size)) * 2 + rng.integers(0, 20, (size, size)))
    out = io.BytesIO()
    Image.fromarray(arr.astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def walk(obj: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """Yield (tagpath, attribute object) for every attribute, depth first."""
    for key, attr in obj.items():
        p = f"{path}{key}"
        yield p, attr
        if attr.get("vr") == "SQ":
            for i, item in enumerate(attr.get("Value", [])):
                yield from walk(item, f"{p}/{i}/")


def assert_json_safe(obj: dict) -> None:
    """No NaN/Infinity anywhere, dataset keys ascending, orjson round trip."""

    def scalar(v: Any) -> None:
        if isinstance(v, float):
            assert math.isfinite(v), v
        else:
            assert v is None or isinstance(v, (str, int)), type(v)

    def dataset(d: dict) -> None:
        keys = list(d)
        assert keys == sorted(keys)
        assert all(len(k) == 8 and k == k.upper() for k in keys), keys
        for attr in d.values():
            assert set(attr) <= {"vr", "Value", "InlineBinary", "BulkDataURI"}, attr
            for v in attr.get("Value", []):
                if attr["vr"] == "SQ":
                    dataset(v)
                elif attr["vr"] == "PN" and v is not None:
                    assert v and set(v) <= {"Alphabetic", "Ideographic", "Phonetic"}
                    assert all(isinstance(x, str) and x for x in v.values())
                else:
                    scalar(v)

    dataset(obj)
    assert orjson.loads(orjson.dumps(obj)) == obj


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def model_tags(ds: Dataset) -> set[str]:
    return {f"{t:08X}" for t in ds.keys() if t.element != 0 and t.group != 2}

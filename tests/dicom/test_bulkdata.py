"""Bulk data tag paths (the path part of the BulkDataURIs of PS3.18 F.2.6):
parsing and rejection (dicomweb_server.dicom.bulkdata)."""

from __future__ import annotations

import pytest

from dicomweb_server.dicom.bulkdata import bulkdata_tagpath_parse
from dicomweb_server.dicom.json_model import MAX_ITEM_INDEX


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("7FE00010", [(0x7FE00010, None)]),
        ("00091010", [(0x00091010, None)]),
        ("00540016/0/00181072", [(0x00540016, 0), (0x00181072, None)]),
        ("7fe00010", [(0x7FE00010, None)]),
        (
            "00400275/12/00081140/0/00420011",
            [(0x00400275, 12), (0x00081140, 0), (0x00420011, None)],
        ),
        ("/".join(["00081140/0"] * 7 + ["00420011"]), [(0x00081140, 0)] * 7 + [(0x00420011, None)]),
        (f"00081140/{MAX_ITEM_INDEX}/00420011", [(0x00081140, MAX_ITEM_INDEX), (0x00420011, None)]),
    ],
)
def test_tagpath_parse(path: str, expected: list) -> None:
    assert bulkdata_tagpath_parse(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "",
        "7FE0001",  # 7 digits
        "7FE000100",  # 9 digits
        "7FE0001G",  # not hex
        "0x7FE0010",
        "+7FE0010",
        " 7FE00010",
        "7FE00010 ",
        "7FE00010/",
        "/7FE00010",
        "00540016/0",  # ends in an index: odd element count
        "00540016/00181072",  # tag after tag
        "00540016/0/0/00181072",
        "00540016//00181072",
        "00540016/-1/00181072",
        "00540016/+1/00181072",
        "00540016/01/00181072",  # leading zero
        "00540016/x/00181072",
        "00540016/1.0/00181072",
        f"00540016/{MAX_ITEM_INDEX + 1}/00181072",
        "00540016/99999999999999999999/00181072",
        "/".join(["00081140/0"] * 8 + ["00420011"]),  # 9 levels
        "7FE00010\x00",
        "..",
        "../00100010",
        "７FE00010",  # non-ASCII digit
    ],
)
def test_tagpath_parse_rejects(path: str) -> None:
    with pytest.raises(ValueError) as exc:
        bulkdata_tagpath_parse(path)
    assert str(exc.value)

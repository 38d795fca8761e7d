"""UID validation (PS3.5 9.1): what the archive accepts before building paths."""

from __future__ import annotations

import pytest

from dicomweb_server.dicom.uids import UID_RE, validate_uid

VALID = [
    "0",
    "1",
    "1.2",
    "1.2.840.10008.1.2.1",
    "1.2.840.10008.5.1.4.1.1.2",
    "2.25.329800735698586629295641978511506172918",
    "1.0.0.0",
    "1.2.3.10.100",
    "1." + "2" * 62,  # exactly 64 characters
    "1.2.826.0.1.3680043.8.498." + "1" * 38,  # exactly 64 characters
]

INVALID = [
    "",
    " ",
    ".",
    "..",
    "../1.2",
    "1.2/../3",
    "1.2/3",
    "/etc/passwd",
    "1.2\\3",
    "1.2.3 ",  # PS3.5 padding is not part of the UID
    " 1.2.3",
    "1.2.3\x00",  # NUL padding
    "1.2\x00.3",
    "1.2. 3",
    "1..2",
    ".1.2",
    "1.2.",
    "01.2",  # leading zero component
    "1.02",
    "1.2.00",
    "1.2.3a",
    "1.2.-3",
    "+1.2",
    "1,2",
    "1.2\n",
    "\u0661.2",  # ARABIC-INDIC DIGIT ONE: not an ASCII digit
    "1.２",  # FULLWIDTH DIGIT TWO
    "1." + "2" * 63,  # 65 characters
    "1.2.826.0.1.3680043.8.498." + "1" * 39,  # 65 characters
]


@pytest.mark.parametrize("uid", VALID)
def test_valid(uid: str) -> None:
    assert len(uid) <= 64
    assert validate_uid(uid) == uid
    assert UID_RE.fullmatch(uid)


@pytest.mark.parametrize("uid", INVALID)
def test_invalid(uid: str) -> None:
    with pytest.raises(ValueError) as exc:
        validate_uid(uid)
    assert str(exc.value)  # a message the web layer can show


@pytest.mark.parametrize("value", [None, 1.2, b"1.2.3", ["1.2"]])
def test_not_a_string(value) -> None:
    with pytest.raises(ValueError, match="string"):
        validate_uid(value)  # type: ignore[arg-type]


def test_messages_say_why() -> None:
    with pytest.raises(ValueError, match="64"):
        validate_uid("1." + "2" * 63)
    with pytest.raises(ValueError, match="leading zero"):
        validate_uid("1.02")
    with pytest.raises(ValueError, match="empty component"):
        validate_uid("1..2")
    with pytest.raises(ValueError, match="not allowed"):
        validate_uid("1.2/..")
    with pytest.raises(ValueError, match="empty"):
        validate_uid("")

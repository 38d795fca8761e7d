"""The Specific Character Set (0008,0005) of a data set the archive builds from its own
Unicode data (DICOM JSON of the index, REST input) and sends over DIMSE: C-FIND answers
of every information model (dimse/find.py, dimse/worklist.py) and the identifiers of its
own C-FIND requests (dimse/pull.py).

The values are Unicode; the bytes on the wire are pydicom's encoding of them in the data
set's Specific Character Set. Without (0008,0005) pydicom writes non-ASCII text as Latin-1
bytes (its ``iso8859`` default), and a value the character set cannot hold with ``?``
(a warning): a modality would read a wrong patient name. :func:`set_character_set` decides
the character set from the values themselves:

- every value in the default repertoire (ASCII): no (0008,0005). PS3.4 C.4.1.1.3.1 and
  C.4.1.1.3.2: it "shall be included if expanded or replacement character sets may be used
  in any of the Attributes" of the identifier, "It shall not be included otherwise";
- else the first of the ``preferred`` character sets that holds every text value exactly:
  the one the SCU's request named (C.4.1.1.3.2: the SCP answers in it when it can, and "may
  return responses with a different Specific Character Set" when it cannot), then the one
  the data came with (a stored instance's, a worklist entry's own), then the archive's
  ``dimse_character_set`` (default ISO_IR 100: what most modalities read, and the bytes
  they had before (0008,0005) was sent; Orthanc's ``DefaultEncoding`` is Latin-1 too);
- else ISO_IR 192 (UTF-8, PS3.3 C.12.1.1.2, Table C.12-5), which holds every character.
  Never replacement characters.

Which values are text: the VRs PS3.5 §6.1.2.3 lets a character set replace or extend the
default repertoire in (SH, LO, ST, LT, UC, UT, PN), in sequence items too. An item's own
(0008,0005) is removed (PS3.5 §7.5.3: items inherit the data set's): one choice holds for
the whole answer.

Character sets with code extensions (multi-valued, ISO 2022): a value is held when each of
its characters is in one of the named character sets. Where value 1 is the default
repertoire (empty, ``ISO 2022 IR 6``), pydicom encodes a Latin-1 character without the
escape sequence that designates its set (PS3.5 §6.1.2.5.3): such values are not taken as
held there (the next choice applies).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from pydicom.charset import STAND_ALONE_ENCODINGS, custom_encoders, default_encoding, python_encoding
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue

#: Specific Character Set (0008,0005)
TAG = 0x00080005
#: Unicode in UTF-8 (PS3.3 Table C.12-5): holds every value
UTF8 = "ISO_IR 192"
#: the VRs whose values are in the Specific Character Set (PS3.5 §6.1.2.3)
TEXT_VRS = frozenset({"SH", "LO", "ST", "LT", "UC", "UT", "PN"})
#: GB 2312 (PS3.3 Table C.12-4): pydicom encodes it as a handled encoding, without its
#: ``ESC $ ) A`` designation, so a reader decodes other characters: never chosen
_NO_ESCAPES = "ISO 2022 IR 58"


def terms(value: object) -> tuple[str, ...] | None:
    """The Defined Terms of a Specific Character Set value (a str, a multi-value, a DICOM JSON
    element's ``Value`` list), stripped; None when it names nothing (absent, empty), a term
    pydicom cannot encode or an invalid combination (it cannot be honoured: C.4.1.1.3.2
    allows another)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        value = [value]
    found = tuple((v.decode("ascii", "replace") if isinstance(v, bytes) else str(v or "")).strip()
                  for v in value)
    if not any(found):
        return None
    if any(t not in python_encoding for t in found) or any(t == "" for t in found[1:]):
        return None
    if len(found) > 1 and any(t in STAND_ALONE_ENCODINGS for t in found):
        return None  # UTF-8, GB18030, GBK take no code extensions (PS3.3 C.12.1.1.2): pydicom drops the rest
    if _NO_ESCAPES in found:
        return None  # pydicom writes GB 2312 without the escape sequence PS3.5 Annex K requires (review)
    return found


def of_json(obj: dict) -> tuple[str, ...] | None:
    """The Defined Terms (:func:`terms`) of the (0008,0005) of a DICOM JSON object (PS3.18 F.2):
    a stored study's, a worklist entry's."""
    return terms((obj.get("00080005") or {}).get("Value"))


def configured(value: str) -> tuple[str, ...] | None:
    """The Defined Terms of the ``dimse_character_set`` setting (values separated by
    backslashes, as in a data set): :func:`terms`; None when empty or not valid."""
    return terms(value.split("\\")) if value.strip() else None


def text_values(ds: Dataset) -> Iterator[str]:
    """Every value of ``ds`` (its sequence items included) a character set applies to."""
    for elem in ds:
        if elem.VR == "SQ":
            for item in elem.value or ():
                yield from text_values(item)
        elif elem.VR in TEXT_VRS and elem.value not in (None, ""):
            values = elem.value if isinstance(elem.value, (MultiValue, list, tuple)) else [elem.value]
            for v in values:
                if v is not None:
                    yield v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)


def _encodes(ch: str, encoding: str) -> bool:
    try:
        encoder = custom_encoders.get(encoding)
        encoder(ch) if encoder is not None else ch.encode(encoding)  # type: ignore[operator]
        return True
    except UnicodeError:
        return False


def holds(charset: Sequence[str], values: Iterable[str]) -> bool:
    """Does the character set (its Defined Terms) hold every value exactly as pydicom
    encodes it? (module docstring)"""
    encodings = [python_encoding[t] for t in charset]
    first, rest = encodings[0], encodings[1:]
    if first == default_encoding:  # the default repertoire: ASCII, not pydicom's Latin-1
        encodings = ["ascii", *rest]
    for value in values:
        if value.isascii():
            continue
        if first == default_encoding and any(not ch.isascii() and _encodes(ch, "latin_1") for ch in value):
            return False  # pydicom would write Latin-1 bytes without their escape sequence
        if not all(ch.isascii() and first == default_encoding or any(_encodes(ch, e) for e in encodings)
                   for ch in value):
            return False
    return True


def choose(values: Iterable[str], *preferred: Sequence[str] | None) -> tuple[str, ...] | None:
    """The Specific Character Set of data holding ``values`` (module docstring): None when
    every value is ASCII, else the first ``preferred`` one holding them all, else ISO_IR 192."""
    values = [v for v in values if not v.isascii()]
    if not values:
        return None
    for charset in preferred:
        if charset and holds(charset, values):
            return tuple(charset)
    return (UTF8,)


def _drop_item_charsets(ds: Dataset) -> None:
    for elem in ds:
        if elem.VR == "SQ":
            for item in elem.value or ():
                if TAG in item:
                    del item[TAG]
                _drop_item_charsets(item)


def set_character_set(ds: Dataset, *preferred: Sequence[str] | None) -> Dataset:
    """Give ``ds`` (Unicode values) the Specific Character Set :func:`choose` finds, or none;
    its items' own are removed. ``preferred``: Defined Terms (:func:`terms`), in order.
    Returns ``ds``."""
    _drop_item_charsets(ds)
    chosen = choose(text_values(ds), *preferred)
    if chosen is None:
        if TAG in ds:
            del ds[TAG]
    else:
        ds.SpecificCharacterSet = chosen[0] if len(chosen) == 1 else list(chosen)
    return ds


__all__ = ["TAG", "UTF8", "TEXT_VRS", "terms", "of_json", "configured", "text_values", "holds", "choose", "set_character_set"]

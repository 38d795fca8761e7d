"""DICOM UID validation (PS3.5 section 9.1).

A UID is a series of numeric components separated by ``.``; each component is
``0`` or digits not starting with ``0``; the whole is 1..64 characters of
``0-9`` and ``.`` only (PS3.5 9.1, Table 6.2-1 VR UI).  The archive builds file
paths from validated UIDs, so anything else -- ``..``, ``/``, NUL, spaces,
padding, non-ASCII digits, an empty string -- is rejected.
"""

from __future__ import annotations

import re

__all__ = ["IMPLEMENTATION_CLASS_UID", "IMPLEMENTATION_VERSION_NAME", "UID_MAX_LENGTH", "UID_RE", "validate_uid"]

#: This archive's Implementation Class UID (PS3.7 D.3.3.2, PS3.10 §7.1), written in the file
#: meta of the files it makes (dicom/bare.py): a UUID-derived UID (PS3.5 B.2), "2.25." and
#: the integer of ``uuid.uuid5(uuid.NAMESPACE_URL, "dicomweb-archive implementation class")``.
IMPLEMENTATION_CLASS_UID = "2.25.68319187678154762346849548042397779334"
#: Implementation Version Name (SH, at most 16 characters)
IMPLEMENTATION_VERSION_NAME = "DICOMWEB_ARCHIVE"

#: Maximum length of a UID (PS3.5 9.1).
UID_MAX_LENGTH = 64

#: Full-match pattern of a UID's syntax (length is checked separately).
UID_RE = re.compile(r"(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*", re.ASCII)


def validate_uid(value: str) -> str:
    """Return `value` unchanged if it is a valid DICOM UID.

    Parameters
    ----------
    value : str
        Candidate UID, e.g. ``"1.2.840.10008.1.2.1"``.  No trimming is done:
        a trailing NUL or space (PS3.5 padding) is an error here.

    Returns
    -------
    str
        `value`.

    Raises
    ------
    ValueError
        If `value` is not a str, is empty, longer than 64 characters, or not
        dot-separated components of digits without leading zeros (PS3.5 9.1).
    """
    if not isinstance(value, str):
        raise ValueError(f"UID must be a string, not {type(value).__name__}")
    if not value:
        raise ValueError("UID is empty")
    if len(value) > UID_MAX_LENGTH:
        raise ValueError(f"UID is {len(value)} characters long, the maximum is {UID_MAX_LENGTH}")
    if UID_RE.fullmatch(value) is None:
        bad = next((c for c in value if c not in "0123456789."), None)
        if bad is not None:
            why = f"character {bad!r} is not allowed (digits and '.' only)"
        elif value.startswith(".") or value.endswith(".") or ".." in value:
            why = "it has an empty component (leading, trailing or double '.')"
        else:
            why = "a component has a leading zero"
        raise ValueError(f"invalid UID {value!r}: {why}")
    return value

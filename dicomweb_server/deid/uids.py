"""Consistent UID replacement for de-identification (PS3.15 E.1-1 action U: "replace
with a non-zero length UID that is internally consistent within a set of Instances").

``new_uid(secret, uid)`` = ``2.25.`` + the decimal of 128 bits of HMAC-SHA256(secret,
uid), shaped as a version 8 UUID (RFC 9562 §5.8: custom; the variant and version bits
set): a UID derived from a UUID, PS3.5 §B.2. Same secret (one per project) and same
original UID -> same new UID, in every export and every process, so that references
(ReferencedSOPInstanceUID, FrameOfReferenceUID, StudyInstanceUID of two studies of one
patient...) still resolve; without the secret the original cannot be recovered.

UIDs defined by DICOM itself (root ``1.2.840.10008.``: SOP classes, transfer syntaxes,
coding schemes, well-known frames of reference) are never replaced.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid

DICOM_ROOT = "1.2.840.10008."


def well_known(uid: str) -> bool:
    """A UID the standard defines (PS3.6 Annex A): the same for every site, not an identity."""
    return uid.startswith(DICOM_ROOT)


def new_uid(secret: bytes, uid: str) -> str:
    """The replacement of ``uid`` under ``secret`` (well-known UIDs come back unchanged)."""
    uid = uid.strip().rstrip("\0")
    if not uid or well_known(uid):
        return uid
    digest = hmac.new(secret, b"uid\0" + uid.encode("ascii", "replace"), hashlib.sha256).digest()
    b = bytearray(digest[:16])
    b[6] = (b[6] & 0x0F) | 0x80  # version 8
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122/9562 variant
    return f"2.25.{uuid.UUID(bytes=bytes(b)).int}"

"""STOW-RS failure reasons: the values of FailureReason (0008,1197) this archive
puts in FailedSOPSequence items.

References
----------
PS3.18 §10.5.3 (Store Instances Response), PS3.4 Annex B.2.3 (Storage SCP status
codes: A7xx out of resources, A9xx data set does not match SOP Class, Cxxx cannot
understand), PS3.7 Annex C (0110 processing failure, 0111 duplicate SOP instance).
"""

from __future__ import annotations

from enum import IntEnum


class FailureReason(IntEnum):
    """FailureReason codes; each one is documented in docs/dicomweb.md (STOW-RS)."""

    PROCESSING_FAILURE = 0x0110  # unexpected error while storing (PS3.7 C.4)
    DUPLICATE_SOP_INSTANCE = 0x0111  # same SOP Instance UID, different content (PS3.7 C.4)
    OUT_OF_RESOURCES = 0xA700  # disk full, read-only storage (PS3.4 B.2.3)
    DATASET_MISMATCH = 0xA900  # required UIDs missing or invalid (PS3.4 B.2.3)
    CANNOT_UNDERSTAND = 0xC000  # not a PS3.10 file, truncated, unreadable (PS3.4 B.2.3)
    STUDY_UID_MISMATCH = 0xC409  # StudyInstanceUID differs from the request URL's study
    NOT_AUTHORIZED = 0x0124  # PS3.7 C: a study the client may not see (access/rules.py)


class InstanceError(Exception):
    """An instance that cannot be stored; carries its FailureReason and whatever
    UIDs could be read from it (for the FailedSOPSequence item)."""

    def __init__(
        self,
        reason: FailureReason,
        message: str,
        sop_class_uid: str | None = None,
        sop_instance_uid: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.sop_class_uid = sop_class_uid
        self.sop_instance_uid = sop_instance_uid

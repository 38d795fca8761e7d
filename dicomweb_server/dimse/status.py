"""DIMSE status values this archive sends, named as the standard names them.

References
----------
PS3.7 Annex C (general status: 0x0000 success, 0x0110 processing failure, 0x0111
duplicate SOP instance, 0x0122 SOP class not supported, 0x0124 refused: not authorized),
PS3.4 B.2.3 (Storage SCP: 0xA7xx out of resources, 0xA9xx data set does not match SOP
Class, 0xCxxx cannot understand), PS3.4 C.4.1.1.4 (C-FIND), C.4.2.1.5 (C-MOVE), C.4.3.1.4
(C-GET).
"""

from __future__ import annotations

from ..dicom.status import FailureReason

SUCCESS = 0x0000
PENDING = 0xFF00  # C-FIND/C-GET/C-MOVE: matches/sub-operations are continuing (PS3.4 C.4)
CANCEL = 0xFE00  # matching/sub-operations terminated due to a C-CANCEL (PS3.4 C.4)
PROCESSING_FAILURE = 0x0110  # PS3.7 C
DUPLICATE_SOP_INSTANCE = 0x0111  # PS3.7 C
SOP_CLASS_NOT_SUPPORTED = 0x0122  # PS3.7 C: Refused: SOP Class Not Supported (also: not on this context)
NOT_AUTHORIZED = 0x0124  # PS3.7 C: Refused: Not Authorized (any DIMSE service; dimse/access.py)

# Storage SCP (PS3.4 B.2.3)
STORE_OUT_OF_RESOURCES = 0xA700
STORE_DATASET_MISMATCH = 0xA900
STORE_CANNOT_UNDERSTAND = 0xC000
STORE_HANDLER_EXCEPTION = 0xC211  # a Failure (C000-CFFF, Cannot Understand): pynetdicom's answer to a handler's exception

# Query/Retrieve SCP (PS3.4 C.4.1.1.4, C.4.2.1.5, C.4.3.1.4)
QR_OUT_OF_RESOURCES = 0xA700  # C-FIND: refused, out of resources
QR_OUT_OF_RESOURCES_MATCHES = 0xA701  # C-MOVE/C-GET: unable to calculate number of matches
QR_OUT_OF_RESOURCES_SUBOPS = 0xA702  # C-MOVE/C-GET: unable to perform sub-operations
QR_MOVE_DESTINATION_UNKNOWN = 0xA801  # C-MOVE
QR_IDENTIFIER_MISMATCH = 0xA900  # identifier does not match SOP Class
QR_UNABLE_TO_PROCESS = 0xC000  # failed: unable to process
QR_SUBOPS_WARNING = 0xB000  # sub-operations complete, one or more failures or warnings


def dataset(code: int, comment: str | None = None, offending: int | None = None):
    """A response's status as a handler returns it to pynetdicom: Status, Error Comment
    (0000,0902: LO, 64 characters, ASCII here) and Offending Element (0000,0901: the tag of the
    element at fault, e.g. of a 0xA900, PS3.4 C.4.1.1.4, C.4.2.1.5, C.4.3.1.4) when given."""
    from pydicom.dataset import Dataset

    ds = Dataset()
    ds.Status = code
    if offending:
        ds.OffendingElement = [offending]
    if comment:
        ds.ErrorComment = comment.encode("ascii", "replace").decode()[:64]
    return ds


def store_status(reason: FailureReason) -> int:
    """C-STORE-RSP status of an archive failure: the STOW-RS FailureReason values are
    the PS3.4 B.2.3 / PS3.7 C statuses already (0xC409 is STOW-RS only: never raised
    here, since a C-STORE names no study)."""
    if reason is FailureReason.STUDY_UID_MISMATCH:
        return STORE_DATASET_MISMATCH
    return int(reason)

"""Typed result of a STOW-RS Store Instances transaction (PS3.18 Section 10.5.3).

The server answers with a DICOM JSON data set (PS3.18 Section 10.5.3)::

    (0008,1190) RetrieveURL               the study's URL
    (0008,1198) FailedSOPSequence         ReferencedSOPClassUID, ReferencedSOPInstanceUID, FailureReason
    (0008,1199) ReferencedSOPSequence     ReferencedSOPClassUID, ReferencedSOPInstanceUID, RetrieveURL
                                          [, WarningReason]
    (0008,119A) OtherFailuresSequence     FailureReason, ...

and a status: 200 (all stored), 202 (some stored, some failed or warnings),
409 (none stored), 4xx/5xx otherwise (PS3.18 Table 10.5.3-1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections import namedtuple
from typing import Any

__all__ = [
    "ReferencedSOP",
    "FailedSOP",
    "StoreResult",
    "FAILURE_REASONS",
    "WARNING_REASONS",
    "parse_store_response",
    "describe_reason",
]

# Tags (PS3.6)
RETRIEVE_URL = "00081190"
FAILED_SOP_SEQUENCE = "00081198"
REFERENCED_SOP_SEQUENCE = "00081199"
OTHER_FAILURES_SEQUENCE = "0008119A"
REFERENCED_SOP_CLASS_UID = "00081150"
REFERENCED_SOP_INSTANCE_UID = "00081155"
FAILURE_REASON = "00081197"
WARNING_REASON = "00081196"
ERROR_COMMENT = "00000902"

#: Failure Reason (0008,1197) values: PS3.18 Section 10.5.3, the Storage
#: Service Class statuses of PS3.4 Annex B and the general statuses of PS3.7 Annex C. A range of
#: codes (e.g. A7xx, A9xx, Cxxx) is keyed by its first code.
FAILURE_REASONS: dict[int, str] = {
    0x0110: "Processing failure",
    0x0111: "Duplicate SOP Instance",
    0x0112: "No such object instance",
    0x0117: "Invalid object instance",
    0x0118: "No such SOP Class",
    0x0119: "Class-instance conflict",
    0x0122: "Referenced SOP Class not supported",
    0x0124: "Not authorized",
    0xA700: "Refused: out of resources",
    0xA900: "Error: data set does not match SOP Class",
    0xC000: "Error: cannot understand",
    0xC122: "Referenced Transfer Syntax not supported",
}

#: Warning Reason (0008,1196) values (PS3.18 Section 10.5.3, PS3.4 Annex B).
WARNING_REASONS: dict[int, str] = {
    0xB000: "Coercion of data elements",
    0xB006: "Elements discarded",
    0xB007: "Data set does not match SOP Class",
}


def describe_reason(code: int | None) -> str:
    """Text for a FailureReason / WarningReason code (``"0xC000 Error: cannot understand"``)."""
    if code is None:
        return "unknown reason"
    text = FAILURE_REASONS.get(code) or WARNING_REASONS.get(code)
    if text is None:
        if 0xA700 <= code <= 0xA7FF:
            text = FAILURE_REASONS[0xA700]
        elif 0xA900 <= code <= 0xA9FF:
            text = FAILURE_REASONS[0xA900]
        elif 0xC000 <= code <= 0xCFFF:
            text = FAILURE_REASONS[0xC000]
        else:
            text = "unknown reason"
    return f"0x{code:04X} {text}"


class ReferencedSOP(namedtuple("_ReferencedSOP", "sop_class_uid sop_instance_uid retrieve_url")):
    """An instance the server stored (an item of ReferencedSOPSequence).

    A 3-tuple ``(sop_class_uid, sop_instance_uid, retrieve_url)``; the
    optional WarningReason (0008,1196) is the ``warning_reason`` attribute.
    """

    def __new__(cls, sop_class_uid, sop_instance_uid, retrieve_url, warning_reason: int | None = None):
        self = super().__new__(cls, sop_class_uid, sop_instance_uid, retrieve_url)
        self.warning_reason = warning_reason
        return self

    def _asdict(self) -> dict:
        return dict(super()._asdict(), warning_reason=self.warning_reason)


class FailedSOP(namedtuple("_FailedSOP", "sop_class_uid sop_instance_uid failure_reason")):
    """An instance the server did not store (an item of FailedSOPSequence).

    A 3-tuple ``(sop_class_uid, sop_instance_uid, failure_reason)``; an
    ErrorComment (0000,0902), when sent, is the ``error_comment`` attribute.
    """

    def __new__(cls, sop_class_uid, sop_instance_uid, failure_reason, error_comment: str | None = None):
        self = super().__new__(cls, sop_class_uid, sop_instance_uid, failure_reason)
        self.error_comment = error_comment
        return self

    @property
    def reason(self) -> str:
        """Human readable FailureReason (``"0xC000 Error: cannot understand"``)."""
        return describe_reason(self.failure_reason)

    def _asdict(self) -> dict:
        return dict(super()._asdict(), error_comment=self.error_comment)


@dataclass
class StoreResult:
    """What a STOW-RS request stored and what it did not.

    A partial failure (HTTP 202) is returned, not raised: check :attr:`failed`.
    For compatibility with the PyPI ``dicomweb-client`` (which returns a
    pydicom Dataset), DICOM keywords are readable as attributes
    (``result.ReferencedSOPSequence``) and :attr:`dataset` gives the Dataset.

    Attributes
    ----------
    status_code : int
        HTTP status (200, 202, 409 ...).
    retrieve_url : str or None
        The study's RetrieveURL (0008,1190).
    referenced : list of ReferencedSOP
        Stored instances: (SOP Class UID, SOP Instance UID, RetrieveURL) tuples
        (``.warning_reason`` holds a WarningReason, if any).
    failed : list of FailedSOP
        Instances not stored: (SOP Class UID, SOP Instance UID, FailureReason) tuples
        (``.error_comment``, ``.reason`` for a description).
    other_failures : list of dict
        Raw items of OtherFailuresSequence (0008,119A).
    warnings : list of str
        HTTP ``Warning`` header values of the answer.
    raw : dict
        The DICOM JSON answer as received.
    """

    status_code: int
    retrieve_url: str | None = None
    referenced: list[ReferencedSOP] = field(default_factory=list)
    failed: list[FailedSOP] = field(default_factory=list)
    other_failures: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every instance was stored (no failed item, status < 300)."""
        return self.status_code < 300 and not self.failed and not self.other_failures

    @property
    def partial(self) -> bool:
        """True when some instances were stored and others failed."""
        return bool(self.referenced) and bool(self.failed or self.other_failures)

    @property
    def dataset(self):
        """The answer as a ``pydicom.Dataset`` (what PyPI ``dicomweb-client`` returns)."""
        from pydicom import Dataset

        return Dataset.from_json(self.raw) if self.raw else Dataset()

    def __getattr__(self, name: str) -> Any:
        # Only DICOM keywords (CamelCase) are forwarded to the Dataset view.
        if name[:1].isupper():
            return getattr(self.dataset, name)
        raise AttributeError(name)

    def summary(self) -> dict:
        """A plain JSON-serialisable summary (used by the command line)."""
        return {
            "status": self.status_code,
            "retrieve_url": self.retrieve_url,
            "referenced": [r._asdict() for r in self.referenced],
            "failed": [dict(f._asdict(), reason=f.reason) for f in self.failed],
            "other_failures": self.other_failures,
            "warnings": self.warnings,
        }


def _first(item: dict, tag: str) -> Any:
    elem = item.get(tag)
    if not isinstance(elem, dict):
        return None
    value = elem.get("Value")
    if not value:
        return None
    v = value[0]
    if isinstance(v, dict) and "Alphabetic" in v:  # PN, not expected here
        return v["Alphabetic"]
    return v


def _int(v: Any) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return int(str(v), 0)
        except ValueError:
            return None


def _items(doc: dict, tag: str) -> list[dict]:
    elem = doc.get(tag)
    if not isinstance(elem, dict):
        return []
    return [i for i in (elem.get("Value") or []) if isinstance(i, dict)]


def parse_store_response(status_code: int, doc: Any, warnings: list[str] | None = None) -> StoreResult:
    """Build a :class:`StoreResult` from a Store Instances Response.

    Parameters
    ----------
    status_code : int
        HTTP status of the answer.
    doc : dict or list or None
        The parsed DICOM JSON body (a list holding one data set is accepted).
    warnings : list of str, optional
        ``Warning`` header values.
    """
    if isinstance(doc, list):
        doc = doc[0] if doc and isinstance(doc[0], dict) else {}
    if not isinstance(doc, dict):
        doc = {}
    referenced = [
        ReferencedSOP(
            _first(i, REFERENCED_SOP_CLASS_UID),
            _first(i, REFERENCED_SOP_INSTANCE_UID),
            _first(i, RETRIEVE_URL),
            _int(_first(i, WARNING_REASON)),
        )
        for i in _items(doc, REFERENCED_SOP_SEQUENCE)
    ]
    failed = [
        FailedSOP(
            _first(i, REFERENCED_SOP_CLASS_UID),
            _first(i, REFERENCED_SOP_INSTANCE_UID),
            _int(_first(i, FAILURE_REASON)),
            _first(i, ERROR_COMMENT),
        )
        for i in _items(doc, FAILED_SOP_SEQUENCE)
    ]
    return StoreResult(
        status_code=status_code,
        retrieve_url=_first(doc, RETRIEVE_URL),
        referenced=referenced,
        failed=failed,
        other_failures=_items(doc, OTHER_FAILURES_SEQUENCE),
        warnings=list(warnings or []),
        raw=doc,
    )

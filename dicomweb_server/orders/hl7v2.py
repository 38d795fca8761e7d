"""HL7 v2 ORM^O01 orders as modality worklist entries (dicom/worklist.py), parsed with
python-hl7 (``hl7`` on PyPI); the MLLP listener that receives them: orders/mllp.py.

Each ORC segment with the OBR segment that follows it is one order (HL7 v2.5 4.4.1). Its
Order Control (ORC-1) says what to do:

- ``NW`` (new order): a worklist entry, replacing the one with the same Scheduled Procedure
  Step ID (as ``POST /worklist`` does);
- ``CA`` (cancel): the entry with that Scheduled Procedure Step ID is removed;
- any other: the message is rejected (``AR``).

The fields are mapped as IHE Radiology Scheduled Workflow does (RAD TF-2 Appendix B, HL7
order mapping to DICOM MWL):

========================  =========================================================
HL7 field                 DICOM attribute of the entry
========================  =========================================================
PID-3.1, PID-3.4          Patient ID (0010,0020), Issuer of Patient ID (0010,0021)
PID-5                     Patient's Name (0010,0010): family^given^middle^prefix^suffix
PID-7, PID-8              Patient's Birth Date (0010,0030), Patient's Sex (0010,0040)
PV1-8                     Referring Physician's Name (0008,0090)
ORC-2.1, ORC-3.1          Placer / Filler Order Number Imaging Service Request (0040,2016 / 0040,2017)
OBR-4 (code^text^scheme)  Requested Procedure Code Sequence (0032,1064), Requested Procedure
                          Description (0032,1060), Scheduled Procedure Step Description (0040,0007)
OBR-16                    Requesting Physician (0032,1032)
OBR-18                    Accession Number (0008,0050)
OBR-19                    Requested Procedure ID (0040,1001)
OBR-20                    Scheduled Procedure Step ID (0040,0009) (else ORC-2.1, at most 16 characters)
OBR-24                    Modality (0008,0060) in the Scheduled Procedure Step Sequence
OBR-27.4 (else ORC-7.4)   Scheduled Procedure Step Start Date and Time (0040,0002 / 0040,0003)
OBR-21                    Scheduled Station AE Title (0040,0001), when the RIS fills it (a site
                          convention: HL7 has no field for it)
ZDS-1.1                   Study Instance UID (0020,000D) (else one is made)
========================  =========================================================

The entry's Scheduled Procedure Step Status (0040,0020) is ``SCHEDULED``.
"""

from __future__ import annotations

from dataclasses import dataclass

import hl7
from hl7.util import escape

from ..dicom.worklist import Entry, WorklistError, prepare

ACCEPT, ERROR, REJECT = "AA", "AE", "AR"  # Acknowledgment Code (HL7 Table 0008)


class OrderError(ValueError):
    """A message that cannot be taken: its acknowledgment code (AE or AR) and why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Order:
    control: str  # "NW" or "CA"
    sps_id: str
    entry: Entry | None  # NW: the worklist entry


def _get(segment, field: int, component: int = 1, repeat: int = 1) -> str:
    """A field's component ("" when absent), unescaped by python-hl7."""
    try:
        return str(segment.extract_field(1, field, repeat, component, 1) or "").strip()
    except (IndexError, KeyError):
        return ""


def _v(vr: str, value: object) -> dict:
    return {"vr": vr, "Value": [value]}


def _pn(segment, field: int, offset: int = 0) -> str:
    """An XPN (offset 0) or XCN (offset 1: component 1 is the ID) as a DICOM PN."""
    family, given, middle, suffix, prefix = (_get(segment, field, offset + i) for i in range(1, 6))
    return "^".join((family, given, middle, prefix, suffix)).rstrip("^")


def message_type(msg: hl7.Message) -> str:
    return f"{_get(msg.segment('MSH'), 9, 1)}^{_get(msg.segment('MSH'), 9, 2)}"


def orders(msg: hl7.Message) -> list[Order]:
    """The orders of an ORM^O01 message, or :class:`OrderError`."""
    if message_type(msg) != "ORM^O01":
        raise OrderError(REJECT, f"message type {message_type(msg)}: only ORM^O01")
    segments = list(msg)
    name = lambda s: str(s[0]).strip()  # noqa: E731
    pid = next((s for s in segments if name(s) == "PID"), None)
    pv1 = next((s for s in segments if name(s) == "PV1"), None)
    zds = next((s for s in segments if name(s) == "ZDS"), None)
    out = []
    for i, orc in enumerate(segments):
        if name(orc) != "ORC":
            continue
        control = _get(orc, 1).upper()
        if control not in ("NW", "CA"):
            raise OrderError(REJECT, f"order control {control or '(none)'}: only NW and CA")
        obr = next((s for s in segments[i + 1:] if name(s) in ("OBR", "ORC")), None)
        obr = obr if obr is not None and name(obr) == "OBR" else None
        sps_id = (_get(obr, 20) if obr is not None else "") or _get(orc, 2)
        if not sps_id or len(sps_id) > 16:
            raise OrderError(ERROR, "no Scheduled Procedure Step ID (OBR-20, or ORC-2 of at most 16 characters)")
        if control == "CA":
            out.append(Order(control, sps_id, None))
            continue
        if pid is None or not _get(pid, 3) or obr is None:
            raise OrderError(ERROR, "a new order needs PID-3 (patient ID) and an OBR segment")
        out.append(Order(control, sps_id, _entry(pid, pv1, orc, obr, zds, sps_id)))
    if not out:
        raise OrderError(ERROR, "no ORC segment")
    return out


def _entry(pid, pv1, orc, obr, zds, sps_id: str) -> Entry:
    item: dict = {"00400009": _v("SH", sps_id), "00400020": _v("CS", "SCHEDULED")}
    doc: dict = {"00100020": _v("LO", _get(pid, 3)), "00400100": {"vr": "SQ", "Value": [item]}}
    if issuer := _get(pid, 3, 4):
        doc["00100021"] = _v("LO", issuer)
    if name := _pn(pid, 5):
        doc["00100010"] = _v("PN", {"Alphabetic": name})
    if birth := _get(pid, 7)[:8]:
        doc["00100030"] = _v("DA", birth)
    if (sex := _get(pid, 8).upper()) in ("M", "F", "O"):
        doc["00100040"] = _v("CS", sex)
    if pv1 is not None and (referring := _pn(pv1, 8, 1)):
        doc["00080090"] = _v("PN", {"Alphabetic": referring})
    for field, tag in ((2, "00402016"), (3, "00402017")):
        if number := _get(orc, field):
            doc[tag] = _v("LO", number)
    code, text, scheme = _get(obr, 4, 1), _get(obr, 4, 2), _get(obr, 4, 3)
    if text:
        doc["00321060"] = _v("LO", text)
        item["00400007"] = _v("LO", text)
    if code and scheme:
        code_item = {"00080100": _v("SH", code), "00080102": _v("SH", scheme)}
        if text:
            code_item["00080104"] = _v("LO", text)
        doc["00321064"] = {"vr": "SQ", "Value": [code_item]}
    if requesting := _pn(obr, 16, 1):
        doc["00321032"] = _v("PN", {"Alphabetic": requesting})
    for field, tag, vr in ((18, "00080050", "SH"), (19, "00401001", "SH")):
        if value := _get(obr, field):
            doc[tag] = _v(vr, value)
    if modality := _get(obr, 24):
        item["00080060"] = _v("CS", modality)
    if station := _get(obr, 21):
        item["00400001"] = _v("AE", station)
    start = _get(obr, 27, 4) or _get(orc, 7, 4)
    if len(start) >= 8 and start[:8].isdigit():
        item["00400002"] = _v("DA", start[:8])
        if len(start) >= 12 and start[8:14].isdigit():
            item["00400003"] = _v("TM", start[8:14])
    if zds is not None and (study := _get(zds, 1)):
        doc["0020000D"] = _v("UI", study)
    try:
        return prepare(doc)
    except WorklistError as e:
        raise OrderError(ERROR, str(e)) from None


def ack(msg: hl7.Message, code: str, text: str, application: str) -> hl7.Message:
    """The ACK of ``msg`` (HL7 v2.5 2.9.2, original mode): MSA-1 ``code``, MSA-2 its Message
    Control ID, MSA-3 ``text`` (80 characters, escaped: HL7 v2.5 2.7)."""
    reply = msg.create_ack(code, application=application)
    if text:
        reply.segment("MSA").assign_field(escape(reply, " ".join(text.split())[:80]), 3)  # \S\ for ^...
    return reply

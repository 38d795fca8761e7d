"""De-identify a pydicom Dataset by the Basic Application Level Confidentiality Profile
of DICOM PS3.15 Annex E and its options (profile.py; Table E.1-1 of PS3.15 2024b).

What :func:`deidentify` does, in the data set it is given (in place: pixel data and
every attribute the profile keeps stay the very same objects, byte-identical):

- every attribute of Table E.1-1, at any depth inside sequences, gets its action
  (:func:`profile.resolve`): X removed; Z emptied (a sequence: no items); D a dummy value
  of its VR (:data:`DUMMY`; a UID: a replaced one; a sequence: kept, its items
  de-identified); U each UID replaced by :func:`uids.new_uid` under the project's secret;
  U* (X/Z/U*) the sequence kept, its items de-identified (their UIDs replaced: references
  still resolve); K kept; C cleaned: a date (DA, DT) moved by the patient's offset under
  Retain Longitudinal Temporal Information With Modified Dates (PS3.15 E.3.6; times kept:
  the shift is whole days), a text (AE, CS, LO, LT, PN, SH, ST, UC, UT) with the
  patient's and institution's identifying values found in the data set (names and their
  components, IDs, accession number, birth date...) replaced by ``*`` (``X`` in a CS), a sequence kept
  with its items de-identified. Attributes not in the table are kept (sequences among
  them de-identified inside).
- private attributes (odd groups, PS3.5 §7.8) removed, unless Retain Safe Private is
  chosen and (private creator, group, element byte) is on the safe-private list
  (:data:`SAFE_PRIVATE`, extended by the caller's); a private creator element stays only
  while an element of its block stays.
- PatientID and PatientName: the patient's pseudonym when the caller gives one
  (pseudonyms.py), else the profile's action (Z/D, Z).
- Patient Identity Removed (0012,0062) ``YES``; De-identification Method (0012,0063) the
  profile and options in words; De-identification Method Code Sequence (0012,0064) the
  CID 7050 codes of the profile and of each option used (PS3.15 E.1.1, PS3.3 C.7.1.1);
  Longitudinal Temporal Information Modified (0028,0303) ``MODIFIED``, ``UNMODIFIED`` or
  ``REMOVED``; the file meta's Media Storage SOP Instance UID follows the SOP Instance
  UID.

Burned-in annotation (PS3.15 E.1.1 leaves pixel cleaning to the Clean Pixel Data option,
not done here): an instance with BurnedInAnnotation (0028,0301) ``YES``, or of a
modality known to burn in text (US, SC, XA; a Secondary Capture SOP class) without
``NO``, is refused (:class:`BurnedIn`) unless the caller allows it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta

from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from . import profile
from .profile import Options
from .uids import new_uid

#: Retain Safe Private (PS3.15 E.3.10): (private creator, group, element byte) kept when
#: the option is chosen. Empty here: a site adds the entries of PS3.15 Table E.3.10-1 it
#: trusts for its devices (Context.safe_private, or a destination's ``safe_private``).
SAFE_PRIVATE: frozenset[tuple[str, int, int]] = frozenset()

def parse_safe_private(text: str) -> tuple[str, int, int]:
    """``"CREATOR:gggg:ee"`` (an odd group and the element's low byte, both hex) -> a
    :data:`SAFE_PRIVATE` entry; ValueError saying what is wrong."""
    creator, _, rest = text.rpartition(":")
    creator, _, group = creator.rpartition(":")
    try:
        g, e = int(group, 16), int(rest, 16)
    except ValueError:
        g = e = -1
    if not creator.strip() or not (0x0009 <= g <= 0xFFFF and g % 2 == 1) or not 0 <= e <= 0xFF:
        raise ValueError(f"safe private element {text!r}: expected CREATOR:gggg:ee (an odd group, the "
                         "element's last two hex digits), e.g. \"ACME 1.0:0009:02\"")
    return creator.strip(), g, e


#: Action D: a dummy value per VR (PS3.15 E.1-1 legend "consistent with the VR")
DUMMY: dict[str, object] = {
    "AE": "ANONYMIZED", "AS": "000D", "CS": "ANONYMIZED", "DA": "19000101", "DS": "0",
    "DT": "19000101000000", "IS": "0", "LO": "ANONYMIZED", "LT": "ANONYMIZED", "PN": "ANONYMIZED",
    "SH": "ANONYMIZED", "ST": "ANONYMIZED", "TM": "000000", "UC": "ANONYMIZED", "UR": "urn:oid:2.25.0",
    "UT": "ANONYMIZED", "AT": 0, "FL": 0.0, "FD": 0.0, "SL": 0, "SS": 0, "SV": 0, "UL": 0, "US": 0, "UV": 0,
}
_BYTES_VRS = {"OB", "OD", "OF", "OL", "OV", "OW", "UN", "OB or OW", "US or OW", "US or SS or OW"}
_STRING_VRS = {"AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM", "UC", "UI", "UR", "UT"}
_TEXT_VRS = {"AE", "CS", "LO", "LT", "PN", "SH", "ST", "UC", "UT"}
#: modalities whose images commonly carry burned-in text (the issue's list; PS3.15 E.3.1)
BURNING_MODALITIES = {"US", "SC", "XA"}
SECONDARY_CAPTURE_PREFIX = "1.2.840.10008.5.1.4.1.1.7"
#: attributes whose values are searched for in texts under C (clean)
_IDENTIFYING = ("PatientName", "PatientID", "OtherPatientIDs", "OtherPatientNames", "PatientBirthName",
                "PatientMotherBirthName", "AccessionNumber", "PatientBirthDate", "PatientAddress",
                "PatientTelephoneNumbers", "InstitutionName", "InstitutionAddress", "ReferringPhysicianName",
                "PerformingPhysicianName", "OperatorsName", "PhysiciansOfRecord", "MedicalRecordLocator",
                "IssuerOfPatientID", "StationName")


class BurnedIn(Exception):
    """The instance may show identities in its pixels: refused (the reason in ``str``)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a de-identification needs besides the data set."""

    secret: bytes  # the project's (pseudonyms.py keeps it)
    options: Options = field(default_factory=Options)
    pseudonym: Callable[[str], str] | None = None  # original PatientID -> pseudonym
    safe_private: frozenset[tuple[str, int, int]] = SAFE_PRIVATE
    allow_burned_in: bool = False


def burned_in_reason(ds: Dataset) -> str | None:
    """Why ``ds`` may carry burned-in identities, or None."""
    flag = str(ds.get("BurnedInAnnotation", "") or "").strip().upper()
    if flag == "YES":
        return "BurnedInAnnotation (0028,0301) is YES"
    if flag == "NO":
        return None
    modality = str(ds.get("Modality", "") or "").strip().upper()
    if modality in BURNING_MODALITIES:
        return f"Modality {modality} commonly burns in text and BurnedInAnnotation (0028,0301) is not NO"
    if str(ds.get("SOPClassUID", "")).startswith(SECONDARY_CAPTURE_PREFIX):
        return "a Secondary Capture image without BurnedInAnnotation (0028,0301) NO"
    return None


def date_offset(secret: bytes, patient_id: str) -> int:
    """Days (negative: 1 to 3650 into the past) every date of this patient moves under
    Retain Longitudinal Temporal Information With Modified Dates: derived from the
    project's secret and the original PatientID, so all studies of a patient, in every
    export, keep their intervals."""
    d = hmac.new(secret, b"date\0" + patient_id.encode("utf-8", "replace"), hashlib.sha256).digest()
    return -(1 + int.from_bytes(d[:8], "big") % 3650)


def shift_date(value: str, days: int) -> str | None:
    """A DA value (YYYYMMDD) moved by ``days``; None when it is not a full date."""
    v = value.strip()
    if not re.fullmatch(r"\d{8}", v):
        return None
    try:
        d = date(int(v[:4]), int(v[4:6]), int(v[6:8])) + timedelta(days=days)
    except ValueError:
        return None
    return f"{d.year:04d}{d.month:02d}{d.day:02d}"


def shift_datetime(value: str, days: int) -> str | None:
    """A DT value moved by ``days`` (its date part; time and offset kept); None when it
    has no full date."""
    v = value.strip()
    head = shift_date(v[:8], days) if len(v) >= 8 else None
    return None if head is None else head + v[8:]


class _Run:
    def __init__(self, ds: Dataset, ctx: Context) -> None:
        self.ctx = ctx
        self.options = ctx.options
        self.original_pid = str(ds.get("PatientID", "") or "")
        self.days = date_offset(ctx.secret, self.original_pid) if ctx.options.retain_modified_dates else 0
        self.pseudonym = ctx.pseudonym(self.original_pid) if ctx.pseudonym is not None else None
        self.needles = _needles(ds)

    # --- values -----------------------------------------------------------------------

    def uid(self, value: object) -> object:
        if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
            return [new_uid(self.ctx.secret, str(v)) for v in value]
        return new_uid(self.ctx.secret, str(value)) if value not in (None, "") else value

    def clean_text(self, value: object, mark: str = "*") -> object:
        if value in (None, ""):
            return value
        if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
            return [self.clean_text(v, mark) for v in value]
        text = str(value)
        for needle in self.needles:
            text = re.sub(re.escape(needle), mark, text, flags=re.IGNORECASE)
        return text

    def shifted(self, vr: str, value: object) -> object:
        if value in (None, ""):
            return value
        many = isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue"
        out = []
        for v in (value if many else [value]):
            s = shift_date(str(v), self.days) if vr == "DA" else shift_datetime(str(v), self.days)
            out.append("" if s is None else s)
        return out if many else out[0]

    # --- the walk ---------------------------------------------------------------------

    def dataset(self, ds: Dataset) -> None:
        kept_private: set[tuple[int, int]] = set()  # (group, block) with a kept element
        creators: list[int] = []
        for elem in list(ds):
            tag = int(elem.tag)
            if elem.tag.is_private:
                if 0x0010 <= (tag & 0xFFFF) <= 0x00FF:
                    creators.append(tag)
                elif self.safe(ds, elem):
                    kept_private.add((tag >> 16, (tag >> 8) & 0xFF))
                    if elem.VR == "SQ":
                        for item in elem.value:
                            self.dataset(item)
                else:
                    del ds[tag]
                continue
            if tag in (0x00100020, 0x00100010) and self.pseudonym is not None:
                if tag == 0x00100010 or str(elem.value or "") == self.original_pid:
                    elem.value = self.pseudonym
                    continue
            if tag & 0xFFFF == 0:  # a group length (PS3.5 §7.2): wrong once elements go; not needed
                del ds[tag]
                continue
            row = profile.row_for(tag)
            if row is None:
                self.keep(elem)
                continue
            self.act(ds, elem, profile.resolve(row, self.options))
        for tag in creators:
            if (tag >> 16, tag & 0xFF) not in kept_private:
                del ds[tag]

    def safe(self, ds: Dataset, elem) -> bool:
        if not self.options.retain_safe_private:
            return False
        tag = int(elem.tag)
        group, block = tag >> 16, (tag >> 8) & 0xFF
        creator = ds.get((group << 16) | block)
        if creator is None:
            return False
        return (str(creator.value).strip(), group, tag & 0xFF) in self.ctx.safe_private

    def keep(self, elem) -> None:
        if elem.VR == "SQ":
            for item in elem.value:
                self.dataset(item)

    def act(self, ds: Dataset, elem, action: str) -> None:
        vr = elem.VR
        if action == "K":
            self.keep(elem)
        elif action == "X":
            del ds[elem.tag]
        elif action == "Z":
            elem.value = Sequence() if vr == "SQ" else "" if vr in _STRING_VRS else None
        elif action in ("U", "U*") or (action == "D" and vr == "UI"):
            if vr == "SQ":
                self.keep(elem)
            elif vr == "UI":
                elem.value = self.uid(elem.value)
            else:
                self.act(ds, elem, "D")
        elif action == "D":
            if vr == "SQ":
                self.keep(elem)
            elif vr in _BYTES_VRS:
                elem.value = b"\0\0"
            else:
                elem.value = DUMMY.get(vr, "ANONYMIZED")
        elif action == "C":
            if vr == "SQ":
                self.keep(elem)
            elif vr in ("DA", "DT"):
                if self.options.retain_modified_dates:
                    elem.value = self.shifted(vr, elem.value)
                # else: a C from another option keeps the date as it is
            elif vr in _TEXT_VRS:
                elem.value = self.clean_text(elem.value, "X" if vr == "CS" else "*")  # CS: A-Z 0-9 _ space
            # other VRs (TM, numbers, bytes: overlays, curves): nothing to clean in words; kept
        else:  # pragma: no cover - the table holds no other code
            raise ValueError(f"unknown action {action!r}")


def _needles(ds: Dataset) -> list[str]:
    """Identifying values of the data set's top level, longest first (whole names and
    their components of 2+ characters)."""
    found: set[str] = set()
    for kw in _IDENTIFYING:
        value = ds.get(kw)
        if value in (None, ""):
            continue
        values: Iterable = value if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue" \
            else [value]
        for v in values:
            s = str(v).strip()
            if len(s) >= 2:
                found.add(s)
            for part in re.split(r"[\^=,\s]+", s):
                if len(part) >= 3:
                    found.add(part)
    return sorted(found, key=len, reverse=True)


def method_description(options: Options) -> list[str]:
    """The values of De-identification Method (0012,0063) (LO, each at most 64 characters)."""
    return [f"PS3.15 {profile.edition()} Basic Application Confidentiality Profile"] + [
        profile.OPTION_CODES[o][1][:64] for o in options.selected()]


def method_codes(options: Options) -> Sequence:
    """De-identification Method Code Sequence (0012,0064): CID 7050 codes."""
    items = []
    for value, meaning in [profile.BASIC_PROFILE_CODE] + [profile.OPTION_CODES[o] for o in options.selected()]:
        item = Dataset()
        item.CodeValue = value
        item.CodingSchemeDesignator = "DCM"
        item.CodeMeaning = meaning
        items.append(item)
    return Sequence(items)


def deidentify(ds: Dataset, ctx: Context) -> Dataset:
    """De-identify ``ds`` in place (see the module's docstring) and return it; raises
    :class:`BurnedIn` (``ds`` untouched) for burned-in annotation unless allowed."""
    if not ctx.allow_burned_in:
        reason = burned_in_reason(ds)
        if reason is not None:
            raise BurnedIn(reason)
    run = _Run(ds, ctx)
    run.dataset(ds)
    ds.PatientIdentityRemoved = "YES"
    ds.DeidentificationMethod = method_description(ctx.options)
    ds.DeidentificationMethodCodeSequence = method_codes(ctx.options)
    o = ctx.options
    ds.LongitudinalTemporalInformationModified = (
        "MODIFIED" if o.retain_modified_dates else "UNMODIFIED" if o.retain_full_dates else "REMOVED")
    meta = getattr(ds, "file_meta", None)
    if meta is not None and "SOPInstanceUID" in ds:
        meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    return ds

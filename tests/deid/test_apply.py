"""deid/apply.py: every attribute of Table E.1-1 gets its action (a data set holding
all of them, for several option sets), nested sequences, private tags, dates, UIDs,
burned-in annotation, pixel data."""

from __future__ import annotations

import copy
import re

import pytest
from pydicom.datadict import dictionary_VR
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from dicomweb_server.deid import profile
from dicomweb_server.deid.apply import (
    DUMMY, BurnedIn, Context, date_offset, deidentify, parse_safe_private, shift_date,
)
from dicomweb_server.deid.profile import Options
from dicomweb_server.deid.uids import new_uid
from tests.helpers import CT_IMAGE_STORAGE, make_dataset, to_bytes

SECRET = b"project-secret-1"
#: attributes deidentify() writes itself after the walk (PS3.15 E.1.1)
WRITTEN = {0x00120062, 0x00120063, 0x00120064, 0x00280303}
REF_UID = "1.2.3.4.5.6.7.8.9"


def _value(vr: str, i: int):
    return {
        "AE": f"DOE{i}", "AS": "045Y", "CS": f"DOE {i}", "DA": "20200115", "DS": "1.5", "DT": "20200115103000",
        "IS": "7", "PN": "Doe^John", "TM": "103000", "UI": f"1.2.3.4.{i}", "UR": "http://x.example/a",
        "US": 5, "SS": 5, "UL": 5, "FL": 1.0, "FD": 1.0,
    }.get(vr, b"\x01\x02" if vr in ("OB", "OW", "UN", "OB or OW", "US or OW") else f"Doe {i}")


def _item() -> Dataset:
    item = Dataset()
    item.ReferencedSOPClassUID = CT_IMAGE_STORAGE
    item.ReferencedSOPInstanceUID = REF_UID
    item.PatientName = "Doe^John"
    return item


def whole_table_dataset() -> tuple[Dataset, dict[int, object]]:
    """One data set with every fixed tag of Table E.1-1 (a valid value for its VR),
    the repeating groups, and a private element."""
    ds = Dataset()
    values: dict[int, object] = {}
    for i, (key, row) in enumerate(sorted(profile.table().items())):
        tag = {"50XXXXXX": 0x50003000, "60XX3000": 0x60003000, "60XX4000": 0x60004000}.get(key)
        if key == "private":
            continue
        tag = tag if tag is not None else int(key, 16)
        vr = dictionary_VR(tag)
        vr = "OW" if vr in ("OB or OW", "US or OW", "US or SS or OW") else vr
        value = Sequence([_item()]) if vr == "SQ" else _value(vr, i)
        ds.add_new(tag, vr, value)
        values[tag] = value
    ds.add_new(0x00090010, "LO", "ACME 1.0")
    ds.add_new(0x00091001, "LO", "Doe secret")
    ds.Modality = "CT"
    ds.SOPClassUID = CT_IMAGE_STORAGE
    return ds, values


def expected_action(tag: int, options: Options) -> str:
    """The table's action as PS3.15 E.3 states it: a chosen option's action replaces
    the Basic Profile's (K before C); combinations as profile.py documents them."""
    row = profile.row_for(tag)
    acts = [a for o, a in row.options.items() if getattr(options, o)]
    if acts:
        return "K" if "K" in acts else "C"
    return {"X/Z": "Z", "X/D": "D", "Z/D": "D", "X/Z/D": "D", "X/Z/U*": "U*"}.get(row.basic, row.basic)


OPTION_SETS = [
    Options(),
    Options(retain_modified_dates=True, clean_descriptors=True, clean_structured_content=True,
            clean_graphics=True),
    Options(retain_full_dates=True, retain_uids=True, retain_device_identity=True,
            retain_institution_identity=True, retain_patient_characteristics=True),
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=["basic", "modified+clean", "retain-all"])
def test_every_attribute_of_table_e1_1_gets_its_action(options):
    ds, values = whole_table_dataset()
    original_pid = values[0x00100020]
    deidentify(ds, Context(SECRET, options))
    days = date_offset(SECRET, original_pid)
    seen = {}
    for tag, original in values.items():
        if tag in WRITTEN:
            continue
        action = expected_action(tag, options)
        seen[action] = seen.get(action, 0) + 1
        vr = dictionary_VR(tag)
        vr = "OW" if vr in ("OB or OW", "US or OW", "US or SS or OW") else vr
        where = f"{profile.row_for(tag).name} ({tag:08X}) {action}"
        if action == "X":
            assert tag not in ds, where
            continue
        assert tag in ds, where
        got = ds[tag].value
        if vr == "SQ":
            if action == "Z":
                assert len(got) == 0, where
            else:  # kept, its item de-identified: the UID replaced unless retained, the name emptied
                item = got[0]
                want_uid = REF_UID if options.retain_uids else new_uid(SECRET, REF_UID)
                assert item.ReferencedSOPInstanceUID == want_uid, where
                assert item.ReferencedSOPClassUID == CT_IMAGE_STORAGE, where
                assert item.PatientName == "", where
        elif action == "K":
            assert got == original, where
        elif action == "Z":
            assert got in (None, "", b""), where
        elif action == "U" or (action == "D" and vr == "UI"):
            assert got == new_uid(SECRET, original) and got.startswith("2.25."), where
        elif action == "D":
            assert got == (b"\0\0" if vr in ("OB", "OW", "UN") else DUMMY[vr]), where
        elif action == "C":
            if vr == "DA":
                assert got == shift_date(original, days), where
            elif vr == "DT":
                assert got == shift_date(original[:8], days) + original[8:], where
            elif vr in ("TM", "OB", "OW", "US", "AS", "DS", "IS"):
                assert got == original, where
            else:
                assert "doe" not in str(got).lower() and got != original, where
        else:
            raise AssertionError(where)
    assert 0x00091001 not in ds and 0x00090010 not in ds  # private: removed
    assert sum(seen.values()) == 621 - 1 - len(WRITTEN & set(values))  # every row but "private"
    assert ds.PatientIdentityRemoved == "YES"


def test_method_codes_name_the_options_used():
    ds = make_dataset()
    deidentify(ds, Context(SECRET, Options(retain_modified_dates=True, clean_descriptors=True)))
    assert [(i.CodeValue, i.CodingSchemeDesignator) for i in ds.DeidentificationMethodCodeSequence] == [
        ("113100", "DCM"), ("113107", "DCM"), ("113105", "DCM")]
    assert ds.DeidentificationMethod[0] == "PS3.15 2024b Basic Application Confidentiality Profile"
    assert ds.LongitudinalTemporalInformationModified == "MODIFIED"
    assert ds.PatientIdentityRemoved == "YES"


def test_nested_sequences_at_any_depth():
    ds = make_dataset()
    inner = Dataset()
    inner.PatientName = "Doe^John"
    inner.InstitutionName = "St Elsewhere"
    inner.ReferencedSOPInstanceUID = REF_UID
    inner.StudyDate = "20200101"
    middle = Dataset()
    middle.ContentSequence = Sequence([inner])  # D: kept, items de-identified
    middle.PatientAddress = "1 Main St"  # X
    middle.OperatorsName = "Smith"  # X/D
    ds.ReferencedImageSequence = Sequence([middle])  # X/Z/U*
    deidentify(ds, Context(SECRET))
    got = ds.ReferencedImageSequence[0]
    assert "PatientAddress" not in got and got.OperatorsName == "ANONYMIZED"
    deep = got.ContentSequence[0]
    assert deep.PatientName == "" and deep.InstitutionName == "ANONYMIZED" and deep.StudyDate == ""
    assert deep.ReferencedSOPInstanceUID == new_uid(SECRET, REF_UID)


def test_private_tags_removed_unless_safe_listed():
    ds = make_dataset()
    ds.add_new(0x00090010, "LO", "ACME 1.0")
    ds.add_new(0x00091001, "LO", "Doe secret")
    ds.add_new(0x00091002, "DS", "2.5")
    ds.add_new(0x00110010, "LO", "OTHER")
    ds.add_new(0x00111001, "LO", "x")
    item = Dataset()
    item.add_new(0x00090010, "LO", "ACME 1.0")
    item.add_new(0x00091002, "DS", "2.5")
    ds.ReferencedImageSequence = Sequence([item])
    kept = copy.deepcopy(ds)
    deidentify(ds, Context(SECRET))
    assert not any(e.tag.is_private for e in ds) and not any(e.tag.is_private for e in ds.ReferencedImageSequence[0])
    safe = frozenset({parse_safe_private("ACME 1.0:0009:02")})
    assert safe == {("ACME 1.0", 0x0009, 0x02)}
    for bad in ("ACME:0008:02", "0009:02", "ACME:0009:1FF", "ACME:zz:02"):
        with pytest.raises(ValueError, match="expected CREATOR:gggg:ee"):
            parse_safe_private(bad)
    deidentify(kept, Context(SECRET, Options(retain_safe_private=True), safe_private=safe))
    assert [(int(e.tag), e.value) for e in kept if e.tag.is_private] == [(0x00090010, "ACME 1.0"),
                                                                        (0x00091002, 2.5)]
    assert [int(e.tag) for e in kept.ReferencedImageSequence[0] if e.tag.is_private] == [0x00090010, 0x00091002]


def test_dates_shift_by_one_offset_per_patient():
    a = make_dataset(PatientID="P1", StudyDate="20240110", AcquisitionDateTime="20240110120000.5+0100")
    b = make_dataset(PatientID="P1", StudyDate="20240301")
    c = make_dataset(PatientID="P2", StudyDate="20240110")
    opts = Options(retain_modified_dates=True)
    for ds in (a, b, c):
        deidentify(ds, Context(SECRET, opts))
    days = date_offset(SECRET, "P1")
    assert -3650 <= days <= -1
    assert a.StudyDate == shift_date("20240110", days) and b.StudyDate == shift_date("20240301", days)
    assert a.AcquisitionDateTime == shift_date("20240110", days) + "120000.5+0100"
    from datetime import date
    da = date(int(a.StudyDate[:4]), int(a.StudyDate[4:6]), int(a.StudyDate[6:]))
    db = date(int(b.StudyDate[:4]), int(b.StudyDate[4:6]), int(b.StudyDate[6:]))
    assert (db - da).days == 51  # the interval between the patient's studies is kept
    assert c.StudyDate == shift_date("20240110", date_offset(SECRET, "P2")) != a.StudyDate
    assert shift_date("20240301", -1) == "20240229"


def test_clean_descriptors_removes_the_patients_name_from_texts():
    ds = make_dataset(PatientName="Doe^John", StudyDescription="CT chest for John Doe",
                      SeriesDescription="axial")
    deidentify(ds, Context(SECRET, Options(clean_descriptors=True)))
    assert ds.StudyDescription == "CT chest for * *" and ds.SeriesDescription == "axial"


def test_pixel_data_byte_identical_and_file_meta_follows():
    ds = make_dataset(PatientName="Doe^John")
    ds.add_new(0x00100000, "UL", 40)  # a group length, stale once the group's elements go
    pixels = ds.PixelData
    deidentify(ds, Context(SECRET))
    assert ds.PixelData is pixels
    assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID
    assert ds.SOPClassUID == CT_IMAGE_STORAGE  # well-known UID kept
    assert 0x00100000 not in ds
    to_bytes(ds)  # still a writable PS3.10 file


@pytest.mark.parametrize("attrs,reason", [
    ({"BurnedInAnnotation": "YES"}, "BurnedInAnnotation (0028,0301) is YES"),
    ({"modality": "US"}, "Modality US commonly burns in text"),
    ({"modality": "SC"}, "Modality SC"),
    ({"modality": "XA"}, "Modality XA"),
])
def test_burned_in_refused_unless_allowed(attrs, reason):
    ds = make_dataset(**attrs)
    before = copy.deepcopy(ds)
    with pytest.raises(BurnedIn, match=re.escape(reason)):
        deidentify(ds, Context(SECRET))
    assert ds == before  # untouched
    deidentify(ds, Context(SECRET, allow_burned_in=True))
    assert ds.PatientIdentityRemoved == "YES"
    assert make_dataset(modality="US", BurnedInAnnotation="NO") and deidentify(
        make_dataset(modality="US", BurnedInAnnotation="NO"), Context(SECRET)).PatientName == ""

"""Table E.1-1 of PS3.15 2024b as data: every row there, with the counts of the
standard's table (checked when generated against an independent transcription, see
scripts/gen_deid_table.py)."""

from collections import Counter

import pytest

from dicomweb_server.deid import profile
from dicomweb_server.deid.profile import Options


def test_the_whole_table_of_the_2024b_edition():
    t = profile.table()
    assert profile.edition() == "2024b"
    assert len(t) == 621
    assert Counter(r.basic for r in t.values()) == {
        "X": 384, "D": 92, "U": 54, "Z": 42, "X/D": 22, "X/Z": 11, "X/Z/D": 8, "Z/D": 6, "X/Z/U*": 2}
    columns = Counter(o for r in t.values() for o in r.options)
    assert columns == {"retain_full_dates": 165, "retain_modified_dates": 165, "clean_descriptors": 125,
                       "retain_uids": 59, "retain_device_identity": 57, "retain_patient_characteristics": 13,
                       "retain_institution_identity": 10, "clean_graphics": 4, "clean_structured_content": 3,
                       "retain_safe_private": 1}
    assert {"50XXXXXX", "60XX3000", "60XX4000", "private"} <= set(t)


@pytest.mark.parametrize("tag,basic,options", [
    (0x00100010, "Z", {}),  # Patient's Name
    (0x00100020, "Z/D", {}),  # Patient ID
    (0x00080050, "Z", {}),  # Accession Number
    (0x0020000D, "U", {"retain_uids": "K"}),
    (0x00080020, "Z", {"retain_full_dates": "K", "retain_modified_dates": "C"}),
    (0x00080080, "X/Z/D", {"retain_institution_identity": "K"}),
    (0x00081140, "X/Z/U*", {"retain_uids": "K"}),
    (0x00081030, "X", {"clean_descriptors": "C"}),
    (0x0040A730, "D", {"clean_structured_content": "C"}),
    (0x00101010, "X", {"retain_patient_characteristics": "K"}),
])
def test_rows_as_the_standard_prints_them(tag, basic, options):
    row = profile.row_for(tag)
    assert (row.basic, row.options) == (basic, options)


def test_repeating_groups_and_resolution():
    assert profile.row_for(0x60023000).name == "Overlay Data"
    assert profile.row_for(0x50100005).name == "Curve Data"
    assert profile.row_for(0x60013000) is None  # odd group: private, not an overlay
    r = profile.row_for
    assert profile.resolve(r(0x00080080), Options()) == "D"
    assert profile.resolve(r(0x00080080), Options(retain_institution_identity=True)) == "K"
    assert profile.resolve(r(0x00080022), Options()) == "Z"  # X/Z
    assert profile.resolve(r(0x00081140), Options()) == "U*"
    assert profile.resolve(r(0x00181002), Options(retain_device_identity=True)) == "K"  # Device UID
    assert profile.resolve(r(0x00080020), Options(retain_modified_dates=True)) == "C"


def test_parse_and_bad_names():
    assert profile.parse("basic,retain_modified_dates", ["clean-descriptors"]) == Options(
        retain_modified_dates=True, clean_descriptors=True)
    with pytest.raises(ValueError, match="unknown de-identification profile"):
        profile.parse("strict")
    with pytest.raises(ValueError, match="unknown de-identification option 'retain_everything'"):
        profile.parse("basic,retain_everything")
    with pytest.raises(ValueError, match="exclusive"):
        profile.parse("basic,retain_full_dates,retain_modified_dates")

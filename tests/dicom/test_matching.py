"""QIDO-RS query parsing (PS3.18 §8.3.4) and matching (PS3.4 C.2.2.2)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from dicomweb_server.dicom.attributes import BY_KEYWORD
from dicomweb_server.dicom.matching import (
    QueryError, match_value, normalize_datetime, normalize_time, parse_query, wildcard_regex,
)


def p(level="study", **params):
    return parse_query(level, list(params.items()))


def test_keyword_and_tag_are_the_same_key():
    assert p(PatientID="X").matches == parse_query("study", [("00100020", "X")]).matches


def test_match_types():
    (m,) = p(StudyDate="20200101-").matches
    assert (m.type, m.values) == ("range", ("20200101", None))
    (m,) = p(PatientName="doe*").matches
    assert (m.type, m.values) == ("wildcard", ("DOE*",))
    (m,) = p(StudyInstanceUID="1.2,1.3").matches
    assert (m.type, m.values) == ("list", ("1.2", "1.3"))
    (m,) = p(PatientID="").matches
    assert m.type == "universal"
    (m,) = p(StudyTime="10").matches
    assert m.values == ("100000.000000", "105959.999999")


def test_includefield_limit_offset():
    q = parse_query("study", [("includefield", "00281050,WindowWidth"), ("includefield", "all"),
                              ("limit", "5"), ("offset", "2"), ("fuzzymatching", "true")])
    assert q.includefields == ("00281050", "00281051")
    assert q.include_all and q.fuzzy and (q.limit, q.offset, q.limited) == (5, 2, False)
    q = parse_query("study", [("limit", "5000")], max_results=100)
    assert (q.limit, q.limited) == (100, True)


def test_time_normalisation():
    assert normalize_time("0930") == "093000.000000"
    assert normalize_time("093000.5") == "093000.500000"
    assert normalize_time("09", upper=True) == "095959.999999"
    assert normalize_time("9:30") is None
    assert normalize_datetime("2020") == "20200101000000.000000"
    assert normalize_datetime("202002", upper=True) == "20200231235959.999999"  # a bound, not a date
    assert normalize_datetime("20200101120000-0500") == "20200101120000.000000"


@pytest.mark.parametrize("params", [
    {"Modality": "CT", "level": "series", "SOPInstanceUID": "1.2"},
])
def test_deeper_level_keys_are_rejected(params):
    with pytest.raises(QueryError, match="instance-level"):
        parse_query("series", [("SOPInstanceUID", "1.2")])


def test_wildcards():
    assert wildcard_regex("D?E*").match("DOE^JOHN")
    assert not wildcard_regex("D?E").match("DOES")
    assert wildcard_regex("a.b*").match("a.bc") and not wildcard_regex("a.b*").match("axbc")


def test_match_value_range_and_empty():
    (m,) = p(StudyDate="20200101-20200615").matches
    assert match_value(m, "20200101") and match_value(m, "20200615")
    assert not match_value(m, None) and not match_value(m, "garbage")


@given(st.lists(st.tuples(st.sampled_from(["PatientID", "StudyDate", "StudyTime", "PatientName", "limit",
                                           "offset", "includefield", "fuzzymatching", "StudyInstanceUID",
                                           "ModalitiesInStudy", "00100020", "bogus", "AcquisitionDateTime",
                                           "TimezoneOffsetFromUTC", "StudyDate", "00400275.00401001",
                                           "RequestAttributesSequence.StudyInstanceUID"]),
                          st.text(max_size=20)), max_size=6))
def test_parser_never_raises_anything_but_query_error(params):
    try:
        parse_query("instance", params)
    except QueryError:
        pass


@given(st.text(alphabet="0123456789-.", max_size=24))
def test_temporal_values_parse_or_400(value):
    for kw in ("StudyDate", "StudyTime", "AcquisitionDateTime"):
        try:
            q = parse_query("instance", [(kw, value)])
        except QueryError:
            continue
        for m in q.matches:
            assert m.attribute is BY_KEYWORD[kw]


def glob_reference(pattern: str, text: str) -> bool:
    """PS3.4 C.2.2.2.4 by dynamic programming: ``*`` any run, ``?`` one character."""
    row = [True] + [False] * len(text)
    for p in pattern:
        if p == "*":
            for j in range(1, len(text) + 1):
                row[j] = row[j] or row[j - 1]
        else:
            row = [False] + [row[j] and (p == "?" or p == text[j]) for j in range(len(text))]
    return row[-1]


@given(st.text(alphabet="ab*?[]\\.^$", max_size=10), st.text(alphabet="ab[]\\.^$\n", max_size=12))
def test_wildcard_regex_is_exact(pattern, text):
    assert (wildcard_regex(pattern).match(text) is not None) == glob_reference(pattern, text)


def test_wildcard_values_are_capped_and_collapsed():
    (m,) = p(StudyDescription="a***b**").matches
    assert (m.type, m.values) == ("wildcard", ("a*b*",))
    assert p(StudyDescription="***").matches[0].type == "universal"
    for params in ({"StudyDescription": "*" * 257}, {"PatientName": "x" * 257}, {"InstanceNumber": "1" * 20},
                   {"StudyInstanceUID": ",".join(["1.2"] * 1001)}, {"PatientID": "a\x00"},
                   {"InstanceNumber": "١"}, {"InstanceNumber": "1_000"}):
        with pytest.raises(QueryError):
            parse_query("instance", list(params.items()))
    assert wildcard_regex("*?" * 128 + "#").match("A" * 256) is None  # O(n*m): no catastrophic backtracking


def test_fuzzy_words_split_at_commas_too():
    (m,) = p(PatientName="Doe,John", fuzzymatching="true").matches
    assert match_value(m, "DOE,JOHN", fuzzy=True) and match_value(m, "JOHN^DOE", fuzzy=True)
    assert not match_value(m, "DOEJOHN", fuzzy=True)


def test_sequence_keys_are_grouped_into_one_item_match():
    q = parse_query("series", [("RequestAttributesSequence.RequestedProcedureID", "XYZ"),
                               ("00400275.00400009", "S*"), ("RequestAttributesSequence.StudyInstanceUID", "1.2,1.3"),
                               ("RequestAttributesSequence", "")])
    (m,) = q.matches
    assert (m.attribute.keyword, m.type) == ("RequestAttributesSequence", "sequence")
    assert [(k.attribute.keyword, k.type, k.values) for k in m.values] == [
        ("RequestedProcedureID", "single", ("XYZ",)), ("ScheduledProcedureStepID", "wildcard", ("S*",)),
        ("StudyInstanceUID", "list", ("1.2", "1.3"))]
    items = [{"RequestedProcedureID": "XYZ", "ScheduledProcedureStepID": "T1", "StudyInstanceUID": "1.2"},
             {"RequestedProcedureID": "ABC", "ScheduledProcedureStepID": "S1", "StudyInstanceUID": "1.3"}]
    assert not match_value(m, items)  # every key must hold in one item
    items[0]["ScheduledProcedureStepID"] = "S2"
    assert match_value(m, items) and not match_value(m, None)
    assert p("series", RequestAttributesSequence="").matches[0].type == "universal"
    assert parse_query("series", [("RequestAttributesSequence.RequestedProcedureID", "*")]).matches[0].type == "universal"


@pytest.mark.parametrize("name, value, message", [
    ("RequestAttributesSequence", "XYZ", "is a sequence"),
    ("PatientID.PatientName", "X", "not a sequence"),
    ("RequestAttributesSequence.PatientName", "X", "not supported"),
    ("RequestAttributesSequence.RequestedProcedureID.X", "1", "one level"),
    ("RequestAttributesSequence.Bogus", "1", "neither a DICOM keyword"),
])
def test_bad_sequence_keys(name, value, message):
    with pytest.raises(QueryError, match=message):
        parse_query("instance", [(name, value)])
    with pytest.raises(QueryError, match="series-level"):
        parse_query("study", [("RequestAttributesSequence.RequestedProcedureID", "X")])


# --- time zones (PS3.5 §6.2, PS3.3 C.12.1.1.8, PS3.4 C.4.1.1.3.1) ----------------------------


def test_offsets_and_utc():
    from dicomweb_server.dicom.timezones import dt_offset, parse_offset, to_utc

    assert [parse_offset(v) for v in ("+0100", "-0530", "+1400", "-1200", "+1401", "0100", "+0160", "", None)] == [
        60, -330, 840, -720, None, None, None, None, None]
    assert to_utc("20200101003000.000000", 60) == "20191231233000.000000"  # back over a year's end
    assert to_utc("20200228233000.000000", -60) == "20200229003000.000000"  # a leap day
    assert to_utc("20200231235959.999999", -60) == "20200301005959.999999"  # an upper bound past the month's end
    assert to_utc("00010101000000.000000", 60) == "00010101000000.000000"  # out of range: unchanged
    assert [dt_offset(v) for v in ("20200101120000-0500", "20200101+0100", "2020", "20200101", "2019-2020")] == [
        -300, 60, None, None, None]


def test_derived_date_time_columns():
    from dicomweb_server.dicom.matching import level_values

    meta = {"00080020": {"vr": "DA", "Value": ["20200102"]}, "00080030": {"vr": "TM", "Value": ["0030"]},
            "00080201": {"vr": "SH", "Value": ["+0100"]},
            "0008002A": {"vr": "DT", "Value": ["20200101120000-0500"]}}
    study = level_values(meta, "study")
    assert (study["_StudyDateTime"], study["_StudyDateTimeUTC"]) == ("20200102003000.000000", "20200101233000.000000")
    assert level_values(meta, "instance")["_AcquisitionDateTimeUTC"] == "20200101170000.000000"  # own offset wins
    del meta["00080201"], meta["00080030"]  # no offset: as stored; no time: the day's start
    assert level_values(meta, "study")["_StudyDateTimeUTC"] == "20200102000000.000000"
    assert level_values({}, "study")["_StudyDateTimeUTC"] is None


def test_query_offset_and_combined_ranges():
    (m,) = p(StudyDate="20200101-20200102", StudyTime="2200-0200").matches  # PS3.4 C.2.2.2.5.1
    assert (m.attribute.keyword, m.values) == ("_StudyDateTime", ("20200101220000.000000", "20200102020059.999999"))
    q = p(StudyDate="20200101", TimezoneOffsetFromUTC="+0100")
    assert q.timezone_offset == 60 and "00080020" in q.includefields and "00080201" in q.includefields
    (m,) = q.matches
    assert (m.attribute.keyword, m.values) == ("_StudyDateTimeUTC", ("20191231230000.000000", "20200101225959.999999"))
    (m,) = p("instance", AcquisitionDateTime="20200101120000+0100-").matches
    assert (m.attribute.keyword, m.values) == ("_AcquisitionDateTimeUTC", ("20200101110000.000000", None))
    # unchanged: a date alone, a single date with a time, a time alone, without an offset
    assert [m.attribute.keyword for m in p(StudyDate="20200101", StudyTime="10-").matches] == ["StudyDate", "StudyTime"]
    assert [m.attribute.keyword for m in p(StudyTime="10", TimezoneOffsetFromUTC="+0100").matches] == ["StudyTime"]
    for bad in ("0100", "+2500", "UTC"):
        with pytest.raises(QueryError, match="TimezoneOffsetFromUTC"):
            p(TimezoneOffsetFromUTC=bad)


# --- calendar validity of DA/TM/DT keys (PS3.5 Table 6.2-1) --------------------------------------


_BAD = "is not a valid {} value or range: {} (PS3.5 Table 6.2-1)"


@pytest.mark.parametrize("level, key, value, message", [
    ("study", "StudyDate", "20201345", _BAD.format("date", "month 13 is not 01-12")),
    ("study", "StudyDate", "20200230", _BAD.format("date", "day 30 is not 01-29 in 2020-02")),
    ("study", "StudyDate", "20210229", _BAD.format("date", "day 29 is not 01-28 in 2021-02")),
    ("study", "StudyDate", "99999999", _BAD.format("date", "month 99 is not 01-12")),
    ("study", "StudyDate", "00000000", _BAD.format("date", "month 00 is not 01-12")),
    ("study", "StudyDate", "20200100", _BAD.format("date", "day 00 is not 01-31 in 2020-01")),
    ("study", "StudyDate", "20201345-", _BAD.format("date", "month 13 is not 01-12")),
    ("study", "StudyDate", "20200101-20201345", _BAD.format("date", "month 13 is not 01-12")),
    ("study", "PatientBirthDate", "19991399", _BAD.format("date", "month 13 is not 01-12")),
    ("study", "StudyTime", "256199", _BAD.format("time", "hour 25 is not 00-23")),
    ("study", "StudyTime", "25", _BAD.format("time", "hour 25 is not 00-23")),
    ("study", "StudyTime", "1261", _BAD.format("time", "minute 61 is not 00-59")),
    ("study", "StudyTime", "120061", _BAD.format("time", "second 61 is not 00-60")),
    ("study", "StudyTime", "-2400", _BAD.format("time", "hour 24 is not 00-23")),
    ("instance", "AcquisitionDateTime", "20201345250000", _BAD.format("datetime", "month 13 is not 01-12")),
    ("instance", "AcquisitionDateTime", "2020010125", _BAD.format("datetime", "hour 25 is not 00-23")),
    ("instance", "AcquisitionDateTime", "20200101120000+1500",
     _BAD.format("datetime", "UTC offset +1500 is not -1200 to +1400")),
])
def test_impossible_dates_and_times_are_refused(level, key, value, message):
    """They used to be searched for and match nothing (200 []); over DIMSE a Success."""
    with pytest.raises(QueryError) as e:
        parse_query(level, [(key, value)])
    assert str(e.value) == f"{key}: {value!r} {message}"


@pytest.mark.parametrize("key, value, values", [
    ("StudyDate", "20200229", ("20200229",)),  # a leap year
    ("StudyDate", "20000229", ("20000229",)),
    ("StudyDate", "20201231-", ("20201231", None)),
    ("StudyTime", "235960", ("235960.000000", "235960.999999")),  # a leap second
    ("StudyTime", "23", ("230000.000000", "235959.999999")),  # truncated: the hour
    ("StudyTime", "0000-2359", ("000000.000000", "235959.999999")),
    ("AcquisitionDateTime", "202002", ("20200201000000.000000", "20200231235959.999999")),
    ("AcquisitionDateTime", "20200101120000-1200", ("20200102000000.000000", "20200102000000.999999")),
])
def test_valid_dates_and_times_stay_valid(key, value, values):
    (m,) = parse_query("instance", [(key, value)]).matches
    assert m.values == values


def test_a_plus_read_as_a_space_is_named():
    """``+`` in a query string is a space (application/x-www-form-urlencoded): curl users
    typing ``+0100`` get a message that says so, and only then."""
    with pytest.raises(QueryError) as e:
        parse_query("instance", [("AcquisitionDateTime", "20200101120000 0100-")])
    assert str(e.value) == ("AcquisitionDateTime: '20200101120000 0100-' is not a valid datetime value or range "
                            "(a '+' in a URL's query string is read as a space: send it as %2B)")
    with pytest.raises(QueryError) as e:
        parse_query("instance", [("TimezoneOffsetFromUTC", " 0100")])
    assert str(e.value) == ("TimezoneOffsetFromUTC: ' 0100' is not an offset +hhmm or -hhmm (-1200 to +1400) "
                            "(a '+' in a URL's query string is read as a space: send it as %2B)")
    with pytest.raises(QueryError) as e:
        parse_query("instance", [("AcquisitionDateTime", "2020 01")])
    assert "%2B" not in str(e.value)


# --- parameter names and single-valued parameters (PS3.18 §8.3.4) -----------------------------


@pytest.mark.parametrize("value", ["x", ""])
def test_an_empty_parameter_name_is_refused(value):
    """pydicom maps the keyword '' to 300A0782: ``?=x`` was refused as that attribute."""
    with pytest.raises(QueryError) as e:
        parse_query("study", [("", value)])
    assert str(e.value) == f"empty parameter name in {'=' + value!r}"


@pytest.mark.parametrize("params, message", [
    ([("limit", "1"), ("limit", "2")], "limit is given more than once"),
    ([("limit", "1"), ("LIMIT", "1")], "limit is given more than once"),
    ([("offset", "0"), ("offset", "1")], "offset is given more than once"),
    ([("fuzzymatching", "true"), ("fuzzymatching", "false")], "fuzzymatching is given more than once"),
    ([("TimezoneOffsetFromUTC", "+0100"), ("00080201", "+0100")], "TimezoneOffsetFromUTC is given more than once"),
])
def test_a_repeated_single_valued_parameter_is_refused(params, message):
    """The last one won: ``limit=1&limit=2`` answered 2 results."""
    with pytest.raises(QueryError) as e:
        parse_query("study", params)
    assert str(e.value) == message
    q = parse_query("study", [("includefield", "PatientAge"), ("includefield", "PatientSize")])  # repeatable
    assert {"00101010", "00101020"} <= set(q.includefields)


@pytest.mark.parametrize("level, key, message", [
    ("series", "SOPInstanceUID", "SOPInstanceUID is an instance-level attribute; it cannot be matched in a series search"),
    ("study", "Modality", None),  # an alias of ModalitiesInStudy at the study level
    ("study", "SeriesInstanceUID", "SeriesInstanceUID is a series-level attribute; it cannot be matched in a study search"),
])
def test_the_level_of_an_attribute_takes_its_article(level, key, message):
    if message is None:
        parse_query(level, [(key, "CT")])
        return
    with pytest.raises(QueryError) as e:
        parse_query(level, [(key, "1.2.3")])
    assert str(e.value) == message


def test_keyword_tag_refuses_what_is_no_keyword():
    from dicomweb_server.dicom.attributes import keyword_tag, level_article

    assert keyword_tag("PatientID") == 0x00100020
    assert [keyword_tag(k) for k in ("", " ", "00100020", "patientid", "PatientID ", "Bogus")] == [None] * 6
    assert [level_article(lv) for lv in ("study", "series", "instance")] == ["a", "a", "an"]


def test_the_utc_bounds_split_a_dt_range_where_its_match_did():
    """``20200101-0100-1300``: split after ``20200101`` the upper bound has an offset of
    -1300 (no offset: PS3.5 §6.2), so the range is ``20200101-0100`` (at -0100) to the year
    1300. The UTC conversion read its bounds from the first split of the right shape and
    left the range unconverted."""
    (m,) = parse_query("instance", [("AcquisitionDateTime", "20200101-0100-1300")]).matches
    assert (m.attribute.keyword, m.values) == ("_AcquisitionDateTimeUTC",
                                               ("20200101010000.000000", "13001231235959.999999"))

"""The indexes answer alike: the same random data (conflicting UIDs, odd names,
dates and modalities included) stored in a memory, a SQLite and a PostgreSQL index, the same random
queries (wildcards, fuzzy names, ranges, UID lists, person-name case, sequence items,
combined date-time ranges, query and instance time-zone offsets) before and after
a random DELETE; every answer must be equal, down to the study/series JSON returned."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid

from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.matching import QueryError, parse_query
from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.postgresql import PostgreSQLIndex
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.helpers import MR_IMAGE_STORAGE, make_dataset
from tests.postgres import skipped

STUDIES = [generate_uid() for _ in range(3)]
SERIES = [generate_uid() for _ in range(4)]
SOPS = [generate_uid() for _ in range(8)]

TEXT = st.text(alphabet="aAbB*?[]^,= %_\\é", max_size=8)
NAMES = st.one_of(st.sampled_from(["Doe^John", "DOE^JOHN", "Doe,John", "doe john", "Müller^Jörg", "",
                                   "Roe^Jane=Roe^J", "O'Neil^Pat", "[x]^y*", "Doe^Johnny^^Dr"]), TEXT)
DATES = st.sampled_from(["20200101", "20201231", "19991231", "2020-01-01", "2020", "", "2020010", "0",
                         "20200101\\20200102"])
TIMES = st.sampled_from(["101010", "1010", "10", "235959.5", "9:30", "", "25"])
MODALITIES = st.sampled_from(["CT", "MR", "CT\\PT", "", "ct", "SR"])
INTS = st.sampled_from(["1", "2", "-3", "007", "99999999999", "", "+2"])

def _request_attributes(items: tuple[tuple[str, str], ...]) -> list[Dataset]:
    out = []
    for rp, sps in items:
        ds = Dataset()
        ds.RequestedProcedureID, ds.ScheduledProcedureStepID = rp, sps
        out.append(ds)
    return out


REQUEST_ITEMS = st.lists(st.tuples(st.sampled_from(["XYZ", "ABC", "", "x*"]), st.sampled_from(["S1", "S2", ""])),
                         max_size=3).map(lambda items: _request_attributes(tuple(items)))

INSTANCE = st.fixed_dictionaries({
    "study": st.sampled_from(STUDIES), "series": st.sampled_from(SERIES), "sop": st.sampled_from(SOPS),
    "modality": MODALITIES, "sop_class": st.sampled_from([MR_IMAGE_STORAGE, "1.2.840.10008.5.1.4.1.1.2"]),
    "PatientName": NAMES, "ReferringPhysicianName": NAMES, "PatientID": st.sampled_from(["A", "B", "a", ""]),
    "StudyDate": DATES, "StudyTime": TIMES, "StudyDescription": TEXT, "SeriesDescription": TEXT,
    "SeriesNumber": INTS, "InstanceNumber": INTS, "AcquisitionDateTime": st.sampled_from(
        ["20200101101010", "2020", "20200101101010.5+0100", "", "x"]),
    "TimezoneOffsetFromUTC": st.sampled_from(["+0100", "-0500", "+0000", "", "x"]),
    "RequestAttributesSequence": REQUEST_ITEMS,
})

KEYS = {
    "PatientName": st.one_of(NAMES, st.sampled_from(["doe", "john", "doe*", "*john", "d?e^*", "DOE,JOHN", "j*"])),
    "ReferringPhysicianName": NAMES,
    "StudyDescription": st.one_of(TEXT, st.sampled_from(["*?*?*?*?*?*?*?*?*#", "**", "*a*", "a?"])),
    "SeriesDescription": TEXT,
    "PatientID": st.sampled_from(["A", "a", "*", "A*", "?"]),
    "StudyDate": st.sampled_from(["20200101", "20200101-", "-20200101", "19990101-20201231", "2020-01-01"]),
    "StudyTime": st.sampled_from(["10", "1010-", "-10", "0000-2359", "101010"]),
    "AcquisitionDateTime": st.sampled_from(["2020", "2020-", "-20191231", "20200101101010"]),
    "ModalitiesInStudy": st.sampled_from(["CT", "MR,PT", "CT\\SR", "ct", "PT"]),
    "Modality": st.sampled_from(["CT", "MR", "CT\\PT", "PT"]),
    "StudyInstanceUID": st.lists(st.sampled_from(STUDIES), min_size=1, max_size=3).map(",".join),
    "SeriesInstanceUID": st.lists(st.sampled_from(SERIES), min_size=1, max_size=3).map("\\".join),
    "SOPInstanceUID": st.sampled_from(SOPS),
    "SeriesNumber": INTS, "InstanceNumber": INTS,
    "NumberOfStudyRelatedInstances": st.sampled_from(["1", "2", "3"]),
    "NumberOfSeriesRelatedInstances": st.sampled_from(["1", "2"]),
    "SOPClassesInStudy": st.just(MR_IMAGE_STORAGE),
    "TimezoneOffsetFromUTC": st.sampled_from(["+0100", "-0100", "+0000"]),
    "RequestAttributesSequence.RequestedProcedureID": st.sampled_from(["XYZ", "X*", "ABC", "x?"]),
    "RequestAttributesSequence.ScheduledProcedureStepID": st.sampled_from(["S1", "S*"]),
}

QUERY = st.tuples(
    st.sampled_from(["study", "series", "instance"]),
    st.dictionaries(st.sampled_from(sorted(KEYS)), st.none(), max_size=3).flatmap(
        lambda keys: st.fixed_dictionaries({k: KEYS[k] for k in keys})),
    st.booleans(),  # fuzzymatching
    st.sampled_from([None, 0, 1]),  # index of a study to scope to (path parameter)
    st.sampled_from([(None, None), ("2", "0"), ("1", "1")]),  # limit, offset
)


def answers(index, query):
    return [(h.study_uid, h.series_uid, h.sop_uid, h.study_json, h.series_json, h.instance_json, h.computed)
            for h in index.search(query)]


def compare(indexes, queries) -> None:
    for level, params, fuzzy, scope, (limit, offset) in queries:
        items = list(params.items()) + [("fuzzymatching", str(fuzzy).lower())]
        if limit is not None:
            items += [("limit", limit), ("offset", offset)]
        try:
            query = parse_query(level, items, study_uid=None if scope is None else STUDIES[scope])
        except QueryError:
            continue
        mem, *sql = (answers(i, query) for i in indexes)
        for other in sql:
            assert mem == other, (level, items)


@pytest.fixture(scope="module")
def postgres_or_none(request):
    """The test PostgreSQL server, or None when DICOMWEB_POSTGRES=skip."""
    return None if skipped() else request.getfixturevalue("postgres")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(INSTANCE, min_size=1, max_size=7), st.lists(QUERY, min_size=1, max_size=8),
       st.sampled_from(["study", "series", "instance"]), st.integers(0, 6))
def test_memory_and_sqlite_give_the_same_answers(postgres_or_none, instances, queries, delete_level, victim):
    with tempfile.TemporaryDirectory() as tmp:
        records = []
        for i, spec in enumerate(instances):
            ds = make_dataset(SpecificCharacterSet="ISO_IR 192", **spec)
            path = Path(tmp) / f"{i}.dcm"
            ds.save_as(path, enforce_file_format=True)
            records.append(describe_instance(path))
        indexes = (MemoryIndex(), SQLiteIndex(Path(tmp) / "index.sqlite"))
        if postgres_or_none is not None:
            indexes += (PostgreSQLIndex(postgres_or_none.fresh_url(), pool_size=2),)
        try:
            # in two batches, as two requests would be: refusals must also agree
            half = len(records) // 2
            for batch in (records[:half], records[half:]):
                mem, *sql = ([getattr(r, "reason", r) for r in i.add(batch)] for i in indexes)
                assert all(mem == other for other in sql)
            compare(indexes, queries)
            rec = records[victim % len(records)]
            scope = {"study": (rec.study_uid,), "series": (rec.study_uid, rec.series_uid),
                     "instance": (rec.study_uid, rec.series_uid, rec.sop_uid)}[delete_level]
            mem, *sql = (sorted(i.delete(*scope)) for i in indexes)
            assert all(mem == other for other in sql)
            compare(indexes, queries)
            assert len({i.count() for i in indexes}) == 1
        finally:
            for i in indexes:
                i.close()

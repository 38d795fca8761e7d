"""C-FIND PATIENT level Number of Patient Related Studies, Series and Instances
(0020,1200/1202/1204; PS3.4 Table C.6-1, C.3.4) from one pass over the index: the pages
of the study search are read once, so an index that changes while the answers are made
(a study stored meanwhile) cannot give a patient without counts (a first version read
the index twice and raised KeyError for a patient only the second read met)."""

from __future__ import annotations

import orjson
from pydicom.dataset import Dataset

from dicomweb_server.dimse.find import find
from dicomweb_server.store.base import SearchHit


def _hit(study: str, patient: str, name: str, series: int, instances: int) -> SearchHit:
    js = {"0020000D": {"vr": "UI", "Value": [study]}, "00100020": {"vr": "LO", "Value": [patient]},
          "00100010": {"vr": "PN", "Value": [{"Alphabetic": name}]}}
    return SearchHit(study, None, None, orjson.dumps(js), None, None,
                     {"NumberOfStudyRelatedSeries": series, "NumberOfStudyRelatedInstances": instances})


class ChangingIndex:
    """Answers the study search page by page, and one more study (a new patient's) to
    every search after the first: as if stored meanwhile."""

    def __init__(self, hits: list[SearchHit]) -> None:
        self.hits, self.searches = hits, []

    def search(self, query, allowed):
        self.searches.append(query.offset)
        hits = self.hits + ([_hit("1.2.3.99", "LATE", "Late^Comer", 1, 1)] if len(self.searches) > 1 else [])
        return hits[query.offset:query.offset + query.limit]


def _ask(**keys) -> Dataset:
    ds = Dataset()
    ds.QueryRetrieveLevel = "PATIENT"
    for k, v in keys.items():
        setattr(ds, k, v)
    return ds


def test_counts_come_from_one_pass_over_changing_pages(monkeypatch):
    monkeypatch.setattr("dicomweb_server.dimse.find._PAGE", 2)
    index = ChangingIndex([_hit("1.2.3.1", "P1", "Doe^Jane", 2, 3), _hit("1.2.3.2", "P2", "Roe^Rick", 1, 1),
                           _hit("1.2.3.3", "P1", "Doe^Jane", 1, 2)])
    answers = list(find(index, _ask(PatientID="", PatientName="", NumberOfPatientRelatedStudies="",
                                    NumberOfPatientRelatedSeries="", NumberOfPatientRelatedInstances=""),
                        "patient", max_results=2))
    got = [(a.PatientID, a.NumberOfPatientRelatedStudies, a.NumberOfPatientRelatedSeries,
            a.NumberOfPatientRelatedInstances) for a in answers]
    # pages of 2: offsets 0, 2 and 4 read once each; the study added after the first read is
    # met on the second page, and counted like any other
    assert index.searches == [0, 2, 4]
    assert got == [("P1", 2, 3, 5), ("P2", 1, 1, 1), ("LATE", 1, 1, 1)]


def test_without_a_count_asked_for_the_answers_stream_one_per_patient():
    index = ChangingIndex([_hit("1.2.3.1", "P1", "Doe^Jane", 2, 3), _hit("1.2.3.2", "P1", "Doe^Jane", 1, 1)])
    answers = find(index, _ask(PatientID="", PatientName=""), "patient", max_results=10)
    first = next(answers)  # answered before the index was read to its end
    assert first.PatientID == "P1" and "NumberOfPatientRelatedStudies" not in first
    assert list(answers) == []

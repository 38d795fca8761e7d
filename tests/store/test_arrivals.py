"""Sources, sizes and sender declarations in every index (store/arrivals.py,
dicomweb_server/arrivals.py; issue 32: the operator's study page)."""

from __future__ import annotations

import os
import sqlite3

from pydicom.uid import generate_uid

from dicomweb_server.access.filter import only, only_study
from dicomweb_server.arrivals import study_arrivals
from dicomweb_server.store.arrivals import Arrived, Declared
from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.sqlite import SQLiteIndex
from tests.helpers import CT_IMAGE_STORAGE
from tests.store.test_index_contract import index, record  # noqa: F401 - the fixture

SR = "1.2.840.10008.5.1.4.1.1.88.11"


def _study(tmp_path, source_of=("dimse:CT_SCANNER", "dimse:CT_SCANNER", "stow:alice", "import")):
    """Four instances of one study: two series (2 + 2), each record given its source."""
    study, se1, se2 = generate_uid(), generate_uid(), generate_uid()
    recs = [record(tmp_path, study=study, series=se, PatientID="P1", InstanceNumber=n, rows=4 * (n + 1), columns=4)
            for n, se in enumerate((se1, se1, se2, se2))]
    for r, src in zip(recs, source_of):
        r.source = src
    return study, se1, se2, recs


def _size(tmp_path, r) -> int:
    return os.path.getsize(tmp_path / f"{r.sop_uid}.dcm")


def test_sources_and_sizes_of_a_study(index, tmp_path):  # noqa: F811
    study, se1, se2, recs = _study(tmp_path)
    assert index.add(recs) == [True] * 4
    sizes = [_size(tmp_path, r) for r in recs]
    assert len(set(sizes)) == 4  # (rows differ: each file its own size)
    assert [r.size for r in recs] == sizes  # the size the index keeps is the stored file's
    assert index.arrived(study) == [
        Arrived(se1, "dimse:CT_SCANNER", 2, sizes[0] + sizes[1]),
        Arrived(se2, "import", 1, sizes[3]),
        Arrived(se2, "stow:alice", 1, sizes[2]),
    ]
    assert index.arrived(generate_uid()) is None
    # access filtering is part of the query: a study the reader may not see is not there
    assert index.arrived(study, only(["other"])) is None
    assert index.arrived(study, only_study(study)) == index.arrived(study)
    assert index.set_label(study, "ct") is True
    assert index.arrived(study, only(["ct"])) == index.arrived(study)
    # a deleted instance leaves the counts and sizes
    index.delete(study, se2, recs[2].sop_uid)
    assert index.arrived(study) == [Arrived(se1, "dimse:CT_SCANNER", 2, sizes[0] + sizes[1]),
                                    Arrived(se2, "import", 1, sizes[3])]


def test_unknown_source_and_update_keeps_the_source(index, tmp_path):  # noqa: F811
    study, se1, se2, recs = _study(tmp_path, ("", "dimse:MR1", "dimse:MR1", "dimse:MR1"))
    index.add(recs)
    assert [(a.series_uid, a.source, a.instances) for a in index.arrived(study)] == [
        (se1, "", 1), (se1, "dimse:MR1", 1), (se2, "dimse:MR1", 2)]
    # $update (lifecycle/update.py): a new version, described again from its file (no source):
    # it came from where the instance came from
    new = record(tmp_path, study=study, series=se1, sop=recs[1].sop_uid, PatientID="P1", rows=40, columns=4)
    new.path = new.path.replace(".dcm", ".v2.dcm")
    index.replace([new], study, se1, recs[1].sop_uid)
    assert [(a.series_uid, a.source, a.instances, a.bytes) for a in index.arrived(study)] == [
        (se1, "", 1, recs[0].size), (se1, "dimse:MR1", 1, new.size), (se2, "dimse:MR1", 2, recs[2].size + recs[3].size)]
    assert new.size == _size(tmp_path, new) != recs[1].size


def test_commitment_declarations(index, tmp_path):  # noqa: F811
    a, b, c = generate_uid(), generate_uid(), generate_uid()
    index.declare("1.2.3.100", "MODALITY", [(CT_IMAGE_STORAGE, a), (CT_IMAGE_STORAGE, b)], 1000.0)
    index.declare("1.2.3.100", "MODALITY", [(CT_IMAGE_STORAGE, b), (SR, c)], 1001.0)  # repeated: adds c only
    index.declare("1.2.3.200", "OTHER", [(SR, c)], 2000.0)
    assert index.declarations([a]) == [
        *sorted([Declared("1.2.3.100", "MODALITY", 1000.0, CT_IMAGE_STORAGE, a),
                 Declared("1.2.3.100", "MODALITY", 1000.0, CT_IMAGE_STORAGE, b)], key=lambda d: d.sop_uid),
        Declared("1.2.3.100", "MODALITY", 1001.0, SR, c),
    ]
    assert [d.transaction_uid for d in index.declarations([c])] == ["1.2.3.100"] * 3 + ["1.2.3.200"]
    assert index.declarations([generate_uid()]) == []
    assert index.declarations([]) == []


def test_study_arrivals_against_declarations(index, tmp_path):  # noqa: F811
    """The page's document: arrived N of declared M, from the two declarations there are."""
    study, se1, se2 = generate_uid(), generate_uid(), generate_uid()
    recs = [record(tmp_path, study=study, series=se1, PatientID="P1", InstanceNumber=1,
                   NumberOfSeriesRelatedInstances=3, NumberOfStudyRelatedInstances=5),
            record(tmp_path, study=study, series=se1, PatientID="P1", InstanceNumber=2,
                   NumberOfSeriesRelatedInstances=3, NumberOfStudyRelatedInstances=5),
            record(tmp_path, study=study, series=se2, PatientID="P1", InstanceNumber=1)]  # declares nothing
    other = record(tmp_path, PatientID="P2")
    for r in recs:
        r.source = "dimse:CT_SCANNER"
    other.source = "stow:10.0.0.7"
    index.add(recs + [other])
    missing = generate_uid()
    index.declare("1.2.3.300", "CT_SCANNER", [(CT_IMAGE_STORAGE, r.sop_uid) for r in recs]
                  + [(CT_IMAGE_STORAGE, other.sop_uid), (CT_IMAGE_STORAGE, missing)], 1700000000.0)
    doc = study_arrivals(index, study)
    assert doc["received"] is not None and doc["received"]["first"] <= doc["received"]["latest"]
    del doc["received"]
    assert doc == {
        "study": study, "instances": 3, "bytes": sum(r.size for r in recs),
        "sources": {"dimse:CT_SCANNER": 3}, "declared": 5,
        "series": [
            {"series": se1, "instances": 2, "bytes": recs[0].size + recs[1].size,
             "sources": {"dimse:CT_SCANNER": 2}, "declared": 3},
            {"series": se2, "instances": 1, "bytes": recs[2].size, "sources": {"dimse:CT_SCANNER": 1},
             "declared": None},
        ],
        "commitments": [{"kind": "storage-commitment", "transaction": "1.2.3.300", "requester": "CT_SCANNER", "time": "2023-11-14T22:13:20.000000Z",
                         "declared": 5, "arrived": 4, "in_study": 3, "missing_count": 1,
                         "missing": [{"sop_class": CT_IMAGE_STORAGE, "sop": missing}]}],
    }
    # a reader who may see this study only: the instance of the other study counts as missing
    doc = study_arrivals(index, study, only_study(study))
    assert [(c["arrived"], c["missing_count"]) for c in doc["commitments"]] == [(3, 2)]
    assert study_arrivals(index, study, only(["nothing"])) is None
    # a study no request named: no declaration invented
    doc = study_arrivals(index, other.study_uid)
    assert (doc["declared"], doc["series"][0]["declared"], doc["sources"]) == (None, None, {"stow:10.0.0.7": 1})
    assert [c["transaction"] for c in doc["commitments"]] == ["1.2.3.300"]


def test_memory_index_keeps_sources_across_a_restart(tmp_path):
    """The in-memory index is rebuilt from the files at start-up (no source in them): the
    journal keeps each instance's source until it is deleted."""
    journal = tmp_path / "journal.sqlite"
    study, se1, se2, recs = _study(tmp_path)
    idx = MemoryIndex(journal=journal)
    idx.add(recs)
    idx.close()
    idx = MemoryIndex(journal=journal)
    for r in recs:
        r.source = ""  # as Archive.rebuild describes them again
    idx.add(recs)
    assert [(a.source, a.instances) for a in idx.arrived(study)] == [
        ("dimse:CT_SCANNER", 2), ("import", 1), ("stow:alice", 1)]
    # the strings are shared: one object per distinct source
    insts = [idx._instances[r.sop_uid] for r in recs[:2]]
    assert insts[0].source is insts[1].source
    idx.delete(study, se2)
    idx.close()
    con = sqlite3.connect(journal)
    assert sorted(s for (s,) in con.execute("SELECT source FROM instance_source")) == ["dimse:CT_SCANNER"] * 2
    con.close()


def test_sqlite_index_made_before_sources_gets_the_column(tmp_path):
    study, se1, _se2, recs = _study(tmp_path)
    idx = SQLiteIndex(tmp_path / "index.sqlite")
    idx.add(recs[:1])
    idx.close()
    con = sqlite3.connect(tmp_path / "index.sqlite")
    con.execute("ALTER TABLE instance DROP COLUMN _source")  # as an index of an earlier release
    con.commit()
    con.close()
    idx = SQLiteIndex(tmp_path / "index.sqlite")
    idx.add(recs[1:2])
    assert idx.arrived(study) == [Arrived(se1, "", 1, recs[0].size),
                                  Arrived(se1, "dimse:CT_SCANNER", 1, recs[1].size)]
    idx.close()

"""Rejected instances in the index (store/rejections.py) on the three indexes: hidden
from every read (search at each level with the computed attributes, instances,
metadata, locate) by the index itself, remembered before they arrive, listed,
restored, purged, with their change-log rows."""

from __future__ import annotations

from pydicom.uid import generate_uid

from tests.store.test_index_contract import index, q, record  # noqa: F401 - fixture


def _search(index, level: str):
    return index.search(q(level, {"limit": "100"}))


def summary(changes) -> list[tuple]:
    return [(c.action, c.state, c.sop_uid, c.version) for c in changes]


def test_rejected_instances_leave_every_read_and_come_back(index, tmp_path):
    st, ct, mr = generate_uid(), generate_uid(), generate_uid()
    a, b = (record(tmp_path, study=st, series=ct, InstanceNumber=n) for n in (1, 2))
    c = record(tmp_path, study=st, series=mr, modality="MR", sop_class="1.2.840.10008.5.1.4.1.1.4")
    assert index.add([a, b, c]) == [True] * 3
    (hit,) = _search(index, "study")
    assert hit.computed["ModalitiesInStudy"] == ["CT", "MR"] and hit.computed["NumberOfStudyRelatedInstances"] == 3

    assert index.reject([(st, mr, c.sop_uid), (st, ct, a.sop_uid)], "113001^DCM", 1000.0) == 2
    (hit,) = _search(index, "study")
    assert hit.computed == {"ModalitiesInStudy": ["CT"], "SOPClassesInStudy": ["1.2.840.10008.5.1.4.1.1.2"],
                            "NumberOfStudyRelatedSeries": 1, "NumberOfStudyRelatedInstances": 1}
    assert [h.series_uid for h in _search(index, "series")] == [ct]
    assert [h.sop_uid for h in _search(index, "instance")] == [b.sop_uid]
    assert [x.sop_uid for x in index.instances(st)] == [b.sop_uid]
    assert index.metadata(st, ct, a.sop_uid) == [] and index.locate(a.sop_uid) is None
    assert index.count() == 1
    rows = index.rejections(st)
    assert [(r.sop_uid, r.code, r.timestamp, r.path) for r in sorted(rows, key=lambda r: r.sop_uid)] == sorted(
        [(a.sop_uid, "113001^DCM", 1000.0, a.path), (c.sop_uid, "113001^DCM", 1000.0, c.path)])
    assert sorted(p for _, p in index.paths()) == sorted([a.path, b.path, c.path])  # files still the index's
    # stored again (a duplicate STOW-RS, the in-memory index's start-up): stays hidden
    assert index.add([a]) == [False] and index.locate(a.sop_uid) is None

    index.unreject(rows)
    assert index.add([a, c], action="restore") == [True, True]
    (hit,) = _search(index, "study")
    assert hit.computed["ModalitiesInStudy"] == ["CT", "MR"] and hit.computed["NumberOfStudyRelatedInstances"] == 3
    assert index.rejections() == []
    assert summary(index.changes(limit=100)) == [
        ("create", "rejected", a.sop_uid, 1), ("create", "current", b.sop_uid, 1),
        ("create", "rejected", c.sop_uid, 1), ("reject", "rejected", a.sop_uid, 1),
        ("reject", "rejected", c.sop_uid, 1), ("restore", "current", a.sop_uid, 1),
        ("restore", "current", c.sop_uid, 1)]


def test_an_instance_rejected_before_it_arrives_stays_hidden(index, tmp_path):
    a = record(tmp_path)
    assert index.reject([(a.study_uid, a.series_uid, a.sop_uid)], "113039^DCM", 5.0) == 0
    assert [r.path for r in index.rejections()] == [None]
    assert index.add([a]) == [False]
    assert _search(index, "instance") == [] and index.instances(a.study_uid) == []
    assert [r.path for r in index.rejections()] == [a.path]
    assert index.changes(limit=10) == []


def test_purge_forgets_and_logs_a_delete(index, tmp_path):
    a, b = record(tmp_path), record(tmp_path)
    index.add([a, b])
    index.reject([(a.study_uid, a.series_uid, a.sop_uid)], "113001^DCM", 100.0)
    index.reject([(b.study_uid, b.series_uid, b.sop_uid)], "113001^DCM", 200.0)
    old = index.rejections(before=150.0)
    assert [r.sop_uid for r in old] == [a.sop_uid]
    index.purge(old)
    assert [r.sop_uid for r in index.rejections()] == [b.sop_uid]
    assert sorted(p for _, p in index.paths()) == [b.path]
    assert summary(index.changes(limit=100))[-1] == ("delete", "deleted", a.sop_uid, 1)
    assert index.changes(limit=100)[0].state == "deleted"


def test_purging_twice_logs_one_delete(index, tmp_path):
    """Two processes purging at once: the second finds nothing left to purge."""
    a = record(tmp_path)
    index.add([a])
    index.reject([(a.study_uid, a.series_uid, a.sop_uid)], "113001^DCM", 1.0)
    rows = index.rejections()
    index.purge(rows)
    index.purge(rows)
    assert [c.action for c in index.changes(limit=10)] == ["create", "reject", "delete"]


def test_a_reference_under_the_wrong_study_still_hides_the_instance(index, tmp_path):
    """A note's evidence names the instance under other study/series UIDs: the instance
    is found by its SOP Instance UID and filed under its own UIDs."""
    a = record(tmp_path)
    index.add([a])
    assert index.reject([("1.2.3", "1.2.3.4", a.sop_uid)], "113001^DCM", 1.0) == 1
    assert index.locate(a.sop_uid) is None and _search(index, "study") == []
    assert [(r.study_uid, r.series_uid) for r in index.rejections()] == [(a.study_uid, a.series_uid)]


def test_a_refused_restore_keeps_the_rejection_as_it_was(index, tmp_path):
    """Index.add(action="restore") forgets the rejection row of what it shows again, in its
    commit; one it refuses (store/base.py hierarchy_conflict: its study is another
    patient's now) keeps its row exactly as it was: its file's path, reason, time."""
    st = generate_uid()
    a = record(tmp_path, study=st, PatientID="P1")
    assert index.add([a]) == [True]
    assert index.reject([(st, a.series_uid, a.sop_uid)], "113038^DCM", 1000.0) == 1
    other = record(tmp_path, study=st, PatientID="P2")  # the study is P2's now
    assert index.add([other]) == [True]
    (refused,) = index.add([a], action="restore")
    assert type(refused).__name__ == "Refused" and "belongs to patient" in refused.message
    assert [(r.sop_uid, r.study_uid, r.series_uid, r.code, r.timestamp, r.path) for r in index.rejections(st)] == [
        (a.sop_uid, st, a.series_uid, "113038^DCM", 1000.0, a.path)]
    assert sorted(p for _, p in index.paths()) == sorted([a.path, other.path])  # not an orphan
    assert [x.sop_uid for x in index.instances(st)] == [other.sop_uid]
    # once it fits again, it comes back and its row goes, in that commit
    index.delete(st)
    assert index.add([a], action="restore") == [True]
    assert index.rejections() == [] and [x.sop_uid for x in index.instances(st)] == [a.sop_uid]
    assert summary(index.changes(limit=100))[-1] == ("restore", "current", a.sop_uid, 1)

"""Index.received (store/changes.py received): per study, when the first and the latest of
its current instance versions arrived, from the change log, on the three indexes; deleted
and rejected instances no longer count (retention's arrival times, policy/retention.py)."""

from __future__ import annotations

from pydicom.uid import generate_uid

from tests.store.test_index_contract import index, record  # noqa: F401 - fixture


def test_received_first_and_latest_of_the_stored_instances(index, tmp_path):
    st, other = generate_uid(), generate_uid()
    a, b = record(tmp_path, study=st), record(tmp_path, study=st)
    c = record(tmp_path, study=other)
    assert index.received() == {}
    index.add([a])
    index.add([b])
    index.add([c])
    times = {ch.sop_uid: ch.timestamp for ch in index.changes(limit=10)}
    assert times[a.sop_uid] <= times[b.sop_uid] <= times[c.sop_uid]
    assert index.received() == {st: (times[a.sop_uid], times[b.sop_uid]),
                                other: (times[c.sop_uid], times[c.sop_uid])}
    assert index.received(other) == {other: (times[c.sop_uid], times[c.sop_uid])}
    index.delete(st, b.series_uid, b.sop_uid)  # the latest arrival gone: the first is also the latest
    assert index.received(st) == {st: (times[a.sop_uid], times[a.sop_uid])}
    index.reject([(other, c.series_uid, c.sop_uid)], "113039^DCM", 1.0)
    assert index.received() == {st: (times[a.sop_uid], times[a.sop_uid])}


def test_a_label_is_not_an_arrival(index, tmp_path):
    """A label put on a study (or taken away) logs a ``label`` row per instance in the change
    log; it was counted as an arrival, so labelling a study made it "received" now (its
    retention by arrival restarted, the operator's page showed it as just arrived)."""
    st = generate_uid()
    a = record(tmp_path, study=st)
    index.add([a])
    [created] = [ch.timestamp for ch in index.changes(limit=10)]
    index.set_label(st, "cardio")
    index.set_label(st, "cardio", present=False)
    assert [ch.action for ch in index.changes(limit=10)] == ["create", "label", "label"]
    assert index.received() == {st: (created, created)}

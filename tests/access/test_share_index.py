"""Share links in the index (store/shares.py), on every index (memory, SQLite,
PostgreSQL): kept by their token's hash, listed, revoked; a share's filter
(access/filter.py only_study) lets every read see its one study only, in the query."""

from __future__ import annotations

import time

from dicomweb_server.access.filter import Filter, only, only_study
from dicomweb_server.store.memory import MemoryIndex
from dicomweb_server.store.shares import Share
from dicomweb_server.store.sql import SQLITE, compile_search
from tests.access.test_index_labels import q, two  # noqa: F401 - fixtures
from tests.store.test_index_contract import index, open_index, record  # noqa: F401 - the parametrised fixture


def test_shares_are_kept_listed_and_revoked(index):  # noqa: F811
    now = time.time()
    s1 = Share("id1", "ab" * 32, "1.2.3", now, now + 60, "key-1", False)
    s2 = Share("id2", "cd" * 32, "1.2.4", now + 1, now + 61, None, False)
    index.put_share(s1)
    index.put_share(s2)
    assert index.share("id1") == s1
    assert index.share(token_sha256="cd" * 32) == s2
    assert index.share("nope") is None and index.share(token_sha256="ef" * 32) is None
    assert [s.id for s in index.shares()] == ["id2", "id1"]  # newest first
    assert index.revoke_share("id1") is True
    assert index.share("id1").revoked is True and not index.share("id1").valid(now)
    assert index.revoke_share("nope") is False
    assert s2.valid(now) and not s2.valid(now + 61)


def test_a_share_filter_sees_its_study_only(two):  # noqa: F811
    index, recs, sa, sb, sn = two
    one = only_study(sb)
    assert [h.study_uid for h in index.search(q("study"), one)] == [sb]
    assert len(index.search(q("instance"), one)) == 2
    assert [h.study_uid for h in index.search(q("instance", {"limit": "1", "offset": "1"}), one)] == [sb]
    assert index.search(q("study", {"StudyInstanceUID": sa}), one) == []
    assert index.instances(sa, allowed=one) == [] and len(index.instances(sb, allowed=one)) == 2
    assert index.metadata(sa, allowed=one) == [] and len(index.metadata(sb, allowed=one)) == 2
    assert index.locate(recs[0].sop_uid, one) is None and index.locate(recs[1].sop_uid, one) is not None
    assert index.labels(sa, one) is None and index.labels(sb, one) == ["b"]
    assert index.counts(one).studies == 1 and index.counts(one).instances == 2
    # a share of a study combined with a label clause: both hold
    assert index.search(q("study"), Filter(only({"a"}).clauses, frozenset({sb}))) == []
    assert index.search(q("study"), only_study(sn)) != []  # an unlabelled study is shared too


def test_the_share_filter_is_in_the_sql():
    sql, params = compile_search(SQLITE, q("study", {"PatientID": "X"}), only_study("1.2.3"))
    assert "s.StudyInstanceUID IN (?)" in sql and params[:2] == ["X", "1.2.3"]
    assert not only_study("1.2.3").unrestricted
    assert only_study("1.2.3").allows((), "1.2.3") and not only_study("1.2.3").allows(("a",), "1.2.4")


def test_memory_shares_survive_a_restart(tmp_path):
    journal = tmp_path / "outbox.sqlite"
    idx = MemoryIndex(journal)
    share = Share("id1", "ab" * 32, "1.2.3", 1.0, 2.0, "me")
    idx.put_share(share)
    idx.close()
    again = MemoryIndex(journal)
    assert again.shares() == [share]
    again.close()

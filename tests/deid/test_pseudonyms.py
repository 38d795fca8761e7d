"""deid/pseudonyms.py: the project secret and the pseudonym table, in a SQLite file and
in PostgreSQL (schema version 9)."""

from __future__ import annotations

import pytest

from dicomweb_server.deid.pseudonyms import Mapping, PseudonymError, Pseudonyms, generated_pseudonym


@pytest.fixture(params=["sqlite", "postgresql"])
def table(request, tmp_path):
    if request.param == "sqlite":
        t = Pseudonyms.sqlite(tmp_path / "index.sqlite")
    else:
        t = Pseudonyms.postgresql(request.getfixturevalue("pg_url"))
    yield t
    t.close()


def test_generated_pseudonyms_are_stable_and_recorded(table, tmp_path):
    secret = table.secret("trial-a")
    assert len(secret) == 32 and table.secret("trial-a") == secret != table.secret("trial-b")
    p1 = table.pseudonym("trial-a", "MRN-1")
    assert p1 == generated_pseudonym(secret, "MRN-1") and p1.startswith("PSN-") and len(p1) == 20
    assert table.pseudonym("trial-a", "MRN-1") == p1
    assert table.pseudonym("trial-b", "MRN-1") != p1  # another project, another secret
    assert table.mapping("trial-a") == [Mapping("MRN-1", p1, "generated")]


def test_csv_pseudonyms_win_and_bad_csvs_write_nothing(table):
    n = table.load_csv("trial-a", "PatientID,pseudonym\nMRN-1,SUBJ-001\nMRN-2,SUBJ-002\n\n")
    assert n == 2 and table.pseudonym("trial-a", "MRN-1") == "SUBJ-001"
    assert table.load_csv("trial-a", "MRN-1,SUBJ-001\n") == 0  # the same again: nothing new
    with pytest.raises(PseudonymError, match="'MRN-1' already has pseudonym 'SUBJ-001'"):
        table.load_csv("trial-a", "MRN-3,SUBJ-003\nMRN-1,SUBJ-999\n")
    with pytest.raises(PseudonymError, match="given to two patients"):
        table.load_csv("trial-a", "MRN-4,X\nMRN-5,X\n")
    with pytest.raises(PseudonymError, match="line 2: expected PatientID,pseudonym"):
        table.load_csv("trial-a", "MRN-6,S6\nMRN-7\n")
    assert [m.patient_id for m in table.mapping("trial-a")] == ["MRN-1", "MRN-2"]  # MRN-3 not written


def test_kept_across_a_reopen(tmp_path):
    t = Pseudonyms.sqlite(tmp_path / "outbox.sqlite")
    secret, p = t.secret("x"), t.pseudonym("x", "A")
    t.close()
    t = Pseudonyms.sqlite(tmp_path / "outbox.sqlite")
    assert t.secret("x") == secret and t.mapping("x") == [Mapping("A", p, "generated")]
    t.close()


def test_two_processes_agree(tmp_path):
    """Two handles on one file (two workers): one secret, one pseudonym per patient."""
    a, b = Pseudonyms.sqlite(tmp_path / "index.sqlite"), Pseudonyms.sqlite(tmp_path / "index.sqlite")
    assert a.secret("x") == b.secret("x")
    assert a.pseudonym("x", "P") == b.pseudonym("x", "P")
    assert len(b.mapping("x")) == 1
    a.close()
    b.close()

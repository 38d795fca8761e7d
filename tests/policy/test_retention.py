"""Retention and quotas (policy/retention.py) on the three indexes: rules matched as QIDO-RS
matches (Modality) and by the calling AE title; expiry by StudyDate and by arrival;
protect_recent; only once delivered; the dry run lists exactly what the real run removes
(through the archive's delete path: change log, files, audit); the quota's watermarks; the
hard limit refuses a store with 507 / 0xA700 and leaves no file behind."""

from __future__ import annotations

import logging
import os
import time

import orjson
import pytest
from pydicom.uid import generate_uid

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.dicom.status import FailureReason
from dicomweb_server.policy.retention import PolicyError, load_policy, plan, run
from dicomweb_server.routing.outbox import Settlement
from dicomweb_server.settings import Settings
from dicomweb_server.store import changes as changelog
from tests.helpers import make_dataset

POSTGRESQL = True  # tests/conftest.py: index_kind covers PostgreSQL too
DAY = 86400.0


@pytest.fixture
def open_archive(request, tmp_path, index_kind):
    opened: list[Archive] = []
    extra = {"database_url": request.getfixturevalue("pg_url")} if index_kind == "postgresql" else {}

    def make(policy: str, routes: str | None = None) -> Archive:
        path = tmp_path / "retention.toml"
        path.write_text(policy)
        more = dict(extra)
        if routes is not None:
            (tmp_path / "routes.toml").write_text(routes)
            more["routes_file"] = tmp_path / "routes.toml"
        archive = Archive.open(Settings(data_dir=tmp_path / "data", index=index_kind, retention_file=path, **more))
        opened.append(archive)
        return archive

    yield make
    for a in opened:
        a.close()


def store(archive: Archive, datasets, source: str | None = None):
    parts = []
    for ds in datasets:
        if source is not None:
            ds.file_meta.SourceApplicationEntityTitle = source
        path = archive.blobs.spool / f"{ds.SOPInstanceUID}.part"
        ds.save_as(path, enforce_file_format=True)
        parts.append(SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True))
    return archive.store(parts)


def study(archive, n: int = 1, source: str | None = None, **attrs) -> str:
    uid = generate_uid()
    outcome = store(archive, [make_dataset(study=uid, **attrs) for _ in range(n)], source)
    assert len(outcome.stored) == n, outcome.failed
    return uid


def planned(archive, now=None) -> list[tuple[str, str]]:
    return [(r.study_uid, r.rule) for r in plan(archive, archive.retention, now).removals]


@pytest.fixture
def clock(monkeypatch, index_kind):
    """The change log's clock (the arrival times) of SQLite and the in-memory index, set by
    the test; PostgreSQL's is the database's own and cannot be moved."""
    if index_kind == "postgresql":
        pytest.skip("arrival times come from the PostgreSQL server's clock")
    t = [time.time()]
    monkeypatch.setattr(changelog, "now", lambda: t[0])
    return t


def test_policy_file_errors_name_the_line(tmp_path):
    path = tmp_path / "p.toml"
    cases = {
        '[[rules]]\nname = "a"\nby = "Date"\n': "line 3: [[rules]] #1 by: 'Date'",
        '[[rules]]\nmatch = { Modality = "CT" }\n\n[[rules]]\naction = "purge"\n': "line 5: [[rules]] #2 action",
        '[[rules]]\nmatch = { ModalitiesInStudy = "CT" }\n': "line 2: [[rules]] #1 match: ModalitiesInStudy is computed",
        '[[rules]]\nolder_than = -1\n': "older_than: a number of days",
        '[quota]\nhigh = "10 GB"\n': "give both high and low",
        '[quota]\nhigh = "10 GB"\nlow = "20 GB"\n': "low (20000000000 bytes) must be below high (10000000000 bytes)",
        '[quota]\nhigh = "10 GB"\nlow = "5 GB"\nhard = "9 GB"\n': "hard (9000000000 bytes) must be at least high",
        '[quota]\nhard = "lots"\n': "[quota] hard: 'lots' is not a size",
        'keep = 1\n': "unknown top-level key(s) ['keep']",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(PolicyError) as e:
            load_policy(path)
        assert message in str(e.value), (text, str(e.value))
    path.write_text('protect_recent = 2\n[[rules]]\nmatch = { Modality = ["CT", "MR"] }\nolder_than = 30\n'
                    'by = "StudyDate"\naction = "reject"\nwhen_delivered = true\n'
                    '[quota]\nhigh = "1.5 GiB"\nlow = "1 GiB"\nhard = 2000000000\n')
    p = load_policy(path)
    (rule,) = p.rules
    assert (rule.name, rule.older_than, rule.by, rule.action, rule.when_delivered) == (
        "rule 1", 30.0, "StudyDate", "reject", True)
    assert len(rule.alternatives) == 2 and p.protect_recent == 2.0
    assert (p.quota.high, p.quota.low, p.quota.hard) == (1610612736, 1073741824, 2000000000)


def test_rules_match_as_qido_and_by_source_ae_first_rule_wins(open_archive):
    archive = open_archive("""
protect_recent = 0
[[rules]]
name = "from scanner 1"
match = { SourceApplicationEntityTitle = "SCANNER*" }
older_than = 1
[[rules]]
name = "MR and CT"
match = { Modality = "MR\\\\CT", StudyDescription = "*HEAD*" }
older_than = 1
""")
    from_scanner = study(archive, source="SCANNER1", modality="US")
    head_mr = study(archive, modality="MR", StudyDescription="MR HEAD")
    head_ct_scanner = study(archive, source="SCANNER2", StudyDescription="CT HEAD")
    other = [study(archive, source="OTHER", modality="US"), study(archive, StudyDescription="CHEST"),
             study(archive, modality="US", StudyDescription="HEAD")]
    assert other  # no rule matches these: never removed
    later = time.time() + 2 * DAY
    assert sorted(planned(archive, later)) == sorted([(from_scanner, "from scanner 1"), (head_mr, "MR and CT"),
                                                      (head_ct_scanner, "from scanner 1")])
    assert planned(archive, time.time() + 0.5 * DAY) == []  # not a day old yet


def test_expiry_by_study_date_and_by_arrival(open_archive):
    archive = open_archive("""
protect_recent = 0
[[rules]]
name = "CT by StudyDate"
match = { Modality = "CT" }
older_than = 365
by = "StudyDate"
[[rules]]
name = "MR by arrival"
match = { Modality = "MR" }
older_than = 10
by = "received"
""")
    today = time.strftime("%Y%m%d", time.gmtime())
    old_ct = study(archive, StudyDate="20000101")
    study(archive, StudyDate=today)
    study(archive, StudyDate="")  # no StudyDate: never expires by it
    mr = study(archive, modality="MR", StudyDate="19990101")
    assert planned(archive, time.time() + 1) == [(old_ct, "CT by StudyDate")]
    assert planned(archive, time.time() + 9 * DAY) == [(old_ct, "CT by StudyDate")]
    assert sorted(planned(archive, time.time() + 11 * DAY)) == sorted([(old_ct, "CT by StudyDate"),
                                                                       (mr, "MR by arrival")])
    (removal,) = [r for r in plan(archive, archive.retention).removals]
    assert removal.reason == "expired: StudyDate 20000101 is more than 365 days old"
    assert removal.study_date == "20000101" and removal.instances == 1


def test_protect_recent_keeps_a_study_with_a_new_instance(open_archive, clock):
    archive = open_archive("""
protect_recent = 30
[[rules]]
older_than = 1
by = "StudyDate"
""")
    start = clock[0]
    old = study(archive, StudyDate="20000101")
    growing = study(archive, StudyDate="20000101")
    assert planned(archive, start + 29 * DAY) == []  # received within protect_recent
    clock[0] = start + 20 * DAY  # one more instance of the second study, 20 days later
    assert store(archive, [make_dataset(study=growing)]).stored
    assert archive.index.received(growing)[growing] == (start, start + 20 * DAY)
    assert planned(archive, start + 31 * DAY) == [(old, "rule 1")]
    assert sorted(planned(archive, start + 51 * DAY)) == sorted([(old, "rule 1"), (growing, "rule 1")])


def test_only_when_delivered_to_every_destination(open_archive):
    archive = open_archive("""
protect_recent = 0
[[rules]]
name = "CT once delivered"
match = { Modality = "CT" }
older_than = 1
when_delivered = true
[[rules]]
name = "MR whatever"
match = { Modality = "MR" }
older_than = 1
""", routes="""
[[destinations]]
name = "pacs"
stow_url = "http://127.0.0.1:9/dicom-web"
[[destinations]]
name = "backup"
stow_url = "http://127.0.0.1:9/backup"
[[rules]]
destinations = ["pacs", "backup"]
""")
    ct = study(archive, n=2)
    mr = study(archive, modality="MR")
    later = time.time() + 2 * DAY
    assert planned(archive, later) == [(mr, "MR whatever")]  # the CT study's forwards are owed
    outbox = archive.routing.outbox
    assert outbox.undelivered(ct) == {"pacs": 2, "backup": 2}

    def deliver(destination: str, n: int) -> None:
        rows, _ = outbox.claim(destination, n, "test:1:x:0", 60, 2)
        outbox.settle(Settlement([r.id for r in rows if r.study_uid == ct], [], [], []), "test:1:x:0")

    deliver("pacs", 10)
    assert outbox.undelivered(ct) == {"backup": 2}
    assert planned(archive, later) == [(mr, "MR whatever")]  # delivered to one destination of two
    deliver("backup", 10)
    assert outbox.undelivered(ct) == {}
    assert sorted(planned(archive, later)) == sorted([(ct, "CT once delivered"), (mr, "MR whatever")])


def test_dry_run_lists_exactly_what_the_run_removes(open_archive, tmp_path):
    from dicomweb_server.access.audit import configure_audit_file

    audit = tmp_path / "audit.jsonl"
    configure_audit_file(audit)
    archive = open_archive("""
protect_recent = 0
[[rules]]
name = "old CT"
match = { Modality = "CT" }
older_than = 365
by = "StudyDate"
[[rules]]
name = "SR rejected"
match = { Modality = "SR" }
older_than = 1
action = "reject"
""")
    old = [study(archive, n=2, StudyDate="20000101"), study(archive, StudyDate="20100101")]
    sr = study(archive, modality="SR")
    kept = [study(archive, StudyDate=time.strftime("%Y%m%d", time.gmtime())), study(archive, modality="MR")]
    paths = {s: [loc.path for loc in archive.index.instances(s)] for s in old + [sr] + kept}
    before = archive.index.counts().stored_bytes
    t = time.time() + 2 * DAY
    dry = run(archive, archive.retention, dry_run=True, now=t)
    listed = [(r.study_uid, r.action, r.size) for r in dry.plan.removals]
    assert sorted(s for s, _, _ in listed) == sorted(old + [sr])
    assert archive.index.counts().stored_bytes == before  # nothing changed
    real = run(archive, archive.retention, now=t)
    assert [(r.study_uid, r.action, r.size) for r in real.done] == listed and real.skipped == []
    # deleted through the delete path: rows, change log, files; the SR study rejected (113039)
    for s in old:
        assert archive.index.instances(s) == []
        assert not any(archive.blobs.exists(p) for p in paths[s])
        assert {c.action for p in paths[s] for c in archive.index.changes(limit=1000)
                if c.study_uid == s} >= {"delete"}
    assert archive.index.instances(sr) == []
    assert [(r.code, r.path) for r in archive.index.rejections(sr)] == [("113039^DCM", paths[sr][0])]
    assert archive.blobs.exists(paths[sr][0])  # kept keep_rejected days, restorable
    for s in kept:
        assert [loc.path for loc in archive.index.instances(s)] == paths[s]
    assert archive.index.counts().stored_bytes == before - sum(size for _, _, size in listed)
    for handler in logging.getLogger("dicomweb_server.audit").handlers:
        handler.flush()
    lines = [orjson.loads(x) for x in audit.read_text().splitlines() if '"retention"' in x]
    assert [(x["dry_run"], sorted(s["study"] for s in x["studies"])) for x in lines[-2:]] == [
        (True, sorted(old + [sr])), (False, sorted(old + [sr]))]
    assert lines[-1]["bytes"] == sum(size for _, _, size in listed)


def test_quota_watermarks_remove_the_oldest_down_to_low(open_archive):
    archive = open_archive("""
protect_recent = 0
[[rules]]
name = "CT"
match = { Modality = "CT" }
by = "StudyDate"
[quota]
high = 5000
low = 2700
""")
    dates = ["20200105", "20200101", "20200104", "20200102", "20200106", "20200103"]
    studies = {d: study(archive, StudyDate=d) for d in dates}
    mr = study(archive, modality="MR", StudyDate="19900101")  # no rule: the quota never takes it
    sizes = {d: sum(x.size for x in archive.index.instances(s)) for d, s in studies.items()}
    total = archive.index.counts().stored_bytes
    assert total > 5000 and all(800 < s < 1000 for s in sizes.values())  # seven instances of ~900 bytes
    assert 4 * 800 < total - 2700 < 4 * 1000  # four of them must go
    expected, left = [], total
    for d in sorted(dates):  # oldest StudyDate first, until at or below the low watermark
        if left <= 2700:
            break
        expected.append(studies[d])
        left -= sizes[d]
    report = run(archive, archive.retention)
    assert [r.study_uid for r in report.done] == expected
    assert len(expected) == 4 and expected == [studies[d] for d in sorted(dates)[:4]]
    assert report.done[0].reason == f"quota: {total} bytes stored, past the high watermark of 5000 (down to 2700)"
    assert archive.index.counts().stored_bytes == left <= 2700
    assert archive.index.instances(mr)
    assert run(archive, archive.retention).done == []  # below the high watermark now


def test_hard_limit_refuses_the_store_with_a700_and_no_file(open_archive, monkeypatch):
    archive = open_archive('[quota]\nhard = 3000\n')
    first = generate_uid()
    kept = [make_dataset(study=first) for _ in range(3)]  # ~2,700 bytes
    assert len(store(archive, kept).stored) == 3
    stored = archive.index.counts().stored_bytes
    assert 2400 < stored <= 3000
    ds = make_dataset(study=first)
    outcome = store(archive, [ds])
    assert outcome.stored == []
    (failed,) = outcome.failed
    assert failed.reason == FailureReason.OUT_OF_RESOURCES and failed.sop_instance_uid == ds.SOPInstanceUID
    assert failed.message.startswith(f"the archive's hard storage limit of 3000 bytes would be passed: "
                                     f"{stored} bytes stored, this instance is ")
    assert archive.index.locate(str(ds.SOPInstanceUID)) is None
    assert not archive.blobs.exists(f"{first}/{ds.SeriesInstanceUID}/{ds.SOPInstanceUID}.dcm")
    assert list(archive.blobs.spool.iterdir()) == []
    assert archive.hard_limit.room(archive) == 3000 - stored
    # an instance already stored, sent again, adds nothing: still a success
    (again,) = store(archive, [kept[0]]).stored
    assert again.duplicate
    # a delete makes room (seen at the next reading of the index's count)
    monkeypatch.setattr("dicomweb_server.policy.retention.HARD_LIMIT_REFRESH", 0.0)
    assert archive.delete(first, str(kept[1].SeriesInstanceUID), str(kept[1].SOPInstanceUID)) == 1
    assert len(store(archive, [ds]).stored) == 1
    assert archive.index.counts().stored_bytes <= 3000


def test_stow_and_c_store_past_the_hard_limit_answer_507_and_a700(tmp_path):
    import httpx
    import pydicom

    from tests.dimse.conftest import Dimse
    from tests.helpers import LiveServer, free_port, multipart, to_bytes

    policy = tmp_path / "retention.toml"
    policy.write_text('[quota]\nhard = 2000\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=None,
                     retention_file=policy).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            dimse = Dimse(srv, port, http)
            a, b = make_dataset(), make_dataset()
            assert dimse.store([a, b], ae_title="SCANNER1") == [0x0000, 0x0000]
            c = make_dataset()
            assert dimse.store([c]) == [0xA700]
            body, ctype = multipart([to_bytes(make_dataset()), to_bytes(make_dataset())])
            r = http.post("/studies", content=body, headers={"Content-Type": ctype})
            assert r.status_code == 507, r.text
            assert [x["00081197"]["Value"][0] for x in r.json()["00081198"]["Value"]] == [0xA700, 0xA700]
            assert "hard storage limit of 2000 bytes" in r.headers["warning"]
            listed = http.get("/instances").json()
            assert sorted(x["00080018"]["Value"][0] for x in listed) == sorted([a.SOPInstanceUID, b.SOPInstanceUID])
            files = sorted(p.name for p in (tmp_path / "data" / "blobs").rglob("*.dcm"))
            assert files == sorted(f"{x.SOPInstanceUID}.dcm" for x in (a, b))
            stored = pydicom.dcmread(next((tmp_path / "data" / "blobs").rglob(f"{a.SOPInstanceUID}.dcm")))
            assert stored.file_meta.SourceApplicationEntityTitle == "SCANNER1"
    finally:
        srv.stop()

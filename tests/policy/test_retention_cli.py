"""``dicomweb-server retention [--dry-run] [--json]`` and the server's periodic run
(retention_interval): the dry run's table lists what the run then removes, both audited."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.cli import main
from dicomweb_server.settings import Settings
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.policy.test_retention import study

POLICY = """
protect_recent = 0
[[rules]]
name = "old CT"
match = { Modality = "CT" }
older_than = 365
by = "StudyDate"
"""


def test_dry_run_table_then_the_run(tmp_path, capsys):
    policy = tmp_path / "retention.toml"
    policy.write_text(POLICY)
    data = tmp_path / "data"
    archive = Archive.open(Settings(data_dir=data, index="sqlite"))
    dates = {study(archive, n=2, StudyDate="20000101"): "20000101", study(archive, StudyDate="20010101"): "20010101"}
    old = sorted(dates)
    kept = study(archive, modality="MR", StudyDate="20000101")
    sizes = {s: sum(x.size for x in archive.index.instances(s)) for s in old}
    total = archive.index.counts().stored_bytes
    archive.close()
    audit = tmp_path / "audit.jsonl"
    args = ["retention", "--data-dir", str(data), "--retention", str(policy), "--audit-log", str(audit)]

    assert main(args + ["--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["study", "date", "received", "bytes", "action", "rule", "reason"]
    rows = sorted(line.split()[:4] for line in out[1:3])
    assert [(r[0], r[1], r[3]) for r in rows] == [(s, dates[s], str(sizes[s])) for s in old]
    assert out[3:] == [f"would remove 2 study(ies), {sum(sizes.values())} bytes ({total} bytes stored)"]

    assert main(args + ["--json"]) == 0
    done = orjson.loads(capsys.readouterr().out)
    assert done["dry_run"] is False and sorted(s["study"] for s in done["studies"]) == old
    assert done["bytes"] == sum(sizes.values())
    assert all(s["reason"].startswith("expired: StudyDate ") for s in done["studies"])

    archive = Archive.open(Settings(data_dir=data, index="sqlite"))
    try:
        assert [archive.index.instances(s) for s in old] == [[], []]
        assert len(archive.index.instances(kept)) == 1
    finally:
        archive.close()
    lines = [orjson.loads(x) for x in audit.read_text().splitlines()]
    assert [(x["action"], x["dry_run"], sorted(s["study"] for s in x["studies"])) for x in lines] == [
        ("retention", True, old), ("retention", False, old)]
    assert lines[0]["user"].endswith("(command line)")


def test_a_bad_policy_is_one_line(tmp_path, capsys):
    policy = tmp_path / "retention.toml"
    policy.write_text('[[rules]]\naction = "shred"\n')
    Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite")).close()
    assert main(["retention", "--data-dir", str(tmp_path / "data"), "--retention", str(policy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dicomweb-server retention: --retention: ") and "line 2: [[rules]] #1 action" in err


@pytest.mark.parametrize("interval", [0.2])
def test_the_server_runs_the_policy_every_interval(tmp_path, interval):
    policy = tmp_path / "retention.toml"
    policy.write_text(POLICY)
    srv = LiveServer(tmp_path / "data", "sqlite", retention_file=policy, retention_interval=interval).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            old, new = make_dataset(StudyDate="20000101"), make_dataset(StudyDate=time.strftime("%Y%m%d"))
            body, ctype = multipart([to_bytes(old), to_bytes(new)])
            assert http.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
            deadline = time.monotonic() + 20
            while True:
                listed = [x["0020000D"]["Value"][0] for x in http.get("/studies").json()]
                if listed == [new.StudyInstanceUID] or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert listed == [new.StudyInstanceUID]
    finally:
        srv.stop()

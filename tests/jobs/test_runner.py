"""The durable runner of background jobs (jobs/runner.py) on each index's outbox: a job
runs to its end with its counts; a JobError fails it at once (a dead letter), another
exception is tried again from the checkpoint; a cancel stops it at its next save; a
shutdown stops it and the next runner resumes it; a SIGKILLed runner's job is resumed
by the next runner from its last checkpoint, every item done, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.jobs.runner import Runner
from dicomweb_server.jobs.store import destination
from dicomweb_server.routing import open_outbox
from dicomweb_server.settings import Settings
from tests.jobs import kinds
from tests.routing.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "memory", "postgresql"])
def settings(request, tmp_path) -> Settings:
    extra = {"database_url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return Settings(data_dir=tmp_path / "data", index=request.param, **extra)


class Opened:
    def __init__(self, settings: Settings, **kw) -> None:
        self.archive = Archive.open(settings)
        self.outbox = open_outbox(settings, self.archive.committer.writer)
        self.runner = Runner(self.archive, self.outbox, **{"retry": 0.05, "poll": 0.05, **kw})

    def close(self) -> None:
        self.runner.stop()
        self.outbox.close()
        self.archive.close()


@pytest.fixture
def opened(settings, monkeypatch):
    kinds.install(monkeypatch)
    o = Opened(settings)
    yield o
    o.close()


def _done(out: Path) -> list[int]:
    return [int(x) for x in (out / "done.log").read_text().split()] if (out / "done.log").exists() else []


def _final(runner: Runner, job_id: str, timeout: float = 60) -> dict:
    return wait_for(lambda: (j := runner.store.get(job_id))["state"] in ("done", "failed", "cancelled") and j,
                    timeout, f"job {job_id} to end")


def test_a_job_runs_to_its_end_with_its_counts(opened, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    opened.runner.start()
    job_id = opened.runner.submit("count", {"out": str(out), "n": 7, "every": 3}, "api-key:alice", False)
    job = _final(opened.runner, job_id)
    assert job["state"] == "done" and job["result"] == {"items": 7}
    assert job["progress"] == {"total": 7, "done": 7, "failed": 0, "skipped": 0}
    assert job["checkpoint"] == {"next": 7} and job["attempts"] == 1 and job["owner"] == "api-key:alice"
    assert _done(out) == list(range(7))
    rows = wait_for(lambda: [r for r in opened.outbox.rows(destination("count")) if r["state"] != "pending"],
                    30, "its row settled")
    assert [(r["SOPInstanceUID"], r["state"]) for r in rows] == [(job_id, "delivered")]


def test_stop_waits_for_a_job_still_settling_its_queue_row(opened, tmp_path, monkeypatch):
    """A finished job leaves the running ones, then settles its queue row: stop() returned
    meanwhile and its caller closed the outbox under the settling thread (a segfault in CI,
    SQLite's connection closed under a running statement)."""
    out = tmp_path / "out"
    out.mkdir()
    settling, settled = threading.Event(), threading.Event()
    real = opened.outbox.settle

    def slow(*args, **kwargs):
        settling.set()
        time.sleep(0.5)
        real(*args, **kwargs)
        settled.set()

    monkeypatch.setattr(opened.outbox, "settle", slow)
    opened.runner.start()
    opened.runner.submit("count", {"out": str(out), "n": 2, "every": 1}, "api-key:alice", False)
    assert settling.wait(30)
    opened.runner.stop()
    assert settled.is_set()


def test_a_job_error_fails_at_once_and_is_a_dead_letter(opened, tmp_path):
    opened.runner.start()
    job_id = opened.runner.submit("count", {"out": str(tmp_path), "n": 1, "bad": "no such target"})
    job = _final(opened.runner, job_id)
    assert (job["state"], job["error"], job["attempts"]) == ("failed", "bad parameters: no such target", 1)
    # (its queue row is settled after the job's state: a crash between leaves the row owed,
    # and the next runner, seeing the job ended, settles it without running it)
    [row] = wait_for(lambda: [r for r in opened.outbox.rows(destination("count")) if r["state"] != "pending"],
                     30, "its row settled")
    assert (row["state"], row["last_error"]) == ("failed", "bad parameters: no such target")


def test_a_raising_job_runs_again_from_its_checkpoint(opened, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    opened.runner.start()
    job_id = opened.runner.submit("count", {"out": str(out), "n": 6, "every": 2, "fail_once_at": 3})
    job = _final(opened.runner, job_id)
    assert (job["state"], job["attempts"]) == ("done", 2)
    # items 0-1 saved, 2 done but not saved when 3 raised: 2 again, from checkpoint {"next": 2}
    assert _done(out) == [0, 1, 2, 2, 3, 4, 5]
    assert (out / "starts.log").read_text().split() == ["0", "2"]


def test_cancel_stops_a_running_job_at_its_next_save(opened, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    opened.runner.start()
    job_id = opened.runner.submit("count", {"out": str(out), "n": 10_000, "sleep": 0.01})
    wait_for(lambda: len(_done(out)) >= 3, 30, "the job to start")
    assert opened.runner.store.cancel(job_id) == "running"
    job = _final(opened.runner, job_id)
    assert job["state"] == "cancelled" and job["cancel"] is True
    assert len(_done(out)) < 10_000
    wait_for(lambda: opened.outbox.rows(destination("count"))[0]["state"] == "delivered", 30, "its row settled")


def test_cancel_of_a_queued_job_is_immediate_and_it_never_runs(opened, tmp_path):
    job_id = opened.runner.submit("count", {"out": str(tmp_path), "n": 3})
    assert opened.runner.store.cancel(job_id) == "cancelled"
    opened.runner.start()
    wait_for(lambda: opened.outbox.rows(destination("count"))[0]["state"] == "delivered", 30, "its row settled")
    assert not (tmp_path / "done.log").exists()


def test_a_shutdown_requeues_and_the_next_runner_resumes(settings, monkeypatch, tmp_path):
    kinds.install(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    first = Opened(settings)
    first.runner.start()
    job_id = first.runner.submit("count", {"out": str(out), "n": 60, "sleep": 0.01})
    wait_for(lambda: len(_done(out)) >= 5, 30, "the job to start")
    first.close()  # stops at its next save: requeued, lease released
    second = Opened(settings)
    try:
        assert second.runner.store.get(job_id)["state"] == "queued"
        second.runner.start()
        job = _final(second.runner, job_id)
    finally:
        second.close()
    assert job["state"] == "done" and job["attempts"] == 2
    assert sorted(set(_done(out))) == list(range(60)) and len(_done(out)) == 60  # every=1: nothing twice


def test_a_sigkilled_runner_is_resumed_from_its_checkpoint(settings, monkeypatch, tmp_path):
    """A real process running the job, killed with SIGKILL; the next runner (same host:
    it frees the dead process's lease at once) runs the job on from its last save."""
    kinds.install(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    args = [sys.executable, "-m", "tests.jobs.runner_process", str(settings.data_dir), settings.index]
    if settings.database_url:
        args.append(settings.database_url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    Archive.open(settings).close()  # created before the child opens it
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        submitter = Opened(settings)
        job_id = submitter.runner.submit("count", {"out": str(out), "n": 80, "every": 4, "sleep": 0.01})
        submitter.close()
        wait_for(lambda: len(_done(out)) >= 10, 60, "the child to run the job")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_at = len(_done(out))
    assert killed_at < 80
    resumer = Opened(settings)
    try:
        resumer.runner.start()
        job = _final(resumer.runner, job_id)
    finally:
        resumer.close()
    done = _done(out)
    assert job["state"] == "done" and job["progress"]["done"] == 80
    assert sorted(set(done)) == list(range(80))
    starts = [int(x) for x in (out / "starts.log").read_text().split()]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] % 4 == 0 and starts[1] > 0
    assert len(done) - 80 <= 4  # at most the items after the last save ran twice


def test_a_runner_that_lost_its_lease_writes_nothing_more(opened, tmp_path):
    """Another runner took the job over (this one stalled past its lease): this one's next
    save finds the queue row leased by the other, writes no checkpoint, stops, and neither
    finishes nor settles the job (the other runner's outcome counts)."""
    out = tmp_path / "out"
    out.mkdir()
    opened.runner.start()
    job_id = opened.runner.submit("count", {"out": str(out), "n": 10_000, "every": 1, "sleep": 0.01})
    wait_for(lambda: len(_done(out)) >= 3, 30, "the job to start")
    with opened.outbox._transaction() as con:  # the takeover: the row's lease is another's now
        con.execute(opened.outbox._sql("UPDATE outbox SET _lease_owner = 'elsewhere:1:jobs:x:0:', "
                                       "_lease_until = ? WHERE SOPInstanceUID = ?"), (time.time() + 600, job_id))
    wait_for(lambda: not opened.runner._running, 30, "the runner to let the job go")
    job = opened.runner.store.get(job_id)
    saved = job["checkpoint"]["next"]
    assert job["state"] == "running" and saved < 10_000
    assert len(_done(out)) <= saved + 1  # it stopped at its first save after the takeover
    [row] = opened.outbox.rows(destination("count"))
    assert row["state"] == "pending"
    time.sleep(0.3)
    assert opened.runner.store.get(job_id)["checkpoint"]["next"] == saved

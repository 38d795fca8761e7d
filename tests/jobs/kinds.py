"""A job kind for the runner's tests: ``count`` does items 0..n-1, each item appending a
line ``<item>`` to ``<out>/done.log`` (so the test sees how often each ran) and saving a
checkpoint every ``every`` items; ``sleep`` seconds per item; ``fail_once_at``: raises
the first time it reaches that item (a marker file says it did); ``bad``: a JobError."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dicomweb_server.jobs import Context, JobError


def count(ctx: Context) -> dict:
    p = ctx.params
    if p.get("bad"):
        raise JobError("bad parameters: " + p["bad"])
    out = Path(p["out"])
    n, every = p["n"], p.get("every", 1)
    start = ctx.checkpoint.get("next", 0)
    with open(out / "starts.log", "a") as f:
        f.write(f"{start}\n")
    for i in range(start, n):
        if p.get("fail_once_at") == i and not (out / "failed-once").exists():
            (out / "failed-once").touch()
            raise RuntimeError(f"item {i} failed (once)")
        time.sleep(p.get("sleep", 0))
        with open(out / "done.log", "a") as f:
            f.write(f"{i}\n")
            f.flush()
            os.fsync(f.fileno())
        if (i + 1) % every == 0 or i + 1 == n:
            ctx.save({"next": i + 1}, total=n, done=i + 1)
    return {"items": n}


def install(monkeypatch) -> None:
    from dicomweb_server import jobs

    monkeypatch.setitem(jobs.KINDS, "count", "tests.jobs.kinds:count")

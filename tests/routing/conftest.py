from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.routing.sink import Sink

FAST = """
[delivery]
batch_size = 5
backoff_base = 0.05
backoff_max = 0.3
max_attempts = 100000
poll_interval = 0.2
timeout = 10
"""


def write_routes(path: Path, sink_url: str, extra: str = "", match: str = "") -> Path:
    path.write_text(f"""
[[destinations]]
name = "sink"
stow_url = "{sink_url}"

[[rules]]
name = "everything"
{match}
destinations = ["sink"]
{extra}
{FAST}""")
    return path


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll until ``predicate()`` is true (a deadline, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def sink(tmp_path):
    s = Sink(tmp_path / "sink").start()
    yield s
    s.stop()

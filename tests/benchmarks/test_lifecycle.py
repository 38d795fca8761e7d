"""The lifecycle benchmark (benchmarks/lifecycle.py) runs: its core with one 5-instance
study, through a real server. Keeps the script from rotting; the figures are not checked,
the counts and the all-old-or-all-new rule are."""

from __future__ import annotations

from benchmarks import lifecycle as bench


def test_lifecycle_benchmark_core_runs(tmp_path):
    out = bench.run([5], tmp_path)
    assert out["sizes"][5]["instances"] == 5
    assert out["file_size"] > 64 * 64 * 2  # the 16-bit pixels and the header
    rd = out["readers"]
    assert rd["instances"] == 5
    assert rd["answers"] > 0 and rd["old"] + rd["new"] == rd["answers"]
    assert rd["mixed"] == rd["wrong_count"] == rd["errors"] == rd["old_after"] == 0
    assert rd["new"] >= 1  # the last answer was asked after the update's acknowledgement
    # 5 creates, then 5 updates twice (the study updated, then updated again under the readers)
    assert [(f["metadata"], f["entries"], f["with_metadata"]) for f in out["feed"]] == [(True, 15, 5), (False, 15, 0)]
    text = bench.report([out], bench.facts(), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), "now", 1.0)
    assert "| 5 |" in text and "entries/s" in text

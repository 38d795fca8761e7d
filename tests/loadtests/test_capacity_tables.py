"""loadtests.capacity tables: the load average of each step is shown, and the
baseline comparison (this build against an older one) has no Orthanc bar."""

from __future__ import annotations

from loadtests import capacity


def _row(op: str, req_s: float, cpu: float, load: str | None) -> dict:
    return {"operation": op, "connections": 8, "requests": int(req_s * 10), "req_s": req_s, "mb_s": 1.0,
            "p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0, "errors": 0, "peak_server_mb": 100.0,
            "wrk_cpu_pct": 10.0, "server_cpu_pct": 90.0, "other_cpu_pct": 5.0, "cpu_ms_per_op": cpu,
            "stored": 80 if op == "stow" else None, "loadavg": load}


def test_load_average_column_and_baseline_ratio():
    ours = [_row("stow", 450.0, 2.1, "1.50 1.20 0.90")]
    base = [_row("stow", 300.0, 2.8, "1.60 1.25 0.91")]
    table = capacity.server_table(ours)
    assert "load avg" in table.splitlines()[0] and "1.50 1.20 0.90" in table
    text, cmp = capacity.ratio_table(ours, base, None)
    assert cmp == [{"operation": "stow", "connections": 8, "ours_req_s": 450.0, "peer_req_s": 300.0,
                    "ratio": 1.5, "round_ratios": [1.5], "ours_cpu_ms_per_op": 2.1, "peer_cpu_ms_per_op": 2.8}]
    assert "meets" not in text and "1.50x" in text
    text, _ = capacity.ratio_table(ours, base)  # against Orthanc: the 1.5x bar
    assert "meets 1.5x" in text
    assert capacity.load_average() is None or len(capacity.load_average().split()) == 3


def test_rounds_ratio_is_the_geometric_mean_of_the_rounds():
    """With the order alternated (run_servers' rounds), a server measured first gains in
    one round and loses in the other: the ratio is the geometric mean of the two."""
    ours = [dict(_row("stow", 900.0, 1.5, None), round=0), dict(_row("stow", 600.0, 1.9, None), round=1)]
    peer = [dict(_row("stow", 600.0, 2.0, None), round=0), dict(_row("stow", 750.0, 2.2, None), round=1)]
    text, cmp = capacity.ratio_table(ours, peer)
    assert cmp == [{"operation": "stow", "connections": 8, "ours_req_s": 750.0, "peer_req_s": 675.0,
                    "ratio": 1.1, "round_ratios": [1.5, 0.8], "ours_cpu_ms_per_op": 1.7,
                    "peer_cpu_ms_per_op": 2.1}]  # sqrt(1.5 * 0.8) = 1.095
    assert "1.50 / 0.80" in text and "below 1.5x" in text


def test_rounds_that_do_not_pair_give_no_ratio():
    """Review: a round missing on one side gave the other round's ratio alone (with the
    order effect in it) as if it were the pair's."""
    ours = [dict(_row("stow", 900.0, 1.5, None), round=0), dict(_row("stow", 600.0, 1.9, None), round=1)]
    peer = [dict(_row("stow", 600.0, 2.0, None), round=0)]
    text, cmp = capacity.ratio_table(ours, peer)
    assert cmp[0]["ratio"] is None and "rounds differ" in text and "meets" not in text
    twice = [dict(_row("stow", 600.0, 2.0, None), round=0), dict(_row("stow", 700.0, 2.0, None), round=0)]
    assert capacity.ratio_table(ours, twice)[1][0]["ratio"] is None


def test_server_and_static_tables_show_the_rounds():
    rows = [dict(_row("study", 100.0, 5.0, None), round=0), dict(_row("study", 100.0, 5.0, None), round=1)]
    assert capacity.server_table(rows).splitlines()[0].split("|")[3].strip() == "round"
    assert "round" not in capacity.server_table(rows[:1]).splitlines()[0]
    static = [dict(_row("study", 1.0, 1.0, None), round=0, mb_s=4.0), dict(_row("study", 1.0, 1.0, None), round=1,
                                                                         mb_s=1.0)]
    lines = capacity.static_table(rows, static).splitlines()[2:]
    assert [line.split("|")[5].strip() for line in lines] == ["0.25", "1.00"]  # each round against its own


def test_an_odd_number_of_rounds_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        capacity.main(["--host", "http://127.0.0.1:1", "--rounds", "3"])
    assert "an even number" in capsys.readouterr().err

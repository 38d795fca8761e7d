"""``python -m loadtests.route --via dimse`` (issue 12): C-STORE ingest into a spawned
forwarding archive (its DIMSE front door) and a spawned sink; the reconciliation counts
are exact: every acknowledged instance at the sink once, none missing, none extra."""

from __future__ import annotations

import argparse

from loadtests import route


def test_cstore_ingest_reconciles_exactly():
    spawned = route.Spawned(workers=1, dimse=True)
    try:
        r = route.run_step(spawned.archive, spawned.sink, spawned.sink_data, clients=2, n=5, size=16,
                           archive_data=spawned.archive_data, dimse=("127.0.0.1", spawned.dimse_port, "DICOMWEB"))
    finally:
        spawned.close()
    assert r["via"] == "C-STORE"
    assert (r["sent"], r["acked"], r["errors"]) == (5, 5, 0)
    assert (r["at_sink"], r["files"], r["missing"], r["extra"], r["listed_twice"], r["resends"]) == (5, 5, 0, 0, 0, 0)
    assert r["queue_after"]["sink"]["pending"] == 0 and r["queue_after"]["sink"]["delivered"] == 5
    text = route.report([r], argparse.Namespace(size=16, via="dimse", workers=1, spawn=True), "test")
    assert "C-STORE (one association per client" in text and " 5/5 " in text

"""GET /changefeed (api/changefeed.py): Microsoft dicom-server's change feed over our
change log, on every index: STOW-RS creates, DELETE deletes, the entry fields, v1 and v2
paging, limits, includemetadata, /latest, and the read scope."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx
import pytest
from pydicom.uid import generate_uid

from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

POSTGRESQL = True  # tests/conftest.py: the index_kind fixture covers PostgreSQL too

ENTRY_FIELDS = ["Sequence", "StudyInstanceUid", "SeriesInstanceUid", "SopInstanceUid", "Action", "Timestamp",
                "State"]


def stow(url: str, datasets) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    r = httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=30)
    assert r.status_code == 200, r.text


def feed(url: str, path: str = "/changefeed", **params) -> list[dict]:
    r = httpx.get(url + path, params=params, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.json()


def test_creates_deletes_and_their_entries(server):
    url = server.url
    r = httpx.get(url + "/changefeed/latest")
    assert r.status_code == 204  # nothing changed yet
    assert feed(url) == []
    st, se = generate_uid(), generate_uid()
    dss = [make_dataset(study=st, series=se, PatientID="CF", InstanceNumber=n) for n in (1, 2, 3)]
    t0 = datetime.now(UTC)
    stow(url, dss)
    assert httpx.delete(f"{url}/studies/{st}/series/{se}/instances/{dss[1].SOPInstanceUID}").status_code == 204
    got = feed(url)
    assert [(e["Sequence"], e["Action"], e["State"], e["SopInstanceUid"]) for e in got] == [
        (1, "create", "current", dss[0].SOPInstanceUID), (2, "create", "deleted", dss[1].SOPInstanceUID),
        (3, "create", "current", dss[2].SOPInstanceUID), (4, "delete", "deleted", dss[1].SOPInstanceUID)]
    for e in got:
        assert list(e) == [*ENTRY_FIELDS, "Metadata"]
        assert (e["StudyInstanceUid"], e["SeriesInstanceUid"]) == (st, se)
        stamp = datetime.fromisoformat(e["Timestamp"])
        assert e["Timestamp"].endswith("Z") and abs((stamp - t0).total_seconds()) < 60
    # Metadata: the instance's DICOM JSON while current (as WADO-RS metadata gives it), null when deleted
    (wado,) = httpx.get(f"{url}/studies/{st}/series/{se}/instances/{dss[0].SOPInstanceUID}/metadata").json()
    assert got[0]["Metadata"] == wado and got[0]["Metadata"]["00080018"]["Value"] == [dss[0].SOPInstanceUID]
    assert got[1]["Metadata"] is None and got[3]["Metadata"] is None
    assert list(feed(url, includemetadata="false")[0]) == ENTRY_FIELDS
    assert list(feed(url, includeMetadata="False")[0]) == ENTRY_FIELDS  # parameter names: any case
    latest = httpx.get(url + "/changefeed/latest", params={"includemetadata": "false"}).json()
    assert latest == {k: got[3][k] for k in ENTRY_FIELDS}
    assert httpx.delete(f"{url}/studies/{st}").status_code == 204
    assert [(e["Sequence"], e["Action"]) for e in feed(url, offset=4)] == [(5, "delete"), (6, "delete")]
    assert {e["State"] for e in feed(url, limit=100)} == {"deleted"}


def test_v1_and_v2_paging_and_limits(server):
    url = server.url
    stow(url, [make_dataset(PatientID="P1") for _ in range(12)])
    time.sleep(0.05)
    middle = datetime.now(UTC).isoformat()
    time.sleep(0.05)
    stow(url, [make_dataset(PatientID="P2") for _ in range(3)])
    seqs = lambda entries: [e["Sequence"] for e in entries]  # noqa: E731
    # version 1 (also unversioned): offset = the Sequence to read after; limit default 10, max 100
    assert seqs(feed(url)) == list(range(1, 11))
    assert seqs(feed(url, "/v1/changefeed", offset=10)) == [11, 12, 13, 14, 15]
    assert seqs(feed(url, offset=3, limit=2)) == [4, 5]
    # version 2: a time window, offset = entries of it skipped; limit default 100, max 200
    assert seqs(feed(url, "/v2/changefeed")) == list(range(1, 16))
    assert seqs(feed(url, "/v2/changefeed", startTime=middle)) == [13, 14, 15]
    assert seqs(feed(url, "/v2/changefeed", startTime=middle, offset=1, limit=1)) == [14]
    assert seqs(feed(url, "/v2/changefeed", endtime=middle, offset=10)) == [11, 12]
    assert seqs(feed(url, "/v2/changefeed", startTime="2000-01-01", endTime="2001-01-01")) == []
    assert httpx.get(url + "/v2/changefeed/latest").json()["Sequence"] == 15
    for path, params in [("/changefeed", {"limit": 101}), ("/changefeed", {"limit": 0}),
                         ("/changefeed", {"offset": -1}), ("/v2/changefeed", {"limit": 201}),
                         ("/changefeed", {"includemetadata": "maybe"}), ("/v2/changefeed", {"startTime": "soon"}),
                         ("/v2/changefeed", {"startTime": middle, "endTime": middle}),
                         ("/changefeed", {"limit": "ten"})]:
        r = httpx.get(url + path, params=params)
        assert r.status_code == 400, (path, params, r.text)
    assert len(feed(url, "/v2/changefeed", limit=200)) == 15


def test_the_feed_needs_the_read_scope(tmp_path):
    srv = LiveServer(tmp_path / "data", api_keys={"reader": ["read"], "writer": ["write"]}).start()
    try:
        assert httpx.get(srv.url + "/changefeed").status_code == 401
        assert httpx.get(srv.url + "/changefeed", headers={"Authorization": "Bearer writer"}).status_code == 403
        r = httpx.get(srv.url + "/changefeed/latest", headers={"Authorization": "Bearer reader"})
        assert r.status_code == 204
    finally:
        srv.stop()


@pytest.mark.parametrize("prefix", ["/dicomweb"])
def test_under_the_dicomweb_prefix(tmp_path, prefix):
    srv = LiveServer(tmp_path / "data", prefix=prefix).start()
    try:
        stow(srv.url + prefix, [make_dataset()])
        assert [e["Sequence"] for e in feed(srv.url + prefix, includemetadata="false")] == [1]
    finally:
        srv.stop()

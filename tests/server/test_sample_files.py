"""The pydicom sample files through real HTTP, on both indexes: each is stored,
found by QIDO-RS at every level with the right counts, retrieved byte-identical,
and its metadata holds every element; the SQLite archive answers the same after
a restart (issue #2, "Done means")."""

from __future__ import annotations

import collections
import io

import httpx
import pydicom
import pytest
from python_multipart.multipart import MultipartParser

from tests.helpers import LiveServer, multipart, sample_files

SAMPLES = sample_files()


def split_multipart(resp: httpx.Response) -> list[tuple[dict[str, str], bytes]]:
    """Decode a multipart/related answer (python-multipart's byte parser)."""
    ctype = resp.headers["content-type"]
    boundary = [p.split("=", 1)[1].strip('"') for p in ctype.split(";") if p.strip().startswith("boundary=")][0]
    parts: list[tuple[dict[str, str], bytes]] = []
    state = {"h": b"", "v": b""}

    def begin():
        parts.append(({}, bytearray()))

    def hf(d, s, e):
        state["h"] += d[s:e]

    def hv(d, s, e):
        state["v"] += d[s:e]

    def he():
        parts[-1][0][state["h"].decode().lower()] = state["v"].decode()
        state["h"] = state["v"] = b""

    def data(d, s, e):
        parts[-1][1].extend(d[s:e])

    p = MultipartParser(boundary, {"on_part_begin": begin, "on_header_field": hf, "on_header_value": hv,
                                   "on_header_end": he, "on_part_data": data})
    p.write(resp.content)
    p.finalize()
    return [(h, bytes(b)) for h, b in parts]


@pytest.fixture(scope="module", params=["sqlite", "memory"])
def loaded(request, tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("data"), request.param).start()
    client = httpx.Client(base_url=srv.url, timeout=120)
    paths = list(SAMPLES.values())
    referenced: set[str] = set()
    failed = []
    for i in range(0, len(paths), 25):
        body, ctype = multipart([p.read_bytes() for p in paths[i : i + 25]])
        r = client.post("/studies", content=body, headers={"Content-Type": ctype})
        assert r.status_code in (200, 202), r.text
        js = r.json()
        for item in js.get("00081199", {}).get("Value", []):
            referenced.add(item["00081155"]["Value"][0])
        failed += js.get("00081198", {}).get("Value", [])
    yield srv, client, referenced, failed
    client.close()
    srv.stop()


def _expected():
    studies: dict[str, set[str]] = collections.defaultdict(set)
    series: dict[str, set[str]] = collections.defaultdict(set)
    for sop, path in SAMPLES.items():
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        studies[ds.StudyInstanceUID].add(ds.SeriesInstanceUID)
        series[(ds.StudyInstanceUID, ds.SeriesInstanceUID)].add(sop)
    return studies, series


def test_the_set_is_computed():
    # about 116 instances in 29 studies in pydicom 3.0; the test does not depend on the numbers
    assert len(SAMPLES) > 50


def test_every_file_is_referenced(loaded):
    _srv, _client, referenced, failed = loaded
    assert failed == []
    assert referenced == set(SAMPLES)


def test_qido_finds_every_instance_with_counts(loaded):
    _srv, client, _ref, _f = loaded
    studies, series = _expected()
    r = client.get("/studies", params={"limit": 1000})
    found = {s["0020000D"]["Value"][0]: s for s in r.json()}
    assert set(found) == set(studies)
    for study_uid, series_uids in studies.items():
        s = found[study_uid]
        n_inst = sum(len(series[(study_uid, se)]) for se in series_uids)
        assert s["00201206"]["Value"] == [len(series_uids)]
        assert s["00201208"]["Value"] == [n_inst]
        r = client.get(f"/studies/{study_uid}/series")
        got = {x["0020000E"]["Value"][0]: x["00201209"]["Value"][0] for x in r.json()}
        assert got == {se: len(series[(study_uid, se)]) for se in series_uids}
        for se in series_uids:
            r = client.get(f"/studies/{study_uid}/series/{se}/instances")
            assert {x["00080018"]["Value"][0] for x in r.json()} == series[(study_uid, se)]
    r = client.get("/instances", params={"limit": 1000})
    assert {x["00080018"]["Value"][0] for x in r.json()} == set(SAMPLES)


def test_wado_returns_each_file_and_pixels_identical(loaded):
    _srv, client, _ref, _f = loaded
    for sop, path in SAMPLES.items():
        ds = pydicom.dcmread(path)
        url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{sop}"
        r = client.get(url, headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
        assert r.status_code == 200, (path.name, r.text)
        (headers, body), = split_multipart(r)
        assert body == path.read_bytes(), path.name
        assert f"transfer-syntax={ds.file_meta.TransferSyntaxUID}" in headers["content-type"]
        got = pydicom.dcmread(io.BytesIO(body))
        if "PixelData" in ds:
            assert got.PixelData == ds.PixelData


def test_metadata_holds_every_element(loaded):
    _srv, client, _ref, _f = loaded
    for sop, path in SAMPLES.items():
        ds = pydicom.dcmread(path)
        r = client.get(f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{sop}/metadata")
        assert r.status_code == 200
        (meta,) = r.json()
        want = {f"{int(e.tag):08X}" for e in ds if e.tag.group != 0x0002 and e.tag.element != 0}
        assert set(meta) == want, (path.name, set(meta) ^ want)
        assert meta["00080018"]["Value"] == [sop]


def test_archive_answers_the_same_after_restart(loaded):
    """SQLite reopens its index; the in-memory index is rebuilt from the data folder."""
    srv, client, _ref, _f = loaded
    before = client.get("/studies", params={"limit": 1000}).json()
    srv.restart()
    after = client.get("/studies", params={"limit": 1000}).json()
    assert after == before
    sop, path = next(iter(SAMPLES.items()))
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    r = client.get(f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{sop}",
                   headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'})
    assert split_multipart(r)[0][1] == path.read_bytes()

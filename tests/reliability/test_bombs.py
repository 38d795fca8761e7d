"""Bad-input corpus, class "bombs": STOW-RS parts that are small on the wire but
expand (Deflate), lie about their lengths (truncated elements anywhere in the data
set) or nest without end (sequences). Each fails its instance with 0xC000 and a
clear reason while the good parts of the request are stored; on both indexes."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import httpx
import pytest
from pydicom.uid import DeflatedExplicitVRLittleEndian

from dicomweb_server.dicom import reading
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

FAILED, REASON = "00081198", "00081197"
MiB = 1024 * 1024


def _url(ds) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


def _elem(group: int, element: int, vr: bytes, value: bytes, declared: int | None = None) -> bytes:
    """One explicit VR little endian element; ``declared`` overrides the length."""
    n = len(value) if declared is None else declared
    if vr in (b"OB", b"OW", b"OF", b"OD", b"SQ", b"UN", b"UT", b"UC", b"UR"):
        return struct.pack("<HH2sHL", group, element, vr, 0, n) + value
    return struct.pack("<HH2sH", group, element, vr, n) + value


def _deep(levels: int) -> bytes:
    """(0040,A730) Content Sequence nested ``levels`` deep, undefined lengths."""
    open_ = struct.pack("<HH2sHL", 0x0040, 0xA730, b"SQ", 0, 0xFFFFFFFF) + struct.pack("<HHL", 0xFFFE, 0xE000, 0xFFFFFFFF)
    close = struct.pack("<HHL", 0xFFFE, 0xE00D, 0) + struct.pack("<HHL", 0xFFFE, 0xE0DD, 0)
    inner = _elem(0x0040, 0xA010, b"CS", b"CONTAINS")
    return open_ * levels + inner + close * levels


def _bomb(inflated: int, **attrs) -> tuple[object, bytes]:
    """A Deflated file whose data set inflates to about ``inflated`` bytes (a private
    OB element of zeros), and its dataset."""
    ds = make_dataset(pixels=False, PatientID="bombs", **attrs)
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    head = to_bytes(ds)  # pydicom writes the meta and the deflated data set
    meta_end = _meta_end(head)
    plain = zlib.decompress(head[meta_end:], -15)
    plain += _elem(0x0009, 0x0010, b"LO", b"BOMB") + _elem(0x0009, 0x1001, b"OB", b"", declared=inflated)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = comp.compress(plain)
    zeros = bytes(MiB)
    for _ in range(inflated // MiB):
        body += comp.compress(zeros)
    return ds, head[:meta_end] + body + comp.flush()


def _meta_end(data: bytes) -> int:
    (group_length,) = struct.unpack("<L", data[140:144])  # (0002,0000) UL value
    return 144 + group_length


@pytest.fixture(scope="module", params=["sqlite", "memory"])
def archive(request, tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("bombs"), request.param).start()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield srv, c
    srv.stop()


def _store_with_good(c, bad: bytes):
    good = make_dataset(PatientID="bombs")
    body, ctype = multipart([bad, to_bytes(good)])
    r = c.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 202, r.text
    (failed,) = r.json()[FAILED]["Value"]
    assert failed[REASON]["Value"] == [0xC000]
    assert c.get(_url(good) + "/metadata").status_code == 200
    return r.headers["warning"]


class TestBombs:
    def test_deflate_bomb_is_refused_with_bounded_memory(self, archive, monkeypatch):
        _srv, c = archive
        monkeypatch.setattr(reading, "MAX_INFLATED_BYTES", 4 * MiB)
        _ds, data = _bomb(32 * MiB)
        assert len(data) < 64 * 1024
        tracemalloc.start()
        try:
            warning = _store_with_good(c, data)
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert "inflates to more than 4194304 bytes" in warning
        assert peak < 12 * MiB, peak

    @pytest.mark.parametrize("where", ["top level", "in a sequence item"])
    def test_element_bomb_is_refused(self, archive, monkeypatch, where):
        """Zero bytes are 8-byte elements ((0000,0000), length 0) that deflate about 1000:1:
        a 50 KB part inflating to 50 MB took 43 s of a worker to parse (6 million elements),
        within MAX_INFLATED_BYTES. The parse now runs out of reads (MAX_ELEMENT_READS),
        whether the elements are in the data set or in a sequence item of defined length,
        parsed later (PS3.5 §7.5.1). 0xC000 (PS3.18 §10.5.3) and the good part stored."""
        _srv, c = archive
        monkeypatch.setattr(reading, "MAX_ELEMENT_READS", 100_000, raising=False)
        ds = make_dataset(pixels=False, PatientID="bombs")
        ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
        head = to_bytes(ds)
        meta_end = _meta_end(head)
        zeros = bytes(8 * 200_000)
        if where == "in a sequence item":  # (0040,A043) Concept Name Code Sequence, one item of them
            item = struct.pack("<HHL", 0xFFFE, 0xE000, len(zeros)) + zeros
            zeros = _elem(0x0040, 0xA043, b"SQ", item)
        plain = zlib.decompress(head[meta_end:], -15) + zeros
        comp = zlib.compressobj(9, zlib.DEFLATED, -15)
        data = head[:meta_end] + comp.compress(plain) + comp.flush()
        assert len(data) < 8 * 1024
        warning = _store_with_good(c, data)
        assert "needs more than 100000 reads to parse" in warning

    def test_deflated_within_bound_is_stored(self, archive):
        _srv, c = archive
        ds = make_dataset(rows=16, columns=16, frames=2, PatientID="bombs")
        ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
        body, ctype = multipart([to_bytes(ds)])
        assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        r = c.get(_url(ds) + "/frames/2", headers={"Accept": "multipart/related; type=application/octet-stream"})
        assert r.status_code == 200 and ds.PixelData[512:] in r.content

    @pytest.mark.parametrize("where", ["end", "in a sequence item", "after the pixel data"])
    def test_truncated_element_anywhere_is_refused(self, archive, where):
        _srv, c = archive
        ds = make_dataset(pixels=where == "after the pixel data", PatientID="bombs")
        data = to_bytes(ds)
        liar = _elem(0x0009, 0x0010, b"LO", b"ACME") + _elem(0x0009, 0x1001, b"OB", b"x" * 64, declared=0xFFFFFFF0)
        if where == "in a sequence item":  # the item holds 24 bytes; its element declares 1000
            item_value = _elem(0x0008, 0x0100, b"SH", b"CODE01") + struct.pack("<HH2sH", 0x0008, 0x0104, b"LO", 1000) \
                + b"y" * 6
            item = struct.pack("<HHL", 0xFFFE, 0xE000, len(item_value)) + item_value
            liar = _elem(0x0040, 0xA043, b"SQ", item)
        warning = _store_with_good(c, data + liar)
        assert "truncated" in warning

    def test_deep_nesting_is_refused(self, archive):
        _srv, c = archive
        for levels in (reading.MAX_SEQUENCE_DEPTH + 1, 90, 5000):
            warning = _store_with_good(c, to_bytes(make_dataset(pixels=False)) + _deep(levels))
            assert f"nested deeper than {reading.MAX_SEQUENCE_DEPTH}" in warning

    def test_nesting_within_the_limit_is_stored(self, archive):
        _srv, c = archive
        ds = make_dataset(pixels=False, PatientID="bombs")
        body, ctype = multipart([to_bytes(ds) + _deep(reading.MAX_SEQUENCE_DEPTH)])
        assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        meta = c.get(_url(ds) + "/metadata").json()[0]
        depth, node = 0, meta
        while "0040A730" in node:
            node, depth = node["0040A730"]["Value"][0], depth + 1
        assert depth == reading.MAX_SEQUENCE_DEPTH and node["0040A010"]["Value"] == ["CONTAINS"]

    def test_memory_index_start_up_skips_a_stored_bomb(self, tmp_path, monkeypatch):
        """A bomb already on disk (e.g. written by an older version) is not inflated
        without bound when the memory index rebuilds itself at start-up (only that
        index reads every file at start-up)."""
        monkeypatch.setattr(reading, "MAX_INFLATED_BYTES", 4 * MiB)
        ds, data = _bomb(8 * MiB)
        good = make_dataset(PatientID="bombs")
        blobs = tmp_path / "data" / "blobs"
        for d, b in ((ds, data), (good, to_bytes(good))):
            path = blobs / d.StudyInstanceUID / d.SeriesInstanceUID / f"{d.SOPInstanceUID}.dcm"
            path.parent.mkdir(parents=True)
            path.write_bytes(b)
        srv = LiveServer(tmp_path / "data", "memory").start()
        try:
            found = httpx.get(srv.url + "/instances", params={"PatientID": "bombs"}).json()
        finally:
            srv.stop()
        assert [x["00080018"]["Value"][0] for x in found] == [good.SOPInstanceUID]

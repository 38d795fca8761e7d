"""The STOW-RS part spooler (RFC 2046 framing) on hand-built bodies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dicomweb_server.dicom import multipart
from dicomweb_server.dicom.multipart import MultipartError, PartSpooler, TooLarge


def spool(tmp_path, body: bytes, boundary="b=.1", chunk=7, **kw):
    s = PartSpooler(boundary, tmp_path, max_bytes=kw.get("max_bytes", 10**9), max_parts=kw.get("max_parts", 100))
    for i in range(0, len(body), chunk):
        s.feed(body[i : i + chunk])
    s.close()
    for p in s.parts:  # small parts stay in memory until the storing thread writes them
        p.spool(tmp_path)
    return s


def test_parts_headers_and_bytes(tmp_path):
    body = (b"preamble\r\n--b=.1\r\nContent-Type: application/dicom\r\nContent-Location: x\r\n\r\nAB\r\n--b=.1 \r\n"
            b"\r\n--b=.1--notreally\r\n\r\n--b=.1--\r\nepilogue")
    s = spool(tmp_path, body)
    assert [p.complete for p in s.parts] == [True, True]
    assert s.parts[0].headers == {"content-type": "application/dicom", "content-location": "x"}
    assert s.parts[0].path.read_bytes() == b"AB"
    assert s.parts[1].path.read_bytes() == b"--b=.1--notreally\r\n"


def test_truncated_last_part_is_incomplete(tmp_path):
    s = spool(tmp_path, b"--zz\r\n\r\nAB\r\n--zz\r\n\r\nCD", boundary="zz")
    assert [p.complete for p in s.parts] == [True, False]


def test_errors(tmp_path):
    with pytest.raises(MultipartError):
        spool(tmp_path, b"x" * 70000, boundary="zz", chunk=4096)
    with pytest.raises(MultipartError):
        spool(tmp_path, b"nothing", boundary="zz")
    with pytest.raises(TooLarge):
        spool(tmp_path, b"--zz\r\n\r\n" + b"A" * 100 + b"\r\n--zz--", boundary="zz", max_bytes=50)
    with pytest.raises(TooLarge):
        spool(tmp_path, b"--zz\r\n\r\nA\r\n--zz\r\n\r\nB\r\n--zz--", boundary="zz", max_parts=1)
    with pytest.raises(MultipartError):
        PartSpooler("x" * 71, tmp_path, max_bytes=1, max_parts=1)


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.binary(max_size=300), min_size=1, max_size=4), chunk=st.integers(1, 64),
       preamble=st.binary(max_size=40).filter(lambda b: b"--q.=" not in b))
def test_any_payload_round_trips(tmp_path_factory, parts, chunk, preamble):
    d = tmp_path_factory.mktemp("mp")
    boundary = "q.=" + "7" * 20
    body = (preamble + b"\r\n" if preamble else b"") + b"".join(
        f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + p + b"\r\n" for p in parts
    ) + f"--{boundary}--\r\n".encode()
    if any(f"\r\n--{boundary}".encode() in p for p in parts):
        return
    s = spool(d, body, boundary=boundary, chunk=chunk)
    assert [p.path.read_bytes() for p in s.parts] == parts
    s.discard()


def test_small_parts_stay_in_memory_large_ones_go_to_files(tmp_path, monkeypatch):
    monkeypatch.setattr(multipart, "MEMORY_PART_BYTES", 100)
    monkeypatch.setattr(multipart, "MEMORY_REQUEST_BYTES", 250)
    parts = [b"a" * 90, b"b" * 150, b"c" * 90, b"d" * 90, b"e" * 60]
    body = b"".join(b"--zz\r\n\r\n" + p + b"\r\n" for p in parts) + b"--zz--\r\n"
    s = PartSpooler("zz", tmp_path, max_bytes=10**6, max_parts=10)
    for i in range(0, len(body), 16):
        s.feed(body[i : i + 16])
    s.close()
    # 150 B > 100 B per part: a file; then 90 + 90 + 90 > 250 B per request: the third to a file
    assert [p.data for p in s.parts] == [parts[0], None, parts[2], None, parts[4]]
    assert [p.path is not None for p in s.parts] == [False, True, False, True, False]
    assert s.parts[1].path.read_bytes() == parts[1] and s.parts[3].path.read_bytes() == parts[3]
    assert len(list(tmp_path.iterdir())) == 2  # nothing written for the parts in memory
    for p in s.parts:
        p.spool(tmp_path)
    assert [p.path.read_bytes() for p in s.parts] == parts
    assert all(p.data is None for p in s.parts)
    s.discard()
    assert list(tmp_path.iterdir()) == []


def test_spool_error_fails_the_part(tmp_path):
    s = spool(tmp_path, b"--zz\r\n\r\nAB\r\n--zz--\r\n", boundary="zz")
    part = multipart.SpooledPart(data=b"AB", complete=True)
    part.spool(tmp_path / "missing")
    assert part.path is None and isinstance(part.error, FileNotFoundError)
    assert s.parts[0].path.read_bytes() == b"AB"


@pytest.mark.parametrize("end", ["close", "discard", "close and discard"])
def test_spooler_is_freed_without_the_garbage_collector(tmp_path, end):
    """The parser's callbacks are the spooler's methods: once the body is read (close) or
    given up (discard), nothing keeps the spooler, nor the bytes of its parts, alive but
    its owner, so they are freed when the request lets go of them, not at the next run of
    the cyclic collector (which left every 132 KB part to fresh memory: 33 page faults
    per STOW-RS request, issue 33)."""
    import gc
    import weakref

    body = b"--zz\r\n\r\n" + b"A" * 200_000 + b"\r\n--zz--\r\n"
    gc.collect()
    gc.disable()
    try:
        s = PartSpooler("zz", tmp_path, max_bytes=10**6, max_parts=10)
        for i in range(0, len(body), 65536):
            s.feed(body[i : i + 65536])
        for step in end.split(" and "):
            getattr(s, step)()
        assert s.parts[0].data == (b"A" * 200_000 if end == "close" else None)  # (discard drops it)
        ref = weakref.ref(s)
        del s
        assert ref() is None
    finally:
        gc.enable()

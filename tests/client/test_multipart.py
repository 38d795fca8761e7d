"""multipart/related decoding and encoding on hand-built bodies."""
from __future__ import annotations

import gc
import io
import os
import random
import tracemalloc

import pydicom
import pytest

from dicomweb_client.multipart import (
    DATA,
    END,
    HEADERS,
    MultipartDecoder,
    MultipartError,
    Part,
    aiter_part_streams,
    aiter_parts,
    encode_multipart,
    format_media_type,
    iter_part_streams,
    iter_parts,
    parse_media_type,
    stow_body,
)

from .conftest import sample_path
from .fakeserver import parse_multipart_request

ODD_BOUNDARIES = [
    "simple",
    "a=b",
    "x.y.z",
    "it's",
    "p+q",
    "=_.'+()-:?,/",
    "0f3cf5c0-70e0-41ef-baef-c6f9f65ec3e1",
    "B" * 70,
    "--leading-dashes",
    "with space",
]
CHUNK_SIZES = [1, 2, 3, 7, 64, 4096, 1 << 20]


def chunked(data: bytes, size: int):
    return [data[i : i + size] for i in range(0, len(data), size)]


def random_chunks(data: bytes, rng: random.Random):
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 50)
        out.append(data[i : i + n])
        i += n
    return out


def body(boundary: str, parts, *, preamble=b"", epilogue=b"", padding=b"", first_crlf=False) -> bytes:
    """Hand-built multipart body."""
    b = boundary.encode()
    out = [preamble, b"\r\n" if (first_crlf or preamble) else b""]
    for i, (headers, content) in enumerate(parts):
        if i:
            out.append(b"\r\n")
        out.append(b"--" + b + padding + b"\r\n")
        for line in headers:
            out.append(line + b"\r\n")
        out.append(b"\r\n" + content)
    out.append(b"\r\n--" + b + b"--" + epilogue)
    return b"".join(out)


PARTS = [
    ([b"Content-Type: application/dicom; transfer-syntax=1.2.840.10008.1.2.1", b"Content-Location: /studies/1/series/2/instances/3"], b"DICM" + bytes(range(256)) * 3),
    ([b"content-type: image/jpeg"], b"\xff\xd8\xff\xe0 jpeg \r\n\r\n bytes \xff\xd9"),
    ([], b""),
    ([b"Content-Type: application/octet-stream"], b"\r\n"),
]


# ---------------------------------------------------------------- media types
@pytest.mark.parametrize(
    "value,expected",
    [
        ('multipart/related; type="application/dicom"; boundary=abc', ("multipart/related", {"type": "application/dicom", "boundary": "abc"})),
        ("multipart/related; type=application/dicom; boundary=abc", ("multipart/related", {"type": "application/dicom", "boundary": "abc"})),
        ('Multipart/Related; TYPE="Application/DICOM"; Boundary="a=b.c"', ("multipart/related", {"type": "Application/DICOM", "boundary": "a=b.c"})),
        ('multipart/related;boundary="x;y=z";type="application/dicom"', ("multipart/related", {"boundary": "x;y=z", "type": "application/dicom"})),
        ("multipart/related ; boundary = abc ; ; type = application/dicom", ("multipart/related", {"boundary": "abc", "type": "application/dicom"})),
        ('application/dicom; transfer-syntax=1.2.840.10008.1.2.4.50', ("application/dicom", {"transfer-syntax": "1.2.840.10008.1.2.4.50"})),
        ('multipart/related; boundary="quoted \\"inner\\""', ("multipart/related", {"boundary": 'quoted "inner"'})),
        ("multipart/related; boundary='single'", ("multipart/related", {"boundary": "single"})),
        ("", ("", {})),
        (None, ("", {})),
        ("application/dicom+json", ("application/dicom+json", {})),
    ],
)
def test_parse_media_type(value, expected):
    assert parse_media_type(value) == expected


def test_format_media_type_quotes_when_needed():
    assert format_media_type("multipart/related", {"boundary": "abc"}) == "multipart/related; boundary=abc"
    assert format_media_type("multipart/related", {"type": "application/dicom", "boundary": "a=b"}) == (
        'multipart/related; type="application/dicom"; boundary="a=b"'
    )
    for b in ODD_BOUNDARIES:
        ct = format_media_type("multipart/related", {"type": "application/dicom", "boundary": b})
        assert parse_media_type(ct)[1]["boundary"] == b


# ------------------------------------------------------------------ decoding
@pytest.mark.parametrize("boundary", ODD_BOUNDARIES)
@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_odd_boundaries_any_chunk_size(boundary, size):
    data = body(boundary, PARTS, preamble=b"preamble text\r\nmore preamble", epilogue=b"\r\nthe epilogue --" + boundary.encode())
    parts = list(iter_parts(chunked(data, size), boundary))
    assert [p.content for p in parts] == [c for _, c in PARTS]
    assert parts[0].media_type == "application/dicom"
    assert parts[0].transfer_syntax_uid == "1.2.840.10008.1.2.1"
    assert parts[0].content_location == "/studies/1/series/2/instances/3"
    assert parts[1].content_type == "image/jpeg"  # header names are case-insensitive
    assert parts[2].headers == {}


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_streaming_parts_match_whole_parts(size):
    data = body("a=b.c", PARTS, preamble=b"\r\n", epilogue=b"\r\n")
    streamed = []
    for sp in iter_part_streams(chunked(data, size), "a=b.c"):
        streamed.append((sp.headers, b"".join(sp)))
    assert streamed == [(p.headers, p.content) for p in iter_parts([data], "a=b.c")]


def test_no_preamble_and_leading_crlf():
    for kwargs in ({}, {"first_crlf": True}, {"preamble": b"junk", "first_crlf": True}):
        data = body("bnd", PARTS, **kwargs)
        for size in (1, 5, 1000):
            assert [p.content for p in iter_parts(chunked(data, size), "bnd")] == [c for _, c in PARTS]


def test_boundary_in_whole_content_type():
    data = body("x'y", PARTS)
    parts = list(iter_parts([data], 'multipart/related; type="application/dicom"; boundary="x\'y"'))
    assert len(parts) == len(PARTS)


def test_transport_padding_after_boundary():
    data = body("pad", PARTS, padding=b" \t ")
    for size in (1, 3, 100):
        assert [p.content for p in iter_parts(chunked(data, size), "pad")] == [c for _, c in PARTS]


@pytest.mark.parametrize(
    "content",
    [
        b"--BND",  # boundary without CRLF before it
        b"xx--BND\r\nyy",  # boundary mid-line
        b"\r\n--BNDX",  # CRLF + boundary + other char: not a delimiter
        b"\r\n--BND-x",  # one dash only
        b"\r\n--BN",  # truncated boundary at the end of the part
        b"\r\n--BND\rX",  # CR not followed by LF
        b"--BND--",  # closing delimiter without CRLF before it
        b"\r\r\n\n--BNDBND",
    ],
)
@pytest.mark.parametrize("size", [1, 2, 3, 11, 1000])
def test_boundary_lookalikes_are_data(content, size):
    data = body("BND", [([b"Content-Type: application/octet-stream"], content), ([], b"next")])
    parts = list(iter_parts(chunked(data, size), "BND"))
    assert [p.content for p in parts] == [content, b"next"]


def test_random_splits_many_parts():
    rng = random.Random(1234)
    contents = [os.urandom(rng.randint(0, 3000)) for _ in range(30)]
    boundary = "r=a.n'd+o"
    data = b"".join(encode_multipart([({"Content-Type": "application/octet-stream"}, c) for c in contents], boundary))
    for _ in range(5):
        assert [p.content for p in iter_parts(random_chunks(data, rng), boundary)] == contents


def test_header_variants():
    raw = (
        b"--b\r\n"
        b"Content-Type: application/dicom;\r\n"
        b"  transfer-syntax=1.2.840.10008.1.2.4.50\r\n"  # folded header line
        b"X-Repeat: 1\r\nX-Repeat: 2\r\n"
        b"\r\nAAA"
        b"\r\n--b\n"  # bare LF after boundary
        b"Content-Type: text/plain\n\nBBB"  # LF-only header block
        b"\r\n--b--"
    )
    parts = list(iter_parts(chunked(raw, 1), "b"))
    assert parts[0].transfer_syntax_uid == "1.2.840.10008.1.2.4.50"
    assert parts[0].headers["x-repeat"] == "1, 2"
    assert parts[0].content == b"AAA"
    assert parts[1].media_type == "text/plain" and parts[1].content == b"BBB"


def test_empty_multipart():
    assert list(iter_parts([b"--b--\r\n"], "b")) == []
    assert list(iter_parts([b"preamble\r\n--b--"], "b")) == []


def test_truncated_body_is_an_error():
    data = body("b", PARTS)
    cut = data[: data.index(PARTS[1][1]) + 5]  # inside the second part
    with pytest.raises(MultipartError, match="truncated"):
        list(iter_parts(chunked(cut, 7), "b"))
    # lenient mode ends the last part where the body ends
    parts = list(iter_parts(chunked(cut, 7), "b", strict=False))
    assert [p.content for p in parts] == [PARTS[0][1], PARTS[1][1][:5]]


def test_no_boundary_at_all():
    with pytest.raises(MultipartError, match="no multipart boundary"):
        list(iter_parts([b"just some bytes"], "b"))


def test_headers_too_large():
    data = b"--b\r\nX-Big: " + b"a" * 100_000
    with pytest.raises(MultipartError, match="exceed"):
        list(iter_parts(chunked(data, 4096), "b", max_header_bytes=10_000))


def test_malformed_header_line():
    with pytest.raises(MultipartError, match="malformed"):
        list(iter_parts([b"--b\r\nno colon here\r\n\r\nx\r\n--b--"], "b"))


def test_empty_boundary_rejected():
    with pytest.raises(MultipartError):
        MultipartDecoder("")
    with pytest.raises(MultipartError):
        list(iter_parts([b""], "multipart/related; type=application/dicom"))


def test_decoder_events_and_bounded_tail():
    dec = MultipartDecoder("bnd")
    events = dec.feed(b"--bnd\r\nA: 1\r\n\r\n" + b"x" * 100_000)
    kinds = [k for k, _ in events]
    assert kinds[0] == HEADERS and DATA in kinds and END not in kinds
    assert len(dec._tail) < len(b"\r\n--bnd")  # only a possible delimiter start is kept
    events = dec.feed(b"\r\n--bnd--\r\nepilogue")
    assert events[-1] == (END, None) and dec.done
    assert dec.feed(b"more epilogue") == []
    assert dec.close() == []


def test_stops_reading_after_closing_delimiter():
    def chunks():
        yield body("b", PARTS)
        raise AssertionError("epilogue chunks must not be read")

    assert len(list(iter_parts(chunks(), "b"))) == len(PARTS)


async def _agen(chunks):
    for c in chunks:
        yield c


@pytest.mark.parametrize("size", [1, 13, 100_000])
async def test_async_decoders(size):
    data = body("a'b", PARTS, preamble=b"pre", epilogue=b"epi")
    parts = [p async for p in aiter_parts(_agen(chunked(data, size)), "a'b")]
    assert [p.content for p in parts] == [c for _, c in PARTS]
    streamed = []
    async for sp in aiter_part_streams(_agen(chunked(data, size)), "a'b"):
        streamed.append(await sp.read())
    assert streamed == [c for _, c in PARTS]
    # skipping bodies: the next part drains the previous one
    heads = [sp.headers async for sp in aiter_part_streams(_agen(chunked(data, size)), "a'b")]
    assert heads == [p.headers for p in parts]


async def test_async_truncated():
    data = body("b", PARTS)[:-10]
    with pytest.raises(MultipartError):
        [p async for p in aiter_parts(_agen([data]), "b")]


def test_skipping_streamed_parts():
    data = body("b", PARTS)
    heads = [sp.headers for sp in iter_part_streams(chunked(data, 3), "b")]
    assert heads == [p.headers for p in iter_parts([data], "b")]
    # partially read part, then the next
    out = []
    for sp in iter_part_streams(chunked(data, 3), "b"):
        it = iter(sp)
        out.append(next(it, b""))
    assert len(out) == len(PARTS)


def test_part_object():
    p = Part({"content-type": 'application/dicom; transfer-syntax="1.2.3"'}, b"abc")
    assert len(p) == 3 and p.transfer_syntax_uid == "1.2.3" and "3 bytes" in repr(p)
    assert p == Part(dict(p.headers), b"abc")
    assert p.content_id is None and p.content_location is None


# ------------------------------------------------------------------ encoding
def test_encoder_round_trip_sources(tmp_path):
    file_data = os.urandom(300_000)
    path = tmp_path / "f.bin"
    path.write_bytes(file_data)
    sources = [
        b"plain bytes",
        bytearray(b"bytearray"),
        memoryview(b"memoryview"),
        str(path),
        path,
        io.BytesIO(b"file object"),
        [b"it", b"er", b"able"],
        b"",
    ]
    expected = [b"plain bytes", b"bytearray", b"memoryview", file_data, file_data, b"file object", b"iterable", b""]
    headers = {"Content-Type": "application/octet-stream"}
    chunks = list(encode_multipart([(headers, s) for s in sources], "enc=b.o'u+n", chunk_size=65536))
    assert max(len(c) for c in chunks) <= 65536 + 200  # files read in pieces
    data = b"".join(chunks)
    for size in (1, 1000, len(data)):
        if size == 1 and len(data) > 100_000:
            continue
        parts = list(iter_parts(chunked(data, size), "enc=b.o'u+n"))
        assert [p.content for p in parts] == expected
        assert all(p.media_type == "application/octet-stream" for p in parts)


def test_encoder_output_parses_with_python_multipart():
    contents = [os.urandom(5000), b"", b"x--bnd y"]
    data = b"".join(encode_multipart([({"Content-Type": "application/dicom"}, c) for c in contents], "bnd"))
    parsed = parse_multipart_request(data, "bnd")
    assert [c for _, c in parsed] == contents
    assert all(h["content-type"] == "application/dicom" for h, _ in parsed)


def test_stow_body_files_has_exact_length(tmp_path):
    paths = [sample_path("CT_small.dcm"), sample_path("MR_small.dcm")]
    sb = stow_body([str(p) for p in paths], boundary="x=y")
    data = b"".join(sb)
    assert sb.length == len(data)
    ct, params = parse_media_type(sb.content_type)
    assert ct == "multipart/related" and params == {"type": "application/dicom", "boundary": "x=y"}
    parts = list(iter_parts([data], sb.content_type))
    assert [p.content for p in parts] == [p.read_bytes() for p in paths]
    # iterating again re-reads the files
    assert b"".join(sb) == data
    empty = stow_body([], boundary="e")
    assert empty.length == len(b"".join(empty))


def test_stow_body_datasets_one_at_a_time():
    ds_list = [pydicom.dcmread(sample_path(n)) for n in ("CT_small.dcm", "MR_small.dcm")]
    no_meta = pydicom.dcmread(sample_path("MR_small.dcm"))
    del no_meta.file_meta
    encoded_count = 0

    def gen():
        nonlocal encoded_count
        for ds in ds_list + [no_meta]:
            encoded_count += 1
            yield ds

    sb = stow_body(gen())
    assert sb.length is None  # unknown: chunked transfer
    it = iter(sb)
    first = next(it)  # first part header
    assert encoded_count == 1  # lazily, one dataset at a time
    data = first + b"".join(it)
    parts = list(iter_parts([data], sb.content_type))
    back = [pydicom.dcmread(io.BytesIO(p.content)) for p in parts]
    assert [d.SOPInstanceUID for d in back] == [d.SOPInstanceUID for d in ds_list + [no_meta]]
    assert back[2].file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
    assert "file_meta" not in no_meta.__dict__ or not getattr(no_meta, "file_meta", None)  # input untouched
    assert back[0].PixelData == ds_list[0].PixelData


# ------------------------------------------------------------- large bodies
def _big_parts(n_parts: int, part_size: int):
    block = os.urandom(1 << 16)
    reps = part_size // len(block)

    def content():
        for _ in range(reps):
            yield block

    for _ in range(n_parts):
        yield {"Content-Type": "application/octet-stream"}, content()


def test_200mb_body_streams_in_bounded_memory():
    total = 200 * (1 << 20)
    gc.collect()
    tracemalloc.start()
    try:
        # 100 parts of 2 MiB: whole parts, one at a time
        n = 0
        size = 0
        for part in iter_parts(encode_multipart(_big_parts(100, 2 << 20), "big=bnd"), "big=bnd"):
            n += 1
            size += len(part.content)
        assert (n, size) == (100, total)
        _, peak_parts = tracemalloc.get_traced_memory()
        del part
        tracemalloc.reset_peak()
        # one 200 MiB part, streamed chunk by chunk
        size = 0
        for sp in iter_part_streams(encode_multipart(_big_parts(1, total), "big=bnd"), "big=bnd"):
            for chunk in sp:
                size += len(chunk)
        assert size == total
        _, peak_stream = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_parts < 12 * (1 << 20), peak_parts  # ~ one 2 MiB part (+ join), not 200 MB
    assert peak_stream < 1 << 20, peak_stream  # ~ a few 64 KiB chunks, not 200 MB

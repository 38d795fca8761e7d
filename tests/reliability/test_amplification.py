"""Bad-input corpus, class "amplification": small read-only requests that made the
archive build huge answers in memory or fail with a 5xx (issue 14 §3), and the STOW
checks that keep declared sizes honest. Every answer streams or has a bound checked
before work starts; on both indexes."""

from __future__ import annotations

import tracemalloc

import httpx
import numpy as np
import pytest
from pydicom.encaps import encapsulate
from pydicom.uid import JPEGBaseline8Bit

from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.server.test_sample_files import split_multipart

FAILED, REASON = "00081198", "00081197"
OCTET_MR = "multipart/related; type=application/octet-stream"


def _url(ds) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


TWO = make_dataset(rows=16, columns=16, frames=2, PatientID="amplification")
BIG = make_dataset(rows=256, columns=512, frames=40, PatientID="amplification")  # 40 frames of 256 KiB


def _store(c: httpx.Client, *datasets) -> httpx.Response:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    return c.post("/studies", content=body, headers={"Content-Type": ctype})


@pytest.fixture(scope="module", params=["sqlite", "memory"])
def archive(request, tmp_path_factory):
    srv = LiveServer(tmp_path_factory.mktemp("amplification"), request.param).start()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        assert _store(c, TWO, BIG).status_code == 200
        yield c
    srv.stop()


class TestAmplification:
    def test_repeated_frame_list_is_bounded_before_work(self, archive):
        r = archive.get(_url(TWO) + "/frames/" + ",".join(["1"] * 3000), headers={"Accept": OCTET_MR})
        assert r.status_code == 400
        assert "at most 2 items" in r.json()["detail"]
        r = archive.get(_url(TWO) + "/frames/2,2", headers={"Accept": OCTET_MR})  # repeats within the bound
        assert r.status_code == 200
        want = TWO.PixelData[512:1024]
        assert [bytes(d) for _h, d in split_multipart(r)] == [want, want]

    def test_frames_are_streamed_one_at_a_time(self, archive):
        """All 40 frames (10 MiB) are answered with the server's allocations never
        holding more than a few frames (the server runs in this process)."""
        frame = 256 * 512 * 2
        tracemalloc.start()
        try:
            with archive.stream("GET", _url(BIG) + "/frames/" + ",".join(str(k) for k in range(40, 0, -1)),
                                headers={"Accept": OCTET_MR}) as r:
                assert r.status_code == 200
                size = sum(len(chunk) for chunk in r.iter_bytes())
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert size > 40 * frame
        assert peak < 12 * frame, f"peak {peak} bytes while answering {size}"

    @pytest.mark.parametrize("digits", ["9" * 5000, "0" * 4999 + "1", "1" + "0" * 11])
    def test_long_frame_numbers_are_not_parsed(self, archive, digits):
        r = archive.get(_url(TWO) + "/frames/" + digits, headers={"Accept": OCTET_MR})
        expected = 200 if digits.lstrip("0") == "1" else 404
        assert r.status_code == expected, r.text

    @pytest.mark.parametrize("accept", ["text/html", "*/*;q=0", "foo", "image/png", ";;;", "application/dicom"])
    def test_bulkdata_with_unacceptable_accept_is_406(self, archive, accept):
        r = archive.get(_url(TWO) + "/bulkdata/7FE00010", headers={"Accept": accept})
        assert r.status_code == 406, (accept, r.status_code, r.text)
        assert "bulk data" in r.json()["detail"]

    def test_big_pixel_bulkdata_with_unacceptable_accept_is_406(self, archive):
        r = archive.get(_url(BIG) + "/bulkdata/7FE00010", headers={"Accept": "*/*;q=0"})
        assert r.status_code == 406


def _one_bit(frames: int):
    ds = make_dataset(pixels=False, PatientID="amplification")
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 1
    ds.HighBit, ds.PixelRepresentation = 0, 0
    ds.NumberOfFrames = frames
    ds.PixelData = np.packbits(np.ones(64 * 2, np.uint8)).tobytes()  # two frames: 16 bytes
    return ds


def _encapsulated(frames: int, fragments: int = 2):
    ds = make_dataset(pixels=False, transfer_syntax=JPEGBaseline8Bit, PatientID="amplification")
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit, ds.PixelRepresentation = 7, 0
    ds.NumberOfFrames = frames
    ds.PixelData = encapsulate([b"\xff\xd8fake\xff\xd9"] * fragments)
    return ds


class TestDeclaredFrameCounts:
    """STOW-RS checks NumberOfFrames against the pixel data (0xC000), so no read trusts
    a declared count (an instance declaring 2^31 frames made bulk data allocate GBs)."""

    @pytest.mark.parametrize("make, frames, words", [
        (_one_bit, 2**31 - 1, "needs"), (_one_bit, 3, "needs"), (_one_bit, 0, "at least 1"),
        (_encapsulated, 2**31 - 1, "fragment"), (_encapsulated, 3, "fragment"), (_encapsulated, -1, "at least 1"),
    ])
    def test_mismatch_fails_the_instance(self, archive, make, frames, words):
        good = make_dataset(PatientID="amplification")
        r = _store(archive, make(frames), good)
        assert r.status_code == 202, r.text
        (failed,) = r.json()[FAILED]["Value"]
        assert failed[REASON]["Value"] == [0xC000]
        assert words in r.headers["warning"]
        assert archive.get(_url(good) + "/metadata").status_code == 200

    @pytest.mark.parametrize("make", [_one_bit, _encapsulated])
    def test_honest_counts_are_stored_and_answer(self, archive, make):
        ds = make(2)
        assert _store(archive, ds).status_code == 200
        uri = archive.get(_url(ds) + "/metadata").json()[0]["7FE00010"]["BulkDataURI"]
        parts = split_multipart(archive.get(uri, headers={"Accept": OCTET_MR}))
        assert [bytes(d) for _h, d in parts] == (
            [ds.PixelData] if make is _one_bit else [b"\xff\xd8fake\xff\xd9"] * 2)


def test_a_frame_beyond_the_count_is_404_before_the_list_bound(archive):
    r = archive.get(_url(TWO) + "/frames/1,2,3", headers={"Accept": OCTET_MR})
    assert r.status_code == 404 and "no frame 3" in r.json()["detail"]

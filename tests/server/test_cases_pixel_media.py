"""Cases P1 (Float and Double Float Pixel Data) and P2 (every pixel-data media type
of PS3.18 Table 8.7.3-5): two-frame instances in each transfer syntax, frames and
bulk data as stored, byte for byte, under their own media type; on both indexes.

Codestreams are real where an encoder is installed (Pillow: JPEG baseline;
imagecodecs: JPEG extended/lossless, JPEG-LS, JPEG 2000, HTJ2K, JPEG XL; pydicom: RLE).
JPX (.92/.93) holds a JPEG 2000 Part 1 codestream (a Part 1 stream is a valid Part 2
stream) and the video syntaxes hold fake-but-framed streams (no encoder here): these
tests check negotiation and labelling, which need the stored bytes back, not a decoder.
"""

from __future__ import annotations

import io

import httpx
import imagecodecs
import numpy as np
import pytest
from PIL import Image
from pydicom.encaps import encapsulate
from pydicom.pixels.encoders import RLELosslessEncoder

from dicomweb_server.dicom.media_types import PIXEL_MEDIA_TYPES
from dicomweb_server.policy import transcode
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.s3server import storage_settings
from tests.server.test_sample_files import split_multipart

PARAMETRIC_MAP = "1.2.840.10008.5.1.4.1.1.30"
OCTET = "application/octet-stream"
rng = np.random.default_rng(14)
FRAMES8 = [rng.integers(0, 255, (16, 16), dtype=np.uint8) for _ in range(2)]
FRAMES12 = [rng.integers(0, 4095, (16, 16), dtype=np.uint16) for _ in range(2)]


def _pillow_jpeg(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _rle(a: np.ndarray) -> bytes:
    return RLELosslessEncoder.encode(a, rows=16, columns=16, samples_per_pixel=1, bits_allocated=8,
                                     bits_stored=8, pixel_representation=0, photometric_interpretation="MONOCHROME2",
                                     number_of_frames=1)


def _even(make, frames):
    """Codestreams of even length for formats without an end marker (encapsulation pads
    odd ones with a 0x00 that cannot be told from data)."""
    out = []
    for a in frames:
        b = make(a)
        out.append(b if len(b) % 2 == 0 else make(a ^ 1))
    assert all(len(b) % 2 == 0 for b in out)
    return out


ENC = {  # transfer syntax -> (bits, function making the two codestreams)
    "1.2.840.10008.1.2.4.50": (8, lambda: [_pillow_jpeg(a) for a in FRAMES8]),
    "1.2.840.10008.1.2.4.51": (12, lambda: [imagecodecs.jpeg8_encode(a, level=90, bitspersample=12) for a in FRAMES12]),
    "1.2.840.10008.1.2.4.57": (12, lambda: [imagecodecs.jpeg8_encode(a, lossless=True, predictor=2, bitspersample=12)
                                            for a in FRAMES12]),
    "1.2.840.10008.1.2.4.70": (12, lambda: [imagecodecs.jpeg8_encode(a, lossless=True, predictor=1, bitspersample=12)
                                            for a in FRAMES12]),
    "1.2.840.10008.1.2.5": (8, lambda: [_rle(a) for a in FRAMES8]),
    "1.2.840.10008.1.2.4.80": (12, lambda: [imagecodecs.jpegls_encode(a, level=0) for a in FRAMES12]),
    "1.2.840.10008.1.2.4.81": (12, lambda: [imagecodecs.jpegls_encode(a, level=2) for a in FRAMES12]),
    "1.2.840.10008.1.2.4.90": (12, lambda: [imagecodecs.jpeg2k_encode(a, level=0, codecformat="J2K") for a in FRAMES12]),
    "1.2.840.10008.1.2.4.91": (12, lambda: [imagecodecs.jpeg2k_encode(a, level=80, codecformat="J2K") for a in FRAMES12]),
    "1.2.840.10008.1.2.4.92": (12, lambda: [imagecodecs.jpeg2k_encode(a, level=0, codecformat="J2K") for a in FRAMES12]),
    "1.2.840.10008.1.2.4.93": (12, lambda: [imagecodecs.jpeg2k_encode(a, level=80, codecformat="J2K") for a in FRAMES12]),
    "1.2.840.10008.1.2.4.201": (12, lambda: [imagecodecs.htj2k_encode(a) for a in FRAMES12]),
    "1.2.840.10008.1.2.4.202": (12, lambda: [imagecodecs.htj2k_encode(a) for a in FRAMES12]),
    "1.2.840.10008.1.2.4.203": (12, lambda: [imagecodecs.htj2k_encode(a, level=80) for a in FRAMES12]),
    "1.2.840.10008.1.2.4.110": (8, lambda: _even(imagecodecs.jpegxl_encode, FRAMES8)),
    "1.2.840.10008.1.2.4.111": (8, lambda: _even(imagecodecs.jpegxl_encode, FRAMES8)),
    "1.2.840.10008.1.2.4.112": (8, lambda: _even(imagecodecs.jpegxl_encode, FRAMES8)),
}
STILL = sorted(ENC)
VIDEO = [ts for m in PIXEL_MEDIA_TYPES if m.video for ts in m.transfer_syntaxes]
MEDIA = {ts: m for m in PIXEL_MEDIA_TYPES for ts in m.transfer_syntaxes}


def test_every_table_syntax_is_tested():
    assert set(STILL) | set(VIDEO) == set(MEDIA)


def _compressed(ts: str, streams: list[bytes], bits: int, frames: int = 2):
    ds = make_dataset(pixels=False, transfer_syntax=ts, modality="OT")
    ds.Rows = ds.Columns = 16
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 8 if bits == 8 else 16
    ds.BitsStored, ds.HighBit = bits, bits - 1
    ds.PixelRepresentation = 0
    ds.NumberOfFrames = frames
    ds.PixelData = encapsulate(streams)
    ds["PixelData"].VR = "OB"
    return ds


def _float(double: bool):
    ds = make_dataset(pixels=False, sop_class=PARAMETRIC_MAP, modality="OT")
    ds.Rows, ds.Columns = 3, 4
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.NumberOfFrames = 2
    ds.BitsAllocated = 64 if double else 32
    arr = (np.arange(24, dtype=np.float64 if double else np.float32) - 10.5).reshape(2, 3, 4)
    if double:
        ds.DoubleFloatPixelData = arr.tobytes()
    else:
        ds.FloatPixelData = arr.tobytes()
    return ds, arr


@pytest.fixture(scope="module", params=["sqlite", "memory", "sqlite+s3"])
def archive(request, tmp_path_factory):
    """One server per index holding every test instance; yields (client, paths)."""
    index, _, storage = request.param.partition("+")  # sqlite+s3: instances in a local S3 server
    extra = storage_settings(request.getfixturevalue("s3_server")) if storage else {}
    srv = LiveServer(tmp_path_factory.mktemp("pixel-media"), index, **extra).start()
    stored: dict[str, tuple[str, list[bytes]]] = {}
    files = []
    for ts in STILL:
        bits, make = ENC[ts]
        streams = make()
        files.append((ts, _compressed(ts, streams, bits), streams))
    for ts in VIDEO:  # fake-but-framed stream: one fragment holds both frames
        stream = b"\x00\x00\x00\x18ftypmp42" + ts.encode() + bytes(range(40))
        stream += b"\0" * (len(stream) % 2)
        files.append((ts, _compressed(ts, [stream], 8), [stream]))
    for double in (False, True):
        ds, arr = _float(double)
        files.append(("double" if double else "float", ds, [f.tobytes() for f in arr]))
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        body, ctype = multipart([_file(ds) for _k, ds, _s in files])
        r = c.post("/studies", content=body, headers={"Content-Type": ctype})
        assert r.status_code == 200, r.text
        for key, ds, streams in files:
            url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
            stored[key] = (url, streams)
        yield c, stored
    srv.stop()


def _file(ds) -> bytes:
    """PS3.10 bytes; pydicom 3.0 does not know the JPEG XL UIDs, so those files are
    written under a known syntax of the same length and the UID swapped in the meta."""
    ts = str(ds.file_meta.TransferSyntaxUID)
    if ts.startswith("1.2.840.10008.1.2.4.11"):
        ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.100"
        data = to_bytes(ds)
        head = data[:400].replace(b"1.2.840.10008.1.2.4.100\0", ts.encode() + b"\0", 1)
        ds.file_meta.TransferSyntaxUID = ts
        return head + data[400:]
    return to_bytes(ds)


def _get(c, url, accept):
    return c.get(url, headers={"Accept": accept})


# --- P1 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind, tag, vr, size", [("float", "7FE00008", "OF", 48), ("double", "7FE00009", "OD", 96)])
def test_p1_float_pixel_data(archive, kind, tag, vr, size):
    c, stored = archive
    url, frames = stored[kind]
    assert [len(f) for f in frames] == [size, size]
    r = _get(c, url + "/frames/2", "multipart/related; type=application/octet-stream")
    assert r.status_code == 200, r.text
    (headers, data), = split_multipart(r)
    assert data == frames[1]
    assert headers["content-type"] == f"{OCTET}; transfer-syntax=1.2.840.10008.1.2.1"
    r = _get(c, url + "/frames/2,1", "multipart/related; type=application/octet-stream")
    assert [d for _h, d in split_multipart(r)] == [frames[1], frames[0]]
    meta = c.get(url + "/metadata").json()[0]
    assert "7FE00010" not in meta
    assert meta[tag]["vr"] == vr
    uri = meta[tag]["BulkDataURI"]
    assert uri.endswith(f"/bulkdata/{tag}")
    r = _get(c, uri, OCTET)
    assert r.status_code == 200 and r.content == frames[0] + frames[1]
    (_h, data), = split_multipart(_get(c, uri, "multipart/related; type=application/octet-stream"))
    assert data == frames[0] + frames[1]
    assert _get(c, url + "/frames/3", "multipart/related; type=application/octet-stream").status_code == 404


# --- P2 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ts", STILL)
def test_p2_frames_in_own_media_type(archive, ts):
    c, stored = archive
    url, streams = stored[ts]
    media = MEDIA[ts].media_type
    label = f"{media}; transfer-syntax={ts}"
    for accept in (f'multipart/related; type="{media}"', f'multipart/related; type="{media}"; transfer-syntax={ts}',
                   "multipart/related; type=application/octet-stream; transfer-syntax=*",
                   *(f"multipart/related; type={alias}" for alias in MEDIA[ts].aliases)):
        r = _get(c, url + "/frames/2,1", accept)
        assert r.status_code == 200, (accept, r.text)
        assert r.headers["content-type"].startswith(f'multipart/related; type="{media}"')
        parts = split_multipart(r)
        assert [h["content-type"] for h, _d in parts] == [label, label], accept
        assert [bytes(d) for _h, d in parts] == [streams[1], streams[0]], accept
    # the pixel data bulk data: one part per frame, same labels and bytes
    uri = c.get(url + "/metadata").json()[0]["7FE00010"]["BulkDataURI"]
    parts = split_multipart(_get(c, uri, "multipart/related; type=application/octet-stream"))
    assert [(h["content-type"], bytes(d)) for h, d in parts] == [(label, streams[0]), (label, streams[1])]


@pytest.mark.parametrize("ts", STILL)
def test_p2_other_media_types_are_406_unless_transcoded(archive, ts):
    """Another media type is 406 unless the archive transcodes to its default syntax
    (policy/transcode.py): then the part is labelled with that syntax."""
    c, stored = archive
    url, _streams = stored[ts]
    other = [m for m in PIXEL_MEDIA_TYPES if ts not in m.transfer_syntaxes]
    for m in other:
        r = _get(c, url + "/frames/1", f'multipart/related; type="{m.media_type}"')
        default = m.transfer_syntaxes[0]
        if m.video or not transcode.can_transcode(ts, default):
            assert r.status_code == 406, (m.media_type, r.status_code)
        else:
            assert r.status_code == 200, (m.media_type, r.text)
            assert [h["content-type"] for h, _d in split_multipart(r)] == [f"{m.media_type}; transfer-syntax={default}"]
    for media in ("image/jph", "image/png"):
        assert _get(c, url + "/frames/1", f'multipart/related; type="{media}"').status_code == 406
    media = MEDIA[ts].media_type
    wrong_ts = "1.2.840.10008.1.2.4.80" if media != "image/jls" else "1.2.840.10008.1.2.4.90"  # of another type
    r = _get(c, url + "/frames/1", f'multipart/related; type="{media}"; transfer-syntax={wrong_ts}')
    assert r.status_code == 406


@pytest.mark.parametrize("ts", VIDEO)
def test_p2_video_is_one_stream(archive, ts):
    c, stored = archive
    url, (stream,) = stored[ts]
    media = MEDIA[ts].media_type
    uri = c.get(url + "/metadata").json()[0]["7FE00010"]["BulkDataURI"]
    (h, data), = split_multipart(_get(c, uri, f'multipart/related; type="{media}"'))
    assert (h["content-type"], bytes(data)) == (f"{media}; transfer-syntax={ts}", stream)
    r = _get(c, url + "/frames/1", f'multipart/related; type="{media}"')
    assert r.status_code == 406 and "video" in r.json()["detail"]

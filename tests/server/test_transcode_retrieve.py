"""Transcode on retrieve (issue 30): WADO-RS instances, studies, frames and pixel data
bulk data in a transfer syntax the client names (PS3.18 §8.7.3, Table 8.7.3-5),
produced from the stored one by policy/transcode.py; checked by decoding the answer
with pydicom. What cannot be produced stays 406."""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.encaps import encapsulate
from pydicom.pixels import get_decoder

from tests.policy.test_transcode import _synthetic
from tests.server.conftest import stored
from tests.server.test_sample_files import split_multipart

ELE, ILE = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2"
JLS, J2K, J2K_LOSSY, HTJ2K, RLE, JPEG = ("1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91",
                                        "1.2.840.10008.1.2.4.201", "1.2.840.10008.1.2.5", "1.2.840.10008.1.2.4.50")
MEDIA = {JLS: "image/jls", J2K: "image/jp2", J2K_LOSSY: "image/jp2", HTJ2K: "image/jphc", RLE: "image/dicom-rle",
         JPEG: "image/jpeg"}


def _instance(c, url, ts):
    r = c.get(url, headers={"Accept": f'multipart/related; type="application/dicom"; transfer-syntax={ts}'})
    return r


def _native(arr: np.ndarray) -> np.ndarray:
    return arr.astype(arr.dtype.newbyteorder("="))


@pytest.mark.parametrize("name", ["CT_small.dcm", "MR_small_jpeg_ls_lossless.dcm", "MR_small_jp2klossless.dcm",
                                  "SC_rgb_rle_2frame.dcm"])
@pytest.mark.parametrize("ts", [JLS, J2K, HTJ2K, RLE, ILE, ELE])
def test_instance_in_the_syntax_asked(app_client, name, ts):
    ds = pydicom.dcmread(get_testdata_file(name))
    url = stored(app_client, ds)
    r = _instance(app_client, url, ts)
    assert r.status_code == 200, r.text
    ((h, body),) = split_multipart(r)
    assert h["content-type"] == f"application/dicom; transfer-syntax={ts}"
    got = pydicom.dcmread(io.BytesIO(bytes(body)))
    assert got.file_meta.TransferSyntaxUID == ts and got.SOPInstanceUID == ds.SOPInstanceUID
    assert np.array_equal(got.pixel_array, _native(ds.pixel_array))


def test_lossy_instance_only_when_named(app_client):
    ds = _synthetic(8, False, rgb=True)
    url = stored(app_client, ds)
    r = app_client.get(url, headers={"Accept": f"application/dicom; transfer-syntax={JPEG}"})
    assert r.status_code == 200 and r.headers["content-type"] == f"application/dicom; transfer-syntax={JPEG}"
    got = pydicom.dcmread(io.BytesIO(r.content))
    assert got.LossyImageCompression == "01" and got.LossyImageCompressionMethod == "ISO_10918_1"
    assert np.abs(got.pixel_array.astype(int) - ds.pixel_array.astype(int)).max() < 64
    # no transfer syntax named: Explicit VR Little Endian as stored, never lossy
    r = app_client.get(url, headers={"Accept": "application/dicom"})
    assert r.status_code == 200 and pydicom.dcmread(io.BytesIO(r.content)).get("LossyImageCompression") is None


def test_what_cannot_be_produced_is_406(app_client):
    url = stored(app_client, pydicom.dcmread(get_testdata_file("CT_small.dcm")))  # 16-bit signed
    for ts in (JPEG, "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.2"):
        r = _instance(app_client, url, ts)
        assert r.status_code == 406, (ts, r.status_code)
    for accept in ('multipart/related; type="image/jpeg"',  # default JPEG Lossless SV1: no encoder
                   f'multipart/related; type="image/jpeg"; transfer-syntax={JPEG}',  # 16-bit
                   f'multipart/related; type="image/jp2"; transfer-syntax={JLS}'):
        assert app_client.get(url + "/frames/1", headers={"Accept": accept}).status_code == 406, accept


def _decode_frame(codestream: bytes, ts: str, ds) -> np.ndarray:
    arr, _ = get_decoder(ts).as_array(
        encapsulate([codestream]), rows=ds.Rows, columns=ds.Columns, samples_per_pixel=ds.SamplesPerPixel,
        bits_allocated=ds.BitsAllocated, bits_stored=ds.BitsStored, pixel_representation=ds.PixelRepresentation,
        photometric_interpretation=ds.PhotometricInterpretation, number_of_frames=1, planar_configuration=0)
    return arr


@pytest.mark.parametrize("accept, ts", [
    ('multipart/related; type="image/jls"', JLS),  # Table 8.7.3-5 defaults
    ('multipart/related; type="image/jp2"', J2K),
    ('multipart/related; type="image/jphc"', HTJ2K),
    ('multipart/related; type="image/dicom-rle"', RLE),
    (f'multipart/related; type="image/jp2"; transfer-syntax={J2K}', J2K),
    (f'multipart/related; type="image/jp2"; transfer-syntax={J2K_LOSSY}', J2K_LOSSY),
])
def test_frames_in_another_media_type(app_client, accept, ts):
    ds = _synthetic(12, True, frames=3)
    url = stored(app_client, ds)
    r = app_client.get(url + "/frames/3,1", headers={"Accept": accept})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(f'multipart/related; type="{MEDIA[ts]}"')
    parts = split_multipart(r)
    assert [h["content-type"] for h, _ in parts] == [f"{MEDIA[ts]}; transfer-syntax={ts}"] * 2
    for (_h, body), k in zip(parts, (3, 1)):
        got = _decode_frame(bytes(body), ts, ds)
        if ts == J2K_LOSSY:
            assert np.abs(got.astype(int) - ds.pixel_array[k - 1]).max() < 256
        else:
            assert np.array_equal(got, ds.pixel_array[k - 1])


def test_compressed_frames_to_another_compressed_syntax(app_client):
    """JPEG-LS stored, JPEG 2000 asked: decoded and encoded again, pixels unchanged."""
    ds = pydicom.dcmread(get_testdata_file("MR_small_jpeg_ls_lossless.dcm"))
    url = stored(app_client, ds)
    r = app_client.get(url + "/frames/1", headers={"Accept": 'multipart/related; type="image/jp2"'})
    ((h, body),) = split_multipart(r)
    assert h["content-type"] == f"image/jp2; transfer-syntax={J2K}"
    assert np.array_equal(_decode_frame(bytes(body), J2K, ds), ds.pixel_array)
    # as stored, as before
    r = app_client.get(url + "/frames/1", headers={"Accept": 'multipart/related; type="image/jls"'})
    ((h, _body),) = split_multipart(r)
    assert h["content-type"] == f"image/jls; transfer-syntax={JLS}"


def test_encoded_frames_are_cached(app_client):
    ds = _synthetic(16, False, frames=2)
    url = stored(app_client, ds)
    accept = {"Accept": 'multipart/related; type="image/jls"'}
    first = split_multipart(app_client.get(url + "/frames/1,2", headers=accept))
    cache = app_client.app.state.transcode_cache
    hits = cache.hits
    again = split_multipart(app_client.get(url + "/frames/2,1", headers=accept))
    assert cache.hits == hits + 2
    assert [bytes(b) for _, b in again] == [bytes(first[1][1]), bytes(first[0][1])]


def test_study_and_bulk_data(app_client):
    a, b = _synthetic(12, False), _synthetic(16, True, frames=2)
    b.StudyInstanceUID = a.StudyInstanceUID
    urls = [stored(app_client, ds) for ds in (a, b)]
    r = app_client.get(f"/studies/{a.StudyInstanceUID}",
                       headers={"Accept": f'multipart/related; type="application/dicom"; transfer-syntax={RLE}'})
    assert r.status_code == 200
    got = {d.SOPInstanceUID: d for d in (pydicom.dcmread(io.BytesIO(bytes(body))) for _h, body in split_multipart(r))}
    for ds in (a, b):
        assert got[ds.SOPInstanceUID].file_meta.TransferSyntaxUID == RLE
        assert np.array_equal(got[ds.SOPInstanceUID].pixel_array, ds.pixel_array)
    uri = app_client.get(urls[1] + "/metadata").json()[0]["7FE00010"]["BulkDataURI"]
    r = app_client.get(uri, headers={"Accept": 'multipart/related; type="image/jphc"'})
    assert r.status_code == 200
    parts = split_multipart(r)
    assert [h["content-type"] for h, _ in parts] == [f"image/jphc; transfer-syntax={HTJ2K}"] * 2
    for (_h, body), k in zip(parts, (0, 1)):
        assert np.array_equal(_decode_frame(bytes(body), HTJ2K, b), b.pixel_array[k])
    # octet-stream bulk data: unchanged (native, as stored)
    r = app_client.get(uri, headers={"Accept": "application/octet-stream"})
    assert r.status_code == 200 and r.content == b.PixelData

"""Native decoders (issue #14): a stored codestream that makes GDCM abort must not
take the server down. Every pixel-decoding GET of such an instance (thumbnail,
rendered, frames as application/octet-stream, instance in the default syntax) gets
a clear answer, and the same server process keeps serving the next request.

The samples: a one-component JPEG 2000 codestream in an RGB data set (GDCM aborts:
``image->numcomps == GetSamplesPerPixel()``) and a 64x64 JPEG-LS codestream in a
256x256 data set (GDCM aborts in gdcmBitmap.cxx); the first decoders (OpenJPEG,
CharLS) refuse both, so pydicom falls back to GDCM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import httpx
import imagecodecs
import numpy as np
import pytest
from pydicom.encaps import encapsulate
from pydicom.uid import JPEG2000Lossless, JPEGLSLossless

from dicomweb_server.dicom.codestream import CodestreamMismatch, check_frame
from tests.helpers import make_dataset, multipart, to_bytes
from tests.reliability.test_crash import Server

GREY = (np.arange(64 * 64) % 4096).astype(np.uint16).reshape(64, 64)
J2K_GREY = bytes(imagecodecs.jpeg2k_encode(GREY, level=0, codecformat="j2k"))
JLS_64 = bytes(imagecodecs.jpegls_encode(GREY))


def _instance(codestream: bytes, ts: str, rows: int, columns: int, spp: int):
    ds = make_dataset(rows=rows, columns=columns, transfer_syntax=ts, PatientID="decoders")
    ds.SamplesPerPixel = spp
    ds.PhotometricInterpretation = "RGB" if spp == 3 else "MONOCHROME2"
    if spp == 3:
        ds.PlanarConfiguration = 0
    ds.BitsStored, ds.HighBit = 12, 11
    ds.PixelData = encapsulate([codestream])
    ds["PixelData"].VR = "OB"
    return ds


#: (name, data set) of instances whose frame makes GDCM abort
CRASHERS = [
    ("j2k-1-component-in-rgb", _instance(J2K_GREY, JPEG2000Lossless, 64, 64, 3)),
    ("jls-64-in-256", _instance(JLS_64, JPEGLSLossless, 256, 256, 1)),
]
GOOD = _instance(J2K_GREY, JPEG2000Lossless, 64, 64, 1)

_GDCM = """
import sys
from pydicom import dcmread
from pydicom.filebase import DicomBytesIO
from pydicom.pixels import get_decoder
ds = dcmread(DicomBytesIO(sys.stdin.buffer.read()))
get_decoder(ds.file_meta.TransferSyntaxUID).as_array(ds, index=0, decoding_plugin="gdcm")
"""


@pytest.mark.parametrize("name, ds", CRASHERS, ids=[n for n, _ in CRASHERS])
def test_sample_really_aborts_gdcm(name, ds):
    """The sample is a real crasher: GDCM on it, alone in a subprocess, aborts."""
    r = subprocess.run([sys.executable, "-c", _GDCM], input=to_bytes(ds), capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGABRT, f"{name} no longer aborts GDCM: find a new sample ({r.stderr[-300:]!r})"


@pytest.mark.parametrize("name, ds", CRASHERS, ids=[n for n, _ in CRASHERS])
def test_header_check_refuses_the_sample(name, ds):
    frame = J2K_GREY if "j2k" in name else JLS_64
    with pytest.raises(CodestreamMismatch, match="does not match the data set"):
        check_frame(frame, ds.file_meta.TransferSyntaxUID, rows=ds.Rows, columns=ds.Columns,
                    samples_per_pixel=ds.SamplesPerPixel, bits_allocated=ds.BitsAllocated)


def test_decoder_crash_is_isolated_without_the_header_check():
    """With the header check switched off the sample reaches GDCM, which aborts in
    the decode worker; the caller gets PixelDataError and decodes the next frame."""
    script = textwrap.dedent(f"""
        import numpy as np
        from pydicom.dataset import Dataset
        from dicomweb_server.dicom import compressed, pixels
        compressed.check_frame = lambda *a, **k: None
        bad = Dataset(); bad.Rows = bad.Columns = 64; bad.SamplesPerPixel = 3; bad.PlanarConfiguration = 0
        bad.BitsAllocated, bad.BitsStored, bad.PixelRepresentation = 16, 12, 0
        bad.PhotometricInterpretation = "RGB"
        frame = bytes.fromhex("{J2K_GREY.hex()}")
        try:
            pixels.decode_frame(bad, frame, "{JPEG2000Lossless}")
        except pixels.PixelDataError as e:
            print("refused:", e)
        bad.SamplesPerPixel = 1; bad.PhotometricInterpretation = "MONOCHROME2"
        arr = pixels.decode_frame(bad, frame, "{JPEG2000Lossless}")
        print("next:", int(arr.astype(np.int64).sum()))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("refused: the stored JPEG 2000 Image Compression (Lossless Only) frame cannot be "
                               "decoded: the decoder process ended with signal 6"), lines
    assert lines[1] == f"next: {int(GREY.astype(np.int64).sum())}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("decoders"), "sqlite")
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        body, ctype = multipart([to_bytes(ds) for _, ds in CRASHERS] + [to_bytes(GOOD)])
        assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        yield srv, c
    srv.kill()


def _path(ds) -> str:
    return f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"


GETS = [
    # (resource suffix, Accept, expected status)
    ("/thumbnail", "image/jpeg", 406),
    ("/rendered", "image/jpeg", 406),
    ("/rendered", "image/gif", 406),
    ("/frames/1", 'multipart/related; type="application/octet-stream"', 406),
    ("", 'multipart/related; type="application/dicom"; transfer-syntax=1.2.840.10008.1.2.1', 406),
]


@pytest.mark.parametrize("name, ds", CRASHERS, ids=[n for n, _ in CRASHERS])
def test_every_decoding_get_answers_and_the_server_lives(server, name, ds):
    srv, c = server
    pid = srv.proc.pid
    for suffix, accept, status in GETS:
        r = c.get(_path(ds) + suffix, headers={"Accept": accept})
        assert r.status_code == status, (suffix, accept, r.status_code, r.text[:300])
        assert "does not match the data set" in r.text, (suffix, r.text[:300])
        good = c.get(_path(GOOD) + "/rendered", headers={"Accept": "image/png"})
        assert good.status_code == 200 and good.content.startswith(b"\x89PNG"), suffix
    # the instance without a transfer syntax asked: the file as stored, with a Warning
    r = c.get(_path(ds), headers={"Accept": "application/dicom"})
    assert r.status_code == 200 and r.content == to_bytes(ds)
    assert r.headers["Warning"].startswith('299 dicomweb-archive: "returned in the stored transfer syntax')
    # a viewer's automatic study thumbnail: the study's first image is a crasher
    r = c.get(f"/studies/{ds.StudyInstanceUID}/thumbnail", headers={"Accept": "image/jpeg"})
    assert r.status_code in (200, 406), r.text[:300]
    assert srv.proc.poll() is None and srv.proc.pid == pid


def test_worker_pool_survives_crash_and_hang():
    """The pool itself: a worker that aborts or exits is WorkerDied, one that hangs
    is killed after the timeout (WorkerTimeout); the next call is served."""
    import os
    import time

    from dicomweb_server.dicom import decode_worker

    with pytest.raises(decode_worker.WorkerDied, match="signal 6"):
        decode_worker.call(os.abort)
    with pytest.raises(decode_worker.WorkerDied, match="exit code 3"):
        decode_worker.call(os._exit, 3)
    saved = decode_worker.TIMEOUT
    decode_worker.configure(timeout=0.5)
    try:
        with pytest.raises(decode_worker.WorkerTimeout, match="did not finish within 0.5 s"):
            decode_worker.call(time.sleep, 30)
    finally:
        decode_worker.configure(timeout=saved)
    with pytest.raises(ZeroDivisionError):  # an exception of the function comes back as it is
        decode_worker.call(divmod, 1, 0)
    assert decode_worker.call(divmod, 7, 2) == (3, 1)


def test_a_huge_declared_picture_is_refused_before_decoding():
    from pydicom.dataset import Dataset

    from dicomweb_server.dicom import pixels

    ds = Dataset()
    ds.Rows = ds.Columns = 65535
    ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "RGB", 0
    ds.BitsAllocated, ds.BitsStored, ds.PixelRepresentation = 16, 16, 0
    with pytest.raises(pixels.PixelDataError, match="would decode to 25,769,017,350 bytes"):
        pixels.decode_frame(ds, J2K_GREY, JPEG2000Lossless)

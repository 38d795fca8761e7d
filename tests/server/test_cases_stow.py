"""STOW-RS conformance cases: S1 an instance of another study than the URL's, S2 bad parts
beside good ones, S3 multipart framing variants (PS3.18 §10.5), and the duplicate policy."""

from __future__ import annotations

import os

import pytest

from tests.helpers import make_dataset, multipart, to_bytes
from tests.helpers import spool_files as helpers_spool_files

POSTGRESQL = True  # conftest.py: the server fixtures run on PostgreSQL too
S3 = True  # ... and with the instances in a local S3 server

FAILED, REFERENCED = "00081198", "00081199"


def post(http, parts, path="/studies", boundary="b.=1"):
    body, ctype = multipart(parts, boundary)
    return http.post(path, content=body, headers={"Content-Type": ctype})


def blob_files(server) -> list[str]:
    if server.settings.storage is not None:  # objects: every key under the prefix
        return sorted(server.archive.blobs.walk())
    root = server.settings.data_dir / "blobs"
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _s, fs in os.walk(root) for f in fs)


def spool_files(server) -> list[str]:
    return helpers_spool_files(server.settings.data_dir)


def test_s1_study_mismatch(http, server):
    a = make_dataset(study="1.2.3")
    b = make_dataset(study="9.9.9")
    r = post(http, [to_bytes(a), to_bytes(b)], "/studies/1.2.3")
    assert r.status_code == 202
    js = r.json()
    (ref,) = js[REFERENCED]["Value"]
    assert ref["00081150"]["Value"] == [a.SOPClassUID]
    assert ref["00081155"]["Value"] == [a.SOPInstanceUID]
    assert ref["00081190"]["Value"] == [
        f"{server.url}/studies/1.2.3/series/{a.SeriesInstanceUID}/instances/{a.SOPInstanceUID}"]
    (fail,) = js[FAILED]["Value"]
    assert fail["00081155"]["Value"] == [b.SOPInstanceUID]
    assert fail["00081197"]["Value"] == [0xC409]
    assert js["00081190"]["Value"] == [f"{server.url}/studies/1.2.3"]
    assert http.get("/studies", params={"StudyInstanceUID": "9.9.9"}).json() == []
    assert "9.9.9" not in "".join(blob_files(server))

    r = post(http, [to_bytes(make_dataset(study="9.9.9"))], "/studies/1.2.3")
    assert r.status_code == 409
    assert r.json()[FAILED]["Value"][0]["00081197"]["Value"] == [0xC409]


def test_s1_empty_study_uid_fails_that_instance(http, server):
    ds = make_dataset()
    ds.StudyInstanceUID = ""
    r = post(http, [to_bytes(ds)])
    assert r.status_code == 409
    (fail,) = r.json()[FAILED]["Value"]
    assert fail["00081197"]["Value"] == [0xA900]
    assert fail["00081155"]["Value"] == [ds.SOPInstanceUID]
    assert "StudyInstanceUID" in r.headers["warning"]


@pytest.mark.parametrize("uid", ["1.2.3.", "1.02.3", "1.2.abc", "1" * 65, "../../etc"])
def test_invalid_uids_fail(http, server, uid):
    ds = make_dataset()
    ds.SeriesInstanceUID = uid
    r = post(http, [to_bytes(ds)])
    assert r.status_code == 409
    assert r.json()[FAILED]["Value"][0]["00081197"]["Value"] == [0xA900]
    assert blob_files(server) == []


def test_s2_bad_parts_fail_good_parts_stored(http, server):
    good = make_dataset(rows=64, columns=64)
    cut = to_bytes(make_dataset(rows=64, columns=64))
    cut = cut[: len(cut) - 1000]  # inside PixelData
    r = post(http, [to_bytes(good), ("application/dicom", b"A" * 200), cut, ("text/plain", b"hello")])
    assert r.status_code == 202
    js = r.json()
    assert [x["00081155"]["Value"][0] for x in js[REFERENCED]["Value"]] == [good.SOPInstanceUID]
    reasons = [x["00081197"]["Value"][0] for x in js[FAILED]["Value"]]
    assert reasons == [0xC000, 0xC000, 0xC000]
    assert blob_files(server) == [f"{good.StudyInstanceUID}/{good.SeriesInstanceUID}/{good.SOPInstanceUID}.dcm"]
    assert spool_files(server) == []
    assert len(http.get("/instances").json()) == 1


def test_s2_all_bad_is_409_and_wrong_type_is_415(http, server):
    r = post(http, [("application/dicom", b"garbage" * 50)])
    assert r.status_code == 409
    body, _ = multipart([to_bytes(make_dataset())])
    for ctype in ("application/json", "multipart/form-data; boundary=b.=1",
                  'multipart/related; type="application/dicom+json"; boundary="b.=1"', ""):
        r = http.post("/studies", content=body, headers={"Content-Type": ctype})
        assert r.status_code == 415, ctype
    assert blob_files(server) == [] and spool_files(server) == []


def test_s2_missing_boundary_and_framing(http, server):
    body, _ = multipart([to_bytes(make_dataset())])
    r = http.post("/studies", content=body, headers={"Content-Type": 'multipart/related; type="application/dicom"'})
    assert r.status_code == 400
    r = http.post("/studies", content=b"no boundary here",
                  headers={"Content-Type": 'multipart/related; type="application/dicom"; boundary=zz'})
    assert r.status_code == 400
    # the body stops inside a part: that part fails, nothing is half-written
    data = to_bytes(make_dataset())
    body = b"--zz\r\nContent-Type: application/dicom\r\n\r\n" + data[:500]
    r = http.post("/studies", content=body,
                  headers={"Content-Type": 'multipart/related; type="application/dicom"; boundary=zz'})
    assert r.status_code == 409
    assert blob_files(server) == [] and spool_files(server) == []


def _variants(data: bytes):
    yield "quoted boundary with = and .", b"--a=b.c\r\nContent-Type: application/dicom\r\n\r\n" + data + b"\r\n--a=b.c--\r\n", \
        'multipart/related; type="application/dicom"; boundary="a=b.c"'
    yield "unquoted type", b"--zz\r\nContent-Type: application/dicom\r\n\r\n" + data + b"\r\n--zz--\r\n", \
        "multipart/related; type=application/dicom; boundary=zz"
    yield "order and case", b"--zz\r\ncontent-type: Application/DICOM\r\n\r\n" + data + b"\r\n--zz--\r\n", \
        "Multipart/Related; BOUNDARY=zz; Type=\"application/dicom\""
    yield "no type", b"--zz\r\nContent-Type: application/dicom\r\n\r\n" + data + b"\r\n--zz--\r\n", \
        "multipart/related; boundary=zz"
    yield "disagreeing part transfer-syntax", \
        b"--zz\r\nContent-Type: application/dicom; transfer-syntax=1.2.840.10008.1.2.4.50\r\n\r\n" + data + b"\r\n--zz--\r\n", \
        "multipart/related; type=application/dicom; boundary=zz"
    yield "preamble and epilogue", b"this is a preamble\r\n--zz\r\nContent-Type: application/dicom\r\n\r\n" + data + \
        b"\r\n--zz--\r\nand an epilogue\r\n", "multipart/related; type=application/dicom; boundary=zz"
    yield "part without headers", b"--zz\r\n\r\n" + data + b"\r\n--zz--\r\n", \
        "multipart/related; type=application/dicom; boundary=zz"


@pytest.mark.parametrize("variant", [v[0] for v in _variants(b"")] + ["chunked"])
def test_s3_framing_variants(http, server, variant):
    ds = make_dataset()
    data = to_bytes(ds)
    if variant == "chunked":
        body, ctype = multipart([data])
        r = http.post("/studies", content=iter([body[:100], body[100:5000], body[5000:]]),
                      headers={"Content-Type": ctype})
        assert "content-length" not in r.request.headers
    else:
        _name, body, ctype = next(v for v in _variants(data) if v[0] == variant)
        r = http.post("/studies", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
    got = http.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"})
    assert got.content == data  # stored as sent; the file meta's transfer syntax wins
    assert "transfer-syntax=1.2.840.10008.1.2.1" in got.headers["content-type"]


def test_duplicate_policy(http, server):
    ds = make_dataset()
    data = to_bytes(ds)
    assert post(http, [data]).status_code == 200
    r = post(http, [data])  # identical again: success, nothing rewritten
    assert r.status_code == 200
    assert r.json()[REFERENCED]["Value"][0]["00081155"]["Value"] == [ds.SOPInstanceUID]
    ds.PatientID = "changed"
    r = post(http, [to_bytes(ds)])  # different content, same SOP Instance UID: refused
    assert r.status_code == 409
    assert r.json()[FAILED]["Value"][0]["00081197"]["Value"] == [0x0111]
    url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
    assert http.get(url, headers={"Accept": "application/dicom"}).content == data
    assert len(http.get("/instances").json()) == 1


def test_the_same_data_set_under_other_file_meta_is_a_duplicate_not_a_conflict(http, server):
    """The same instance received again with other file meta (PS3.10 §7.1: e.g. first
    by STOW-RS as the sender's file, then by C-STORE with file meta built from the
    association) is the identical instance: success, the stored file kept as it was.
    Before: 0x0111 "already stored with different content" (new-user trial)."""
    ds = make_dataset()
    first = to_bytes(ds)
    assert post(http, [first]).status_code == 200
    ds.file_meta.SourceApplicationEntityTitle = "MODALITY"
    ds.file_meta.ImplementationVersionName = "OTHER_1.0"
    again = to_bytes(ds)
    assert again != first  # the file meta differs; the data set is the same
    r = post(http, [again])
    assert r.status_code == 200, r.text
    assert r.json()[REFERENCED]["Value"][0]["00081155"]["Value"] == [ds.SOPInstanceUID]
    url = f"/studies/{ds.StudyInstanceUID}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
    assert http.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"}).content == first
    # the same attributes in another transfer syntax: the same instance decoded (as after a
    # recompress, policy/ingest.py same_instance_transcoded), the stored file kept
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2"
    r = post(http, [to_bytes(ds)])
    assert r.status_code == 200, r.text
    assert http.get(url, headers={"Accept": "application/dicom; transfer-syntax=*"}).content == first
    # one attribute changed, in another transfer syntax: other content, a conflict
    ds.PatientName = "Other^Content"
    r = post(http, [to_bytes(ds)])
    assert r.status_code == 409
    assert r.json()[FAILED]["Value"][0]["00081197"]["Value"] == [0x0111]
    assert len(http.get("/instances").json()) == 1


def test_a_part_cut_short_names_its_uids_from_the_file_meta(http, server):
    """A part whose data set cannot be read (here: cut inside its pixel data) still names
    the instance in its FailedSOPSequence item, from the file meta (PS3.10 §7.1, PS3.18
    §10.5.3); the good part beside it is stored."""
    bad, good = make_dataset(rows=64, columns=64), make_dataset()
    r = post(http, [to_bytes(bad)[:-100], to_bytes(good)])
    assert r.status_code == 202, r.text
    (item,) = r.json()[FAILED]["Value"]
    assert item["00081197"]["Value"] == [0xC000]
    assert item["00081150"]["Value"] == [bad.SOPClassUID]
    assert item["00081155"]["Value"] == [bad.SOPInstanceUID]
    (ref,) = r.json()[REFERENCED]["Value"]
    assert ref["00081155"]["Value"] == [good.SOPInstanceUID]


def test_a_pixel_description_pydicom_cannot_convert_fails_that_part_alone(http, server):
    """SamplesPerPixel as UN of 3 bytes: pydicom raises when the value is asked for, after
    the file was read. It was a 500 for the whole request (the good part not stored)."""
    import struct

    bad, good = make_dataset(rows=2, columns=2), make_dataset()
    data = to_bytes(bad)
    i = data.index(struct.pack("<HH2sH", 0x28, 0x02, b"US", 2))
    data = data[:i] + struct.pack("<HH2s2xI", 0x28, 0x02, b"UN", 3) + b"\x01\x00\x00" + data[i + 10:]
    r = post(http, [data, to_bytes(good)])
    assert r.status_code == 202, r.text
    (item,) = r.json()[FAILED]["Value"]
    assert item["00081197"]["Value"] == [0xC000]
    assert item["00081155"]["Value"] == [bad.SOPInstanceUID]
    assert [i["00080018"]["Value"][0] for i in http.get("/instances").json()] == [good.SOPInstanceUID]


def test_same_instance_twice_in_one_request(http, server):
    data = to_bytes(make_dataset())
    r = post(http, [data, data])
    assert r.status_code == 202
    assert r.json()[FAILED]["Value"][0]["00081197"]["Value"] == [0x0111]


def test_size_and_part_caps(tmp_path):
    import httpx

    from tests.helpers import LiveServer

    srv = LiveServer(tmp_path / "d", "sqlite", max_request_bytes=20_000, max_parts=2).start()
    try:
        with httpx.Client(base_url=srv.url) as c:
            big = to_bytes(make_dataset(rows=128, columns=128))
            body, ctype = multipart([big])
            r = c.post("/studies", content=body, headers={"Content-Type": ctype})
            assert r.status_code == 413 and "20000" in r.json()["detail"]
            r = c.post("/studies", content=iter([body]), headers={"Content-Type": ctype})  # chunked: no length
            assert r.status_code == 413
            body, ctype = multipart([to_bytes(make_dataset()) for _ in range(3)])
            r = c.post("/studies", content=body, headers={"Content-Type": ctype})
            assert r.status_code == 413 and "parts" in r.json()["detail"]
            assert helpers_spool_files(srv.settings.data_dir) == []
    finally:
        srv.stop()


def test_delete_study_series_instance(http, server):
    from pydicom.uid import generate_uid

    study, series = generate_uid(), generate_uid()
    items = [make_dataset(study=study, series=series), make_dataset(study=study, series=series),
             make_dataset(study=study)]
    assert post(http, [to_bytes(x) for x in items]).status_code == 200
    a = items[0]
    assert http.delete(f"/studies/{study}/series/{series}/instances/{a.SOPInstanceUID}").status_code == 204
    (s,) = http.get("/studies", params={"StudyInstanceUID": study}).json()
    assert s["00201208"]["Value"] == [2]
    assert http.delete(f"/studies/{study}/series/{series}").status_code == 204
    (s,) = http.get("/studies", params={"StudyInstanceUID": study}).json()
    assert s["00201206"]["Value"] == [1]
    assert http.delete(f"/studies/{study}").status_code == 204
    assert http.get("/studies", params={"StudyInstanceUID": study}).json() == []
    assert http.delete(f"/studies/{study}").status_code == 404
    assert blob_files(server) == []
    # stored again after a delete: a new instance
    assert post(http, [to_bytes(a)]).status_code == 200

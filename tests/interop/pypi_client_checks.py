"""Every call of the PyPI package ``dicomweb-client`` against a running archive.

Run by ``test_pypi_dicomweb_client.py`` with the Python of a separate virtual
environment (the PyPI package imports as ``dicomweb_client``, like this project's
own client), as ``python pypi_client_checks.py CONTEXT.json RESULTS.json``.
CONTEXT names the archive URL and the instances the test stored; RESULTS gets
``{check name: {"ok": bool, "error": str}}``. This module imports nothing from
the PyPI package at import time, so the test can read ``CHECKS`` for its names.
"""

from __future__ import annotations

import io
import json
import sys
import traceback

CHECKS: dict = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _uid(item: dict, tag: str) -> str:
    return item[tag]["Value"][0]


def _value(item: dict, tag: str):
    v = item.get(tag, {}).get("Value")
    return v[0] if v else None


def _sops(results: list[dict]) -> set[str]:
    return {_uid(r, "00080018") for r in results}


def _pixels(path: str) -> bytes:
    import pydicom

    return pydicom.dcmread(path).PixelData


# -- QIDO-RS -------------------------------------------------------------------------------


@check
def search_for_studies_filters_and_fields(c, ctx):
    s = ctx["study"]
    r = c.search_for_studies(search_filters={"PatientID": s["patient_id"]},
                             fields=["StudyDescription", "00081030", "NumberOfStudyRelatedInstances"])
    assert [_uid(x, "0020000D") for x in r] == [s["uid"]], r
    assert _value(r[0], "00081030") == "Interop CT and MR"
    assert int(_value(r[0], "00201208")) == s["instances"]
    assert set(_value_list(r[0], "00080061")) == {"CT", "MR"}
    r = c.search_for_studies(search_filters={"StudyInstanceUID": s["uid"]}, fields=["all"])
    assert len(r) == 1 and _value(r[0], "00080090") is not None  # ReferringPhysicianName via includefield=all
    r = c.search_for_studies(search_filters={"ModalitiesInStudy": "MR", "PatientID": s["patient_id"]})
    assert len(r) == 1
    r = c.search_for_studies(search_filters={"AccessionNumber": "ACC-INTEROP", "StudyID": "1", "PatientID": "INTEROP1"},
                             additional_params={"includefield": "00080050"})
    assert [_uid(x, "0020000D") for x in r] == [s["uid"]]


def _value_list(item, tag):
    return item.get(tag, {}).get("Value") or []


@check
def search_for_studies_wildcards_and_fuzzy(c, ctx):
    s = ctx["study"]
    for filters, fuzzy in [({"PatientName": "interop*"}, None), ({"PatientName": "*VIEW*"}, None),
                           ({"PatientName": "Interop^Vie?er"}, None), ({"PatientName": "viewer"}, True),
                           ({"00100010": "INTEROP*"}, False), ({"StudyDescription": "*CT and*"}, None)]:
        r = c.search_for_studies(search_filters=filters, fuzzymatching=fuzzy)
        assert s["uid"] in [_uid(x, "0020000D") for x in r], (filters, fuzzy)
    r = c.search_for_studies(search_filters={"PatientName": "viewer"}, fuzzymatching=False)
    assert s["uid"] not in [_uid(x, "0020000D") for x in r]


@check
def search_for_studies_date_and_time_ranges(c, ctx):
    s = ctx["study"]
    hit = [{"StudyDate": "20240315"}, {"StudyDate": "20240301-20240331"}, {"StudyDate": "20240315-"},
           {"StudyDate": "-20240315"}, {"StudyDate": "20240101-20241231", "StudyTime": "10-11"},
           {"StudyTime": "101500"}]
    miss = [{"StudyDate": "20250101-"}, {"StudyDate": "-20240314"}, {"StudyDate": "20240315", "StudyTime": "12-"}]
    for f in hit:
        r = c.search_for_studies(search_filters={**f, "PatientID": s["patient_id"]})
        assert len(r) == 1, f
    for f in miss:
        r = c.search_for_studies(search_filters={**f, "PatientID": s["patient_id"]})
        assert r == [], f


@check
def search_for_studies_limit_offset_get_remaining(c, ctx):
    everything = c.search_for_studies()
    n = len(everything)
    assert n == ctx["total_studies"], (n, ctx["total_studies"])
    pages = [c.search_for_studies(limit=2, offset=o) for o in range(0, n + 2, 2)]
    assert [len(p) for p in pages] == [min(2, n - o) if o < n else 0 for o in range(0, n + 2, 2)]
    paged = [_uid(x, "0020000D") for p in pages for x in p]
    assert paged == [_uid(x, "0020000D") for x in everything]
    remaining = c.search_for_studies(limit=1, get_remaining=True)
    assert [_uid(x, "0020000D") for x in remaining] == paged
    assert c.search_for_studies(offset=n) == []


@check
def search_for_series(c, ctx):
    s = ctx["study"]
    r = c.search_for_series(s["uid"])
    assert {_uid(x, "0020000E") for x in r} == {s["ct_series"], s["mr_series"]}
    assert {_value(x, "00080060") for x in r} == {"CT", "MR"}
    r = c.search_for_series(s["uid"], search_filters={"Modality": "MR"}, fields=["SeriesDescription"])
    assert [_uid(x, "0020000E") for x in r] == [s["mr_series"]] and _value(r[0], "0008103E") == "MR phantom"
    r = c.search_for_series(search_filters={"SeriesInstanceUID": s["ct_series"]}, fields=["PatientName"])
    assert len(r) == 1 and _value(r[0], "0020000D") == s["uid"]
    r = c.search_for_series(s["uid"], limit=1, offset=1)
    assert len(r) == 1
    r = c.search_for_series(s["uid"], limit=1, get_remaining=True)
    assert len(r) == 2
    r = c.search_for_series(search_filters={"PatientID": s["patient_id"], "SeriesNumber": "2"})
    assert [_uid(x, "0020000E") for x in r] == [s["mr_series"]]


@check
def search_for_instances(c, ctx):
    s = ctx["study"]
    ct = [i["sop"] for i in ctx["instances"] if i["series"] == s["ct_series"]]
    r = c.search_for_instances(s["uid"], s["ct_series"])
    assert _sops(r) == set(ct)
    r = c.search_for_instances(s["uid"], s["ct_series"], fields=["Rows", "ImagePositionPatient"],
                               search_filters={"InstanceNumber": "2"})
    assert len(r) == 1 and _value(r[0], "00280010") == ctx["size"] and "00200032" in r[0]
    page = c.search_for_instances(s["uid"], s["ct_series"], limit=3, offset=1)
    assert len(page) == 3
    r = c.search_for_instances(s["uid"], s["ct_series"], limit=3, get_remaining=True)
    assert _sops(r) == set(ct)
    r = c.search_for_instances(s["uid"])  # study level
    assert len(r) == s["instances"]
    r = c.search_for_instances(search_filters={"SOPClassUID": "1.2.840.10008.5.1.4.1.1.4",
                                               "PatientID": s["patient_id"]})
    assert len(r) == s["instances"] // 2
    r = c.search_for_instances(search_filters={"SOPInstanceUID": ct[0]}, fields=["all"])
    assert len(r) == 1 and _value(r[0], "00180060") == 120  # KVP from includefield=all


# -- WADO-RS: instances ----------------------------------------------------------------------


@check
def retrieve_study_and_iter_study(c, ctx):
    s = ctx["study"]
    want = {i["sop"]: i for i in ctx["instances"] if i["study"] == s["uid"]}
    got = c.retrieve_study(s["uid"])
    assert {str(d.SOPInstanceUID) for d in got} == set(want)
    for d in got:
        assert d.PixelData == _pixels(want[str(d.SOPInstanceUID)]["path"])
    it = list(c.iter_study(s["uid"], media_types=(("application/dicom", "*"),)))
    assert {str(d.SOPInstanceUID) for d in it} == set(want)


@check
def retrieve_series_and_iter_series(c, ctx):
    s = ctx["study"]
    mr = {i["sop"] for i in ctx["instances"] if i["series"] == s["mr_series"]}
    got = c.retrieve_series(s["uid"], s["mr_series"], media_types=(("application/dicom", "1.2.840.10008.1.2.1"),))
    assert {str(d.SOPInstanceUID) for d in got} == mr
    assert all(str(d.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.1" for d in got)
    assert {str(d.SOPInstanceUID) for d in c.iter_series(s["uid"], s["mr_series"])} == mr


@check
def retrieve_instance_as_stored_and_transcoded(c, ctx):
    ct = ctx["instances"][0]
    d = c.retrieve_instance(ct["study"], ct["series"], ct["sop"])
    assert str(d.SOPInstanceUID) == ct["sop"] and d.PixelData == _pixels(ct["path"])
    jpeg = ctx["samples"]["jpeg_baseline"]
    d = c.retrieve_instance(jpeg["study"], jpeg["series"], jpeg["sop"], media_types=(("application/dicom", "*"),))
    assert str(d.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.4.50"
    d = c.retrieve_instance(jpeg["study"], jpeg["series"], jpeg["sop"],
                            media_types=(("application/dicom", "1.2.840.10008.1.2.4.50"),))
    assert str(d.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.4.50"
    d = c.retrieve_instance(jpeg["study"], jpeg["series"], jpeg["sop"],
                            media_types=(("application/dicom", "1.2.840.10008.1.2.1"),))
    assert str(d.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.1"
    assert len(d.PixelData) == jpeg["rows"] * jpeg["columns"] * jpeg["samples"] * jpeg["frames"]


# -- WADO-RS: metadata -----------------------------------------------------------------------


@check
def retrieve_metadata_at_each_level(c, ctx):
    s = ctx["study"]
    m = c.retrieve_study_metadata(s["uid"])
    assert len(m) == s["instances"] and all("7FE00010" in x for x in m)
    assert all("BulkDataURI" in x["7FE00010"] for x in m)
    m = c.retrieve_series_metadata(s["uid"], s["ct_series"])
    assert len(m) == s["instances"] // 2 and {_value(x, "00080060") for x in m} == {"CT"}
    ct = ctx["instances"][0]
    m = c.retrieve_instance_metadata(ct["study"], ct["series"], ct["sop"])
    assert _uid(m, "00080018") == ct["sop"]
    icon = m["00880200"]["Value"][0]["7FE00010"]
    assert "BulkDataURI" in icon, icon


# -- WADO-RS: frames -------------------------------------------------------------------------


@check
def retrieve_instance_frames_native(c, ctx):
    ct = ctx["instances"][0]
    (frame,) = c.retrieve_instance_frames(ct["study"], ct["series"], ct["sop"], [1])
    assert frame == _pixels(ct["path"])
    (frame,) = c.retrieve_instance_frames(ct["study"], ct["series"], ct["sop"], [1],
                                          media_types=("application/octet-stream",))
    assert frame == _pixels(ct["path"])
    (frame,) = c.retrieve_instance_frames(ct["study"], ct["series"], ct["sop"], [1],
                                          media_types=(("application/octet-stream", "1.2.840.10008.1.2.1"),))
    assert frame == _pixels(ct["path"])
    (frame,) = list(c.iter_instance_frames(ct["study"], ct["series"], ct["sop"], [1]))
    assert frame == _pixels(ct["path"])


@check
def retrieve_instance_frames_compressed(c, ctx):
    import pydicom
    from pydicom.encaps import generate_frames

    mf = ctx["samples"]["jpeg_multiframe"]
    ds = pydicom.dcmread(mf["path"])
    stored = list(generate_frames(ds.PixelData, number_of_frames=mf["frames"]))
    frames = c.retrieve_instance_frames(mf["study"], mf["series"], mf["sop"], [3, 1], media_types=("image/jpeg",))
    assert [f.rstrip(b"\0") for f in frames] == [stored[2].rstrip(b"\0"), stored[0].rstrip(b"\0")]
    frames = c.retrieve_instance_frames(mf["study"], mf["series"], mf["sop"], [2],
                                        media_types=(("image/jpeg", "1.2.840.10008.1.2.4.50"),))
    assert frames[0].rstrip(b"\0") == stored[1].rstrip(b"\0")
    frames = c.retrieve_instance_frames(mf["study"], mf["series"], mf["sop"], [2],
                                        media_types=(("application/octet-stream", "*"),))
    assert frames[0].rstrip(b"\0") == stored[1].rstrip(b"\0")
    # decoded on the server: native pixels
    frames = c.retrieve_instance_frames(mf["study"], mf["series"], mf["sop"], [1, 30],
                                        media_types=("application/octet-stream",))
    assert [len(f) for f in frames] == [mf["rows"] * mf["columns"] * mf["samples"]] * 2
    frames = list(c.iter_instance_frames(mf["study"], mf["series"], mf["sop"], [5, 6], media_types=("image/jpeg",)))
    assert len(frames) == 2 and all(f.startswith(b"\xff\xd8") for f in frames)
    j2k = ctx["samples"]["jpeg2000"]
    (f,) = c.retrieve_instance_frames(j2k["study"], j2k["series"], j2k["sop"], [1], media_types=("image/jp2",))
    assert f.startswith(b"\xff\x4f\xff\x51") or f[4:8] == b"jP  ", f[:12]


# -- WADO-RS: bulk data ----------------------------------------------------------------------


@check
def retrieve_bulkdata_from_metadata_uris(c, ctx):
    import pydicom

    ct = ctx["instances"][0]
    m = c.retrieve_instance_metadata(ct["study"], ct["series"], ct["sop"])
    ds = pydicom.dcmread(ct["path"])
    (pixels,) = c.retrieve_bulkdata(m["7FE00010"]["BulkDataURI"])
    assert pixels == ds.PixelData
    (icon,) = c.retrieve_bulkdata(m["00880200"]["Value"][0]["7FE00010"]["BulkDataURI"])
    assert icon == ds.IconImageSequence[0].PixelData
    (pixels,) = c.retrieve_bulkdata(m["7FE00010"]["BulkDataURI"], media_types=("application/octet-stream",))
    assert pixels == ds.PixelData
    assert list(c.iter_bulkdata(m["7FE00010"]["BulkDataURI"])) == [ds.PixelData]
    # the bulk data URIs of every instance of the study metadata
    for item in c.retrieve_study_metadata(ct["study"]):
        (b,) = c.retrieve_bulkdata(item["7FE00010"]["BulkDataURI"])
        assert len(b) == ctx["size"] ** 2 * 2
    # encapsulated pixel data: one part per frame in its compressed media type
    mf = ctx["samples"]["jpeg_multiframe"]
    m = c.retrieve_instance_metadata(mf["study"], mf["series"], mf["sop"])
    parts = c.retrieve_bulkdata(m["7FE00010"]["BulkDataURI"], media_types=("image/jpeg",))
    assert len(parts) == mf["frames"] and all(p.startswith(b"\xff\xd8") for p in parts)


@check
def retrieve_bulkdata_byte_range(c, ctx):
    ct = ctx["instances"][0]
    m = c.retrieve_instance_metadata(ct["study"], ct["series"], ct["sop"])
    full = _pixels(ct["path"])
    (part,) = c.retrieve_bulkdata(m["7FE00010"]["BulkDataURI"], byte_range=(10, 109))
    assert part == full[10:110], (len(part), len(full))


# -- WADO-RS: rendered -----------------------------------------------------------------------


def _image(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))


@check
def retrieve_rendered(c, ctx):
    ct = ctx["instances"][0]
    img = _image(c.retrieve_instance_rendered(ct["study"], ct["series"], ct["sop"]))
    assert img.format == "JPEG" and img.size == (ctx["size"], ctx["size"])
    img = _image(c.retrieve_instance_rendered(ct["study"], ct["series"], ct["sop"], media_types=("image/png",),
                                              params={"window": "40,400,linear", "viewport": "32,32"}))
    assert img.format == "PNG" and img.size == (32, 32)
    img = _image(c.retrieve_instance_rendered(ct["study"], ct["series"], ct["sop"], media_types=("image/jpeg",),
                                              params={"quality": 50}))
    assert img.format == "JPEG"
    img = _image(c.retrieve_instance_rendered(ct["study"], ct["series"], ct["sop"], media_types=("image/gif",)))
    assert img.format == "GIF"
    mf = ctx["samples"]["jpeg_multiframe"]
    data = c.retrieve_instance_frames_rendered(mf["study"], mf["series"], mf["sop"], [2],
                                               media_types=("image/jpeg",))
    assert _image(data).size == (mf["columns"], mf["rows"])
    data = c.retrieve_instance_frames_rendered(mf["study"], mf["series"], mf["sop"], [1],
                                               media_types=("image/png",), params={"viewport": "64,64"})
    assert _image(data).format == "PNG"


@check
def retrieve_series_rendered(c, ctx):
    s = ctx["study"]
    from requests.exceptions import HTTPError

    body = c.retrieve_series_rendered(s["uid"], s["mr_series"])  # no Accept: multipart/related, one part each
    assert body.count(b"\xff\xd8\xff") >= s["instances"] // 2, body[:200]
    # with a media type the client asks single-part "Accept: image/jpeg", which PS3.18 section 10.4.4
    # rules out for a series: the archive answers 406 (Not Acceptable), as the standard says
    try:
        c.retrieve_series_rendered(s["uid"], s["mr_series"], media_types=("image/jpeg",))
    except HTTPError as e:
        assert e.response.status_code == 406
    else:
        raise AssertionError("single-part rendered series answered")


# -- STOW-RS and DELETE ----------------------------------------------------------------------


@check
def store_instances(c, ctx):
    import pydicom

    datasets = [pydicom.dcmread(p) for p in ctx["to_store"]]
    study = str(datasets[0].StudyInstanceUID)
    answer = c.store_instances(datasets[:2])
    refs = answer.ReferencedSOPSequence
    assert {str(r.ReferencedSOPInstanceUID) for r in refs} == {str(d.SOPInstanceUID) for d in datasets[:2]}
    assert all(r.RetrieveURL.startswith(ctx["url"]) for r in refs)
    answer = c.store_instances(datasets[2:], study_instance_uid=study)
    assert len(answer.ReferencedSOPSequence) == len(datasets) - 2
    assert "FailedSOPSequence" not in answer
    answer = c.store_instances(datasets[:1])  # the same again: a success, nothing rewritten
    assert len(answer.ReferencedSOPSequence) == 1
    found = c.search_for_instances(study)
    assert _sops(found) == {str(d.SOPInstanceUID) for d in datasets}
    got = c.retrieve_instance(study, str(datasets[0].SeriesInstanceUID), str(datasets[0].SOPInstanceUID))
    assert got.PixelData == datasets[0].PixelData


@check
def delete_instance_series_study(c, ctx):
    import pydicom
    from requests.exceptions import HTTPError

    datasets = [pydicom.dcmread(p) for p in ctx["to_delete"]]
    c.store_instances(datasets)
    d0 = datasets[0]
    study, series = str(d0.StudyInstanceUID), str(d0.SeriesInstanceUID)
    c.delete_instance(study, series, str(d0.SOPInstanceUID))
    assert len(c.search_for_instances(study)) == len(datasets) - 1
    try:
        c.retrieve_instance(study, series, str(d0.SOPInstanceUID))
    except HTTPError as e:
        assert e.response.status_code == 404
    else:
        raise AssertionError("deleted instance still retrievable")
    other = [d for d in datasets if str(d.SeriesInstanceUID) != series]
    c.delete_series(study, series)
    assert {str(x["0020000E"]["Value"][0]) for x in c.search_for_series(study)} == \
        {str(d.SeriesInstanceUID) for d in other}
    c.delete_study(study)
    assert c.search_for_studies(search_filters={"StudyInstanceUID": study}) == []


def main(argv: list[str]) -> int:
    from dicomweb_client.api import DICOMwebClient

    with open(argv[1]) as f:
        ctx = json.load(f)
    client = DICOMwebClient(url=ctx["url"])
    client.set_http_retry_params(retry=False)
    names = argv[3:] or list(CHECKS)
    results = {}
    for name in names:
        try:
            CHECKS[name](client, ctx)
            results[name] = {"ok": True, "error": ""}
        except Exception as e:  # noqa: BLE001 -- reported per check
            detail = ""
            resp = getattr(e, "response", None)
            if resp is not None:
                detail = f" [HTTP {resp.status_code} {resp.request.method} {resp.url} " \
                         f"Accept: {resp.request.headers.get('Accept')} -> {resp.text[:300]!r}]"
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}{detail}\n{traceback.format_exc()}"}
    with open(argv[2], "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

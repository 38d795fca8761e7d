"""Pure helpers: URL building, query strings, Accept values, error mapping, STOW results."""
from __future__ import annotations

import datetime

import pytest

from dicomweb_client import errors
from dicomweb_client.media import multipart_accept, normalize_media_types, plain_accept, require_category
from dicomweb_client.results import describe_reason, parse_store_response
from dicomweb_client.urls import (
    DELETE,
    RETRIEVE,
    SEARCH,
    STORE,
    DICOMwebURLs,
    format_filter_value,
    frame_list,
    rendering_params,
    search_params,
    uid_segment,
)


def test_resource_urls():
    u = DICOMwebURLs("http://127.0.0.1:8080/")
    assert u.studies(SEARCH) == "http://127.0.0.1:8080/studies"
    assert u.study("1.2") == "http://127.0.0.1:8080/studies/1.2"
    assert u.series(SEARCH) == "http://127.0.0.1:8080/series"
    assert u.series(SEARCH, "1.2") == "http://127.0.0.1:8080/studies/1.2/series"
    assert u.one_series("1.2", "3.4") == "http://127.0.0.1:8080/studies/1.2/series/3.4"
    assert u.instances(SEARCH) == "http://127.0.0.1:8080/instances"
    assert u.instances(SEARCH, "1.2") == "http://127.0.0.1:8080/studies/1.2/instances"
    assert u.instances(SEARCH, "1.2", "3.4") == "http://127.0.0.1:8080/studies/1.2/series/3.4/instances"
    assert u.instance("1.2", "3.4", "5.6") == "http://127.0.0.1:8080/studies/1.2/series/3.4/instances/5.6"
    assert u.frames("1", "2", "3", [1, 2, 10]) == "http://127.0.0.1:8080/studies/1/series/2/instances/3/frames/1,2,10"
    with pytest.raises(ValueError):
        u.series(SEARCH, None, "3.4")
    with pytest.raises(ValueError):
        u.instances(SEARCH, "1", None, "3")
    with pytest.raises(ValueError):
        u.one_series("1.2", "")
    with pytest.raises(ValueError):
        u.root("bogus")


def test_prefixes_and_path_base():
    u = DICOMwebURLs("https://h/dicom-web", qido_url_prefix="/qido/", wado_url_prefix="wado", stow_url_prefix="stow", delete_url_prefix="del")
    assert u.studies(SEARCH) == "https://h/dicom-web/qido/studies"
    assert u.studies(RETRIEVE, "1") == "https://h/dicom-web/wado/studies/1"
    assert u.studies(STORE) == "https://h/dicom-web/stow/studies"
    assert u.studies(DELETE, "1") == "https://h/dicom-web/del/studies/1"
    assert u.resolve("studies/1/bulk/x") == "https://h/dicom-web/wado/studies/1/bulk/x"
    assert u.resolve("/abs/path") == "https://h/abs/path"
    assert u.resolve("http://other/x") == "http://other/x"
    with pytest.raises(ValueError):
        u.resolve("")


def test_uid_segment():
    assert uid_segment("1.2.840.10008") == "1.2.840.10008"
    assert uid_segment(" 1.2\x00") == "1.2"  # padding from DICOM values
    assert uid_segment("a/b?c#d e") == "a%2Fb%3Fc%23d%20e"
    for bad in ("", None, "   "):
        with pytest.raises(ValueError):
            uid_segment(bad)
    with pytest.raises(TypeError):
        uid_segment(1.2)


def test_frame_list():
    import numpy as np

    assert frame_list(3) == "3"
    assert frame_list([1, np.int64(2), "3"]) == "1,2,3"
    assert frame_list((5, 1)) == "5,1"  # order kept
    for bad, exc in (([], ValueError), ([0], ValueError), ([True], TypeError), ([1.5], TypeError), (["x"], TypeError)):
        with pytest.raises(exc):
            frame_list(bad)


def test_search_params():
    assert search_params() == []
    p = search_params(
        search_filters={"PatientName": "Doe^J*", "StudyDate": "20200101-20201231", (0x0020, 0x000D): ["1", "2"]},
        fields=["StudyDescription", 0x00081030, "StudyDescription"],
        fuzzymatching=False,
        limit=5,
        offset=10,
    )
    assert p == [
        ("PatientName", "Doe^J*"),
        ("StudyDate", "20200101-20201231"),
        ("0020000D", "1,2"),
        ("includefield", "StudyDescription"),
        ("includefield", "00081030"),
        ("fuzzymatching", "false"),
        ("limit", "5"),
        ("offset", "10"),
    ]
    assert search_params(fields="all") == [("includefield", "all")]
    with pytest.raises(TypeError):
        search_params(search_filters={1.5: "x"})
    with pytest.raises(ValueError):
        search_params(search_filters={" ": "x"})


def test_format_filter_value():
    assert format_filter_value(datetime.date(2020, 1, 2)) == "20200102"
    assert format_filter_value(datetime.datetime(2020, 1, 2, 3, 4, 5)) == "20200102030405"
    assert format_filter_value(datetime.datetime(2020, 1, 2, 3, 4, 5, 6)) == "20200102030405.000006"
    assert format_filter_value(datetime.time(3, 4, 5)) == "030405"
    assert format_filter_value((None, datetime.date(2020, 1, 1))) == "-20200101"
    assert format_filter_value((datetime.time(8), datetime.time(17))) == "080000-170000"
    assert format_filter_value(True) == "true"
    assert format_filter_value(1.5) == "1.5"
    assert format_filter_value({"a"}) == "a"


def test_rendering_params():
    assert rendering_params() == []
    assert rendering_params({"quality": 50, "viewport": [10, 20]}, window=("40", "400", "sigmoid"), annotation=["patient", "technique"]) == [
        ("quality", "50"),
        ("viewport", "10,20"),
        ("window", "40,400,sigmoid"),
        ("annotation", "patient,technique"),
    ]
    with pytest.raises(TypeError):
        rendering_params(window=5)
    with pytest.raises(ValueError):
        rendering_params(quality=101)


def test_accept_values():
    assert multipart_accept(None, (("application/dicom", "*"),)) == 'multipart/related; type="application/dicom"; transfer-syntax=*'
    assert multipart_accept(["image/jpeg", ("image/jp2", "1.2.840.10008.1.2.4.90")], ()) == (
        'multipart/related; type="image/jpeg", multipart/related; type="image/jp2"; transfer-syntax=1.2.840.10008.1.2.4.90'
    )
    assert multipart_accept(['multipart/related; type="image/png"'], ()) == 'multipart/related; type="image/png"'
    assert plain_accept(None) is None
    assert plain_accept(("image/png", "image/jpeg")) == "image/png, image/jpeg"
    assert normalize_media_types("Image/JPEG") == [("image/jpeg", None)]
    for bad in ([], ["jpeg"], [("image/jpeg", "1.2.x")], [("a/b", "1", "2")], [5]):
        with pytest.raises((ValueError, TypeError)):
            normalize_media_types(bad)
    with pytest.raises(TypeError):
        normalize_media_types(5)
    require_category([("application/dicom", "*")], ("application/dicom",), "x")
    require_category(["image/png", 'multipart/related; type="image/jpeg"'], ("image/",), "x")
    with pytest.raises(ValueError, match="not supported"):
        require_category(["image/png"], ("application/dicom",), "instances")


def test_error_for_status_mapping_and_messages():
    e = errors.error_for_status(404, body=b'{"detail": "no such study"}', headers={"Content-Type": "application/json"}, method="GET", url="http://x/studies/1")
    assert type(e) is errors.NotFound and e.message == "no such study"
    assert "HTTP 404 (GET http://x/studies/1): no such study" == str(e)
    e = errors.error_for_status(400, body=b'{"errors": ["a", "b"]}', headers={"content-type": "application/json"})
    assert e.message == '["a","b"]'
    e = errors.error_for_status(500, body=b"<html><body>boom</body></html>", headers={"Content-Type": "text/html"})
    assert type(e) is errors.ServerError and "boom" in e.message
    e = errors.error_for_status(599, body=b"\x00\x01", headers={"Content-Type": "application/octet-stream"}, reason="Weird")
    assert type(e) is errors.ServerError and e.message == "Weird"
    e = errors.error_for_status(399)
    assert type(e) is errors.HTTPError
    assert issubclass(errors.ServiceUnavailable, errors.ServerError)
    assert issubclass(errors.RequestTimeout, errors.NetworkError)
    assert issubclass(errors.ResponseError, ValueError)


def test_parse_store_response():
    doc = {
        "00081190": {"vr": "UR", "Value": ["http://x/studies/1"]},
        "00081199": {"vr": "SQ", "Value": [{
            "00081150": {"vr": "UI", "Value": ["1.2.840.10008.5.1.4.1.1.2"]},
            "00081155": {"vr": "UI", "Value": ["1.2.3"]},
            "00081190": {"vr": "UR", "Value": ["http://x/studies/1/series/2/instances/1.2.3"]},
            "00081196": {"vr": "US", "Value": [0xB000]},
        }]},
        "00081198": {"vr": "SQ", "Value": [{
            "00081155": {"vr": "UI", "Value": ["4.5.6"]},
            "00081197": {"vr": "US", "Value": [0xC000]},
            "00000902": {"vr": "LO", "Value": ["not DICOM"]},
        }, "junk"]},
        "0008119A": {"vr": "SQ", "Value": [{"00081197": {"vr": "US", "Value": [0x0110]}}]},
    }
    r = parse_store_response(202, [doc], ['299 x: "coerced"'])
    assert r.retrieve_url == "http://x/studies/1"
    assert r.referenced[0] == ("1.2.840.10008.5.1.4.1.1.2", "1.2.3", "http://x/studies/1/series/2/instances/1.2.3")
    assert r.referenced[0].warning_reason == 0xB000
    assert r.referenced[0]._asdict()["warning_reason"] == 0xB000
    sop_class, sop_uid, reason = r.failed[0]
    assert (sop_class, sop_uid, reason) == (None, "4.5.6", 0xC000)
    assert r.failed[0].sop_instance_uid == "4.5.6" and r.failed[0].failure_reason == 0xC000
    assert r.failed[0].error_comment == "not DICOM" and r.failed[0].reason == "0xC000 Error: cannot understand"
    assert len(r.failed) == 1 and r.other_failures and r.warnings == ['299 x: "coerced"']
    assert r.partial and not r.ok
    empty = parse_store_response(200, None)
    assert empty.ok and empty.referenced == [] and empty.dataset == empty.dataset.__class__()
    assert describe_reason(0xA7FF).endswith("out of resources")
    assert describe_reason(0xA901).endswith("does not match SOP Class")
    assert describe_reason(0xC123).endswith("cannot understand")
    assert describe_reason(0xB006) == "0xB006 Elements discarded"
    assert describe_reason(0x9999).endswith("unknown reason") and describe_reason(None) == "unknown reason"

"""QIDO-RS ``includerejected=true`` (lifecycle/rejected_search.py) on every index: the
rejected instances, and the series and studies left with only rejected instances, are
listed after the regular matches with Instance Availability (0008,0056) UNAVAILABLE; the
write scope is needed (403 without), keys other than UIDs are a 400."""

from __future__ import annotations

import httpx
from pydicom.uid import generate_uid

from tests.helpers import LiveServer, make_dataset, rejection_note

from .test_reject import stow

POSTGRESQL = True  # tests/conftest.py: the index_kind fixture covers PostgreSQL too

UNAVAILABLE = {"vr": "CS", "Value": ["UNAVAILABLE"]}
ONLINE = {"vr": "CS", "Value": ["ONLINE"]}  # what study and instance answers always said


def _uid(entry: dict, tag: str) -> str:
    return entry[tag]["Value"][0]


def test_rejected_instances_series_and_studies_are_listed_marked(http):
    st, ct, mr, st2 = generate_uid(), generate_uid(), generate_uid(), generate_uid()
    a, b = (make_dataset(study=st, series=ct, InstanceNumber=n) for n in (1, 2))
    m = make_dataset(study=st, series=mr, modality="MR", sop_class="1.2.840.10008.5.1.4.1.1.4")
    other = [make_dataset(study=st2, series=generate_uid(), InstanceNumber=n) for n in (1, 2)]
    stow(http, [a, b, m, *other])
    note = rejection_note([a])                                        # a: its series keeps b
    stow(http, [note])
    assert http.post(f"/studies/{st}/series/{mr}/reject/113001%5EDCM").json() == {"count": 1}  # the whole MR series
    assert http.post(f"/studies/{st2}/reject/113039%5EDCM").json() == {"count": 2}            # the whole study

    # without the parameter: nothing rejected
    plain = http.get(f"/studies/{st}/instances").json()
    assert [_uid(e, "00080018") for e in plain] == [b.SOPInstanceUID, note.SOPInstanceUID]
    assert all(e["00080056"] == ONLINE for e in plain)

    # instances: the regular matches, then each rejected instance of the study (UIDs, UNAVAILABLE)
    got = http.get(f"/studies/{st}/instances", params={"includerejected": "true"}).json()
    assert [_uid(e, "00080018") for e in got[:2]] == [b.SOPInstanceUID, note.SOPInstanceUID]
    assert all(e["00080056"] == ONLINE for e in got[:2])
    rejected = sorted([(ct, a.SOPInstanceUID), (mr, m.SOPInstanceUID)])
    assert [(_uid(e, "0020000E"), _uid(e, "00080018")) for e in got[2:]] == rejected
    assert all(e["00080056"] == UNAVAILABLE and _uid(e, "0020000D") == st for e in got[2:])
    assert set(got[2]) == {"0020000D", "0020000E", "00080018", "00080056"}
    # the SOPInstanceUID key narrows them; a series path too
    one = http.get("/instances", params={"includerejected": "true", "SOPInstanceUID": m.SOPInstanceUID}).json()
    assert one == [{"0020000D": {"vr": "UI", "Value": [st]}, "0020000E": {"vr": "UI", "Value": [mr]},
                    "00080018": {"vr": "UI", "Value": [m.SOPInstanceUID]}, "00080056": UNAVAILABLE}]
    got = http.get(f"/studies/{st}/series/{ct}/instances", params={"includerejected": "true"}).json()
    assert [(_uid(e, "00080018"), e["00080056"]) for e in got] == [(b.SOPInstanceUID, ONLINE),
                                                                    (a.SOPInstanceUID, UNAVAILABLE)]

    # series: the CT series (b is left) only once, as before; the MR series as UNAVAILABLE
    got = http.get(f"/studies/{st}/series", params={"includerejected": "true"}).json()
    assert [(_uid(e, "0020000E"), e.get("00080056")) for e in got] == [
        (ct, None), (note.SeriesInstanceUID, None), (mr, UNAVAILABLE)]
    assert got[2]["00201209"]["Value"] == [1] and _uid(got[2], "0020000D") == st

    # studies: the second study (all rejected) as UNAVAILABLE with its count of rejected instances
    got = http.get("/studies", params={"includerejected": "true", "StudyInstanceUID": f"{st},{st2}"}).json()
    assert [(_uid(e, "0020000D"), e.get("00080056")) for e in got] == [(st, ONLINE), (st2, UNAVAILABLE)]
    assert got[1]["00201208"]["Value"] == [2]
    assert http.get("/studies", params={"StudyInstanceUID": f"{st},{st2}"}).json()[1:] == []

    # the next page has no rejected entries; false is the default; bad input is a 400
    assert http.get(f"/studies/{st}/instances", params={"includerejected": "true", "offset": "1"}).json()[1:] == []
    assert len(http.get(f"/studies/{st}/instances", params={"includerejected": "false"}).json()) == 2
    bad = http.get(f"/studies/{st}/instances", params={"includerejected": "true", "Modality": "CT"})
    assert bad.status_code == 400 and "SOPInstanceUID only (not Modality)" in bad.text
    assert http.get("/studies", params={"includerejected": "yes"}).status_code == 400

    # a narrowed read (label=, as the access rules): the rejected entries of visible studies only
    assert http.put(f"/studies/{st}/labels/ward").status_code in (200, 201, 204)
    got = http.get("/instances", params={"includerejected": "true", "label": "ward"}).json()
    assert [_uid(e, "00080018") for e in got if e["00080056"] == UNAVAILABLE] == [s for _, s in rejected]
    got = http.get("/instances", params={"includerejected": "true", "label": "other"}).json()
    assert got == []


def test_includerejected_needs_the_write_scope(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text('{"reader": ["read"], "writer": ["read", "write"]}')
    srv = LiveServer(tmp_path / "data", api_keys_file=keys).start()
    try:
        for path in ("/studies", "/series", "/instances"):
            r = httpx.get(srv.url + path, params={"includerejected": "true"}, headers={"Authorization": "Bearer reader"})
            assert r.status_code == 403 and "write" in r.text, path
            assert httpx.get(srv.url + path, headers={"Authorization": "Bearer reader"}).status_code in (200, 204)
            r = httpx.get(srv.url + path, params={"includerejected": "true"}, headers={"Authorization": "Bearer writer"})
            assert r.status_code in (200, 204), path
    finally:
        srv.stop()

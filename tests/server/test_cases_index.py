"""Index cases through real HTTP on both indexes: P3 (deleting a CT series leaves the study's MR
series, the study record an instance search shows), P5 (a study without Modality leaves
ModalitiesInStudy out) and the index findings of issue 14 (a series
filed under another study; a wildcard that froze the memory index)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from pydicom.uid import generate_uid

from tests.helpers import MR_IMAGE_STORAGE, make_dataset, multipart, to_bytes

POSTGRESQL = True  # conftest.py: the server fixtures run on PostgreSQL too
S3 = True  # conftest.py: and with the instances in a local S3 server

FAILED, REFERENCED, REASON = "00081198", "00081199", "00081197"


def post(http_or_url, datasets) -> httpx.Response:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    if isinstance(http_or_url, str):
        return httpx.post(http_or_url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=60)
    return http_or_url.post("/studies", content=body, headers={"Content-Type": ctype})


def studies(http, **params) -> list[dict]:
    r = http.get("/studies", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/dicom+json")
    return r.json()


def value(result: dict, tag: str):
    return result.get(tag, {}).get("Value")


def test_p3_delete_ct_series_leaves_the_mr_study(http):
    st, ct, mr = generate_uid(), generate_uid(), generate_uid()
    cts = [make_dataset(study=st, series=ct, modality="CT", StudyDescription="WRONG", PatientName="Wrong^P",
                        PatientID="P3") for _ in range(2)]
    mrs = [make_dataset(study=st, series=mr, modality="MR", sop_class=MR_IMAGE_STORAGE, StudyDescription="RIGHT",
                        PatientName="Right^P", PatientID="P3")]  # one patient per study: the name may differ
    assert post(http, cts).status_code == 200
    assert post(http, mrs).status_code == 200
    (s,) = studies(http, StudyInstanceUID=st)
    assert value(s, "00081030") == ["WRONG"]  # the earliest instance still stored speaks
    assert http.delete(f"/studies/{st}/series/{ct}").status_code in (200, 204)
    (s,) = studies(http, StudyInstanceUID=st, includefield="SOPClassesInStudy")
    assert value(s, "00081030") == ["RIGHT"]
    assert value(s, "00100010") == [{"Alphabetic": "Right^P"}] and value(s, "00100020") == ["P3"]
    assert value(s, "00080061") == ["MR"] and value(s, "00080062") == [MR_IMAGE_STORAGE]
    assert (value(s, "00201206"), value(s, "00201208")) == ([1], [1])
    for params in ({"StudyDescription": "WRONG"}, {"PatientName": "Wrong^P"}, {"ModalitiesInStudy": "CT"},
                   {"PatientName": "wrong", "fuzzymatching": "true"}):
        assert studies(http, StudyInstanceUID=st, **params) == [], params
    r = http.get(f"/studies/{st}/series")
    assert [value(x, "0020000E") for x in r.json()] == [[mr]]


def test_p3_instance_answers_show_the_study_record(http):
    """What an instance search returns at the study level is what it matched on: the
    study record (the earliest instance still stored), not each instance's own copy."""
    st, se = generate_uid(), generate_uid()
    first = make_dataset(study=st, series=se, StudyDescription="FIRST", SeriesDescription="S1")
    later = make_dataset(study=st, series=se, StudyDescription="LATER", SeriesDescription="S2")
    assert post(http, [first]).status_code == 200 and post(http, [later]).status_code == 200
    for params in ({"includefield": "StudyDescription,SeriesDescription"}, {"includefield": "all"},
                   {"StudyDescription": "FIRST", "SeriesDescription": "S1"}):
        r = http.get("/instances", params={"StudyInstanceUID": st, **params})
        assert [(value(x, "00081030"), value(x, "0008103E")) for x in r.json()] == [(["FIRST"], ["S1"])] * 2
    assert http.get("/instances", params={"StudyInstanceUID": st, "StudyDescription": "LATER"}).json() == []
    assert http.delete(f"/studies/{st}/series/{se}/instances/{first.SOPInstanceUID}").status_code in (200, 204)
    r = http.get(f"/studies/{st}/instances", params={"includefield": "all"})
    assert [(value(x, "00081030"), value(x, "0008103E")) for x in r.json()] == [(["LATER"], ["S2"])]


def test_series_of_another_study_is_refused_at_stow(http, server):
    a, b, se = generate_uid(), generate_uid(), generate_uid()
    assert post(http, [make_dataset(study=a, series=se, PatientID="PA")]).status_code == 200
    intruder = make_dataset(study=b, series=se, PatientID="PB")
    r = post(http, [intruder])
    assert r.status_code == 409, r.text
    (fail,) = r.json()[FAILED]["Value"]
    assert fail[REASON]["Value"] == [0xA900]
    assert fail["00081155"]["Value"] == [intruder.SOPInstanceUID]
    assert se in r.headers["warning"] and a in r.headers["warning"]
    # nothing of B is visible, A is whole and can be deleted; no stray file is left
    assert http.get(f"/studies/{b}/metadata").status_code == 404
    (meta,) = http.get(f"/studies/{a}/metadata").json()
    assert value(meta, "00100020") == ["PA"]
    assert studies(http, PatientID="PB") == []
    assert not [p for p in server.archive.blobs.walk() if p.startswith(b + "/")]
    # the same SOP Instance UID under another study: a duplicate with other content
    r = post(http, [make_dataset(sop=value(meta, "00080018")[0])])
    assert r.status_code == 409 and r.json()[FAILED]["Value"][0][REASON]["Value"] == [0x0111]
    assert http.delete(f"/studies/{a}").status_code in (200, 204)
    assert http.get("/studies").json() == []


def test_study_of_another_patient_is_refused_at_stow(http, server):
    st = generate_uid()
    first = make_dataset(study=st, PatientID="PA", IssuerOfPatientID="HOSP", PatientName="Doe^John")
    assert post(http, [first]).status_code == 200
    intruder = make_dataset(study=st, series=first.SeriesInstanceUID, PatientID="PB", IssuerOfPatientID="HOSP")
    r = post(http, [intruder])
    assert r.status_code == 409, r.text
    (fail,) = r.json()[FAILED]["Value"]
    assert fail[REASON]["Value"] == [0xA900]
    assert fail["00081155"]["Value"] == [intruder.SOPInstanceUID]
    assert (f"{intruder.SOPInstanceUID}: Study {st} belongs to patient 'PA' (issuer 'HOSP'), not to this "
            "instance's patient 'PB' (issuer 'HOSP') (0xA900)") in r.headers["warning"]
    # a request with one of each: 202, the same patient under a corrected name is stored
    other_issuer = make_dataset(study=st, PatientID="PA", IssuerOfPatientID="CLINIC")
    renamed = make_dataset(study=st, PatientID="PA", IssuerOfPatientID="HOSP", PatientName="Doe^Jon")
    r = post(http, [other_issuer, renamed])
    assert r.status_code == 202, r.text
    assert [f["00081155"]["Value"] for f in r.json()[FAILED]["Value"]] == [[other_issuer.SOPInstanceUID]]
    assert [f["00081155"]["Value"] for f in r.json()[REFERENCED]["Value"]] == [[renamed.SOPInstanceUID]]
    assert post(http, [first]).status_code == 200  # the identical instance again: a duplicate, a success
    # nothing of the refused instances is visible or left on storage
    got = http.get(f"/studies/{st}/metadata").json()
    assert sorted(value(m, "00080018")[0] for m in got) == sorted([first.SOPInstanceUID, renamed.SOPInstanceUID])
    assert {tuple(value(m, "00100020")) for m in got} == {("PA",)}
    assert studies(http, PatientID="PB") == []
    stored = [p for p in server.archive.blobs.walk() if p.startswith(st + "/")]
    assert sorted(stored) == sorted(f"{st}/{ds.SeriesInstanceUID}/{ds.SOPInstanceUID}.dcm" for ds in (first, renamed))


def send_together(url: str, bodies: list[list]) -> list[httpx.Response]:
    """One STOW-RS request per body, all released at the same moment."""
    barrier = threading.Barrier(len(bodies))

    def send(datasets):
        barrier.wait()
        return post(url, datasets)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(send, bodies))


def test_two_concurrent_stores_of_one_series_in_two_studies(server):
    for _ in range(3):
        se = generate_uid()
        bodies = [[make_dataset(study=st, series=se) for _ in range(3)] for st in (generate_uid(), generate_uid())]
        codes = sorted(r.status_code for r in send_together(server.url, bodies))
        assert codes == [200, 409]
        (s,) = httpx.get(server.url + "/series", params={"SeriesInstanceUID": se}).json()
        assert value(s, "00201209") == [3]


def test_two_concurrent_stores_of_one_study_for_two_patients(server):
    for _ in range(3):
        st = generate_uid()
        bodies = [[make_dataset(study=st, PatientID=pid) for _ in range(3)] for pid in ("RACE-A", "RACE-B")]
        responses = send_together(server.url, bodies)
        assert sorted(r.status_code for r in responses) == [200, 409]
        winner = ("RACE-A", "RACE-B")[[r.status_code for r in responses].index(200)]
        (s,) = httpx.get(server.url + "/studies", params={"StudyInstanceUID": st}).json()
        assert value(s, "00100020") == [winner] and value(s, "00201208") == [3]


def test_p5_study_without_modality_leaves_out_modalities_in_study(http):
    """OHIF 3.13 reads ModalitiesInStudy.Value.length whenever the element is present."""
    none = make_dataset(PatientID="P5", modality="CT")
    del none.Modality
    with_ct = make_dataset(PatientID="P5", modality="CT")
    assert post(http, [none, with_ct]).status_code == 200
    ohif = {"PatientID": "P5", "limit": "101", "offset": "0", "fuzzymatching": "true",
            "includefield": "00081030,00080060,00080061"}
    got = {value(s, "0020000D")[0]: s for s in studies(http, **ohif)}
    assert "00080061" not in got[none.StudyInstanceUID]
    assert value(got[with_ct.StudyInstanceUID], "00080061") == ["CT"]
    assert value(got[none.StudyInstanceUID], "00201208") == [1]
    assert value(got[none.StudyInstanceUID], "00080056") == ["ONLINE"]  # InstanceAvailability


@pytest.mark.parametrize("params, status", [
    ({"StudyDescription": "*?*?*?*?*?*?*?*?*#"}, 200),
    ({"StudyDescription": "*" * 60000}, 400),
    ({"PatientName": "a" * 257}, 400),
    ({"StudyDescription": "x\x00"}, 400),
    ({"NumberOfStudyRelatedInstances": "9" * 30}, 400),
    ({"StudyInstanceUID": ",".join(["1.2.3"] * 1001)}, 400),
])
def test_wildcards_and_long_values(http, params, status):
    store_ok = post(http, [make_dataset(StudyDescription="A" * 60, PatientID="W14")]).status_code
    assert store_ok == 200
    if params == {"StudyDescription": "*" * 60000}:  # sent as is: percent-encoded it passes httpx's URL cap
        r = http.get("/studies?StudyDescription=" + "*" * 60000)
    else:
        r = http.get("/studies", params=params)
    assert r.status_code == status, r.text
    if status == 200:
        assert r.json() == []
    else:
        assert r.json()["detail"]


def test_wildcard_runs_and_fuzzy_commas(http):
    ds = make_dataset(PatientName="Doe,John", StudyDescription="Head*CT", PatientID="W15")
    assert post(http, [ds]).status_code == 200
    for params in ({"StudyDescription": "**"}, {"StudyDescription": "Head**CT"}, {"StudyDescription": "Head?CT"},
                   {"PatientName": "john", "fuzzymatching": "true"}, {"PatientName": "DOE,JOHN"},
                   {"PatientName": "doe*j?hn"}):
        assert [value(s, "0020000D") for s in studies(http, PatientID="W15", **params)] == \
            [[ds.StudyInstanceUID]], params


def test_searches_run_off_the_event_loop(http, server):
    archive = server._server.config.app.state.archive
    seen = []
    search = archive.index.search

    def spy(query, *args):
        try:
            asyncio.get_running_loop()
            seen.append("event loop")
        except RuntimeError:
            seen.append("thread")
        return search(query, *args)

    archive.index.search = spy
    try:
        for path in ("/studies", "/series", "/instances"):
            assert http.get(path).status_code == 200
    finally:
        archive.index.search = search
    assert seen == ["thread"] * 3

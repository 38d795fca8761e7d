"""Access rules over HTTP, on every index (memory, SQLite, PostgreSQL): a token allowed
label ``a`` and not ``b`` gets nothing of study B from any read route (not in results,
counts or paging), and each route answers for B exactly as for a study that does not
exist (status and body, the UIDs aside). STOW-RS into B is refused (409, 0x0124); a new
study it stores gets its write label. An unrestricted token sees everything."""

from __future__ import annotations

import hashlib

import pytest
from pydicom.uid import generate_uid
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, multipart, to_bytes

ALL, ONLY_A, ONLY_B, READER_A = "tok-all", "tok-a", "tok-b", "tok-read-a"


def key_name(token: str) -> str:
    """The name an API key goes by (api/auth.py): what the access rules name."""
    return f"key-{hashlib.sha256(token.encode()).hexdigest()[:8]}"


def h(token: str, **more) -> dict:
    return {"Authorization": f"Bearer {token}", **more}


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def client(request, tmp_path):
    extra = {"database_url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    every = ["read", "write", "delete"]
    settings = Settings(data_dir=tmp_path, index=request.param, **extra,
                        api_keys={ALL: every, ONLY_A: every, ONLY_B: every, READER_A: ["read"]},
                        access_rules={"identities": {f"key:{key_name(ONLY_A)}": ["a"],
                                                     f"key:{key_name(ONLY_B)}": ["b"],
                                                     f"key:{key_name(READER_A)}": ["a", "shared"]}})
    archive = Archive.open(settings)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def store(client, token, *datasets, study=None):
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    return client.post(f"/studies/{study}" if study else "/studies", content=body,
                       headers=h(token, **{"Content-Type": ctype}))


@pytest.fixture
def two(client):
    """Study A (label a): 2 series, 3 instances, one of 2 frames; study B (label b): 2 instances."""
    sa, sb, sea, seb = generate_uid(), generate_uid(), generate_uid(), generate_uid()
    a = [make_dataset(study=sa, series=sea, PatientID="PA", InstanceNumber=1, frames=2),
         make_dataset(study=sa, series=sea, PatientID="PA", InstanceNumber=2),
         make_dataset(study=sa, PatientID="PA", modality="MR")]
    b = [make_dataset(study=sb, series=seb, PatientID="PB", InstanceNumber=1, frames=2),
         make_dataset(study=sb, series=seb, PatientID="PB", InstanceNumber=2)]
    assert store(client, ALL, *a).status_code == 200
    assert store(client, ALL, *b).status_code == 200
    assert client.put(f"/studies/{sa}/labels/a", headers=h(ALL)).json() == ["a"]
    assert client.put(f"/studies/{sb}/labels/b", headers=h(ALL)).json() == ["b"]
    return a, b


def uids(r):
    return {item["0020000D"]["Value"][0] for item in r.json()}


def test_searches_count_and_page_only_the_allowed(client, two):
    a, b = two
    sa, sb = a[0].StudyInstanceUID, b[0].StudyInstanceUID
    assert uids(client.get("/studies", headers=h(ALL))) == {sa, sb}
    assert uids(client.get("/studies", headers=h(ONLY_A))) == {sa}
    assert uids(client.get("/studies", headers=h(ONLY_B))) == {sb}
    assert len(client.get("/series", headers=h(ONLY_A)).json()) == 2
    assert len(client.get("/instances", headers=h(ONLY_A)).json()) == 3
    assert len(client.get("/instances", headers=h(ONLY_B)).json()) == 2
    # paging: the offset counts allowed instances only
    paged = [client.get(f"/instances?limit=1&offset={n}", headers=h(ONLY_A)).json() for n in range(4)]
    assert [len(p) for p in paged] == [1, 1, 1, 0]
    assert {p[0]["00080018"]["Value"][0] for p in paged[:3]} == {ds.SOPInstanceUID for ds in a}
    # the computed counts of A are A's own
    (study,) = client.get("/studies", headers=h(ONLY_A)).json()
    assert study["00201208"]["Value"] == [3] and study["00201206"]["Value"] == [2]
    # ?label= narrows, never widens
    assert uids(client.get("/studies?label=b", headers=h(ALL))) == {sb}
    assert uids(client.get("/studies?label=a,b", headers=h(ALL))) == {sa, sb}
    assert client.get("/studies?label=b", headers=h(ONLY_A)).json() == []
    assert len(client.get("/instances?label=a", headers=h(ALL)).json()) == 3
    assert client.get("/studies?label=B!", headers=h(ALL)).status_code == 400
    # the labels in use, over the studies seen
    assert client.get("/labels", headers=h(ALL)).json() == {"a": 1, "b": 1}
    assert client.get("/labels", headers=h(ONLY_A)).json() == {"a": 1}


def b_routes(study, series, sop):
    base = f"/studies/{study}"
    inst = f"{base}/series/{series}/instances/{sop}"
    return [base, f"{base}/metadata", f"{base}/series", f"{base}/instances", f"{base}/series/{series}",
            f"{base}/series/{series}/metadata", f"{base}/series/{series}/instances", inst, f"{inst}/metadata",
            f"{inst}/frames/1", f"{inst}/frames/1,2", f"{inst}/bulkdata/7FE00010", f"{inst}/rendered",
            f"{inst}/thumbnail", f"{inst}/frames/1/rendered", f"{base}/rendered", f"{base}/thumbnail",
            f"{base}/series/{series}/rendered", f"{base}/series/{series}/thumbnail", f"{base}/labels"]


def test_every_read_of_a_study_not_allowed_answers_as_for_none(client, two):
    _a, b = two
    real = (b[0].StudyInstanceUID, b[0].SeriesInstanceUID, b[0].SOPInstanceUID)
    none = (generate_uid(), generate_uid(), generate_uid())
    for path, ghost in zip(b_routes(*real), b_routes(*none)):
        seen = client.get(path, headers=h(ONLY_A))
        absent = client.get(ghost, headers=h(ONLY_A))
        body = seen.content
        for r, n in zip(real, none):
            body = body.replace(r.encode(), n.encode())
        assert (seen.status_code, body) == (absent.status_code, absent.content), path
        assert seen.status_code in (200, 404), path  # (200: an empty search)
        if seen.status_code == 200:
            assert seen.json() == [], path
        assert client.get(path, headers=h(ONLY_B)).status_code in (200, 206), path  # B's own token reads it


def test_label_changes_and_delete_of_a_study_not_allowed_are_404(client, two):
    _a, b = two
    sb = b[0].StudyInstanceUID
    assert client.put(f"/studies/{sb}/labels/a", headers=h(ONLY_A)).status_code == 404
    assert client.delete(f"/studies/{sb}/labels/b", headers=h(ONLY_A)).status_code == 404
    assert client.delete(f"/studies/{sb}", headers=h(ONLY_A)).status_code == 404
    assert client.delete(f"/studies/{sb}/series/{b[0].SeriesInstanceUID}", headers=h(ONLY_A)).status_code == 404
    assert client.get(f"/studies/{sb}/labels", headers=h(ALL)).json() == ["b"]
    assert len(client.get(f"/studies/{sb}/metadata", headers=h(ALL)).json()) == 2
    # labels change with the write scope: a reader may list, not change
    sa = _a[0].StudyInstanceUID
    assert client.get(f"/studies/{sa}/labels", headers=h(READER_A)).json() == ["a"]
    assert client.put(f"/studies/{sa}/labels/x", headers=h(READER_A)).status_code == 403
    assert client.delete(f"/studies/{sa}/labels/a", headers=h(READER_A)).status_code == 403
    assert client.put(f"/studies/{sa}/labels/Bad", headers=h(ALL)).status_code == 400


def test_stow_into_a_study_not_allowed_is_refused_and_a_new_study_gets_the_write_label(client, two):
    a, b = two
    sb, sa = b[0].StudyInstanceUID, a[0].StudyInstanceUID
    r = store(client, ONLY_A, make_dataset(study=sb, PatientID="PB"))
    assert r.status_code == 409
    assert r.json()["00081198"]["Value"][0]["00081197"]["Value"] == [0x0124]
    assert len(client.get(f"/studies/{sb}/instances", headers=h(ALL)).json()) == 2  # nothing merged
    # the same refusal for the study in the URL
    assert store(client, ONLY_A, make_dataset(study=sb, PatientID="PB"), study=sb).status_code == 409
    # into its own study: stored
    assert store(client, ONLY_A, make_dataset(study=sa, PatientID="PA")).status_code == 200
    # a new study: stored, labelled a, visible to A and not to B
    new = make_dataset(PatientID="PN")
    assert store(client, ONLY_A, new).status_code == 200
    assert client.get(f"/studies/{new.StudyInstanceUID}/labels", headers=h(ALL)).json() == ["a"]
    assert new.StudyInstanceUID in uids(client.get("/studies", headers=h(ONLY_A)))
    assert new.StudyInstanceUID not in uids(client.get("/studies", headers=h(ONLY_B)))
    # an unrestricted token stores anywhere, labels nothing
    other = make_dataset(study=sb, PatientID="PB")
    assert store(client, ALL, other).status_code == 200
    assert client.get(f"/studies/{sb}/labels", headers=h(ALL)).json() == ["b"]


def test_routing_rules_label_studies_on_arrival(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[rules]]\nname = "MR is research"\nmatch = { Modality = "MR" }\nlabels = ["trial-42"]\n'
                      '[[rules]]\nmatch = { Modality = ["MR", "CT"], PatientID = "P*" }\nlabels = ["radio"]\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        mr, ct, other = make_dataset(modality="MR", PatientID="P1"), make_dataset(PatientID="P2"), \
            make_dataset(PatientID="Q3")
        body, ctype = multipart([to_bytes(mr), to_bytes(ct), to_bytes(other)])
        assert c.post("/studies", content=body, headers={"Content-Type": ctype}).status_code == 200
        assert c.get(f"/studies/{mr.StudyInstanceUID}/labels").json() == ["radio", "trial-42"]
        assert c.get(f"/studies/{ct.StudyInstanceUID}/labels").json() == ["radio"]
        assert c.get(f"/studies/{other.StudyInstanceUID}/labels").json() == []
        assert uids(c.get("/studies?label=trial-42")) == {mr.StudyInstanceUID}
    archive.close()


def test_a_rule_label_must_be_a_label(tmp_path):
    from dicomweb_server.routing.rules import RoutesError, load_routes

    routes = tmp_path / "routes.toml"
    routes.write_text('[[rules]]\nlabels = ["Not A Label"]\n')
    with pytest.raises(RoutesError, match="line 2: .*labels: invalid label"):
        load_routes(routes)
    routes.write_text('[[rules]]\nmatch = { Modality = "CT" }\n')
    with pytest.raises(RoutesError, match="destinations"):
        load_routes(routes)


def test_the_change_feed_shows_only_the_allowed_studies(client, two):
    a, b = two
    sa, sb = a[0].StudyInstanceUID, b[0].StudyInstanceUID
    every = client.get("/changefeed?limit=100", headers=h(ALL)).json()
    assert {e["StudyInstanceUid"] for e in every} == {sa, sb}
    seen = client.get("/changefeed?limit=100", headers=h(ONLY_A)).json()
    assert {e["StudyInstanceUid"] for e in seen} == {sa}
    # creates and the label row of each instance of A, its metadata with it
    assert sorted(e["Action"] for e in seen) == ["create"] * 3 + ["label"] * 3
    assert all(e["Metadata"]["0020000D"]["Value"] == [sa] for e in seen)
    # v2 with paging: the offset counts A's entries only
    page = client.get("/v2/changefeed?limit=2&offset=4", headers=h(ONLY_A)).json()
    assert [e["Sequence"] for e in page] == [e["Sequence"] for e in seen[4:6]]
    assert client.get("/changefeed/latest", headers=h(ONLY_A)).json()["StudyInstanceUid"] == sa
    assert client.get("/changefeed/latest", headers=h(ALL)).json()["StudyInstanceUid"] == sb


def test_the_landing_page_counts_only_the_allowed(client, two):
    got = client.get("/", headers=h(ONLY_B, Accept="application/json")).json()
    assert (got["studies"], got["series"], got["instances"]) == (1, 1, 2)
    got = client.get("/", headers=h(ALL, Accept="application/json")).json()
    assert (got["studies"], got["series"], got["instances"]) == (2, 3, 5)


def test_changes_to_a_study_not_allowed_are_404_like_none(client, two):
    """$update, reject, restore and export of B by a token allowed a: 404, as for a study
    that does not exist; nothing changed."""
    _a, b = two
    sb, seb = b[0].StudyInstanceUID, b[0].SeriesInstanceUID
    ghost = generate_uid()
    json_body = {"Content-Type": "application/dicom+json"}
    for path, body in ((f"/studies/{{}}/$update", b'{"00100010": {"vr": "PN", "Value": [{"Alphabetic": "X^Y"}]}}'),
                       (f"/studies/{{}}/reject/113001%5EDCM", b""), (f"/studies/{{}}/$restore-rejected", b""),
                       ("/admin/export/none/studies/{}", b"")):
        seen = client.post(path.format(sb), content=body, headers=h(ONLY_A, **json_body))
        assert seen.status_code == 404, path
        if "admin" not in path:  # (export: the destination is looked up first, for a study that exists)
            absent = client.post(path.format(ghost), content=body, headers=h(ONLY_A, **json_body))
            assert (seen.status_code, seen.content.replace(sb.encode(), ghost.encode())) == \
                (absent.status_code, absent.content), path
    meta = client.get(f"/studies/{sb}/series/{seb}/metadata", headers=h(ALL)).json()
    assert [m["00100010"]["Value"][0]["Alphabetic"] for m in meta] == ["Test^Patient"] * 2  # not updated
    assert client.get("/admin/rejected", headers=h(ALL)).json() == []  # not rejected


def test_merge_of_a_patient_whose_studies_are_not_allowed_is_404_like_none(client, two):
    """$merge by a token allowed a, of patient PB (study B, label b): 404, the body that of
    a patient with no study; B keeps its patient. Of PA (its own study): merged."""
    a, b = two
    json_body = {"Content-Type": "application/dicom+json"}
    target = b'{"00100020": {"vr": "LO", "Value": ["P-NEW"]}}'
    seen = client.post("/patients/PB/$merge", content=target, headers=h(ONLY_A, **json_body))
    absent = client.post("/patients/PZ/$merge", content=target, headers=h(ONLY_A, **json_body))
    assert (seen.status_code, seen.content.replace(b"PB", b"PZ")) == (absent.status_code, absent.content) == \
        (404, absent.content)
    assert uids(client.get("/studies", params={"PatientID": "PB"}, headers=h(ALL))) == {b[0].StudyInstanceUID}
    merged = client.post("/patients/PA/$merge", content=target, headers=h(ONLY_A, **json_body))
    assert merged.status_code == 200 and [s["StudyInstanceUID"] for s in merged.json()["studies"]] == \
        [a[0].StudyInstanceUID]
    assert uids(client.get("/studies", params={"PatientID": "P-NEW"}, headers=h(ALL))) == {a[0].StudyInstanceUID}


def test_qido_counts_of_a_patient_split_across_labels(client):
    """QIDO-RS study and series counts (0020,1206/1208/1209) when one patient has a study
    labelled a (2 series of 2 + 1 instances) and one labelled b (1 series of 4): a token
    allowed a sees study 1 alone, with its own counts, and none of study 2's series."""
    s1, s2, se1a, se1b, se2 = (generate_uid() for _ in range(5))
    one = [make_dataset(study=s1, series=se1a, PatientID="PX", InstanceNumber=i) for i in (1, 2)]
    one.append(make_dataset(study=s1, series=se1b, PatientID="PX", InstanceNumber=3))
    two = [make_dataset(study=s2, series=se2, PatientID="PX", InstanceNumber=i) for i in (1, 2, 3, 4)]
    assert store(client, ONLY_A, *one).status_code == 200  # the write label: a
    assert store(client, ONLY_B, *two).status_code == 200  # b
    ask = "/studies?PatientID=PX&includefield=00201206,00201208"

    def studies(token):
        return sorted((s["0020000D"]["Value"][0], s["00201206"]["Value"][0], s["00201208"]["Value"][0])
                      for s in client.get(ask, headers=h(token)).json())

    def series(token):
        return sorted((s["0020000E"]["Value"][0], s["00201209"]["Value"][0])
                      for s in client.get("/series?PatientID=PX&includefield=00201209", headers=h(token)).json())

    assert studies(ONLY_A) == [(s1, 2, 3)]
    assert studies(ALL) == sorted([(s1, 2, 3), (s2, 1, 4)])
    assert series(ONLY_A) == sorted([(se1a, 2), (se1b, 1)])
    assert series(ALL) == sorted([(se1a, 2), (se1b, 1), (se2, 4)])
    # study 2's series, asked by its UID: the empty search of a study that does not exist
    r = client.get(f"/studies/{s2}/series?includefield=00201209", headers=h(ONLY_A))
    assert (r.status_code, r.json()) == (200, [])

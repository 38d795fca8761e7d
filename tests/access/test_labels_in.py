"""Labels on arrival (access/labels_in.py), on every index (memory, SQLite, PostgreSQL):
the labels an instance's study gets are written by the Index.add that indexes it, in the
same transaction (a SIGKILL right after the commit leaves the study labelled); the routes
file gives them by attributes (QIDO-RS matching), by the C-STORE calling AE title
(``SourceApplicationEntityTitle``) and by the STOW-RS door (``stow_prefix``:
``POST /{door}/studies``); a client restricted to labels stores only through a door whose
labels it may see."""

from __future__ import annotations

import dataclasses
import signal

import httpx
import orjson
import pytest
from pydicom.uid import generate_uid
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.dimse import status as S
from dicomweb_server.routing.rules import Arrival, RoutesError, load_routes
from dicomweb_server.settings import Settings
from tests.access.test_http_access import h, key_name, uids
from tests.dimse.conftest import Dimse
from tests.reliability.test_crash import Server
from tests.helpers import LiveServer, free_port, make_dataset, multipart, to_bytes
from tests.store.test_index_contract import index, record  # noqa: F401 - the parametrised fixture

# --- the index: labels written by the add, in its transaction ------------------------------


def test_add_puts_the_records_labels_on_their_studies(index, tmp_path):  # noqa: F811
    sa, sb = generate_uid(), generate_uid()
    a1, a2 = record(tmp_path, study=sa, PatientID="PA"), record(tmp_path, study=sa, PatientID="PA")
    b1 = record(tmp_path, study=sb, PatientID="PB")
    a1.labels, a2.labels, b1.labels = ("cardio",), ("cardio", "trial-42"), ()
    assert index.add([a1, a2, b1]) == [True, True, True]
    assert index.labels(sa) == ["cardio", "trial-42"]
    assert index.labels(sb) == []
    assert index.all_labels() == {"cardio": 1, "trial-42": 1}
    # the change log: the creates, then a label row per instance of the study for each new label
    logged = index.changes(limit=100)
    rows = [(c.action, c.sop_uid) for c in logged]
    assert rows == [("create", a1.sop_uid), ("create", a2.sop_uid), ("create", b1.sop_uid),
                    ("label", a1.sop_uid), ("label", a2.sop_uid), ("label", a1.sop_uid), ("label", a2.sop_uid)]
    # a duplicate (not added) labels nothing; a new instance with a label the study has logs nothing
    again = dataclasses.replace(b1, labels=("x",))
    a3 = record(tmp_path, study=sa, PatientID="PA")
    a3.labels = ("cardio",)
    assert index.add([again, a3]) == [False, True]
    assert index.labels(sb) == [] and index.labels(sa) == ["cardio", "trial-42"]
    assert [c.action for c in index.changes(after=logged[-1].sequence, limit=100)] == ["create"]


def test_an_add_that_fails_leaves_no_label(index, tmp_path):  # noqa: F811
    """The labels are in the add's transaction: a write hook failing (routing's outbox
    rows cannot be written) rolls back the instance and its labels together."""
    def failing(con, records, added):
        raise RuntimeError("outbox full")

    index.add_write_hook(failing)
    rec = record(tmp_path, PatientID="P")
    rec.labels = ("cardio",)
    with pytest.raises(RuntimeError):
        index.add([rec])
    assert index.labels(rec.study_uid) is None
    assert index.all_labels() == {}


# --- the routes file -----------------------------------------------------------------------


def test_rules_by_calling_ae_title_and_stow_door(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[rules]]\nname = "echo lab"\nmatch = { SourceApplicationEntityTitle = ["ECHO*", "US_2"] }\n'
                      'labels = ["cardio"]\n'
                      '[[rules]]\nname = "cardio door"\nstow_prefix = ["cardio", "heart"]\nlabels = ["cardio"]\n'
                      '[[rules]]\nname = "MR by the research door"\nstow_prefix = "research"\n'
                      'match = { Modality = "MR" }\nlabels = ["trial-42"]\n')
    r = load_routes(routes)
    ct, mr = record(tmp_path, PatientID="P"), record(tmp_path, PatientID="P", modality="MR")
    assert r.labels_for(ct, Arrival(calling_ae="ECHO_LAB")) == {"cardio"}
    assert r.labels_for(ct, Arrival(calling_ae="US_2")) == {"cardio"}
    assert r.labels_for(ct, Arrival(calling_ae="CT_ROOM1")) == set()
    assert r.labels_for(ct, Arrival(stow_prefix="heart")) == {"cardio"}
    assert r.labels_for(ct, Arrival(stow_prefix="research")) == set()  # not MR
    assert r.labels_for(mr, Arrival(stow_prefix="research")) == {"trial-42"}
    assert r.labels_for(mr, Arrival()) == set()  # the plain /studies, an import
    assert r.stow_prefixes == {"cardio": {"cardio"}, "heart": {"cardio"}, "research": {"trial-42"}}


@pytest.mark.parametrize("text, error", [
    ('stow_prefix = "Cardio"\nlabels = ["c"]', r"line 2: \[\[rules\]\] #1 stow_prefix: 'Cardio': a path segment"),
    ('stow_prefix = "studies"\nlabels = ["c"]', "is a DICOMweb path segment"),
    ('stow_prefix = "c"\nlabels = ["c"]\ndestinations = ["pacs"]', "gives labels, and has no destinations"),
    ('match = { SourceApplicationEntityTitle = "CT*" }\ndestinations = ["pacs"]', "has no destinations"),
    ('match = { SourceApplicationEntityTitle = [] }\nlabels = ["c"]', "an AE title or a list of them"),
])
def test_arrival_keys_are_checked(tmp_path, text, error):
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[rules]]\n{text}\n[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:1/x"\n')
    with pytest.raises(RoutesError, match=error):
        load_routes(routes)


# --- STOW-RS doors ---------------------------------------------------------------------------

ALL, ONLY_A, A_AND_CARDIO, ONLY_B = "tok-all", "tok-a", "tok-a-cardio", "tok-b"
ROUTES = ('[[rules]]\nstow_prefix = "cardio"\nlabels = ["cardio"]\n'
          '[[rules]]\nmatch = { SourceApplicationEntityTitle = "ECHO*" }\nlabels = ["cardio"]\n'
          '[[rules]]\nmatch = { Modality = "MR" }\nlabels = ["mr"]\n')


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def client(request, tmp_path):
    extra = {"database_url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    (tmp_path / "routes.toml").write_text(ROUTES)
    every = ["read", "write", "delete"]
    settings = Settings(data_dir=tmp_path / "data", index=request.param, routes_file=tmp_path / "routes.toml",
                        **extra, api_keys={t: every for t in (ALL, ONLY_A, A_AND_CARDIO, ONLY_B)},
                        access_rules={"identities": {f"key:{key_name(ONLY_A)}": ["a"],
                                                     f"key:{key_name(A_AND_CARDIO)}": ["a", "cardio"],
                                                     f"key:{key_name(ONLY_B)}": ["b"]}})
    archive = Archive.open(settings)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        yield c
    archive.close()


def post(client, token, path, *datasets):
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    return client.post(path, content=body, headers=h(token, **{"Content-Type": ctype}))


def labels_of(client, ds) -> list[str]:
    return client.get(f"/studies/{ds.StudyInstanceUID}/labels", headers=h(ALL)).json()


def test_stow_door_labels_the_studies_posted_to_it(client):
    door, plain, mr = make_dataset(PatientID="P1"), make_dataset(PatientID="P2"), make_dataset(PatientID="P3",
                                                                                              modality="MR")
    assert post(client, ALL, "/cardio/studies", door, mr).status_code == 200
    assert post(client, ALL, "/studies", plain).status_code == 200
    assert labels_of(client, door) == ["cardio"]
    assert labels_of(client, mr) == ["cardio", "mr"]  # the door and the attributes
    assert labels_of(client, plain) == []
    # the door with a study in the URL; the answer's URLs are those of the archive
    more = make_dataset(study=plain.StudyInstanceUID, PatientID="P2")
    r = post(client, ALL, f"/cardio/studies/{plain.StudyInstanceUID}", more)
    assert r.status_code == 200
    assert r.json()["00081190"]["Value"][0].endswith(f"/studies/{plain.StudyInstanceUID}")
    assert labels_of(client, plain) == ["cardio"]
    assert uids(client.get("/studies?label=cardio", headers=h(ALL))) == {
        door.StudyInstanceUID, mr.StudyInstanceUID, plain.StudyInstanceUID}
    # a door no rule names: 404, nothing read
    r = post(client, ALL, "/oncology/studies", make_dataset(PatientID="P4"))
    assert r.status_code == 404 and "no STOW-RS door 'oncology'" in r.text


def test_a_restricted_client_stores_only_through_a_door_it_may_write(client):
    # B may not see label cardio: refused before the body is read, nothing stored
    refused = make_dataset(PatientID="PB")
    r = post(client, ONLY_B, "/cardio/studies", refused)
    assert r.status_code == 403 and "not authorized to store into label cardio" in r.text
    assert client.get(f"/studies/{refused.StudyInstanceUID}/labels", headers=h(ALL)).status_code == 404
    # a client that may see cardio: its new study is labelled cardio, not also with its write label a
    ok = make_dataset(PatientID="PC")
    assert post(client, A_AND_CARDIO, "/cardio/studies", ok).status_code == 200
    assert labels_of(client, ok) == ["cardio"]
    assert ok.StudyInstanceUID in uids(client.get("/studies", headers=h(A_AND_CARDIO)))
    # the plain route: the write label, as before; with a rule's label it may not see, both
    plain, mr = make_dataset(PatientID="PD"), make_dataset(PatientID="PE", modality="MR")
    assert post(client, ONLY_A, "/studies", plain, mr).status_code == 200
    assert labels_of(client, plain) == ["a"]
    assert labels_of(client, mr) == ["a", "mr"]
    # into a study it may not see (B's), through the door it may write: refused, never merged
    theirs = make_dataset(PatientID="PF")
    assert post(client, ONLY_B, "/studies", theirs).status_code == 200
    r = post(client, A_AND_CARDIO, "/cardio/studies", make_dataset(study=theirs.StudyInstanceUID, PatientID="PF"))
    assert r.status_code == 409 and r.json()["00081198"]["Value"][0]["00081197"]["Value"] == [0x0124]
    assert labels_of(client, theirs) == ["b"]
    assert len(client.get(f"/studies/{theirs.StudyInstanceUID}/instances", headers=h(ALL)).json()) == 1


# --- C-STORE: by calling AE title -------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def dimse(request, tmp_path):
    extra = {"database_url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    (tmp_path / "routes.toml").write_text(ROUTES)
    port = free_port()
    srv = LiveServer(tmp_path / "data", request.param, dimse_port=port, dimse_in_worker=True, **extra,
                     routes_file=tmp_path / "routes.toml",
                     access_rules={"identities": {"ae:ECHO_B": ["b"], "ae:CT_A": ["a"]}}).start()
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield Dimse(srv, port, client)
    srv.stop()


def test_c_store_labels_by_calling_ae_title(dimse):
    echo, ct, mr = make_dataset(PatientID="P1"), make_dataset(PatientID="P2"), make_dataset(PatientID="P3",
                                                                                           modality="MR")
    assert dimse.store([echo], ae_title="ECHO_LAB") == [S.SUCCESS]
    assert dimse.store([ct, mr], ae_title="CT_ROOM9") == [S.SUCCESS, S.SUCCESS]
    lab = {d.PatientID: dimse.http.get(f"/studies/{d.StudyInstanceUID}/labels").json() for d in (echo, ct, mr)}
    assert lab == {"P1": ["cardio"], "P2": [], "P3": ["mr"]}
    # a restricted AE: the rule's label, and its write label when the rule's would hide the study from it
    b, a = make_dataset(PatientID="P4"), make_dataset(PatientID="P5")
    assert dimse.store([b], ae_title="ECHO_B") == [S.SUCCESS]
    assert dimse.store([a], ae_title="CT_A") == [S.SUCCESS]
    assert dimse.http.get(f"/studies/{b.StudyInstanceUID}/labels").json() == ["b", "cardio"]
    assert dimse.http.get(f"/studies/{a.StudyInstanceUID}/labels").json() == ["a"]
    # ECHO_B cannot store into the study of CT_A (label a): refused, nothing labelled
    assert dimse.store([make_dataset(study=a.StudyInstanceUID, PatientID="P5")], ae_title="ECHO_B") == \
        [S.NOT_AUTHORIZED]
    assert dimse.http.get(f"/studies/{a.StudyInstanceUID}/labels").json() == ["a"]


# --- SIGKILL right after the commit -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "memory", "postgresql"])
def test_sigkill_after_the_commit_leaves_the_study_labelled(tmp_path, kind, request, monkeypatch):
    """The server SIGKILLs itself (faults.py ``indexed``) once the index commit of a STOW-RS
    returned, before the answer: after a restart the instance is there and so are its
    labels (before, they were written after the commit: the study stayed unlabelled)."""
    (tmp_path / "routes.toml").write_text(ROUTES)
    monkeypatch.setenv("DICOMWEB_ROUTES_FILE", str(tmp_path / "routes.toml"))
    monkeypatch.setenv("DICOMWEB_API_KEYS", orjson.dumps({ALL: ["read", "write"], ONLY_A: ["read", "write"]}).decode())
    monkeypatch.setenv("DICOMWEB_ACCESS_RULES",
                       orjson.dumps({"identities": {f"key:{key_name(ONLY_A)}": ["a"]}}).decode())
    if kind == "postgresql":
        monkeypatch.setenv("DICOMWEB_DATABASE_URL", request.getfixturevalue("postgres").fresh_url())
    data = tmp_path / "data"
    by_door, by_client = make_dataset(PatientID="P1", modality="MR"), make_dataset(PatientID="P2")
    for token, path, ds in ((ALL, "/cardio/studies", by_door), (ONLY_A, "/studies", by_client)):
        server = Server(data, kind, fault="indexed:1")
        body, ctype = multipart([to_bytes(ds)])
        try:  # killed before it answered
            r = httpx.post(server.url + path, content=body, headers=h(token, **{"Content-Type": ctype}), timeout=30)
        except httpx.HTTPError:
            pass
        else:
            pytest.fail(f"answered instead of dying after the commit: {r.status_code} {r.text[:500]}")
        assert server.proc.wait(10) == -signal.SIGKILL
    server = Server(data, kind)
    try:
        for ds, want in ((by_door, ["cardio", "mr"]), (by_client, ["a"])):
            assert httpx.get(f"{server.url}/studies/{ds.StudyInstanceUID}/labels", headers=h(ALL)).json() == want
        assert by_client.StudyInstanceUID in uids(httpx.get(server.url + "/studies", headers=h(ONLY_A)))
    finally:
        server.proc.terminate()
        server.proc.wait(20)

"""Share links over HTTP (api/shares.py, api/auth.py), on every index (memory, SQLite,
PostgreSQL): a link reads its one study on every read route (QIDO-RS, WADO-RS, metadata,
frames, bulk data, rendered); every other study answers as one that does not exist;
it cannot write nor delete (403); after expiry or revocation it is 401; GET /shares
lists it without its token; each use is in the audit log (never the token)."""

from __future__ import annotations

import calendar
import time

import orjson
import pytest
from pydicom.uid import generate_uid
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.settings import Settings
from tests.access.test_http_access import ALL, ONLY_A, ONLY_B, b_routes, h, key_name, store, uids
from tests.helpers import make_dataset


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def client(request, tmp_path):
    extra = {"database_url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    every = ["read", "write", "delete"]
    settings = Settings(data_dir=tmp_path / "data", index=request.param, **extra, audit_log=tmp_path / "audit.log",
                        api_keys={ALL: every, ONLY_A: every, ONLY_B: every},
                        access_rules={"identities": {f"key:{key_name(ONLY_A)}": ["a"],
                                                     f"key:{key_name(ONLY_B)}": ["b"]}},
                        share_max_seconds=30 * 86400)
    archive = Archive.open(settings)
    with TestClient(create_app(archive.settings, archive=archive)) as c:
        c.audit = tmp_path / "audit.log"
        yield c
    archive.close()


@pytest.fixture
def two(client):
    """Study A (label a): 2 instances, one of 2 frames; study B (label b): 1 instance."""
    sa, sb, sea = generate_uid(), generate_uid(), generate_uid()
    a = [make_dataset(study=sa, series=sea, PatientID="PA", InstanceNumber=1, frames=2),
         make_dataset(study=sa, series=sea, PatientID="PA", InstanceNumber=2)]
    b = [make_dataset(study=sb, PatientID="PB", InstanceNumber=1, frames=2)]
    assert store(client, ALL, *a).status_code == 200
    assert store(client, ALL, *b).status_code == 200
    assert client.put(f"/studies/{sa}/labels/a", headers=h(ALL)).status_code == 200
    assert client.put(f"/studies/{sb}/labels/b", headers=h(ALL)).status_code == 200
    return a, b


def share(client, study, token=ALL, **body):
    return client.post(f"/studies/{study}/share", headers=h(token), content=orjson.dumps(body) if body else b"")


def test_a_share_link_reads_its_study_and_nothing_else(client, two):
    a, b = two
    sa, sb = a[0].StudyInstanceUID, b[0].StudyInstanceUID
    before = time.time()
    r = share(client, sa)
    assert r.status_code == 201, r.text
    link = r.json()
    token = link["token"]
    assert len(token) == 43 and link["dicomweb"] == "http://testserver"
    assert link["url"] == f"http://testserver/viewer/viewer?StudyInstanceUIDs={sa}&token={token}"
    expires = calendar.timegm(time.strptime(link["expires"], "%Y-%m-%dT%H:%M:%SZ"))
    assert before + 7 * 86400 - 1 <= expires <= time.time() + 7 * 86400  # the default: 7 days
    # every read route of A: as for the archive's own key
    for path in b_routes(sa, a[0].SeriesInstanceUID, a[0].SOPInstanceUID):
        mine, theirs = client.get(path, headers=h(token)), client.get(path, headers=h(ALL))
        assert mine.status_code == 200, (path, mine.status_code)
        assert mine.content == theirs.content or "multipart" in mine.headers["content-type"], path
    assert uids(client.get("/studies", headers=h(token))) == {sa}
    assert len(client.get("/instances", headers=h(token)).json()) == 2
    assert client.get(f"/studies?StudyInstanceUID={sb}", headers=h(token)).json() == []
    assert client.get("/series?PatientID=PB", headers=h(token)).json() == []
    # the frames of A's first instance: the exact pixel bytes
    frames = client.get(f"/studies/{sa}/series/{a[0].SeriesInstanceUID}/instances/{a[0].SOPInstanceUID}/frames/2",
                        headers=h(token, Accept='multipart/related; type="application/octet-stream"'))
    assert frames.status_code == 200 and a[0].PixelData[len(a[0].PixelData) // 2:] in frames.content
    # B, and a study that does not exist: the same answers
    real = (sb, b[0].SeriesInstanceUID, b[0].SOPInstanceUID)
    none = (generate_uid(), generate_uid(), generate_uid())
    for path, ghost in zip(b_routes(*real), b_routes(*none)):
        seen, absent = client.get(path, headers=h(token)), client.get(ghost, headers=h(token))
        body = seen.content
        for x, y in zip(real, none):
            body = body.replace(x.encode(), y.encode())
        assert seen.status_code in (404, 200) and (seen.status_code, body) == (absent.status_code, absent.content), path
        assert seen.status_code == 404 or seen.json() == [], path  # a retrieve: 404; a search: no match
    # the token as the share query parameter (a viewer's first request, a link to a rendered image)
    assert uids(client.get(f"/studies?share={token}")) == {sa}
    assert uids(client.get(f"/studies?PatientID=PA&share={token}")) == {sa}
    # the other parameters reach the route byte for byte (their escapes kept)
    assert uids(client.get(f"/studies?share={token}&PatientID=P%41&includefield=00100010%2C00100020")) == {sa}
    assert client.get(f"/studies/{sa}/rendered?share={token}").status_code == 200
    assert client.get(f"/studies/{sb}/metadata?share={token}").status_code == 404


def test_a_share_link_cannot_write_nor_delete(client, two):
    a, b = two
    sa = a[0].StudyInstanceUID
    token = share(client, sa).json()["token"]
    more = make_dataset(study=sa, PatientID="PA")
    assert store(client, token, more).status_code == 403
    assert store(client, token, more, study=sa).status_code == 403
    assert client.delete(f"/studies/{sa}", headers=h(token)).status_code == 403
    assert client.put(f"/studies/{sa}/labels/x", headers=h(token)).status_code == 403
    assert client.delete(f"/studies/{sa}/labels/a", headers=h(token)).status_code == 403
    assert share(client, sa, token).status_code == 403
    assert client.get("/shares", headers=h(token)).status_code == 403
    assert client.get("/admin/queue", headers=h(token)).status_code == 403
    assert client.delete(f"/studies/{sa}?share={token}").status_code == 403
    assert len(client.get(f"/studies/{sa}/instances", headers=h(ALL)).json()) == 2  # nothing changed


def test_expired_and_revoked_links_are_401(client, two):
    a, _b = two
    sa = a[0].StudyInstanceUID
    short = share(client, sa, expires_in=1).json()
    kept = share(client, sa).json()
    assert client.get(f"/studies/{sa}/metadata", headers=h(short["token"])).status_code == 200
    time.sleep(1.1)
    r = client.get(f"/studies/{sa}/metadata", headers=h(short["token"]))
    assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
    assert client.get(f"/studies?share={short['token']}").status_code == 401
    # revoked
    assert client.get(f"/studies/{sa}/metadata", headers=h(kept["token"])).status_code == 200
    r = client.delete(f"/shares/{kept['id']}", headers=h(ALL))
    assert r.status_code == 200 and r.json()["revoked"] is True and r.json()["active"] is False
    assert client.get(f"/studies/{sa}/metadata", headers=h(kept["token"])).status_code == 401
    assert client.get(f"/studies/{sa}/metadata?share={kept['token']}").status_code == 401
    assert client.delete(f"/shares/{kept['id']}", headers=h(ALL)).status_code == 200  # idempotent
    assert client.delete("/shares/nope", headers=h(ALL)).status_code == 404
    # an unknown token in the query: 401 too
    assert client.get("/studies?share=not-a-token").status_code == 401


def test_shares_are_listed_without_tokens_and_by_who_may_see_the_study(client, two):
    a, b = two
    sa, sb = a[0].StudyInstanceUID, b[0].StudyInstanceUID
    la = share(client, sa, ONLY_A, expires_in=3600).json()
    lb = share(client, sb, ALL).json()
    listed = client.get("/shares", headers=h(ALL))
    assert listed.status_code == 200
    assert la["token"].encode() not in listed.content and lb["token"].encode() not in listed.content
    rows = {s["id"]: s for s in listed.json()}
    assert set(rows) == {la["id"], lb["id"]}
    assert rows[la["id"]]["study"] == sa and rows[la["id"]]["creator"] == key_name(ONLY_A)
    assert rows[la["id"]]["expires"] == la["expires"] and rows[la["id"]]["active"] is True
    assert set(rows[la["id"]]) == {"id", "study", "created", "expires", "creator", "revoked", "active"}
    # a restricted caller: its studies' links only; another's: 404, like none
    assert [s["id"] for s in client.get("/shares", headers=h(ONLY_A)).json()] == [la["id"]]
    assert client.delete(f"/shares/{lb['id']}", headers=h(ONLY_A)).status_code == 404
    assert share(client, sb, ONLY_A).status_code == 404  # a study it may not see
    assert share(client, generate_uid()).status_code == 404  # a study that does not exist
    # expires_in: above the maximum (share_max_seconds), not a number, zero: 400
    assert share(client, sa, expires_in=30 * 86400 + 1).status_code == 400
    assert share(client, sa, expires_in=30 * 86400).status_code == 201
    assert share(client, sa, expires_in="1").status_code == 400
    assert share(client, sa, expires_in=0).status_code == 400
    assert share(client, sa, other=1).status_code == 400


def test_the_default_lifetime_is_capped_by_the_maximum(tmp_path):
    settings = Settings(data_dir=tmp_path, index="memory", api_keys={ALL: ["read", "write"]}, share_max_seconds=3600)
    archive = Archive.open(settings)
    with TestClient(create_app(archive.settings, archive=archive)) as client:
        ds = make_dataset(PatientID="P")
        assert store(client, ALL, ds).status_code == 200
        before = time.time()
        r = share(client, ds.StudyInstanceUID)
        expires = calendar.timegm(time.strptime(r.json()["expires"], "%Y-%m-%dT%H:%M:%SZ"))
        assert r.status_code == 201 and before + 3600 - 1 <= expires <= time.time() + 3600
        assert share(client, ds.StudyInstanceUID, expires_in=3601).status_code == 400
    archive.close()


def test_each_use_is_audited_and_the_token_never_is(client, two):
    a, _b = two
    sa = a[0].StudyInstanceUID
    link = share(client, sa, expires_in=1).json()
    client.get(f"/studies/{sa}/metadata", headers=h(link["token"]))
    client.get(f"/studies?share={link['token']}")
    time.sleep(1.1)
    client.get(f"/studies/{sa}/metadata", headers=h(link["token"]))
    text = client.audit.read_text()
    assert link["token"] not in text
    uses = [r for r in map(orjson.loads, text.splitlines()) if r.get("share") == link["id"]]
    assert [(u["user"], u["auth"], u["path"], u["outcome"]) for u in uses] == [
        (f"share-{link['id']}", "share", f"/studies/{sa}/metadata", 200),
        (f"share-{link['id']}", "share", "/studies", 200),
        (None, None, f"/studies/{sa}/metadata", 401)]
    assert uses[1]["query"] == ""


def test_the_change_feed_and_downloads_of_a_share_link_hold_its_study_only(client, two):
    a, b = two
    sa, sb = a[0].StudyInstanceUID, b[0].StudyInstanceUID
    token = share(client, sa).json()["token"]
    seen = client.get("/changefeed?limit=100", headers=h(token)).json()
    assert {e["StudyInstanceUid"] for e in seen} == {sa} and len(seen) == 4  # 2 creates, 2 label rows
    assert client.get("/changefeed/latest", headers=h(token)).json()["StudyInstanceUid"] == sa
    zipped = client.get(f"/studies/{sa}/archive", headers=h(token))
    assert zipped.status_code == 200 and zipped.content[:2] == b"PK"
    assert client.get(f"/studies/{sb}/archive", headers=h(token)).status_code == 404
    ndjson = client.get("/export/metadata", headers=h(token))
    assert ndjson.status_code == 200
    assert {orjson.loads(line)["0020000D"]["Value"][0] for line in ndjson.text.splitlines()} == {sa}

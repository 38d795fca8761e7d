"""``GET /admin/studies/{study}/arrivals`` (api/admin.py, dicomweb_server/arrivals.py): the
source each front door gives its instances (STOW-RS: the authenticated user, else the
client's address; the command line's import) and the sizes of the stored files."""

from __future__ import annotations

import hashlib
import os

from pydicom.uid import generate_uid
from starlette.testclient import TestClient

from dicomweb_server.app import create_app
from dicomweb_server.archive import Archive
from dicomweb_server.importer import ImportRun, run_import
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, to_bytes

KEY = "s3cret"
KEY_NAME = f"key-{hashlib.sha256(KEY.encode()).hexdigest()[:8]}"  # (api/auth.py: what a key is called)


def _stow(c: TestClient, datasets, headers=None) -> None:
    body = b"".join(b"--b\r\nContent-Type: application/dicom\r\n\r\n" + to_bytes(ds) + b"\r\n" for ds in datasets)
    r = c.post("/studies", content=body + b"--b--\r\n",
               headers={"Content-Type": 'multipart/related; type="application/dicom"; boundary=b', **(headers or {})})
    assert r.status_code == 200, r.text


def _sizes(archive, study: str) -> dict[str, int]:
    return {loc.sop_uid: os.path.getsize(archive.blobs.resolve(loc.path)) for loc in archive.index.instances(study)}


def test_stow_by_a_client_address_and_by_an_api_key(tmp_path):
    study, se1, se2 = str(generate_uid()), str(generate_uid()), str(generate_uid())
    anon = make_dataset(study=study, series=se1, PatientID="S1")
    keyed = make_dataset(study=study, series=se2, PatientID="S1", rows=16)
    with TestClient(create_app(Settings(data_dir=tmp_path / "a", index="sqlite"))) as c:
        _stow(c, [anon])
    with TestClient(create_app(Settings(data_dir=tmp_path / "a", index="sqlite",
                                        api_keys={KEY: ["read", "write"]}))) as c:
        auth = {"Authorization": f"Bearer {KEY}"}
        _stow(c, [keyed], auth)
        assert c.get(f"/admin/studies/{study}/arrivals").status_code == 401
        doc = c.get(f"/admin/studies/{study}/arrivals", headers=auth).json()
        sizes = _sizes(c.app.state.archive, study)
        assert c.get(f"/admin/studies/{generate_uid()}/arrivals", headers=auth).status_code == 404
    assert doc["sources"] == {"stow:testclient": 1, f"stow:{KEY_NAME}": 1}  # (TestClient's address: "testclient")
    assert [(s["series"], s["instances"], s["bytes"], s["sources"], s["declared"]) for s in doc["series"]] == [
        (se1, 1, sizes[str(anon.SOPInstanceUID)], {"stow:testclient": 1}, None),
        (se2, 1, sizes[str(keyed.SOPInstanceUID)], {f"stow:{KEY_NAME}": 1}, None)]
    assert (doc["instances"], doc["bytes"], doc["declared"], doc["commitments"]) == (2, sum(sizes.values()), None, [])


def test_import_is_the_source_of_imported_files(tmp_path):
    ds = make_dataset(PatientID="I1")
    path = tmp_path / "in.dcm"
    path.write_bytes(to_bytes(ds))
    for index in ("memory", "sqlite"):
        archive = Archive.open(Settings(data_dir=tmp_path / index, index=index))
        try:
            run = run_import(archive, [path], [], ImportRun(), quiet=True)
            assert run.stored == 1
            [group] = archive.index.arrived(str(ds.StudyInstanceUID))
            assert (group.source, group.instances, group.bytes) == ("import", 1, os.path.getsize(path))
        finally:
            archive.close()

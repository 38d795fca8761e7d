"""The outbox rows and the instance rows commit together: if the outbox cannot be
written, the instance is not stored (and not acknowledged), with every index."""

from __future__ import annotations

import os
import sqlite3

import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.dicom.status import FailureReason
from dicomweb_server.routing.outbox import Outbox
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset
from tests.routing.conftest import ALL


def _part(archive: Archive, name: str, **attrs) -> SpooledPart:
    path = archive.blobs.spool / name
    make_dataset(**attrs).save_as(path, enforce_file_format=True)
    return SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True)


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_an_outbox_that_cannot_be_written_fails_the_store(tmp_path, monkeypatch, backend):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
                      '[[rules]]\nmatch = { Modality = "CT" }\ndestinations = ["pacs"]\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index=backend.index, routes_file=routes,
                                    **backend.settings))
    try:
        ok = archive.store([_part(archive, "a.dcm", modality="CT"), _part(archive, "b.dcm", modality="MR")])
        assert len(ok.stored) == 2
        assert [(r["destination"], r["state"]) for r in archive.routing.outbox.rows()] == [("pacs", "pending")]

        def disk_full(self, entries, con=None):
            if backend.index == "postgresql":
                import psycopg

                raise psycopg.errors.DiskFull("could not extend file: No space left on device")
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(Outbox, "insert", disk_full)
        failed = archive.store([_part(archive, "c.dcm", modality="CT", PatientID="lost")])
        assert [f.reason for f in failed.failed] == [FailureReason.OUT_OF_RESOURCES] and not failed.stored
        assert archive.index.count() == 2  # nothing of the failed store is visible
        assert sorted(p.name for p in (tmp_path / "data" / "blobs").rglob("*.dcm")) == sorted(
            f"{s.sop_instance_uid}.dcm" for s in ok.stored)
        # an instance the rules do not match writes no row, so the outbox is not in its way
        assert len(archive.store([_part(archive, "d.dcm", modality="MR")]).stored) == 1
    finally:
        archive.close()

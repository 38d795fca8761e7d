"""The pydicom sample corpus stored by C-STORE: every file the archive accepts over
STOW-RS (the same Archive.store) is accepted over DIMSE, found by QIDO-RS and
retrieved by WADO-RS with identical pixel data."""

from __future__ import annotations

import io
import shutil
import warnings

import pydicom
import pytest
from pynetdicom import _config, build_context

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES
from dicomweb_server.settings import Settings
from tests.helpers import sample_files

ANY_TS = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}


def _stow_accepts(tmp_path, files) -> set[str]:
    """SOP Instance UIDs the STOW-RS write path (Archive.store) accepts."""
    archive = Archive.open(Settings(data_dir=tmp_path / "ref", index="memory"))
    try:
        parts = []
        for i, path in enumerate(files):
            copy = archive.blobs.spool / f"ref-{i}"
            shutil.copyfile(path, copy)
            parts.append(SpooledPart(path=copy, size=copy.stat().st_size, complete=True))
        return {s.sop_instance_uid for s in archive.store(parts).stored}
    finally:
        archive.close()


@pytest.mark.parametrize("dimse", ["sqlite"], indirect=True)
def test_sample_corpus(dimse, tmp_path, monkeypatch):
    warnings.filterwarnings("ignore")
    monkeypatch.setattr(_config, "STORE_SEND_CHUNKED_DATASET", True)
    files = sample_files()
    accepted = _stow_accepts(tmp_path, list(files.values()))
    assert len(accepted) > 20
    sent: dict[str, int] = {}
    inconsistent = set()  # file meta names another instance/class: the command would say so (0xA900)
    for sop, path in files.items():
        ds = pydicom.dcmread(path)
        ts = str(ds.file_meta.TransferSyntaxUID)
        if (ds.file_meta.get("MediaStorageSOPInstanceUID"), ds.file_meta.get("MediaStorageSOPClassUID")) != (
                ds.get("SOPInstanceUID"), ds.get("SOPClassUID")):
            inconsistent.add(sop)
        if ts not in TRANSFER_SYNTAXES:
            continue  # no presentation context for it: the association would not carry it
        assoc = dimse.associate([build_context(str(ds.SOPClassUID), [ts])])
        try:
            if not assoc.accepted_contexts:
                continue
            sent[sop] = int(assoc.send_c_store(path).Status)  # the file's bytes, not re-encoded
        finally:
            assoc.release()
    stored = {sop for sop, st in sent.items() if st == S.SUCCESS}
    assert {sent[sop] for sop in inconsistent & set(sent)} <= {S.STORE_DATASET_MISMATCH}
    assert stored == (accepted - inconsistent) & set(sent), {sop: hex(st) for sop, st in sent.items() if (sop in accepted) != (st == 0)}
    assert len(stored) > 20
    for sop in stored:
        original = pydicom.dcmread(files[sop])
        hits = dimse.http.get("/instances", params={"SOPInstanceUID": sop}).json()
        assert len(hits) == 1
        url = (f"/studies/{original.StudyInstanceUID}/series/{original.SeriesInstanceUID}/instances/{sop}")
        r = dimse.http.get(url, headers=ANY_TS)
        assert r.status_code == 200
        body = r.content
        got = pydicom.dcmread(io.BytesIO(body[body.index(b"DICM") - 128:]))
        assert got.get("PixelData") == original.get("PixelData"), sop

"""Crash safety of IOCM rejection (lifecycle/reject.py): a rejection note and the hiding of
what it names are one index transaction. A real server process storing a note is killed
(SIGKILL) inside that transaction (``note-indexed``: the note's rows written, the hiding
not yet) and right after its commit (``indexed``: not yet answered); after a restart the
archive is in one of the two consistent states, never a stored note beside the instances
it rejects still visible. Before, the note was committed first and applied in a second
transaction: killed between the two, the rejected instances stayed visible for good
(the client's retry of the note was an identical duplicate that applied nothing)."""

from __future__ import annotations

import httpx
import pytest
from pydicom.uid import generate_uid

from tests.helpers import make_dataset, multipart, rejection_note, to_bytes
from tests.reliability.test_crash import Server, _database


def _stow(url: str, datasets) -> httpx.Response:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    return httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=60)


def _visible(url: str, st: str) -> set[str]:
    r = httpx.get(f"{url}/studies/{st}/instances", timeout=30)
    assert r.status_code in (200, 204), r.text
    return {x["00080018"]["Value"][0] for x in (r.json() if r.status_code == 200 else [])}


@pytest.mark.parametrize("index", ["sqlite", "memory", "postgresql"])
@pytest.mark.parametrize("fault", ["note-indexed", "indexed:2"])
def test_sigkill_while_a_rejection_note_is_stored(tmp_path, index, fault, request, monkeypatch):
    index = _database(request, monkeypatch, index)
    data = tmp_path / "data"
    st = generate_uid()
    a, b = make_dataset(study=st, PatientID="K"), make_dataset(study=st, PatientID="K")
    note = rejection_note([a])
    sops = {str(a.SOPInstanceUID), str(b.SOPInstanceUID)}
    srv = Server(data, index, fault)
    try:
        assert _stow(srv.url, [a, b]).status_code == 200
        with pytest.raises(httpx.HTTPError):
            _stow(srv.url, [note])
    finally:
        srv.kill()
    assert srv.proc.returncode == -9
    srv = Server(data, index)
    try:
        seen = _visible(srv.url, st)
        if str(note.SOPInstanceUID) in seen:  # the note is stored: what it rejects is hidden
            assert seen == {str(b.SOPInstanceUID), str(note.SOPInstanceUID)}
            assert httpx.get(f"{srv.url}/studies/{st}/series/{a.SeriesInstanceUID}/instances/"
                             f"{a.SOPInstanceUID}/metadata", timeout=30).status_code == 404
        else:  # not stored (never acknowledged): nothing rejected
            assert seen == sops
        # the client sends the unacknowledged note again: the rejection is in force
        assert _stow(srv.url, [note]).status_code == 200
        assert _visible(srv.url, st) == {str(b.SOPInstanceUID), str(note.SOPInstanceUID)}
        rejected = httpx.get(f"{srv.url}/admin/rejected", timeout=30).json()
        assert [r["SOPInstanceUID"] for r in rejected] == [str(a.SOPInstanceUID)]
        if fault == "indexed:2":
            assert str(note.SOPInstanceUID) in seen  # committed before the kill
    finally:
        srv.kill()

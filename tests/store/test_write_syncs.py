"""The STOW-RS write path's system calls (issue 11): an in-memory part is written to
its spool file only once it is valid and fdatasync'ed on the descriptor that wrote
it (never opened again to be synced); the write locks, kept open per process, still
keep threads and processes apart."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import threading
import time

from dicomweb_server.archive import Archive
from dicomweb_server.dicom import multipart
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.settings import Settings
from dicomweb_server.store.blobs import BlobStore
from tests.helpers import make_dataset, to_bytes


def _archive(tmp_path) -> Archive:
    return Archive.open(Settings(data_dir=str(tmp_path / "data"), index="sqlite"))


def _part(data: bytes) -> SpooledPart:
    return SpooledPart(headers={"content-type": "application/dicom"}, size=len(data), complete=True, data=data)


def _count_syncs(monkeypatch) -> list[tuple[str, str]]:
    """Record (call, 'dir'|'file') for every fsync / fdatasync."""
    calls: list[tuple[str, str]] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def wrapper(fd, _real=real, _name=name):
            kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            calls.append((_name, kind))
            return _real(fd)

        monkeypatch.setattr(os, name, wrapper)
    return calls


def test_in_memory_part_is_synced_once_on_its_own_descriptor(tmp_path, monkeypatch):
    archive = _archive(tmp_path)
    try:
        ds = make_dataset(rows=16, columns=16)
        data = to_bytes(ds)
        opened: list[str] = []
        real_open = os.open

        def spy_open(path, flags, *a, **k):
            if not flags & os.O_CREAT:  # not the spool file's creation (mkstemp)
                opened.append(str(path))
            return real_open(path, flags, *a, **k)

        calls = _count_syncs(monkeypatch)
        monkeypatch.setattr(os, "open", spy_open)
        outcome = archive.store([_part(data)])
        assert [s.sop_instance_uid for s in outcome.stored] == [ds.SOPInstanceUID]
        assert outcome.failed == []
        file_syncs = [c for c in calls if c[1] == "file"]
        assert file_syncs[0] == ("fdatasync", "file")  # the instance's data, by its writer
        # the instance's spool file is never opened again (to be synced or otherwise)
        assert not [p for p in opened if "part-" in p]
        # the stored bytes are the sent bytes, at the instance's own path
        stored = archive.blobs.resolve(f"{ds.StudyInstanceUID}/{ds.SeriesInstanceUID}/{ds.SOPInstanceUID}.dcm")
        assert stored.read_bytes() == data
        assert list(archive.blobs.spool.iterdir()) == []  # spool name removed once linked
    finally:
        archive.close()


def test_invalid_in_memory_part_never_reaches_the_disk(tmp_path, monkeypatch):
    archive = _archive(tmp_path)
    try:
        made: list[str] = []
        real = multipart.new_spool_file

        def spy(*a, **k):
            fd, name = real(*a, **k)
            made.append(name)
            return fd, name

        monkeypatch.setattr(multipart, "new_spool_file", spy)
        outcome = archive.store([_part(b"not a DICOM file" * 10)])
        assert outcome.stored == [] and len(outcome.failed) == 1
        assert int(outcome.failed[0].reason) == 0xC000
        assert made == []
    finally:
        archive.close()


def test_disk_error_writing_a_valid_part_fails_it_with_its_uids(tmp_path, monkeypatch):
    archive = _archive(tmp_path)
    try:
        ds = make_dataset(rows=8, columns=8)

        def full(*a, **k):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(multipart, "new_spool_file", full)
        outcome = archive.store([_part(to_bytes(ds))])
        assert outcome.stored == []
        (f,) = outcome.failed
        assert (int(f.reason), f.sop_instance_uid) == (0xA700, ds.SOPInstanceUID)
        assert archive.index.locate(ds.SOPInstanceUID) is None
    finally:
        archive.close()


def test_write_locks_exclude_threads_of_one_process(tmp_path):
    blobs = BlobStore(tmp_path)
    order: list[str] = []
    inside = threading.Event()

    def second():
        inside.wait(5)
        with blobs.locked(["1.2.3"]):
            order.append("second")

    t = threading.Thread(target=second)
    t.start()
    with blobs.locked(["1.2.3", "1.2.4"]):
        inside.set()
        time.sleep(0.2)
        order.append("first")
    t.join(5)
    assert order == ["first", "second"]
    blobs.close_locks()


def test_write_locks_exclude_other_processes(tmp_path):
    blobs = BlobStore(tmp_path)
    code = (
        "import sys, time; from pathlib import Path; from dicomweb_server.store.blobs import BlobStore\n"
        "b = BlobStore(Path(sys.argv[1]))\n"
        "with b.locked(['1.2.3']):\n"
        "    print('locked', flush=True); time.sleep(1.0)\n"
    )
    with blobs.locked(["1.2.3"]):  # held here first: the child waits for it
        child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        assert child.poll() is None
    t0 = time.monotonic()
    assert child.stdout.readline().strip() == "locked"  # type: ignore[union-attr]
    # now the child holds it: this process waits (its cached descriptor still locks)
    with blobs.locked(["1.2.3"]):
        waited = time.monotonic() - t0
    child.wait(10)
    assert waited > 0.5
    blobs.close_locks()


def test_deflated_part_in_memory_inflates_in_the_spool_folder(tmp_path, monkeypatch):
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    archive = _archive(tmp_path)
    try:
        ds = make_dataset(rows=8, columns=8, transfer_syntax=DeflatedExplicitVRLittleEndian)
        data = to_bytes(ds)
        outcome = archive.store([_part(data)])
        assert [s.sop_instance_uid for s in outcome.stored] == [ds.SOPInstanceUID], outcome.failed
        assert list(cwd.iterdir()) == []  # the inflated copy was not made in the working folder
        assert list(archive.blobs.spool.iterdir()) == []
    finally:
        archive.close()


def test_a_folder_is_used_by_others_only_once_its_entry_is_durable(tmp_path, monkeypatch):
    """Writer A makes the study/series folders; writer B, placing a file in the same
    series while A's fsync of the new folder's parent is still running, waits for it
    (before: B found the folder, linked, and its commit could be acknowledged first)."""
    from dicomweb_server.store import blobs as blobs_module

    store = BlobStore(tmp_path)
    in_fsync, release = threading.Event(), threading.Event()
    real = blobs_module.fsync_dir
    events: list[str] = []

    def slow_fsync_dir(path):
        if not in_fsync.is_set():  # A's first folder fsync (the parent of the new study folder)
            in_fsync.set()
            release.wait(5)
            events.append("A's folder durable")
        return real(path)

    monkeypatch.setattr(blobs_module, "fsync_dir", slow_fsync_dir)

    def spooled(name: str):
        p = store.spool / name
        p.write_bytes(name.encode())
        return p

    a = threading.Thread(target=store.place, args=(spooled("a"), "1.2/3.4/5.6.dcm"), kwargs={"sync_dir": False})
    a.start()
    assert in_fsync.wait(5)
    assert (tmp_path / "blobs" / "1.2").is_dir()  # made, its entry not yet durable

    def b_place():
        store.place(spooled("b"), "1.2/3.4/7.8.dcm", sync_dir=False)
        events.append("B linked")

    b = threading.Thread(target=b_place)
    b.start()
    time.sleep(0.3)
    assert events == []  # B waits for A's fsync
    release.set()
    a.join(5)
    b.join(5)
    assert events == ["A's folder durable", "B linked"]
    assert (tmp_path / "blobs" / "1.2" / "3.4" / "7.8.dcm").read_bytes() == b"b"
    store.close_locks()


def test_delete_does_not_remove_a_folder_a_placement_is_using(tmp_path):
    store = BlobStore(tmp_path)
    first = store.spool / "x"
    first.write_bytes(b"x")
    store.place(first, "1.2/3.4/5.6.dcm")
    with store._folders(fcntl.LOCK_SH):  # a placement that found the folder, about to link
        t = threading.Thread(target=store.remove, args=("1.2/3.4/5.6.dcm",))
        t.start()
        time.sleep(0.2)
        assert (tmp_path / "blobs" / "1.2" / "3.4").is_dir()  # the emptying DELETE waits
    t.join(5)
    assert not (tmp_path / "blobs" / "1.2").exists()  # then removes the emptied folders
    store.close_locks()


def test_spool_files_are_named_by_process_and_counter_without_mkstemp(tmp_path, monkeypatch):
    """An in-memory part's spool file (STOW-RS, and a C-STORE data set received in memory) is
    made by ``multipart.new_spool_file``: ``part-<pid>-<n>.tmp``, created with ``O_EXCL`` and
    mode 0600, a name already taken (left by an earlier process with the same id) skipped;
    ``tempfile.mkstemp`` (its random name was ~4 % of the listener's GIL time per instance,
    issue 33) is not on the path: the store succeeds with it refusing."""
    import tempfile

    spool = tmp_path / "spool"
    spool.mkdir()
    pid = f"{os.getpid():x}"
    fd, path = multipart.new_spool_file(spool)
    os.close(fd)
    prefix, n = path.name[: -len(".tmp")].rsplit("-", 1)
    assert prefix == f"part-{pid}" and path.suffix == ".tmp" and stat.S_IMODE(path.stat().st_mode) == 0o600
    taken = spool / f"part-{pid}-{int(n, 16) + 1:x}.tmp"
    taken.write_bytes(b"left behind")
    fd, path2 = multipart.new_spool_file(spool)
    os.close(fd)
    assert path2.name == f"part-{pid}-{int(n, 16) + 2:x}.tmp" and taken.read_bytes() == b"left behind"

    def refuse(*_a, **_k):
        raise AssertionError("mkstemp called")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    archive = _archive(tmp_path)
    try:
        ds = make_dataset(rows=8, columns=8)
        outcome = archive.store([_part(to_bytes(ds))])
        assert [s.sop_instance_uid for s in outcome.stored] == [ds.SOPInstanceUID] and outcome.failed == []
        assert list(archive.blobs.spool.iterdir()) == []
    finally:
        archive.close()

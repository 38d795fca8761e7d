"""The dicomweb-server command line: settings from flags and DICOMWEB_* variables,
the one-process rule of the in-memory index, import and check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from dicomweb_server.archive import Archive
from dicomweb_server.cli import main
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, sample_files


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dicomweb_server.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_memory_index_refuses_several_workers(tmp_path):
    r = run("serve", "--index", "memory", "--workers", "2", "--data-dir", str(tmp_path))
    assert r.returncode == 2 and "one process" in r.stderr


def test_settings_from_environment_and_defaults(monkeypatch):
    monkeypatch.setenv("DICOMWEB_PORT", "9999")
    monkeypatch.setenv("DICOMWEB_INDEX", "memory")
    monkeypatch.setenv("DICOMWEB_PREFIX", "dicomweb/")
    s = Settings()
    assert (s.port, s.index, s.prefix, s.effective_workers()) == (9999, "memory", "/dicomweb", 1)
    monkeypatch.delenv("DICOMWEB_INDEX")
    assert Settings().effective_workers() == (os.cpu_count() or 1)
    assert Settings(workers=3).effective_workers() == 3


def test_import_samples_then_again(tmp_path, capsys):
    assert main(["import", "--samples", "--quiet", "--data-dir", str(tmp_path)]) == 0
    first = capsys.readouterr().out
    assert f"imported {len(sample_files())} new instance(s), 0 already stored" in first
    assert main(["import", "--samples", "--quiet", "--data-dir", str(tmp_path)]) == 0
    assert f"imported 0 new instance(s), {len(sample_files())} already stored" in capsys.readouterr().out


def test_check_finds_and_repairs(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        make_dataset().save_as(folder / f"{k}.dcm", enforce_file_format=True)
    data = tmp_path / "data"
    assert main(["import", "--quiet", "--data-dir", str(data), str(folder)]) == 0
    archive = Archive.open(Settings(data_dir=data))
    (uid0, rel0), (uid1, rel1), _third = list(archive.index.paths())
    # an orphan (file, no row: a crash before the commit) and a row whose file is gone
    orphan = archive.blobs.resolve(rel0).read_bytes()
    archive.index.delete(*rel0.split("/")[:2], uid0)
    os.unlink(archive.blobs.resolve(rel1))
    archive.blobs.resolve(rel0).write_bytes(orphan)
    archive.close()
    capsys.readouterr()
    assert main(["check", "--data-dir", str(data)]) == 1
    out = capsys.readouterr().out
    assert "1 file(s) not in the index, 1 index row(s) without a file" in out
    assert main(["check", "--repair", "--data-dir", str(data)]) == 0
    assert "1 re-indexed, 1 row(s) dropped" in capsys.readouterr().out
    assert main(["check", "--data-dir", str(data)]) == 0
    archive = Archive.open(Settings(data_dir=data))
    assert archive.index.count() == 2
    assert archive.index.locate(uid0) is not None and archive.index.locate(uid1) is None
    archive.close()
    shutil.rmtree(data)

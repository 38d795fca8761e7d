"""``dicomweb-server import``: store the DICOM files of folders through the archive's one
write path (:meth:`archive.Archive.store`, as STOW-RS and C-STORE do: the same checks,
duplicate policy, durability and routing).

- Every file found is accounted for: stored, already stored (byte-identical, or the
  same data set), or refused with its reason, broken symbolic links included
  (:class:`ImportRun`; ``--report``/``--verbose`` name each refused file).
- A file that is a data set without the PS3.10 header (no preamble, ``DICM``, file
  meta) is read when its transfer syntax can be inferred and stored as a PS3.10 file
  (dicom/bare.py); STOW-RS keeps refusing those (PS3.18 §10.5.1).
- With a routes file (``--routes``), the forwards owed are written in the import's
  own index transactions (routing/); the running server's forwarder delivers them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .archive import IMPORT_SOURCE
from .dicom.bare import why_not_bare, wrap_bare_data_set
from .dicom.multipart import SpooledPart
from .dicom.status import FailureReason

#: what each kind of refusal means, for the summary line
REASONS = {"CANNOT_UNDERSTAND": "not PS3.10 DICOM or truncated",
           "DATASET_MISMATCH": "missing/invalid UIDs or against a stored study's patient or series' study",
           "DUPLICATE_SOP_INSTANCE": "same SOP Instance UID as a stored file, other content",
           "BROKEN_LINK": "broken symbolic link", "UNREADABLE": "unreadable"}


def bad_paths(raw: list[str]) -> list[str]:
    """One line per PATH argument that names nothing to read (checked before anything
    is created)."""
    out = []
    for text in raw:
        p = Path(text)
        if p.is_symlink() and not p.exists():
            out.append(f"{text}: a broken symbolic link (to {os.readlink(p)})")
        elif not p.exists():
            out.append(f"{text}: no such file or folder")
        elif not (p.is_dir() or p.is_file()):
            out.append(f"{text}: not a file or folder")
        elif not os.access(p, os.R_OK | (os.X_OK if p.is_dir() else 0)):
            out.append(f"{text}: permission denied")
    return out


def files_of(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """The files under ``paths`` (folders recursively, in name order), and the broken
    symbolic links found there."""
    files: list[Path] = []
    broken: list[Path] = []
    for p in paths:
        if not p.is_dir():
            files.append(p)
            continue
        for x in sorted(p.rglob("*")):
            if x.is_file():
                files.append(x)
            elif x.is_symlink() and not x.exists():
                broken.append(x)
    return files, broken


@dataclass
class ImportRun:
    """Counts and refusals of one import; ``expected`` files (pydicom's samples) are
    refused without making the exit status 1."""

    verbose: bool = False
    stored: int = 0
    duplicates: int = 0
    wrapped: int = 0  # bare data sets given a PS3.10 header
    refused: dict[str, int] = field(default_factory=dict)
    not_stored: list[str] = field(default_factory=list)  # "path<TAB>REASON (0xNNNN): message"
    unexpected: int = 0  # refusals of files the user named
    expected: set[Path] = field(default_factory=set)

    def refuse(self, path: Path | None, kind: str, why: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        if path is None or path not in self.expected:
            self.unexpected += 1
        line = f"{path or '(unknown file)'}\t{why}"
        self.not_stored.append(line)
        if self.verbose:
            from tqdm import tqdm

            tqdm.write(f"not stored: {line}", file=sys.stderr)

    def summary(self, data_dir: Path) -> str:
        n = sum(self.refused.values())
        kinds = ", ".join(f"{k} {REASONS.get(r, r.lower().replace('_', ' '))}" for r, k in sorted(self.refused.items()))
        return (f"imported {self.stored} new instance(s), {self.duplicates} already stored, {n} refused"
                + (f" ({kinds})" if kinds else "")
                + (f"; {self.wrapped} bare data set(s) given a PS3.10 header" if self.wrapped else "")
                + f"; archive in {data_dir.resolve()}")


def run_import(archive, files: list[Path], broken: list[Path], run: ImportRun, quiet: bool = False) -> ImportRun:
    """Store ``files`` through ``archive`` in batches of 50; count and name what is refused."""
    from tqdm import tqdm

    for link in broken:
        run.refuse(link, "BROKEN_LINK", f"BROKEN_LINK: a symbolic link to {os.readlink(link)}, which does not exist")
    batch: list[SpooledPart] = []
    origin: dict[Path, Path] = {}  # spool copy -> the file given
    retry: list[Path] = []

    def flush(first_pass: bool) -> None:
        outcome = archive.store(batch, source=IMPORT_SOURCE)
        run.stored += sum(1 for s in outcome.stored if not s.duplicate)
        run.duplicates += sum(1 for s in outcome.stored if s.duplicate)
        for f in outcome.failed:
            source = origin.get(f.source) if f.source is not None else None
            if first_pass and source is not None and f.reason is FailureReason.DUPLICATE_SOP_INSTANCE:
                # may be a second file of one SOP Instance in this batch (the archive refuses
                # those in one request): compared with the stored one after the first pass
                retry.append(source)
                continue
            message = f.message
            if source is not None and f.reason is FailureReason.CANNOT_UNDERSTAND:
                # the store says "preamble and 'DICM' prefix required", but import takes bare
                # data sets: say why this one could not be given a header
                try:
                    why = why_not_bare(source)
                except OSError:  # gone or unreadable since: the store's message stands
                    why = None
                if why is not None:
                    message = why
            run.refuse(source, f.reason.name, f"{f.reason.name} (0x{f.reason.value:04X}): {message}")
        batch.clear()
        origin.clear()

    for first_pass, todo in ((True, files), (False, retry)):
        for path in tqdm(todo, unit="file", desc="import" if first_pass else "compare duplicates",
                         disable=quiet or not todo):
            # the archive takes ownership of what it stores: work on a copy
            fd, tmp = tempfile.mkstemp(prefix="import-", suffix=".tmp", dir=archive.blobs.spool)
            os.close(fd)
            try:
                if wrap_bare_data_set(path, Path(tmp)) is not None:
                    run.wrapped += first_pass
                else:
                    shutil.copyfile(path, tmp)
            except OSError as e:
                os.unlink(tmp)
                run.refuse(path, "UNREADABLE", f"UNREADABLE: {e.strerror or e}")
                continue
            origin[Path(tmp)] = path
            batch.append(SpooledPart(headers={}, path=Path(tmp), size=os.path.getsize(tmp), complete=True))
            if len(batch) >= (50 if first_pass else 1):  # duplicates: one at a time
                flush(first_pass)
        if batch:
            flush(first_pass)
    return run

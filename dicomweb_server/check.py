"""``dicomweb-server check``: reconcile the index with the files on disk.

Orphan files (on disk, not indexed: a crash between writing and indexing, never
acknowledged) are re-indexed; rows whose file is missing are dropped. Without
``repair`` nothing changes (dry run).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .archive import Archive
from .dicom.instance import describe_instance
from .dicom.status import InstanceError


@dataclass
class Report:
    indexed: int = 0
    files: int = 0
    orphans: list[str] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    reindexed: int = 0
    dropped: int = 0
    unreadable: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing)

    def summary(self) -> str:
        lines = [f"{self.indexed} indexed instance(s), {self.files} file(s) on disk",
                 f"{len(self.orphans)} file(s) not in the index, {len(self.missing)} index row(s) without a file"]
        if self.reindexed or self.dropped or self.unreadable:
            lines.append(f"repaired: {self.reindexed} re-indexed, {self.dropped} row(s) dropped, "
                         f"{len(self.unreadable)} unreadable file(s) left in place")
        return "\n".join(lines)


def reconcile(archive: Archive, repair: bool = False) -> Report:
    report = Report()
    rows = dict(archive.index.paths())
    by_path = {p: uid for uid, p in rows.items()}
    files = set(archive.blobs.walk())
    report.indexed, report.files = len(rows), len(files)
    report.orphans = sorted(files - set(by_path))
    report.missing = sorted((uid, p) for p, uid in by_path.items() if p not in files)
    if not repair:
        return report
    for rel in report.orphans:
        try:
            rec = describe_instance(archive.blobs.resolve(rel), bulk_threshold=archive.settings.bulk_threshold)
        except InstanceError:
            report.unreadable.append(rel)
            continue
        if rec.path != rel:
            report.unreadable.append(rel)
            continue
        report.reindexed += sum(r is True for r in archive.index.add([rec]))
    for uid, _p in report.missing:
        loc = archive.index.locate(uid)
        if loc is not None:
            report.dropped += len(archive.index.delete(loc.study_uid, loc.series_uid, uid))
    return report

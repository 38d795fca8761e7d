"""Running a de-identification: a :class:`Deidentifier` (a profile + options, a project's
secret and pseudonyms) applied to stored files, and the export of the studies a QIDO-RS
query selects into a folder (``dicomweb-server export --deidentify``). The routing
forwarder uses the same Deidentifier for a destination with ``deidentify`` (routing/).

The folder gets one PS3.10 file per instance, ``{study}/{series}/{sop}.dcm`` under the
NEW UIDs, each written to a temporary name and renamed (a file there is whole). The
report (a dict, JSON for the command line) counts the instances exported, refused
(burned-in annotation, PS3.15 E.1.1; each with its reason) and failed (unreadable).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydicom import dcmread
from pydicom.dataset import Dataset

from . import profile
from .apply import BurnedIn, Context, deidentify
from .profile import Options
from .pseudonyms import Pseudonyms


@dataclass(frozen=True, slots=True)
class Spec:
    """What to apply: the profile's options, the project (its secret and pseudonyms), and
    whether burned-in annotation is let through."""

    options: Options
    project: str
    allow_burned_in: bool = False
    pseudonymize: bool = True  # PatientID/PatientName from the project's table
    safe_private: frozenset[tuple[str, int, int]] = frozenset()


class Deidentifier:
    """De-identifies data sets and stored files for one :class:`Spec`."""

    def __init__(self, spec: Spec, pseudonyms: Pseudonyms) -> None:
        self.spec = spec
        self.pseudonyms = pseudonyms
        secret = pseudonyms.secret(spec.project)
        lookup = (lambda pid: pseudonyms.pseudonym(spec.project, pid)) if spec.pseudonymize else None
        self.context = Context(secret, spec.options, lookup, spec.safe_private, spec.allow_burned_in)

    def dataset(self, ds: Dataset) -> Dataset:
        """``ds`` de-identified in place; BurnedIn when refused."""
        return deidentify(ds, self.context)

    def file(self, source: Path, target_dir: Path) -> Path:
        """De-identify the PS3.10 file ``source`` into ``target_dir/{study}/{series}/{sop}.dcm``
        (new UIDs; written whole then renamed). Pixel data is copied as stored (its bytes
        unchanged, a large one read lazily). BurnedIn when refused."""
        ds = dcmread(source, defer_size="1 MB")
        self.dataset(ds)
        target = Path(target_dir) / str(ds.StudyInstanceUID) / str(ds.SeriesInstanceUID) / f"{ds.SOPInstanceUID}.dcm"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        with open(tmp, "wb") as f:
            ds.save_as(f, enforce_file_format=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        return target


def select_studies(index, filters: list[tuple[str, str]], page: int = 1000) -> list[str]:
    """The StudyInstanceUIDs a QIDO-RS study search with ``filters`` finds (all pages);
    QueryError for a bad filter."""
    from ..dicom.matching import parse_query

    query = parse_query("study", [(k, v) for k, v in filters if k.lower() not in ("limit", "offset")],
                        max_results=page)
    found: list[str] = []
    while True:
        hits = index.search(dataclasses.replace(query, offset=len(found), limit=page))
        found.extend(h.study_uid for h in hits)
        if len(hits) < page:
            return found


def export_folder(archive, studies: list[str], deid: Deidentifier, to: Path,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """De-identify every stored instance of ``studies`` into the folder ``to``; the report."""
    locations = [loc for study in studies for loc in archive.index.instances(study)]
    report: dict = {"profile": "basic", "edition": profile.edition(), "options": deid.spec.options.selected(),
                    "project": deid.spec.project, "to": str(to), "studies": len(studies),
                    "instances": len(locations), "exported": 0, "refused": 0, "failed": 0, "problems": []}
    for n, loc in enumerate(locations, 1):
        try:
            with archive.blobs.local_copy(loc.path) as path:
                deid.file(path, to)
            report["exported"] += 1
        except BurnedIn as e:
            report["refused"] += 1
            report["problems"].append(_problem(loc, "refused", str(e)))
        except Exception as e:  # noqa: BLE001 - one unreadable instance fails alone, named in the report
            report["failed"] += 1
            report["problems"].append(_problem(loc, "failed", f"{type(e).__name__}: {e}"))
        if progress is not None:
            progress(n, len(locations))
    return report


def _problem(loc, outcome: str, reason: str) -> dict:
    return {"study": loc.study_uid, "series": loc.series_uid, "sop": loc.sop_uid, "outcome": outcome,
            "reason": reason}



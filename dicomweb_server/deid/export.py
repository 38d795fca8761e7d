"""Running a de-identification: a :class:`Deidentifier` (a profile + options, a project's
secret and pseudonyms) applied to stored files, and the studies a QIDO-RS query selects
(:func:`select_studies`). The ``deidentify`` job (deid/job.py: ``export --deidentify``,
``POST /$deidentify``), the downloads (deid/download.py) and the routing forwarder (a
destination with ``deidentify``) all use the same Deidentifier.

A file is written as ``{study}/{series}/{sop}.dcm`` under the NEW UIDs, to a temporary
name and renamed (a file there is whole).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from pydicom import dcmread
from pydicom.dataset import Dataset

from .apply import Context, deidentify
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


class SourceUnreadable(Exception):
    """The stored file to de-identify cannot be read (EIO, EACCES: not a missing file,
    which stays FileNotFoundError): that instance fails alone."""


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
        unchanged, a large one read lazily). BurnedIn when refused; SourceUnreadable when
        ``source`` cannot be read (an OSError other than FileNotFoundError opening or
        reading it, the lazy read of its pixel data included)."""
        try:
            ds = dcmread(source, defer_size="1 MB")
        except FileNotFoundError:
            raise
        except OSError as e:
            raise SourceUnreadable(f"cannot read the stored file: {e.strerror or e}") from e
        self.dataset(ds)
        target = Path(target_dir) / str(ds.StudyInstanceUID) / str(ds.SeriesInstanceUID) / f"{ds.SOPInstanceUID}.dcm"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        with open(tmp, "wb") as f:
            try:
                ds.save_as(f, enforce_file_format=True)
            except OSError as e:  # the lazy read of ``source`` (it names the file) or the write
                if isinstance(e, FileNotFoundError) or e.filename not in (str(source), source):
                    raise
                raise SourceUnreadable(f"cannot read the stored file: {e.strerror or e}") from e
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        return target


def select_studies(index, filters: list[tuple[str, str]], page: int = 1000, allowed=None) -> list[str]:
    """The StudyInstanceUIDs a QIDO-RS study search with ``filters`` finds (all pages)
    among those ``allowed`` (access/filter.py) lets through; QueryError for a bad filter."""
    from ..access.filter import UNRESTRICTED

    from ..dicom.matching import parse_query

    query = parse_query("study", [(k, v) for k, v in filters if k.lower() not in ("limit", "offset")],
                        max_results=page)
    found: list[str] = []
    while True:
        hits = index.search(dataclasses.replace(query, offset=len(found), limit=page),
                            UNRESTRICTED if allowed is None else allowed)
        found.extend(h.study_uid for h in hits)
        if len(hits) < page:
            return found

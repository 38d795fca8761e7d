"""De-identified downloads: the ``?deidentify=PROFILE`` transform of the ZIP and NDJSON
downloads (export.py, api/downloads.py), registered as ``basic`` in export.TRANSFORMS.

One :class:`Deidentifier` (deid/export.py: the profile, its options, the project's secret
and pseudonyms) per download, the very one ``dicomweb-server export --deidentify`` and
routing use: the same project gives the same UIDs, pseudonyms and date offsets in a
ZIP, in a folder export and on the way to a destination.

Per instance (:meth:`DeidentifiedDownload.apply`) the stored file is parsed whole,
de-identified, written again, and both the file and the DICOMDIR's keys come from that
one data set, so the DICOMDIR's records name the de-identified UIDs and pseudonym the
file holds. Memory: about twice the instance's size (its parsed data set, then the
written file), one instance at a time, never the study.

Burned-in annotation (PS3.15 E.1.1; apply.burned_in_reason): such an instance is left
out unless ``allow_burned_in=true``; so is one that cannot be parsed. Each left out is
named (by its de-identified UIDs: the originals identify) with its reason in the ZIP's
member :data:`REPORT` (written before the DICOMDIR, not listed in it), which also says
the profile, options and project; a header cannot say it, the answer having started.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

import orjson
from pydicom import dcmread
from pydicom.dataset import Dataset

from .. import export
from ..dicom.dicomdir import TAGS as DICOMDIR_TAGS
from ..store.base import InstanceLocation
from . import profile
from .apply import BurnedIn, deidentify
from .export import Deidentifier, Spec
from .uids import new_uid

#: the ZIP member that says what was de-identified how, and what was left out
REPORT = "DEIDENTIFICATION.json"
#: values larger than this are read from the file only when the de-identified file is written
_DEFER = 1024 * 1024


class DeidentifiedDownload:
    """An export.InstanceTransform applying one :class:`Deidentifier`."""

    def __init__(self, deid: Deidentifier, blobs) -> None:
        self.deid = deid
        self.blobs = blobs
        self.written = 0
        self.left_out: list[dict] = []

    def apply(self, loc: InstanceLocation, item: dict, chunks: Iterator[bytes]) -> tuple[dict, Iterable[bytes]]:
        """The file parsed from a local copy (the stored file itself, or an object's
        download) with its large values (pixel data) read only as it is written again."""
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        try:
            with self.blobs.local_copy(loc.path) as path:
                ds = dcmread(path, defer_size=_DEFER)
                self.deid.dataset(ds)
                out = io.BytesIO()
                ds.save_as(out, enforce_file_format=True)
        except BurnedIn as e:
            raise self._left_out(loc, "refused", str(e)) from e
        except Exception as e:  # noqa: BLE001 - never the file as stored: left out, named in the report
            raise self._left_out(loc, "failed", f"{type(e).__name__}: {e}") from e
        self.written += 1
        keys = Dataset()
        for keyword in DICOMDIR_TAGS:
            if keyword in ds:
                keys[keyword] = ds[keyword]
        return keys.to_json_dict(), _pieces(out)

    def _left_out(self, loc: InstanceLocation, outcome: str, reason: str) -> export.Excluded:
        secret = self.deid.context.secret
        self.left_out.append({"study": new_uid(secret, loc.study_uid), "series": new_uid(secret, loc.series_uid),
                              "sop": new_uid(secret, loc.sop_uid), "outcome": outcome, "reason": reason})
        return export.Excluded(reason)

    def metadata(self, item: dict) -> dict:
        """The stored DICOM JSON de-identified as the file would be (from_json, the same
        Deidentifier), bulk data left out (its URIs name the original UIDs); burned-in
        annotation does not matter here (no pixels), so it is not refused."""
        ds = Dataset.from_json({t: e for t, e in item.items() if "BulkDataURI" not in e})
        return deidentify(ds, replace(self.deid.context, allow_burned_in=True)).to_json_dict()

    def report(self) -> tuple[str, bytes]:
        spec = self.deid.spec
        body = {"profile": "basic", "edition": profile.edition(), "options": spec.options.selected(),
                "project": spec.project, "allow_burned_in": spec.allow_burned_in, "written": self.written,
                "left_out": self.left_out}
        return REPORT, orjson.dumps(body, option=orjson.OPT_INDENT_2)


def _pieces(out: io.BytesIO) -> Iterator[bytes]:
    view = out.getbuffer()
    try:
        for start in range(0, len(view), export.PIECE):
            yield view[start:start + export.PIECE]
    finally:
        view.release()


def basic(archive, spec: str, query: Mapping[str, list[str]]) -> DeidentifiedDownload:
    """The ``basic`` transform for a request: ``deidentify=basic[,OPTION...]``, ``option=``
    (repeatable), ``project=NAME`` (required; the project must exist: a download uses a
    project's secret and records its pseudonyms, it does not create one), and
    ``allow_burned_in=true``. ValueError saying what is wrong (a 400)."""
    options = profile.parse(spec, query.get("option", []))
    projects = query.get("project", [])
    if len(projects) != 1 or not projects[0]:
        raise ValueError("a de-identified download needs project=NAME (the project's secret and pseudonyms)")
    project = projects[0]
    table = archive.pseudonyms
    if project not in table.projects():
        raise ValueError(f"no de-identification project {project!r}: an admin creates it "
                         f"(POST /admin/deid/{project}/pseudonyms, or dicomweb-server export --deidentify "
                         f"--project {project})")
    allow = [v.lower() for v in query.get("allow_burned_in", ["false"])]
    if len(allow) != 1 or allow[0] not in ("true", "false"):
        raise ValueError("allow_burned_in: true or false")
    return DeidentifiedDownload(Deidentifier(Spec(options, project, allow_burned_in=allow[0] == "true"), table),
                                archive.blobs)


export.TRANSFORMS["basic"] = basic

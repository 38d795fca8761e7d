"""The ``deidentify`` job (jobs/: ``KINDS["deidentify"]``): the studies of a selection
de-identified (PS3.15 Annex E, deid/export.py's :class:`Deidentifier`) into a target,
resumable after a crash without duplicates.

Run by ``dicomweb-server export --deidentify ... [--resume FILE]`` (jobs.run_inline) and
by the archive's durable runner for ``POST /studies/{study}/$deidentify`` and
``POST /$deidentify`` (api/deidentify.py).

Parameters (a JSON-able dict, see :func:`params`):

- the selection: ``studies`` (Study Instance UIDs) or ``query`` (QIDO-RS study matching
  keys, ``[[key, value], ...]``), seen through ``allowed`` (the submitter's access
  filter, access/filter.py: a study they cannot see is not in the selection);
- the profile: ``deidentify`` (``"basic,option,..."``), ``project``, ``allow_burned_in``,
  ``safe_private``;
- the ``target`` (:func:`parse_target`): a ``folder``; an ``s3`` prefix
  (``s3://bucket/prefix``, store/s3.py's client); a ``label`` of this archive (the
  de-identified copies stored through :meth:`Archive.store`, the one write path, and
  their new studies given the label); a routing ``destination`` (routing/destinations.py
  senders: STOW-RS or C-STORE).

Order and checkpoint: the studies of the selection sorted by Study Instance UID, then
the instances of each study in the index's stable order (series, then instances, by
arrival). The checkpoint is ``{next, after, counts, total, problems}``: the UID of the
study in progress and the SOP Instance UID of the last instance done in it (``after``:
resumed just past it; if it is gone, the study again from its start). A few hundred
bytes whatever the selection's size: a query's studies are looked up again when the job
resumes (a study deleted since is passed over, one that matches only now and sorts
after ``next`` is included). Saved every :data:`SAVE_EVERY` instances and at the end of
each study.

Why a restart makes no duplicate: every output is a function of the stored instance
and the project's secret alone (the de-identified UIDs are deterministic per project,
deid/uids.py): the same file name ``{study}/{series}/{sop}.dcm`` (a folder: written
under a temporary name and renamed over the same name; S3: a conditional PUT of the
same key, an existing object compared byte for byte), the same SOP Instance UID (this
archive: a byte-identical duplicate is a success and changes nothing; a destination:
the same instance sent again). The instances after the last save are done again and
land on themselves.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

from .. import faults
from ..access.filter import UNRESTRICTED, Filter, validate_label
from ..dicom.status import FailureReason
from ..jobs import Context, JobError
from ..store.blobs import fsync_dir
from . import profile
from .apply import BurnedIn, parse_safe_private
from .export import Deidentifier, SourceUnreadable, Spec, select_studies

log = logging.getLogger("dicomweb_server.deid.job")

#: instances between two saves of the checkpoint
SAVE_EVERY = 10
#: the problems (refused, failed instances) a job's result names; the counts are complete
MAX_PROBLEMS = 100
#: the checkpoint's "next" study when every study is done (sorts after every UID: digits and dots)
END = "~"


# --- parameters ---------------------------------------------------------------------------

#: the kinds of target
TARGETS = ("folder", "s3", "label", "destination")


def parse_target(text: str) -> dict:
    """``s3://bucket/prefix``, ``label:NAME``, ``destination:NAME`` or a folder path ->
    a target dict; ValueError saying what is wrong."""
    if text.startswith("s3://"):
        from ..store.s3 import parse_storage_url

        parse_storage_url(text)
        return {"s3": text}
    kind, sep, name = text.partition(":")
    if sep and kind in ("label", "destination"):
        if not name:
            raise ValueError(f"target {text!r}: {kind}:NAME")
        if kind == "label":
            validate_label(name)
        return {kind: name}
    if not text:
        raise ValueError("an empty target")
    return {"folder": text}


def check_target(target: dict) -> dict:
    """``target`` (from a request's JSON) when it names exactly one of folder, s3, label,
    destination with a string; ValueError otherwise."""
    if not isinstance(target, dict) or len(target) != 1 or next(iter(target)) not in TARGETS \
            or not isinstance(next(iter(target.values())), str) or not next(iter(target.values())):
        raise ValueError('target: one of {"folder": PATH}, {"s3": "s3://bucket/prefix"}, {"label": NAME}, '
                         '{"destination": NAME}')
    ((kind, value),) = target.items()
    if kind == "folder":
        return {"folder": value}
    parsed = parse_target(value if kind == "s3" else f"{kind}:{value}")
    if kind not in parsed:
        raise ValueError(f"target {target!r}: not an {kind}")
    return parsed


def filter_params(allowed: Filter) -> dict | None:
    """An access filter as job parameters (None: unrestricted)."""
    if allowed.unrestricted:
        return None
    return {"clauses": [sorted(c) for c in allowed.clauses],
            "studies": sorted(allowed.studies) if allowed.studies is not None else None}


def filter_of(p: dict | None) -> Filter:
    if not p:
        return UNRESTRICTED
    studies = p.get("studies")
    return Filter(tuple(frozenset(c) for c in p.get("clauses") or ()),
                  frozenset(studies) if studies is not None else None)


def params(*, deidentify: str, options: list[str] | tuple[str, ...] = (), project: str, target: dict,
           studies: list[str] | None = None, query: list[tuple[str, str]] | None = None,
           allow_burned_in: bool = False, safe_private: list[str] | tuple[str, ...] = (),
           allowed: Filter = UNRESTRICTED) -> dict:
    """The job's parameters, checked (ValueError naming what is wrong): the profile with its
    options folded in (``"basic,retain_modified_dates"``), exactly one of ``studies`` and
    ``query``."""
    opts = profile.parse(deidentify, list(options))
    for t in safe_private:
        parse_safe_private(t)
    if (studies is None) == (query is None):
        raise ValueError("give the studies or a query, not both")
    if opts.retain_uids and "label" in target:
        raise ValueError("the retain_uids option with a label target: the copies would keep the original Study, "
                         "Series and SOP Instance UIDs and land on the identified originals of this archive; "
                         "leave the option out, or choose a folder, S3 or destination target")
    return {"deidentify": ",".join(["basic", *opts.selected()]), "project": project,
            "allow_burned_in": bool(allow_burned_in), "safe_private": sorted(safe_private),
            "studies": list(studies) if studies is not None else None,
            "query": [list(kv) for kv in query] if query is not None else None,
            "allowed": filter_params(allowed), "target": target}


class RequestError(ValueError):
    """A ``$deidentify`` request the archive refuses: ``status`` 400 (bad body), 403 (a
    target the caller may not write to)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_BODY_KEYS = {"profile", "options", "project", "target", "allow_burned_in", "safe_private", "studies", "query"}


def request_params(body, archive, allowed: Filter, scopes, study: str | None = None) -> dict:
    """The job parameters of a ``POST /studies/{study}/$deidentify`` (``study``) or
    ``POST /$deidentify`` JSON body::

        {"profile": "basic", "options": ["retain_modified_dates"], "project": "lung-ai",
         "target": {"s3": "s3://bucket/prefix"} | {"label": NAME} | {"destination": NAME} | {"folder": PATH},
         "studies": [UID, ...] | "query": {"StudyDate": "20240101-20241231", "ModalitiesInStudy": "CT"},
         "allow_burned_in": false, "safe_private": ["ACME 1.0:0009:02"]}

    ``allowed``: the caller's access filter (the job sees no other study); ``scopes``: the
    caller's. RequestError (400, 403) naming what is refused. Blocking (project look-up)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body is a JSON object")
    unknown = sorted(set(body) - _BODY_KEYS)
    if unknown:
        raise RequestError(400, f"unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(_BODY_KEYS))}")
    project = body.get("project")
    if not isinstance(project, str) or not project:
        raise RequestError(400, "project: the name of an existing de-identification project is required")
    if project not in archive.pseudonyms.projects():
        raise RequestError(400, f"no de-identification project {project!r} (an admin makes it: "
                                f"POST /admin/deid/{project}/pseudonyms)")
    try:
        target = check_target(body.get("target"))
    except ValueError as e:
        raise RequestError(400, str(e)) from None
    kind, value = next(iter(target.items()))
    if kind == "folder" and "admin" not in scopes:
        raise RequestError(403, "a folder of the server's host as the target needs the 'admin' scope")
    if kind == "s3" and "admin" not in scopes:  # written with the server's credentials: any bucket they reach
        raise RequestError(403, "an S3 target is written with the server's credentials: it needs the 'admin' "
                                "scope (a label target needs 'write' only)")
    if kind == "label" and not allowed.allows({value}):
        raise RequestError(403, f"label {value!r}: these credentials could not see the studies it would be "
                                "put on")
    if kind == "s3" and inside_storage(value, archive.settings.storage):
        raise RequestError(400, f"target {value}: inside the archive's own storage ({archive.settings.storage})")
    if kind == "destination":
        routing = archive.routing
        dest = routing.routes.destinations.get(value) if routing is not None else None
        if dest is None or dest.webhook is not None:
            known = [n for n, d in (routing.routes.destinations.items() if routing else ()) if d.webhook is None]
            raise RequestError(400, f"no destination {value!r} (configured: {', '.join(known) or 'none'})")
    studies = query = None
    if study is not None:
        if "studies" in body or "query" in body:
            raise RequestError(400, "studies and query: only in POST /$deidentify (the path names the study)")
        studies = [study]
    elif ("studies" in body) == ("query" in body):
        raise RequestError(400, "give studies (a list of StudyInstanceUIDs) or query (QIDO-RS matching keys)")
    elif "studies" in body:
        studies = body["studies"]
        if not isinstance(studies, list) or not studies or not all(isinstance(u, str) for u in studies):
            raise RequestError(400, "studies: a non-empty list of StudyInstanceUIDs")
    else:
        q = body["query"]
        if not isinstance(q, dict) or not all(
                isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
                for v in q.values()):
            raise RequestError(400, 'query: an object of QIDO-RS matching keys, e.g. {"PatientID": "MRN*"}')
        query = [(k, x) for k, v in q.items() for x in ([v] if isinstance(v, str) else v)]
        from ..dicom.matching import QueryError, parse_query

        try:
            parse_query("study", [(k, v) for k, v in query if k.lower() not in ("limit", "offset")])
        except QueryError as e:
            raise RequestError(400, f"query: {e}") from None
    options = body.get("options", [])
    safe = body.get("safe_private", [])
    if not isinstance(body.get("profile", "basic"), str) or not isinstance(options, list) or not isinstance(
            safe, list) or not all(isinstance(x, str) for x in options + safe) or not isinstance(
            body.get("allow_burned_in", False), bool):
        raise RequestError(400, "profile is a string, options and safe_private lists of strings, "
                                "allow_burned_in a boolean")
    try:
        return params(deidentify=body.get("profile", "basic"), options=options, project=project, target=target,
                      studies=studies, query=query, allow_burned_in=body.get("allow_burned_in", False),
                      safe_private=safe, allowed=allowed)
    except (ValueError, TypeError) as e:
        raise RequestError(400, str(e)) from None


def inside_storage(url: str, storage: str | None) -> bool:
    """Whether the S3 prefix ``url`` overlaps the archive's own ``--storage`` prefix (its
    objects are the archive's: a target there would mix with them)."""
    if not storage or not storage.startswith("s3://"):
        return False
    from ..store.s3 import parse_storage_url

    (b1, p1), (b2, p2) = parse_storage_url(url), parse_storage_url(storage)
    return b1 == b2 and (p1.startswith(p2) or p2.startswith(p1))


# --- targets --------------------------------------------------------------------------------

class TargetUnavailable(RuntimeError):
    """The target cannot take instances now (a destination's 5xx, a refused connection):
    the job stops and runs again from its checkpoint (the runner's retries)."""


class _Target:
    """Where a de-identified file goes. ``put`` returns None when it is there (new or
    already the same), else the reason it is not (the instance fails alone); raises for
    what the job cannot go on without (a bucket that does not answer)."""

    name = ""

    def put(self, deid: Deidentifier, source: Path, spool: Path, original_study: str) -> str | None:
        """``original_study``: the Study Instance UID of ``source`` (the identified original)."""
        out = deid.file(source, spool)
        try:
            return self.place(out, out.relative_to(spool).as_posix())
        finally:
            out.unlink(missing_ok=True)

    def place(self, out: Path, relpath: str) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def sync(self) -> None:
        """Make what ``put`` wrote durable, before a checkpoint counts it."""

    def close(self) -> None:
        pass


class _Folder(_Target):
    def __init__(self, path: str) -> None:
        self.to = Path(path)
        self.name = str(self.to)
        if self.to.exists() and not self.to.is_dir():
            raise JobError(f"target {self.to} is not a folder")
        missing = [d for d in (self.to, *self.to.parents) if not d.exists()]
        self.to.mkdir(parents=True, exist_ok=True)
        for d in missing:  # each new folder's entry durable
            fsync_dir(d.parent)
        self.written: set[Path] = set()  # the series folders written into since the last sync

    def put(self, deid: Deidentifier, source: Path, spool: Path, original_study: str) -> str | None:
        out = deid.file(source, self.to)  # written (fsynced) under a temporary name, renamed over the same name
        self.written.add(out.parent)
        return None

    def sync(self) -> None:
        """The renames and the new study/series folders made durable (each folder's entries
        fsynced, up to the target's folder), as store/blobs.py does for the archive's
        files: else a power cut past a checkpoint loses files the resume never redoes."""
        folders = set()
        for series in self.written:
            folders.update((series, series.parent, self.to))
        for d in sorted(folders, key=lambda d: -len(d.parts)):  # the deepest first
            fsync_dir(d)
        self.written.clear()


class _S3(_Target):
    """``s3://bucket/prefix``: one object per instance, ``{prefix}{study}/{series}/{sop}.dcm``,
    by store/s3.py's client (conditional PUT with Content-MD5; endpoint and credentials as
    for ``--storage``)."""

    def __init__(self, url: str, archive) -> None:
        from ..store.s3 import BucketUnreachable, S3BlobStore

        self.name = url
        self.store = S3BlobStore(Path(archive.settings.data_dir), url, endpoint_url=archive.settings.s3_endpoint_url)
        try:
            self.store.check_bucket()
        except BucketUnreachable as e:
            raise JobError(str(e)) from None
        self.store.probe_conditional_put()

    def place(self, out: Path, relpath: str) -> str | None:
        from ..store.blobs import Placed

        if self.store.place(out, relpath) is Placed.NEW or self.store.same(out, relpath):
            return None
        return f"{self.store.key(relpath)} exists in {self.store.bucket} with other content: left as it is"


class _Label(_Target):
    """De-identified copies stored in this archive (archive.store: validated, indexed,
    routed like any STOW-RS), their studies given the label."""

    def __init__(self, label: str, archive) -> None:
        self.name = f"label:{label}"
        self.label = label
        self.archive = archive
        self.labelled: set[str] = set()

    def put(self, deid: Deidentifier, source: Path, spool: Path, original_study: str) -> str | None:
        """Never labels the original's study: a copy under the original's UIDs (the
        retain_uids option, refused by :func:`params` for a label target) is not stored,
        and a store that kept another instance under the copy's SOP Instance UID (a
        duplicate with other content, duplicate_policy ``keep``: e.g. a copy made with
        other options) fails the instance. A store that cannot take it now (0xA700 out of
        resources, 0x0110 processing failure: a full disk, the index down) raises
        TargetUnavailable: the job runs again from its checkpoint (PS3.4 B.2.3, PS3.7 C.4)."""
        from ..dicom.multipart import SpooledPart

        out = deid.file(source, spool)  # archive.store takes the file (and removes it)
        study, sop = out.parent.parent.name, out.stem
        if study == original_study:
            out.unlink(missing_ok=True)
            return ("not stored: the de-identified copy keeps the original's Study Instance UID (retain_uids): "
                    "it would land on the identified original")
        prior = self.archive.index.locate(sop)  # a copy made before: by this job (the same bytes) or not
        other = prior is not None and not self.archive.blobs.same(out, prior.path)
        outcome = self.archive.store([SpooledPart(path=out, size=out.stat().st_size, complete=True)],
                                    source="job:deidentify")
        out.unlink(missing_ok=True)
        if outcome.failed:
            f = outcome.failed[0]
            if f.reason in (FailureReason.OUT_OF_RESOURCES, FailureReason.PROCESSING_FAILURE):
                # a full disk, an index that is down: not this instance's fault
                raise TargetUnavailable(f"{self.name}: not stored: {f.reason.name} (0x{f.reason.value:04X}): "
                                        f"{f.message} (the job runs again from its checkpoint)")
            return f"not stored: {f.reason.name} (0x{f.reason.value:04X}): {f.message}"
        if other and outcome.stored[0].duplicate:  # duplicate_policy keep: the other content kept
            return f"not stored: SOP Instance {sop} is already stored with other content (kept as it is)"
        if study not in self.labelled:
            self.archive.index.set_label(study, self.label)
            self.labelled.add(study)
        return None


class _Destination(_Target):
    """A routing destination (routes file): the de-identified file sent by its STOW-RS or
    C-STORE sender, one instance at a time; a destination that may get better (RETRY:
    5xx, a refused connection) stops the job, to be run again from its checkpoint."""

    def __init__(self, name: str, archive) -> None:
        from ..routing.destinations import sender_for

        routing = archive.routing
        dest = routing.routes.destinations.get(name) if routing is not None else None
        if dest is None:
            raise JobError(f"no destination {name!r} in the routes file")
        if dest.webhook is not None:
            raise JobError(f"destination {name!r} is a webhook: it is sent no instances")
        self.name = f"destination:{name}"
        self.timeout = routing.routes.delivery.timeout
        self.loop = asyncio.new_event_loop()
        self.sender = sender_for(dest, self.timeout)

    def place(self, out: Path, relpath: str) -> str | None:
        from ..routing.destinations import Verdict, item_for

        item = item_for(out, out.stem)
        ((verdict, reason),) = self.loop.run_until_complete(self.sender.send([item], self.timeout))
        if verdict is Verdict.DELIVERED:
            return None
        if verdict is Verdict.RETRY:
            raise TargetUnavailable(f"{self.name}: {reason} (the job runs again from its checkpoint)")
        return f"refused by {self.name}: {reason}"

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.sender.aclose())
        finally:
            self.loop.close()


def open_target(target: dict, archive) -> _Target:
    ((kind, value),) = target.items()
    if kind == "folder":
        return _Folder(value)
    if kind == "s3":
        return _S3(value, archive)
    if kind == "label":
        return _Label(value, archive)
    if kind == "destination":
        return _Destination(value, archive)
    raise JobError(f"unknown target {target!r}")


def target_name(target: dict) -> str:
    ((kind, value),) = target.items()
    return value if kind in ("folder", "s3") else f"{kind}:{value}"


# --- the handler ----------------------------------------------------------------------------

def run(ctx: Context) -> dict:
    """The ``deidentify`` job: its report (the counts; each instance refused or failed with
    the reason, named by its ORIGINAL UIDs: the report is the operator's)."""
    p = ctx.params
    archive = ctx.archive
    try:
        options = profile.parse(p["deidentify"])
        safe = frozenset(parse_safe_private(t) for t in p.get("safe_private") or ())
    except (KeyError, ValueError) as e:
        raise JobError(f"bad parameters: {e}") from None
    allowed = filter_of(p.get("allowed"))
    pseudonyms = archive.pseudonyms
    if p["project"] not in pseudonyms.projects():
        raise JobError(f"no de-identification project {p['project']!r}")
    deid = Deidentifier(Spec(options, p["project"], allow_burned_in=bool(p.get("allow_burned_in")),
                             safe_private=safe), pseudonyms)

    studies = _selection(archive, p, allowed)  # sorted by UID: the same order on every run
    cp = dict(ctx.checkpoint)
    if "counts" not in cp:  # the first run
        total = sum(len(archive.index.instances(s, allowed=allowed)) for s in studies)
        cp = {"total": total, "next": studies[0] if studies else END, "after": None, "counts": _zero(),
              "problems": []}
        ctx.save(cp, total=total, done=0, failed=0, skipped=0)
    counts, problems = dict(cp["counts"]), list(cp["problems"])

    def save(next_study: str, after: str | None) -> None:
        nonlocal cp
        target.sync()  # what the checkpoint counts is durable first
        cp = {"total": cp["total"], "next": next_study, "after": after, "counts": dict(counts),
              "problems": list(problems)}
        ctx.save(cp, done=counts["exported"], failed=counts["failed"], skipped=counts["refused"])

    target = open_target(p["target"], archive)
    try:
        with tempfile.TemporaryDirectory(dir=archive.blobs.spool, prefix="deid-job-") as tmp:
            spool = Path(tmp)
            # from the study the checkpoint names (or the next in UID order, when it is gone)
            first = bisect.bisect_left(studies, cp["next"])
            for i in range(first, len(studies)):
                study = studies[i]
                locations = archive.index.instances(study, allowed=allowed)
                start = 0
                if study == cp["next"] and cp["after"] is not None:
                    sops = [loc.sop_uid for loc in locations]
                    start = sops.index(cp["after"]) + 1 if cp["after"] in sops else 0
                since = 0
                for loc in locations[start:]:
                    _one(archive, deid, target, loc, spool, counts, problems)
                    since += 1
                    if since >= SAVE_EVERY:
                        save(study, loc.sop_uid)
                        since = 0
                save(studies[i + 1] if i + 1 < len(studies) else END, None)
    finally:
        target.close()
    return {"profile": "basic", "edition": profile.edition(), "options": options.selected(),
            "project": p["project"], "to": target_name(p["target"]), "studies": len(studies),
            "instances": cp["total"], **counts, "problems": problems}


def _selection(archive, p: dict, allowed: Filter) -> list[str]:
    """The Study Instance UIDs of the job, those ``allowed`` lets through, sorted (a
    checkpoint names a study by its UID: a few bytes, whatever the selection's size)."""
    if p.get("query") is not None:
        from ..dicom.matching import QueryError

        try:
            return sorted(set(select_studies(archive.index, [tuple(kv) for kv in p["query"]], allowed=allowed)))
        except QueryError as e:
            raise JobError(str(e)) from None
    return sorted({s for s in p["studies"] if archive.index.labels(s, allowed) is not None})


def _zero() -> dict:
    return {"exported": 0, "refused": 0, "failed": 0}


def _one(archive, deid: Deidentifier, target: _Target, loc, spool: Path, counts: dict, problems: list) -> None:
    """One instance into the target; its outcome counted."""
    try:
        with archive.blobs.local_copy(loc.path) as path:
            reason = target.put(deid, path, spool, loc.study_uid)
    except BurnedIn as e:
        _problem(counts, problems, loc, "refused", str(e))
        return
    except SourceUnreadable as e:  # EIO, EACCES reading this stored file: it fails alone
        _problem(counts, problems, loc, "failed", str(e))
        return
    except (JobError, TargetUnavailable, OSError) as e:
        if isinstance(e, FileNotFoundError):  # deleted since it was listed
            _problem(counts, problems, loc, "failed", "no longer stored")
            return
        raise  # the target or the archive cannot go on: the job stops, to run again from its checkpoint
    except Exception as e:  # noqa: BLE001 - one unreadable instance fails alone, named in the report
        reason = f"{type(e).__name__}: {e}"
    if reason is None:
        counts["exported"] += 1
        faults.point("deid-exported")
    else:
        _problem(counts, problems, loc, "failed", reason)


def _problem(counts: dict, problems: list, loc, outcome: str, reason: str) -> None:
    counts[outcome] += 1
    if len(problems) < MAX_PROBLEMS:
        problems.append({"study": loc.study_uid, "series": loc.series_uid, "sop": loc.sop_uid,
                         "outcome": outcome, "reason": reason})


def progress_line(quiet: bool) -> Callable:
    """The command line's progress (stderr): ``de-identified N/TOTAL instance(s)``."""
    import sys

    def show(progress) -> None:
        if quiet or progress.total is None:
            return
        n = progress.done + progress.failed + progress.skipped
        print(f"\rde-identified {n}/{progress.total} instance(s)", end="\n" if n == progress.total else "",
              file=sys.stderr, flush=True)

    return show



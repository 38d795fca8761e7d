"""Rejection of instances: IHE RAD TF-3 Imaging Object Change Management (IOCM) and
PS3.4 Annex KK, plus dcm4chee's reject endpoint (the one OHIF's reject button calls).

A rejection note is a Key Object Selection document (SOP Class
1.2.840.10008.5.1.4.1.1.88.59, PS3.3 A.35.4) whose document title
(ConceptNameCodeSequence) is one of PS3.16 CID 7011 "Rejected for Quality Reasons"
and its siblings (:data:`REJECTION_TITLES`). When one is stored, through any front door
(STOW-RS, C-STORE, import), the instances its CurrentRequestedProcedureEvidenceSequence
names (> ReferencedSeriesSequence > ReferencedSOPSequence) are hidden from every search
and retrieve: the index moves their rows out of the searchable tables into its
rejection table (store/rejections.py), appending a ``reject`` row per instance to the
change log, in the transaction that indexes the note (:func:`note_hook`). The note itself stays stored and visible (it is the record
of who rejected what; a DELETE of it does not restore anything).

The rejected instances' files are kept ``keep_rejected`` days: listable
(``GET /admin/rejected``), restorable (``POST /studies/{study}/$restore-rejected``:
re-indexed from their files, a ``restore`` change-log row each; a rejection note among
them is not applied again; one that cannot come back stays rejected as it was), then purged
(:func:`purge`: the change log says ``delete``, the files are removed).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from .. import faults
from ..dicom.instance import InstanceRecord, describe_instance
from ..store.base import Index, Refused, WriteHook
from ..store.rejections import Rejection

if TYPE_CHECKING:
    from ..archive import Archive

log = logging.getLogger(__name__)

#: seconds between two purges of the rejected instances past keep_rejected, in the server
PURGE_EVERY = 3600.0

#: Key Object Selection Document Storage (PS3.4 B.5)
KOS_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.88.59"

#: PS3.16 CID 7011 Rejected for Quality Reasons / ... (code value, scheme) -> meaning
REJECTION_TITLES = {
    ("113001", "DCM"): "Rejected for Quality Reasons",
    ("113037", "DCM"): "Rejected for Patient Safety Reasons",
    ("113038", "DCM"): "Incorrect Modality Worklist Entry",
    ("113039", "DCM"): "Data Retention Policy Expired",
}

_CONCEPT_NAME = "0040A043"
_EVIDENCE = "0040A375"  # CurrentRequestedProcedureEvidenceSequence
_REF_SERIES = "00081115"
_REF_SOP = "00081199"
_REF_SOP_UID = "00081155"
_STUDY = "0020000D"
_SERIES = "0020000E"


#: set while :func:`restore` indexes rejected instances again (in its thread): the note
#: hook then applies no rejection note (a restore gives back what was rejected)
_RESTORING: contextvars.ContextVar[bool] = contextvars.ContextVar("restoring_rejected", default=False)


class BadReason(ValueError):
    """A ``code^scheme`` that is not a rejection note title of CID 7011."""


def parse_reason(text: str) -> str:
    """``113001^DCM`` (dcm4chee's path segment) checked against CID 7011; returns it."""
    code, _, scheme = text.partition("^")
    if (code, scheme) not in REJECTION_TITLES:
        known = ", ".join(f"{c}^{s}" for c, s in REJECTION_TITLES)
        raise BadReason(f"{text!r} is not a rejection note title of PS3.16 CID 7011 ({known})")
    return text


def _first(item: dict, tag: str) -> str | None:
    values = (item.get(tag) or {}).get("Value") or []
    return values[0] if values and isinstance(values[0], str) else None


def rejection_note(rec: InstanceRecord) -> tuple[str, list[tuple[str, str, str]]] | None:
    """(``code^scheme``, the instances it rejects) when ``rec`` is a rejection note, else None."""
    if rec.sop_class_uid != KOS_SOP_CLASS:
        return None
    meta = orjson.loads(rec.metadata)
    titles = (meta.get(_CONCEPT_NAME) or {}).get("Value") or []
    if not titles:
        return None
    code, scheme = _first(titles[0], "00080100"), _first(titles[0], "00080102")
    if (code, scheme) not in REJECTION_TITLES:
        return None
    refs: list[tuple[str, str, str]] = []
    for study in (meta.get(_EVIDENCE) or {}).get("Value") or []:
        study_uid = _first(study, _STUDY) or rec.study_uid
        for series in (study.get(_REF_SERIES) or {}).get("Value") or []:
            series_uid = _first(series, _SERIES)
            for sop in (series.get(_REF_SOP) or {}).get("Value") or []:
                sop_uid = _first(sop, _REF_SOP_UID)
                if series_uid and sop_uid and sop_uid != rec.sop_uid:  # (a note never rejects itself)
                    refs.append((study_uid, series_uid, sop_uid))
    return f"{code}^{scheme}", refs


def note_hook(index: Index) -> WriteHook:
    """The index write hook (Archive registers it) that applies each rejection note an
    :meth:`Index.add` indexes **in the same transaction**: the note and the hiding of
    what it names commit together or not at all, so a crash (SIGKILL, power loss) can
    never leave a stored note whose instances are still visible. Every path that indexes
    goes through it: STOW-RS, C-STORE, ``import``, ``check --repair`` (an orphan note a
    crash left unindexed), the in-memory index's start-up rebuild.

    The in-memory index writes the rejection in the journal transaction of the note's
    own change-log row (MemoryIndex.reject_in), and re-adds every file at start-up: there
    a note whose create is already in the change log was applied when it was stored (and
    what it hid may have been restored since): it is not applied again; a note whose file
    a crash left unlogged is applied then.

    A note indexed again by :func:`restore` (its study or series rejected, then
    restored) is not applied again either: it took effect when it was stored (the
    rejection rows of what it hid); an instance it hid that the operator restored since
    stays shown, one still rejected stays so (not in the restore's scope) or comes back
    with the restore (in it), and the restore's count is what became visible."""

    def apply(con: object, records: list[InstanceRecord], added: list) -> None:
        if _RESTORING.get():
            return
        now = time.time()
        for rec, new in zip(records, added):
            if new is not True or rec.sop_class_uid != KOS_SOP_CLASS:
                continue
            found = rejection_note(rec)
            if found is None or not found[1]:
                continue
            if con is None:  # the in-memory index (rebuilt at every start)
                last = index.last_change(rec.sop_uid)  # type: ignore[attr-defined]
                if last is not None and last[1] == "current":
                    continue
            faults.point("note-indexed")
            n = index.reject_in(con, found[1], found[0], now)
            log.info("rejection note %s: %d stored instance(s) hidden (%d named) for %s", rec.sop_uid, n,
                     len(found[1]), found[0])

    return apply


def reject(archive: Archive, refs: list[tuple[str, str, str]], code: str, now: float | None = None) -> int:
    """Hide these instances (study, series, SOP Instance UID) in one index commit."""
    with archive._tracked(), archive.committer.writer():
        n = archive.index.reject(refs, code, time.time() if now is None else now)
    if archive.routing is not None:  # webhooks owed the change rows
        archive.routing.committed()
    log.info("rejected %d stored instance(s) (%d named) for %s", n, len(refs), code)
    return n


def reject_stored(archive: Archive, study_uid: str, series_uid: str | None, code: str,
                  now: float | None = None) -> int:
    """The stored instances of a study or series, rejected without a note (dcm4chee's
    ``POST .../reject/{code}^{scheme}``)."""
    refs = [(loc.study_uid, loc.series_uid, loc.sop_uid) for loc in archive.index.instances(study_uid, series_uid)]
    return reject(archive, refs, code, now) if refs else 0


@dataclass(frozen=True, slots=True)
class Restored:
    """What :func:`restore` did: the instances shown again (``count``), and those that
    stay rejected, each with why (``refused``: SOP Instance UID, reason), their rejection
    rows untouched."""

    count: int
    refused: list[tuple[str, str]] = field(default_factory=list)


def restore(archive: Archive, study_uid: str, series_uid: str | None = None) -> Restored:
    """Show again the rejected instances of a study or series: each is described again
    from its file and indexed (a ``restore`` change-log row) and its rejection row
    forgotten, in one index commit (Index.add with ``action="restore"``); a rejection of
    an instance not stored is just forgotten.

    One that cannot be shown again stays rejected **exactly as it was** (its row, with its
    file's path, reason and time, untouched: listed, restorable later, purged in its
    time): its file unreadable, or it no longer fits its study (store/base.py
    hierarchy_conflict: the study is another patient's now, after an ``$update`` of it or
    a store of another patient's instances under its Study Instance UID).

    A rejection note shown again is **not applied again** (:func:`note_hook`): what it
    hid was rejected when it was stored, and those of its instances that are still
    rejected still are (their rows); one the operator restored since stays shown."""
    rows = archive.index.rejections(study_uid, series_uid)
    records: list[InstanceRecord] = []
    forget: list[Rejection] = []
    refused: list[tuple[str, str]] = []
    for row in rows:
        if row.path is None:
            forget.append(row)
            continue
        try:
            with archive.blobs.local_copy(row.path) as local:
                rec = describe_instance(local, bulk_threshold=archive.settings.bulk_threshold)
            rec.path = row.path  # the version it had when rejected ({sop}.vN.dcm after an update)
            records.append(rec)
        except Exception as e:  # noqa: BLE001 - a file gone or unreadable stays rejected
            log.error("cannot restore %s: %s", row.path, e)
            refused.append((row.sop_uid, f"its file {row.path} cannot be read: {e}"))
    if archive.routing is not None:  # shown again: no rule owes it a forward (routing/__init__.py)
        archive.routing.owe_nothing(records)
    added: list = []
    with archive._tracked(), archive.committer.writer():
        if forget:
            archive.index.unreject(forget)
        token = _RESTORING.set(True)
        try:
            added = archive.index.add(records, action="restore") if records else []
        finally:
            _RESTORING.reset(token)
            if archive.routing is not None:
                archive.routing.forget(records)
    for rec, a in zip(records, added):
        if isinstance(a, Refused):  # its rejection row stays as it was (Index.add)
            log.error("cannot restore %s: %s", rec.sop_uid, a.message)
            refused.append((rec.sop_uid, a.message))
    if archive.routing is not None:
        archive.routing.committed()
    return Restored(sum(a is True for a in added), refused)


def purge(archive: Archive, now: float | None = None) -> int:
    """Remove the instances rejected more than ``keep_rejected`` days ago: the rows
    (a ``delete`` change-log row each), then the files, as a DELETE does. Returns how many."""
    before = (time.time() if now is None else now) - archive.settings.keep_rejected * 86400
    rows = archive.index.rejections(before=before)
    if not rows:
        return 0
    with archive._tracked():
        with archive.committer.writer():
            rows = archive.index.purge(rows)
        if archive.routing is not None:
            archive.routing.committed()
        archive.remove_files([r.path for r in rows if r.path is not None])
    if rows:
        log.info("purged %d rejected instance(s)", len(rows))
    return len(rows)


async def purge_periodically(archive: Archive) -> None:
    """The server's housekeeping (as the routing forwarder prunes its outbox): at start,
    then every :data:`PURGE_EVERY` seconds, the rejected instances past ``keep_rejected``
    (:func:`purge`) and the earlier versions past ``keep_versions``
    (lifecycle/versions.py ``purge``); each worker process runs it, a purge that another
    already did finds nothing left (Index.purge; a version file already gone)."""
    from .versions import purge as purge_versions

    while True:
        for what, job in (("rejected instances", purge), ("earlier versions", purge_versions)):
            try:
                await asyncio.to_thread(job, archive)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - housekeeping: tried again later
                log.warning("could not purge %s: %s", what, e)
        await asyncio.sleep(PURGE_EVERY)

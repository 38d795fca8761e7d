"""Update the Patient/Study or Series attributes of stored instances, each changed
instance written as a NEW FILE (a new version: lifecycle/versions.py), then the index
switched to the new files in ONE transaction (Index.replace).

PS3.18 defines no update transaction; the routes (api/lifecycle.py) mirror FHIR-style
operations (``$update``, ``$merge``, ``$restore``). What may change: the attributes of
the Patient, General Study and Patient Study modules (PS3.3 C.7.1.1, C.7.2.1, C.7.2.2)
for a study, of the General Series module and the series-level attributes the archive
keeps (PS3.3 C.7.3.1) for a series (dicom/attributes.py level tables), UIDs excepted:
SOP Instance UIDs, Series and Study Instance UIDs are kept (PS3.3 §A.1.2: the same
instance), pixel data and the SOP class are never touched.

Order (crash safety):
1. under the write locks of every instance of the scope (blob stripes and, on a shared
   index, its advisory locks: no store of the same SOP Instance UIDs meanwhile), each
   file is read, changed, written to the spool, fsynced, and placed at its version's name
   (``{sop}.v{N}.dcm``; an object: a PutObject); the folders are fsynced. The index
   writer is NOT held: readers and other writers go on;
2. one short transaction (the index writer's lock held only for it) switches every row
   of the scope to its new file and appends the change-log rows (``update``, the earlier
   rows ``replaced``) and, with routes, the outbox rows of the routing rules with
   ``on = ["store", "update"]`` (matched against the new versions before it; the
   forwards still pending re-pointed at the new files: routing/__init__.py).
A crash before 2 leaves the index on the old files, the new ones orphans that ``check``
recognises as versions (not indexed, not "misfiled"); the update is not acknowledged
and may be sent again (its files are then overwritten). After 2 every instance is new.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydicom import config as pydicom_config
from pydicom import dcmread
from pydicom.dataset import Dataset
from pydicom.datadict import dictionary_VM, dictionary_VR, keyword_for_tag
from pydicom.valuerep import DA, DT, TM, validate_value

from .. import faults
from ..access.filter import UNRESTRICTED, Filter
from ..dicom.attributes import SERIES_LEVEL_TAGS, STUDY_LEVEL_TAGS, keyword_tag, level_article
from ..dicom.instance import InstanceRecord, describe_instance
from ..dicom.status import InstanceError
from ..store.base import ReplaceRefused
from ..store.blobs import Placed, fsync_dir
from .versions import version_path, split_version, versions, file_of

log = logging.getLogger("dicomweb_server.lifecycle")

#: the largest request body of an update (a few attributes; a DICOM JSON object)
MAX_BODY = 64 * 1024

_NEVER = frozenset({"00080005", "0020000D", "0020000E", "00080016", "00080018", "00020010", "7FE00010"})
ALLOWED = {"study": frozenset(STUDY_LEVEL_TAGS) - _NEVER, "series": frozenset(SERIES_LEVEL_TAGS) - _NEVER}


class UpdateError(Exception):
    """A request the archive refuses; nothing was changed. ``status``: HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Updated:
    """What an update (or restore) did."""

    study_uid: str
    instances: int = 0
    seconds: float = 0.0
    changes: list[dict] = field(default_factory=list)  # per attribute: tag, keyword, from, to (the audit)

    def to_json(self) -> dict:
        return {"StudyInstanceUID": self.study_uid, "instances": self.instances,
                "seconds": round(self.seconds, 3), "changes": self.changes}


def parse_changes(body: bytes, level: str) -> Dataset:
    """The attributes a ``$update`` sets: one DICOM JSON object (PS3.18 Annex F) of
    ``level`` attributes. Raises UpdateError(400) with the reason."""
    if len(body) > MAX_BODY:
        raise UpdateError(400, f"the body is over {MAX_BODY} bytes")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise UpdateError(400, f"the body is not JSON: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise UpdateError(400, "the body must be one DICOM JSON object naming at least one attribute")
    allowed = ALLOWED[level]
    for tag, elem in doc.items():
        if not (isinstance(tag, str) and len(tag) == 8 and all(c in "0123456789abcdefABCDEF" for c in tag)):
            raise UpdateError(400, f"{tag!r} is not a tag (8 hex digits: DICOM JSON)")
        kw = keyword_for_tag(int(tag, 16)) or tag
        if tag.upper() in _NEVER or tag.upper() == "7FE00010":
            raise UpdateError(400, f"{kw} ({tag}) cannot be changed (a UID, the character set or pixel data)")
        if tag.upper() not in allowed:
            raise UpdateError(400, f"{kw} ({tag}) is not {level_article(level)} {level}-level attribute this update may change")
        if not isinstance(elem, dict) or "vr" not in elem:
            raise UpdateError(400, f"{kw} ({tag}): an element needs its vr")
        vr = dictionary_VR(int(tag, 16))
        if elem["vr"] != vr:
            raise UpdateError(400, f"{kw} ({tag}): vr {elem['vr']!r}, the dictionary says {vr}")
        if "BulkDataURI" in elem or "InlineBinary" in elem:
            raise UpdateError(400, f"{kw} ({tag}): binary values cannot be set")
        if vr == "PN" and not all(v is None or isinstance(v, dict) for v in elem.get("Value", [])):
            # PS3.18 F.2.2: each PN value is an object of its component groups
            raise UpdateError(400, f'{kw} ({tag}): a PN value is an object, e.g. {{"Alphabetic": "Doe^Jane"}}')
        _check_json_values(kw, tag, vr, elem)
    try:
        ds = Dataset.from_json(doc)
    except Exception as e:  # noqa: BLE001 - pydicom raises many types on bad values
        raise UpdateError(400, f"the DICOM JSON cannot be read: {e}") from None
    for elem in ds:
        if elem.VR == "SQ":
            continue
        try:
            for value in (elem.value if elem.VM > 1 else [elem.value]):
                if value is not None and value != "":
                    if elem.VR in ("IS", "DS", "PN"):
                        value = str(value)
                    validate_value(elem.VR, value, pydicom_config.RAISE)
                    if elem.VR in _ONE_DATE_TIME:
                        _one_date_time(elem.VR, str(value))
        except ValueError as e:
            raise UpdateError(400, f"{elem.keyword} ({elem.tag:08X}): {e}") from None
    return ds


#: VRs whose one value may contain a backslash (PS3.5 §6.2 Table 6.2-1: LT, ST, UT, UR are
#: single-valued, a backslash is an ordinary character in them); in every other string VR it is the
#: value delimiter (PS3.5 §6.4), never part of a value
_BACKSLASH_ALLOWED = frozenset({"LT", "ST", "UT", "UR"})

# One DT value, PS3.5 §6.2 Table 6.2-1: YYYY[MM[DD[HH[MM[SS[.F{1-6}]]]]]][&ZZXX], the offset
# from UTC -1200..+1400 (hours 00-14, minutes 00-59). Hand-written: pydicom's regex for DT
# (valuerep.VR_REGEXES) also admits the query's ranges (PS3.4 C.2.2.2.5: "-A", "A-", "A-B"),
# and its DT class parses only a prefix of the text ("20240101-20240201" is taken).
_ONE_DT = re.compile(r"\d{4}((0[1-9]|1[0-2])(([0-2]\d|3[01])(([01]\d|2[0-3])"
                     r"([0-5]\d((60|[0-5]\d)(\.\d{1,6})?)?)?)?)?)?([+-](0\d|1[0-4])[0-5]\d)?")
_ONE_DATE_TIME = {"DA": "YYYYMMDD", "TM": "HH[MM[SS[.F{1-6}]]]", "DT": "YYYY[MM[DD[HH[MM[SS[.F{1-6}]]]]]][&ZZXX]"}


def _one_date_time(vr: str, value: str) -> None:
    """``value`` is ONE date/time of its VR (PS3.5 §6.2), not a range: pydicom's
    ``validate_value`` admits ranges (query syntax, PS3.4 C.2.2.2.5), which a stored value
    cannot be. pydicom's DA and TM classes parse exactly one value (and check the calendar:
    no 30 February); for DT the hand-written ``_ONE_DT``, then pydicom's DT for the calendar.
    Raises ValueError naming the rule."""
    try:
        if vr == "DT" and not _ONE_DT.fullmatch(value):
            raise ValueError("not one value")
        {"DA": DA, "TM": TM, "DT": DT}[vr](value)
    except ValueError as e:
        raise ValueError(f"{value!r} is not one {vr} value: {_ONE_DATE_TIME[vr]} (PS3.5 §6.2; a range "
                         f"such as A-B is query syntax, PS3.4 C.2.2.2.5, not a stored value; {e})") from None


def _vm_allows(vm: str, n: int) -> bool:
    """``n`` values within a data dictionary VM (PS3.5 §6.4, PS3.6): "1", "1-3", "1-n",
    "2-2n" (a multiple of 2)... pydicom gives the VM (``dictionary_VM``) but checks no count."""
    if n == 0:
        return True  # an empty value (zero length) is no value count
    low, dash, high = vm.partition("-")
    if not dash:
        return n == int(low)
    if high.endswith("n"):
        return n >= int(low) and n % int(high[:-1] or 1) == 0
    return int(low) <= n <= int(high)


def _check_json_values(kw: str, tag: str, vr: str, elem: dict) -> None:
    """The DICOM JSON ``Value`` array of one element, before pydicom reads it (its
    ``from_json`` splits a string on backslashes, silently making several values):
    each value a separate item of the array (PS3.18 F.2.3), so no backslash inside a string
    value except in LT, ST, UT, UR (PS3.5 §6.2, §6.4); the number of values within the
    attribute's VM (PS3.6 data dictionary). A sequence (SQ) is one value of any items."""
    values = elem.get("Value")
    if values is None:
        return
    if not isinstance(values, list):
        raise UpdateError(400, f"{kw} ({tag}): \"Value\" is an array of the values (PS3.18 F.2.3)")
    if vr == "SQ":
        return
    vm = dictionary_VM(int(tag, 16))
    if not _vm_allows(vm, len(values)):
        raise UpdateError(400, f"{kw} ({tag}): {len(values)} values, its VM is {vm} "
                               f"(PS3.6 data dictionary, PS3.5 §6.4)")
    if vr in _BACKSLASH_ALLOWED:
        return
    for value in values:
        texts = value.values() if isinstance(value, dict) else [value]  # PN: its component groups
        for text in texts:
            if isinstance(text, str) and "\\" in text:
                raise UpdateError(400, f"{kw} ({tag}): {text!r} contains a backslash, the {vr} value "
                                       f"delimiter (PS3.5 §6.2, §6.4); several values are separate items "
                                       f"of \"Value\" (PS3.18 F.2.3)")


def changes_from_keywords(pairs: list[str], level: str) -> Dataset:
    """``Keyword=value`` pairs (the command line) as :func:`parse_changes` takes them."""
    doc: dict = {}
    for pair in pairs:
        kw, sep, value = pair.partition("=")
        tag = keyword_tag(kw.strip()) if sep else None
        if tag is None:
            raise UpdateError(400, f"{pair!r}: expected Keyword=value with a DICOM keyword")
        vr = dictionary_VR(tag)
        # a backslash separates values (PS3.5 §6.4), except in the VRs of one value where it is a
        # character like any other (LT, ST, UT, UR: PS3.5 §6.2)
        values = ([value] if vr in _BACKSLASH_ALLOWED else value.split("\\")) if value != "" else []
        if vr == "PN":
            values = [{"Alphabetic": v} for v in values]
        elif vr in ("IS", "SL", "SS", "UL", "US"):
            try:
                values = [int(v) for v in values]
            except ValueError:
                raise UpdateError(400, f"{kw}: {value!r} is not an integer") from None
        elif vr in ("DS", "FL", "FD"):
            try:
                values = [float(v) for v in values]
            except ValueError:
                raise UpdateError(400, f"{kw}: {value!r} is not a number") from None
        doc[f"{tag:08X}"] = {"vr": vr, **({"Value": values} if values else {})}
    return parse_changes(orjson.dumps(doc), level)


def _json_value(elem) -> list | None:
    """The element's DICOM JSON ``Value`` (PS3.18 F.2: a list; a PN value an object of its
    component groups; None when empty): the same form as the audit's ``from``, the stored
    DICOM JSON."""
    return elem.to_json_dict(None, MAX_BODY).get("Value")


def _apply(ds: Dataset, changes: Dataset) -> None:
    non_ascii = any(isinstance(e.value, str) and not e.value.isascii() or
                    e.VR == "PN" and not str(e.value).isascii() for e in changes if e.VR != "SQ")
    if non_ascii and "ISO_IR 192" not in (ds.get("SpecificCharacterSet") or ""):
        ds.decode()  # every text value to str with the file's character set, written again in UTF-8
        ds.SpecificCharacterSet = "ISO_IR 192"
    for elem in changes:
        ds[elem.tag] = copy.deepcopy(elem)


def _next_version(archive, sop_uid: str) -> int:
    history = archive.index.history(sop_uid)
    return history[-1].version + 1 if history else 2


def _write_version(archive, source_rel: str, target_rel: str, changes: Dataset | None, tmp: Path) -> InstanceRecord:
    """Step 1 for one instance: the file of ``source_rel`` (changed by ``changes``) placed
    durably at ``target_rel`` (its folder not yet fsynced)."""
    blobs = archive.blobs
    with blobs.local_copy(source_rel) as local:
        if changes is None:  # a restore: the same bytes
            with open(local, "rb") as f, open(tmp, "wb") as out:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
        else:
            ds = dcmread(local)
            sop_class = ds.SOPClassUID
            _apply(ds, changes)
            assert ds.SOPClassUID == sop_class
            ds.save_as(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        rec = describe_instance(tmp, bulk_threshold=archive.settings.bulk_threshold)
    except InstanceError as e:
        raise UpdateError(400, f"the changed instance is not valid: {e.message}") from None
    rec.path = target_rel
    if blobs.place(tmp, target_rel, sync_dir=False, synced=True) is Placed.EXISTS:
        blobs.replace(tmp, target_rel)  # the file of an update that never switched (a crash): ours now
    if tmp.exists():
        tmp.unlink()
    return rec


def update(archive, study_uid: str, series_uid: str | None, changes: Dataset,
           action: str = "update") -> Updated:
    """Give every instance of a study (or of one of its series) the attributes of
    ``changes``, as new versions, switched in one index transaction (module docstring).
    Raises UpdateError: 404 nothing stored there, 400 an instance cannot take the change,
    409 the hierarchy refuses it (nothing changed in either case)."""
    started = time.monotonic()
    locs = archive.index.instances(study_uid, series_uid)
    if not locs:
        raise UpdateError(404, f"no instance of study {study_uid}" + (f", series {series_uid}" if series_uid else ""))
    out = Updated(study_uid)
    first = archive.index.metadata(study_uid, series_uid, locs[0].sop_uid)
    before = orjson.loads(first[0]) if first else {}
    for elem in changes:
        tag = f"{elem.tag:08X}"
        out.changes.append({"tag": tag, "keyword": elem.keyword,
                            "from": (before.get(tag) or {}).get("Value"), "to": _json_value(elem)})
    uids = [loc.sop_uid for loc in locs]
    with archive._tracked(), archive.blobs.locked(uids), archive.index.locked(uids):
        locs = archive.index.instances(study_uid, series_uid)  # under the locks: what is switched
        records = _write_all(archive, [(loc, split_version(loc.path)[0], changes) for loc in locs])
        _switch(archive, records, study_uid, series_uid, None, action)
    out.instances = len(records)
    out.seconds = time.monotonic() - started
    log.info("%s of study %s%s: %d instance(s) in %.2f s: %s", action, study_uid,
             f" series {series_uid}" if series_uid else "", len(records), out.seconds, out.changes)
    return out


def _write_all(archive, work) -> list[InstanceRecord]:
    """Step 1 for each (location, base path, changes or None: same bytes, source path)."""
    records: list[InstanceRecord] = []
    dirs: set[Path] = set()
    spool = archive.blobs.spool
    for loc, base, changes, *source in work:
        version = _next_version(archive, loc.sop_uid)
        target = version_path(base, version)
        rec = _write_version(archive, source[0] if source else loc.path, target, changes,
                             spool / f"version-{loc.sop_uid}.dcm")
        if (rec.sop_uid, rec.series_uid, rec.study_uid, rec.sop_class_uid) != \
                (loc.sop_uid, loc.series_uid, loc.study_uid, loc.sop_class_uid):
            raise UpdateError(400, f"instance {loc.sop_uid}: its UIDs or SOP class would change")
        records.append(rec)
        folder = archive.blobs.directory(target)
        if folder is not None:
            dirs.add(folder)
        faults.point("update-written")
    for folder in dirs:
        fsync_dir(folder)
    return records


def _switch(archive, records, study_uid, series_uid, sop_uid, action) -> None:
    """Step 2: the index switched in one transaction (under the index writer's lock)."""
    faults.point("update-switch")
    routing = archive.routing
    if routing is not None and routing.routes.on_update:  # rules matched outside the writer's lock
        routing.plan(records, "update")
    try:
        with archive.committer.writer():
            archive.index.replace(records, study_uid, series_uid, sop_uid, action)
    except ReplaceRefused as e:
        raise UpdateError(409, e.refused.message) from None
    finally:
        if routing is not None:
            routing.forget(records)  # (the plans the switch did not use: refused, rejected meanwhile)
    faults.point("update-switched")
    if routing is not None:  # webhooks owed the changes, rules with on = ["update"] the new versions
        routing.committed()


def restore(archive, study_uid: str, series_uid: str, sop_uid: str, version: int) -> Updated:
    """Make ``version`` of an instance current again, as a new version (a copy of its
    file: ``restore`` in the change log)."""
    started = time.monotonic()
    loc = archive.index.locate(sop_uid)
    if loc is None or (loc.study_uid, loc.series_uid) != (study_uid, series_uid):
        raise UpdateError(404, f"no instance {sop_uid} in study {study_uid}, series {series_uid}")
    base = split_version(loc.path)[0]
    found = {v.version: v for v in versions(archive.blobs, base, archive.index.history(sop_uid))}
    v = found.get(version)
    if v is None or v.size is None:
        raise UpdateError(404, f"instance {sop_uid} has no version {version} kept "
                               f"(kept: {sorted(n for n, w in found.items() if w.size is not None)})")
    if v.current:
        raise UpdateError(409, f"version {version} of instance {sop_uid} is the current one")
    with archive._tracked(), archive.blobs.locked([sop_uid]), archive.index.locked([sop_uid]):
        records = _write_all(archive, [(loc, base, None, v.path)])
        _switch(archive, records, study_uid, series_uid, sop_uid, "restore")
    return Updated(study_uid, 1, time.monotonic() - started, [{"restored": version}])


def replace_version(archive, rec: InstanceRecord, spooled: Path) -> None:
    """``duplicate_policy = "replace"`` (archive.py): other content received under a stored
    SOP Instance UID becomes its new version, as an update makes one (the caller holds the
    instance's locks). Raises UpdateError when the index refuses it (another study or
    series, another patient than its study's): nothing changed."""
    base = rec.path
    rec.path = version_path(base, _next_version(archive, rec.sop_uid))
    if archive.blobs.place(spooled, rec.path, sync_dir=True) is Placed.EXISTS:
        archive.blobs.replace(spooled, rec.path)  # the file of an update that never switched
    if spooled.exists():
        spooled.unlink()
    try:
        _switch(archive, [rec], rec.study_uid, rec.series_uid, rec.sop_uid, "update")
    except UpdateError:
        archive.blobs.remove(rec.path)  # never current: leave nothing behind
        raise


def restore_study(archive, study_uid: str) -> Updated:
    """Make the previous version of every instance of a study current again, as new
    versions, in one switch (undoes a study update, patient included: a single instance
    cannot go back to another patient than its study's).

    Refused (409, nothing changed) unless one change made the current version of every
    instance (the change log: the same action at the same time, one index transaction):
    after a study update and then an update of one series, the previous version of that
    series' instances still holds the study update, the others' not, and the study was
    left with two accession numbers (an integrator's case). What the instances held as
    received, alike or not, does not matter: the versions' history decides."""
    started = time.monotonic()
    locs = archive.index.instances(study_uid)
    if not locs:
        raise UpdateError(404, f"no instance of study {study_uid}")
    uids = [loc.sop_uid for loc in locs]
    with archive._tracked(), archive.blobs.locked(uids), archive.index.locked(uids):
        work = []
        made: dict[tuple[str, float], list[str]] = {}  # the change that made each current version: its instances
        for loc in archive.index.instances(study_uid):
            base = split_version(loc.path)[0]
            kept = [v for v in versions(archive.blobs, base, archive.index.history(loc.sop_uid))]
            current = next((v for v in kept if v.current), None)
            earlier = [v for v in kept if not v.current and v.size is not None
                       and (current is None or v.version < current.version)]
            if not earlier:
                raise UpdateError(409, f"instance {loc.sop_uid} has no earlier version kept")
            made.setdefault((current.action, current.time) if current is not None else ("", 0.0), []).append(
                loc.sop_uid)
            work.append((loc, base, None, earlier[-1].path))
        if len(made) > 1:
            later = max(made, key=lambda change: change[1])  # the latest: it touched some instances only
            raise UpdateError(409, f"the study's instances were not last changed together: "
                                   f"{len(made[later])} of {len(work)} by a later {later[0]} "
                                   f"({', '.join(made[later][:3])}{', ...' if len(made[later]) > 3 else ''}): "
                                   f"nothing restored; restore instances one by one "
                                   f"(.../instances/{{sop}}/$restore?version=N)")
        records = _write_all(archive, work)
        _switch(archive, records, study_uid, None, None, "restore")
    return Updated(study_uid, len(records), time.monotonic() - started, [{"restored": "previous"}])


#: the Patient module attributes a merge may set (PS3.3 C.7.1.1)
MERGE_TAGS = frozenset({"00100010", "00100020", "00100021", "00100022", "00100030", "00100040", "00101000",
                        "00101001", "00101002"})


def merge(archive, patient_id: str, target: Dataset, issuer: str | None = None,
          allowed: Filter = UNRESTRICTED) -> list[Updated]:
    """Move every study of the patient ``patient_id`` (and ``issuer``, when given) that
    ``allowed`` lets the caller see under the identity ``target`` names: a study update of
    each (each study atomic on its own, one after another: a crash between two studies
    leaves those done merged, the others not; sending the merge again finishes it). The
    studies the caller may not see are not touched: none visible answers as none at all.

    ``patient_id`` names one Patient ID exactly as written, never a pattern: Patient ID
    is an LO, whose values may hold ``*``, ``?``, ``-``, ``,`` (PS3.5 §6.2, Table 6.2-1)
    and, written in a path, a backslash; the query model's wildcard, range and list matching
    (PS3.4 C.2.2.2.2-C.2.2.2.5) are for C-FIND and QIDO-RS keys, not for naming a patient.
    The index matches it exactly (single value matching, PS3.4 C.2.2.2.1), with the
    access filter, in one query. Leading and trailing spaces are LO padding (PS3.5 Table
    6.2-1), as the index keeps the value; an empty ID is refused (400).

    ``issuer`` (``?IssuerOfPatientID=``): only the studies whose record names that Issuer
    of Patient ID, exactly (padding aside; ``""``: the studies without an issuer, an empty
    and an absent one being the same). It is read from each study's record as the
    one-patient-per-study rule reads it (dicom/patient.py ``patient_identity``, the same
    for every index kind): no index keeps the issuer as a matching column. Without it,
    every study of that Patient ID moves, whatever its issuer."""
    if "PatientID" not in target:
        raise UpdateError(400, "the target patient needs its PatientID (00100020)")
    for elem in target:
        if f"{elem.tag:08X}" not in MERGE_TAGS:
            raise UpdateError(400, f"{elem.keyword} ({elem.tag:08X}) is not a Patient module attribute a merge sets")
    from ..dicom.matching import exact_study_query
    from ..dicom.patient import patient_identity

    wanted = patient_id.strip()  # as the index keeps it (matching.normalize_stored)
    if not wanted:
        raise UpdateError(400, "the patient ID to merge is empty")
    issuer_wanted = None if issuer is None else issuer.strip(" \x00")
    studies: list[str] = []
    seen = 0
    while True:
        q = exact_study_query({"PatientID": wanted}, offset=seen, limit=1000)
        hits = archive.index.search(q, allowed)
        seen += len(hits)
        studies += [h.study_uid for h in hits
                    if issuer_wanted is None or patient_identity(orjson.loads(h.study_json)).issuer == issuer_wanted]
        if len(hits) < q.limit:
            break
    if not studies:
        raise UpdateError(404, f"no study of patient {patient_id}"
                          + (f" (issuer {issuer_wanted!r})" if issuer_wanted is not None else ""))
    return [update(archive, study, None, target) for study in studies]


def instance_versions(archive, study_uid: str, series_uid: str, sop_uid: str) -> list[dict]:
    loc = archive.index.locate(sop_uid)
    if loc is None or (loc.study_uid, loc.series_uid) != (study_uid, series_uid):
        raise UpdateError(404, f"no instance {sop_uid} in study {study_uid}, series {series_uid}")
    base = split_version(loc.path)[0]
    return [v.to_json() for v in versions(archive.blobs, base, archive.index.history(sop_uid))]


__all__ = ["update", "restore", "parse_changes", "changes_from_keywords", "instance_versions", "UpdateError",
           "Updated", "MAX_BODY", "file_of"]

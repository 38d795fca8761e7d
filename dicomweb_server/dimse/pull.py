"""Pull studies from another PACS: the Query/Retrieve SCU (PS3.4 Annex C) as a job.

``dicomweb-server pull --from AE --query KEY=VALUE... [STUDY...]`` (in its own process) and
``POST /admin/pull`` (api/admin.py: a durable job of jobs/runner.py, ``GET /jobs/{id}``) run
:func:`run` (the job kind ``pull``, dicomweb_server/jobs): the remote is a peer of the
peers file (dimse/peers.py: its ``host``, ``port``, ``tls`` and ``retrieve_method``).

1. C-FIND, Study Root, Query/Retrieve Level STUDY (PS3.4 C.4.1, C.6.2): the query's keys
   (attribute matching as the remote does it: wildcards, date ranges) and the Study Instance
   UIDs given (list of UID matching, PS3.4 C.2.2.2.2), asking for Number of Study Related
   Instances (and SOP Classes in Study for a C-GET). The matches, sorted by Study Instance
   UID, are the job's items: saved in its first checkpoint, so a resumed job walks the same
   list without asking again.
2. Per study, in that order, a retrieve at the STUDY level:

   - C-MOVE (PS3.4 C.4.2) to this archive's own AE title (``ae_title``): the remote opens an
     association to this archive's DIMSE listener and C-STOREs each instance there, through
     the listener's normal C-STORE path (dimse/scp.py). The remote must know that AE title
     as a move destination (its host and port): Orthanc's ``DicomModalities``.
   - C-GET (PS3.4 C.4.3) where the peer says ``retrieve_method = "C-GET"``: the remote sends
     the instances as C-STORE sub-operations on the pull's own association (SCP/SCU Role
     Selection, PS3.7 D.3.3.4: this archive in the Storage SCP role); each is stored by
     :func:`.scp.store_received`, the listener's C-STORE path (validation, durable placement,
     index: :meth:`Archive.store`).

   The final C-MOVE/C-GET response's Number of Completed, Failed and Warning Sub-operations
   (PS3.4 C.4.2.1.4, C.4.3.1.3) are added to the job's counts; a study with failed
   sub-operations, or a failure status, is a failed study (its reason kept in the progress'
   ``detail.failures``), the others go on. A completed sub-operation is an instance this
   archive answered Success to: durably stored and indexed.
3. ``ctx.save`` after each study (checkpoint: the index of the next study and the counts).
   A killed job resumed from its checkpoint retrieves the study that was under way again:
   the archive stores an identical instance once (its SOP Instance UID, same bytes), so
   nothing is duplicated; its sub-operations are counted once (the killed run's never
   reached a checkpoint).

``skip_complete``: a study this archive already holds with at least the remote's Number of
Study Related Instances is not retrieved (counted ``skipped``).

The job fails (:class:`~dicomweb_server.jobs.JobError`, no retries) when the remote is not a
peer with a port, refuses the association (A-ASSOCIATE-RJ permanent), refuses or aborts the
C-FIND (Orthanc aborts the association of an AE title it does not know), says the move
destination is unknown (0xA801), or when every study tried failed. An association that cannot
be made (connection refused, time out) or that ends in the middle of a retrieve raises
:class:`RemoteUnavailable` (a ``ConnectionError``): the durable runner tries the job again
later from its checkpoint, the command line says so and keeps its ``--resume`` file.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from pydicom import datadict
from pydicom.dataset import Dataset
from pynetdicom import AE, StoragePresentationContexts, build_context, build_role, evt
from pynetdicom.sop_class import (
    StudyRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
)

from ..access.rules import FULL
from ..dicom.attributes import keyword_tag
from ..dicom.charset import configured, set_character_set
from ..jobs import Context, JobError
from . import status as S
from . import tls
from .peers import Peer, PeersError, load_peers

log = logging.getLogger("dicomweb_server.dimse")

FIND = StudyRootQueryRetrieveInformationModelFind
MOVE = StudyRootQueryRetrieveInformationModelMove
GET = StudyRootQueryRetrieveInformationModelGet
#: reasons of failed studies kept in the job's progress (the counts count them all)
MAX_FAILURES_SHOWN = 100
#: presentation contexts of a C-GET association: 128 at most (PS3.8 9.3.2.2: odd IDs 1-255)
MAX_CONTEXTS = 128


class RemoteUnavailable(ConnectionError):
    """The remote cannot be reached, or its association ended mid-way: try again later."""


# --- parameters --------------------------------------------------------------------------

def parse_query(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (a keyword such as ``PatientID`` or a tag ``00100020``) -> keyword:
    value; :class:`JobError` for anything else."""
    query: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise JobError(f"query {item!r}: expected KEY=VALUE (e.g. PatientID=123)")
        query[_keyword(key.strip())] = value.strip()
    return query


def _keyword(key: str) -> str:
    keyword = key
    if len(key) == 8 and all(c in "0123456789abcdefABCDEF" for c in key):
        keyword = datadict.keyword_for_tag(int(key, 16)) or ""
    if keyword_tag(keyword) is None:
        raise JobError(f"query key {key!r} is not a DICOM keyword or tag")
    if datadict.dictionary_VR(keyword) == "SQ" or keyword == "QueryRetrieveLevel":
        raise JobError(f"query key {keyword}: not a study matching key")
    return keyword


def check_params(params: dict) -> tuple[str, dict[str, str], list[str], bool]:
    """The source AE title, the query, the Study Instance UIDs and ``skip_complete`` of a pull
    job's parameters (``{"from": AE, "query": {keyword: value}, "studies": [...],
    "skip_complete": bool}``), or :class:`JobError`."""
    source = params.get("from")
    if not isinstance(source, str) or not source.strip():
        raise JobError('"from": the AE title of the remote (a peer of the peers file)')
    query = params.get("query") or {}
    if not isinstance(query, dict) or not all(isinstance(v, str) for v in query.values()):
        raise JobError('"query": an object of keyword -> value (strings)')
    query = {_keyword(str(k)): v for k, v in query.items()}
    studies = params.get("studies") or []
    if not isinstance(studies, list) or not all(isinstance(u, str) and u.strip() for u in studies):
        raise JobError('"studies": a list of Study Instance UIDs')
    if given := query.pop("StudyInstanceUID", None):
        studies = [*studies, *given.split("\\")]
    studies = list(dict.fromkeys(u.strip() for u in studies))
    for uid in studies:
        if len(uid) > 64 or not all(p.isdigit() and (p == "0" or p[0] != "0") for p in uid.split(".")):
            raise JobError(f"{uid[:70]!r} is not a Study Instance UID (PS3.5 9.1)")
    if not studies and not any(query.values()):  # empty values are universal matches (PS3.4 C.2.2.2.3)
        raise JobError("nothing to pull: give query keys with values (PatientID=...) or Study Instance UIDs")
    skip = params.get("skip_complete", False)
    if not isinstance(skip, bool):
        raise JobError('"skip_complete": true or false')
    return source.strip(), query, studies, skip


def request_params(body: object, settings) -> dict:
    """The parameters of a pull job from a ``POST /admin/pull`` body (``{"from": AE, "query":
    {keyword: value}, "studies": [UIDs], "skip_complete": bool}``), checked now (the AE title a
    peer with a port of the peers file): :class:`JobError` for a bad one, before anything is
    queued."""
    if not isinstance(body, dict):
        raise JobError('the body must be a JSON object: {"from": AE, "query": {...}, "studies": [...]}')
    if unknown := set(body) - {"from", "query", "studies", "skip_complete"}:
        raise JobError(f"unknown member(s): {', '.join(sorted(unknown))}")
    source, query, studies, skip = check_params(body)
    peer_of(settings, source)
    return {"from": source, "query": query, "studies": studies, "skip_complete": skip}


def peer_of(settings, source: str) -> Peer:
    try:
        peers = load_peers(settings.dimse_peers_file)
    except PeersError as e:
        raise JobError(str(e)) from None
    peer = peers.get(source)
    if peer is None:
        raise JobError(f"{source!r} is not in the peers file ({settings.dimse_peers_file or 'none configured'}: "
                       "--dimse-peers-file / DICOMWEB_DIMSE_PEERS_FILE)")
    if peer.port is None:
        raise JobError(f"peer {source!r} has no port in the peers file")
    return peer


# --- associations ------------------------------------------------------------------------

def associate(peer: Peer, settings, contexts, ext_neg=(), handlers=()):
    """An established association with ``peer`` (over TLS when the peers file says so,
    PS3.15 Annex B), calling AE title this archive's; :class:`JobError` when refused for good,
    :class:`RemoteUnavailable` when it cannot be made now."""
    ae = AE(ae_title=settings.ae_title)
    ae.acse_timeout = settings.dimse_acse_timeout
    ae.dimse_timeout = settings.dimse_timeout
    ae.network_timeout = settings.dimse_network_timeout
    for cx in contexts:
        ae.add_requested_context(cx.abstract_syntax, cx.transfer_syntax)
    try:
        tls_args = tls.tls_args(peer.tls, peer.host)
    except tls.TlsError as e:
        raise JobError(f"peer {peer.ae_title}: {e}") from None
    answer: list = []
    where = f"{peer.ae_title} at {peer.host}:{peer.port}{' (TLS)' if peer.tls else ''}"
    try:
        assoc = ae.associate(peer.host, peer.port, ae_title=peer.ae_title, ext_neg=list(ext_neg) or None,
                             tls_args=tls_args,
                             evt_handlers=[(evt.EVT_ACSE_RECV, lambda e: answer.append(e.primitive)),
                                           *handlers])
    except Exception as e:  # noqa: BLE001 - e.g. the host does not resolve
        raise RemoteUnavailable(f"cannot associate with {where}: {e}") from None
    if assoc.is_established:
        return assoc
    rj = next((p for p in answer if getattr(p, "result", None) in (1, 2)), None)
    if rj is not None:  # A-ASSOCIATE-RJ (PS3.8 9.3.4)
        why = f"{where} rejected the association: {rj.result_str}, {rj.source_str}: {rj.reason_str}"
        if rj.result == 2:  # transient
            raise RemoteUnavailable(why)
        raise JobError(f"{why} (does it know this archive's AE title {settings.ae_title!r}?)")
    raise RemoteUnavailable(f"cannot associate with {where} (no connection, or no answer in time)")


def _status_text(status: Dataset) -> str:
    code = status.get("Status")
    comment = status.get("ErrorComment")
    return f"0x{code:04X}" + (f" ({comment})" if comment else "")


def find_studies(peer: Peer, settings, query: dict[str, str], studies: list[str], with_classes: bool
                 ) -> list[dict]:
    """The C-FIND of step 1: ``[{"uid", "instances", "classes"}]`` sorted by Study Instance UID."""
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    for keyword, value in query.items():
        setattr(ident, keyword, value)
    ident.StudyInstanceUID = studies[0] if len(studies) == 1 else list(studies) if studies else ""
    ident.NumberOfStudyRelatedInstances = ""
    if with_classes:
        ident.SOPClassesInStudy = ""
    # a non-ASCII key: the archive's preferred set when it holds it, else ISO_IR 192 (PS3.4 C.4.1.1.3.1)
    set_character_set(ident, configured(settings.dimse_character_set))
    assoc = associate(peer, settings, [build_context(FIND)])
    found: dict[str, dict] = {}
    final = None
    try:
        for status, match in assoc.send_c_find(ident, FIND):
            code = status.get("Status")
            if code in (0xFF00, 0xFF01) and match is not None:  # Pending (PS3.4 C.4.1.1.4)
                uid = str(match.get("StudyInstanceUID", "") or "").strip()
                if uid:
                    n = match.get("NumberOfStudyRelatedInstances")
                    classes = match.get("SOPClassesInStudy") if with_classes else None
                    found[uid] = {"uid": uid, "instances": int(n) if n not in (None, "") else None,
                                  "classes": [str(c) for c in (classes if isinstance(classes, list | tuple)
                                                               else [classes] if classes else [])]}
            else:
                final = status
        aborted = (final is None or "Status" not in final) and _ended(assoc)
    finally:
        if assoc.is_established:
            assoc.release()
    if final is None or "Status" not in final:
        hint = " (it aborted the association: does it know this archive's AE title " \
               f"{settings.ae_title!r}? Orthanc: DicomModalities)" if aborted else ""
        raise JobError(f"C-FIND on {peer.ae_title}: no final response{hint}")
    if final.Status != S.SUCCESS:
        raise JobError(f"C-FIND on {peer.ae_title} failed: status {_status_text(final)}")
    return [found[u] for u in sorted(found)]


def _ended(assoc, wait: float = 2.0) -> bool:
    """Whether an association that gave no response was aborted or closed by the peer (not a
    DIMSE timeout): pynetdicom yields the empty status before it marks the association ended."""
    deadline = time.monotonic() + wait
    while assoc.is_established and time.monotonic() < deadline:
        time.sleep(0.02)
    return not assoc.is_established


def _identifier(study_uid: str) -> Dataset:
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    ident.StudyInstanceUID = study_uid
    return ident


def move_study(peer: Peer, settings, study_uid: str) -> Dataset | None:
    """C-MOVE of one study to this archive's AE title: the final response (None: none came)."""
    assoc = associate(peer, settings, [build_context(MOVE)])
    return _final(assoc, assoc.send_c_move(_identifier(study_uid), settings.ae_title, MOVE))


def _final(assoc, responses) -> Dataset | None:
    """The final response of a C-MOVE or C-GET (after its Pending ones), the association
    released; None when none came (aborted, timed out)."""
    final = None
    try:
        for status, _ in responses:
            if status.get("Status") not in (None, S.PENDING):
                final = status
    finally:
        if assoc.is_established:
            assoc.release()
    return final


def _get_contexts(classes: list[str]) -> list:
    """The Storage contexts a C-GET association proposes (the archive as Storage SCP): for the
    study's SOP classes (SOP Classes in Study) one context of the uncompressed transfer
    syntaxes each, then one context per (class, other transfer syntax the archive stores) while
    there is room (PS3.8 9.3.2.2: 128 contexts): the remote sends each instance in the context of
    its own transfer syntax, as stored, where one was proposed (one context listing them all
    lets the remote choose one syntax for the class, and it decompressed a JPEG instance to
    send it). When the remote did not say which classes, pynetdicom's common storage classes,
    uncompressed."""
    from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian

    from .scp import TRANSFER_SYNTAXES

    room = MAX_CONTEXTS - 1  # and the C-GET model's own
    classes = list(dict.fromkeys(classes)) or [cx.abstract_syntax for cx in StoragePresentationContexts]
    native = [ExplicitVRLittleEndian, ImplicitVRLittleEndian]
    contexts = [build_context(c, native) for c in classes[:room]]
    for ts in (t for t in TRANSFER_SYNTAXES if t not in native):
        contexts.extend(build_context(c, [ts]) for c in classes[:room - len(contexts)])
    return contexts


def get_study(peer: Peer, settings, archive, study_uid: str, classes: list[str]) -> Dataset | None:
    """C-GET of one study (PS3.4 C.4.3), each C-STORE sub-operation stored here: the final
    response (None: none came)."""
    storage = _get_contexts(classes)
    roles = [build_role(c, scp_role=True) for c in dict.fromkeys(cx.abstract_syntax for cx in storage)]

    def on_store(event):
        return store_sub_operation(event, archive, peer.ae_title)

    assoc = associate(peer, settings, [build_context(GET), *storage], roles, [(evt.EVT_C_STORE, on_store)])
    return _final(assoc, assoc.send_c_get(_identifier(study_uid), GET))


def store_sub_operation(event, archive, source_ae: str):
    """``EVT_C_STORE`` of a C-GET association: the data set into the spool folder as a PS3.10
    file (file meta with the Source AE Title slot), then :func:`.scp.store_received`. Where
    the listener runs in this process pynetdicom has already written that file
    (``STORE_RECV_CHUNKED_DATASET``, dimse/scp.py)."""
    from .scp import _encoded_file_meta, store_received

    path = getattr(event.request, "_dataset_path", None)
    if path is None:
        req = event.request
        fd, name = tempfile.mkstemp(dir=archive.blobs.spool, prefix="pull-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"\x00" * 128 + b"DICM")
                f.write(_encoded_file_meta(sop_class_uid=req.AffectedSOPClassUID,
                                           sop_instance_uid=req.AffectedSOPInstanceUID,
                                           transfer_syntax=event.context.transfer_syntax))
                f.write(event.encoded_dataset(include_meta=False))
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        path = name
    return store_received(archive, event.request, Path(path), source_ae, event.context.transfer_syntax, FULL)


# --- the job -------------------------------------------------------------------------------

def _local_count(archive, study_uid: str) -> int:
    return len(archive.index.instances(study_uid))


def run(ctx: Context) -> dict:
    """The ``pull`` job (module docstring): its result, the counts of studies and instances."""
    source, query, studies, skip_complete = check_params(ctx.params)
    settings = ctx.archive.settings
    peer = peer_of(settings, source)
    method = peer.retrieve_method
    cp = ctx.checkpoint
    if "studies" not in cp:  # step 1, once: the list is part of the checkpoint
        found = find_studies(peer, settings, query, studies, method == "C-GET")
        missing = [u for u in studies if u not in {s["uid"] for s in found}]
        cp = {"studies": found, "next": 0, "done": 0, "failed": 0, "skipped": 0,
              "instances": {"completed": 0, "failed": 0, "warning": 0},
              "failures": {u: f"not found on {source}" for u in missing[:MAX_FAILURES_SHOWN]},
              "not_found": len(missing)}
        cp["failed"] = len(missing)
        _save(ctx, cp)
        log.info("pull from %s: %d stud%s to retrieve by %s", source, len(found), "y" if len(found) == 1 else "ies",
                 method)
    items = cp["studies"]
    while cp["next"] < len(items):
        study = items[cp["next"]]
        uid, remote_n = study["uid"], study.get("instances")
        if skip_complete and remote_n and _local_count(ctx.archive, uid) >= remote_n:
            cp["skipped"] += 1
        else:
            if method == "C-GET":
                final = get_study(peer, settings, ctx.archive, uid, study.get("classes") or [])
            else:
                final = move_study(peer, settings, uid)
            _count(cp, source, method, settings.ae_title, uid, final)
        cp["next"] += 1
        _save(ctx, cp)
    result = _result(cp, source, method)
    tried = len(items) - cp["skipped"] + cp.get("not_found", 0)
    if tried and cp["done"] == 0:
        first = next(iter(cp["failures"].values()), "")
        raise JobError(f"no study pulled from {source}: {cp['failed']} failed ({first})")
    return result


def _count(cp: dict, source: str, method: str, ae_title: str, uid: str, final: Dataset | None) -> None:
    """Add a study's final C-MOVE/C-GET response to the checkpoint's counts (PS3.4 C.4.2.1.4)."""
    if final is None or "Status" not in final:
        raise RemoteUnavailable(f"{method} of study {uid} from {source}: no final response (the association "
                                "ended, or timed out)")
    code = final.Status
    if method == "C-MOVE" and code == S.QR_MOVE_DESTINATION_UNKNOWN:
        raise JobError(f"{source} does not know this archive's AE title {ae_title!r} as a C-MOVE destination "
                       f"(0xA801): add it to its configuration with this archive's DIMSE host and port")
    counts = {"completed": int(final.get("NumberOfCompletedSuboperations", 0) or 0),
              "failed": int(final.get("NumberOfFailedSuboperations", 0) or 0),
              "warning": int(final.get("NumberOfWarningSuboperations", 0) or 0)}
    for k, v in counts.items():
        cp["instances"][k] += v
    ok = code in (S.SUCCESS, S.QR_SUBOPS_WARNING) and counts["failed"] == 0
    if ok:
        cp["done"] += 1
        return
    cp["failed"] += 1
    why = f"{method} status {_status_text(final)}, {counts['completed']} completed, {counts['failed']} failed"
    if code == S.QR_UNABLE_TO_PROCESS and method == "C-MOVE" and counts["completed"] == 0:
        why += f" (can {source} reach this archive's AE title {ae_title!r} at its DIMSE host and port?)"
    if len(cp["failures"]) < MAX_FAILURES_SHOWN:
        cp["failures"][uid] = why
    log.warning("pull from %s: study %s: %s", source, uid, why)


def _save(ctx: Context, cp: dict) -> None:
    ctx.save(cp, total=len(cp["studies"]) + cp.get("not_found", 0), done=cp["done"], failed=cp["failed"],
             skipped=cp["skipped"], detail={"instances": dict(cp["instances"]), "failures": dict(cp["failures"])})


def _result(cp: dict, source: str, method: str) -> dict:
    return {"from": source, "method": method, "studies": len(cp["studies"]) + cp.get("not_found", 0),
            "pulled": cp["done"], "skipped": cp["skipped"], "failed": cp["failed"],
            "instances": dict(cp["instances"]), "failures": dict(cp["failures"])}

"""What arrived of a study, where from, and what its senders declared: the operator's
study page (ui/, ``GET /admin/studies/{study}/arrivals``: api/admin.py;
docs/notes/sources.md).

From the index alone (store/arrivals.py), never from the files:

- per series: the instances stored, the sizes of their files summed and their sources
  (``dimse:`` + the calling AE title, ``stow:`` + the user or the client's address,
  ``import``: archive.py), and the study's totals;
- when the study's instances arrived (the change log: :meth:`store.base.Index.received`);
- what was declared, where a sender said so (nothing is invented where none did):
  - Number of Series Related Instances (0020,1209) and Number of Study Related Instances
    (0020,1208) when the instances carry them (PS3.4 §C.3.4 defines them as query/retrieve
    attributes, the numbers of the series' and the study's instances; some senders write
    them into the instances they send): the largest value the series' (study's) instances
    carry;
  - the Storage Commitment requests that named an instance of the study (PS3.4 J.3.2, their
    Referenced SOP Sequence: dimse/commitment.py): each with the instances it named, how
    many are stored, how many of those in this study, and the missing ones (not stored,
    or in a study the caller may not see);
  - the same for each completed Modality Performed Procedure Step that named one (PS3.4
    F.7.2.2: the images its Performed Series Sequence lists; dimse/mpps.py), ``kind`` "mpps"
    and its SOP Instance UID as ``transaction`` (``kind`` "storage-commitment" otherwise).
"""

from __future__ import annotations

import orjson

from .access.filter import UNRESTRICTED, Filter
from .store.base import Index
from .store.changes import iso

STUDY_RELATED = "00201208"  # Number of Study Related Instances
SERIES_RELATED = "00201209"  # Number of Series Related Instances
SERIES_UID = "0020000E"
#: missing instances listed per commitment request (all are counted)
MISSING_LISTED = 1000


def _number(element: object) -> int | None:
    """The first value of an IS element of DICOM JSON (a number, or a string: PS3.18 F.2.3)."""
    try:
        value = element["Value"][0]  # type: ignore[index]
        return int(value)
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def study_arrivals(index: Index, study_uid: str, allowed: Filter = UNRESTRICTED) -> dict | None:
    """The study page's "what arrived" (module docstring) as a JSON-ready dict; None when
    the study is not indexed or not one ``allowed`` lets through."""
    groups = index.arrived(study_uid, allowed)
    if groups is None:
        return None
    series: dict[str, dict] = {}
    for g in groups:
        se = series.setdefault(g.series_uid, {"series": g.series_uid, "instances": 0, "bytes": 0, "sources": {},
                                              "declared": None})
        se["instances"] += g.instances
        se["bytes"] += g.bytes
        se["sources"][g.source] = se["sources"].get(g.source, 0) + g.instances
    study_declared: int | None = None
    for meta in index.metadata(study_uid, allowed=allowed):
        if STUDY_RELATED.encode() not in meta and SERIES_RELATED.encode() not in meta:
            continue  # (most instances: not parsed)
        doc = orjson.loads(meta)
        n = _number(doc.get(STUDY_RELATED))
        if n is not None:
            study_declared = max(n, study_declared or 0)
        n = _number(doc.get(SERIES_RELATED))
        se = series.get(str((doc.get(SERIES_UID) or {}).get("Value", [""])[0]))
        if n is not None and se is not None:
            se["declared"] = max(n, se["declared"] or 0)
    sources: dict[str, int] = {}
    for se in series.values():
        for src, n in se["sources"].items():
            sources[src] = sources.get(src, 0) + n
    received = index.received(study_uid).get(study_uid)
    return {
        "study": study_uid,
        "instances": sum(se["instances"] for se in series.values()),
        "bytes": sum(se["bytes"] for se in series.values()),
        "sources": dict(sorted(sources.items())),
        "received": {"first": iso(received[0]), "latest": iso(received[1])} if received else None,
        "declared": study_declared,
        "series": list(series.values()),
        "commitments": _commitments(index, study_uid, allowed),
    }


def _commitments(index: Index, study_uid: str, allowed: Filter) -> list[dict]:
    """The Storage Commitment requests and the completed performed procedure steps that
    named an instance of the study."""
    here = {loc.sop_uid for loc in index.instances(study_uid, allowed=allowed)}
    requests: dict[str, dict] = {}
    for d in index.declarations(sorted(here)):
        r = requests.setdefault(d.transaction_uid, {
            "kind": "storage-commitment", "transaction": d.transaction_uid, "requester": d.requester,
            "time": iso(d.time),
            "declared": 0, "arrived": 0, "in_study": 0, "missing_count": 0, "missing": []})
        r["declared"] += 1
        if d.sop_uid in here:
            r["arrived"] += 1
            r["in_study"] += 1
        elif index.locate(d.sop_uid, allowed) is not None:
            r["arrived"] += 1
        else:
            r["missing_count"] += 1
            if len(r["missing"]) < MISSING_LISTED:
                r["missing"].append({"sop_class": d.sop_class_uid, "sop": d.sop_uid})
    for uid in index.mpps_among(sorted(requests)):  # "transaction": the step's SOP Instance UID
        requests[uid]["kind"] = "mpps"
    return list(requests.values())

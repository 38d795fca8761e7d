"""Rejected instances in a QIDO-RS answer: ``includerejected=true`` (issue 27; IHE RAD
TF-3 IOCM lets an archive list what it hides to a privileged user).

A rejected instance's rows left the searchable tables (store/rejections.py): the index
keeps only its UIDs, the rejection note title and time. So the entries added here carry
the UIDs and **Instance Availability (0008,0056) = ``UNAVAILABLE``** (the standard's own
value for what a query finds but a retrieve will not return; the regular study and
instance entries say ``ONLINE``, PS3.18 Tables 10.6.3-3 and -5), matched on UIDs only:

- instance search: one entry per rejected instance in the query's scope;
- series / study search: one entry per series / study in scope that has rejected
  instances and **no** searchable instance (a series or study that still has some is in
  the regular answer, which counts only those); ``NumberOfSeriesRelatedInstances`` /
  ``NumberOfStudyRelatedInstances`` = how many of its instances are rejected.

The scope is the path's study/series and the ``StudyInstanceUID``, ``SeriesInstanceUID``,
``SOPInstanceUID`` matching keys (single UID or UID list). Any other matching key is a
400: the rejected instances' other attributes are not indexed, and matching them on UIDs
alone would list instances the key excludes. The entries come after the regular matches
on the first page (``offset`` 0) and are not counted by ``limit``. Access rules apply:
see :func:`rejected_entries`.
"""

from __future__ import annotations

from ..access.filter import UNRESTRICTED, Filter
from ..dicom.matching import Query, QueryError
from ..store.base import Index
from ..store.rejections import Rejection

PARAMETER = "includerejected"
UNAVAILABLE = {"00080056": {"vr": "CS", "Value": ["UNAVAILABLE"]}}  # Instance Availability
_UID_KEYS = ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID")


def _uid(tag: str, value: str) -> dict:
    return {tag: {"vr": "UI", "Value": [value]}}


def _count(tag: str, n: int) -> dict:
    return {tag: {"vr": "IS", "Value": [n]}}


def uid_scope(query: Query) -> dict[str, frozenset[str]]:
    """The UID keys of ``query`` (keyword -> allowed UIDs); QueryError for any other key."""
    scope: dict[str, frozenset[str]] = {}
    for m in query.matches:
        if m.type == "universal":
            continue
        if m.attribute.keyword not in _UID_KEYS or m.type not in ("single", "list"):
            raise QueryError(f"{PARAMETER}=true matches rejected instances on StudyInstanceUID, "
                             f"SeriesInstanceUID and SOPInstanceUID only (not {m.attribute.keyword}): "
                             "their other attributes leave the index with them")
        scope[m.attribute.keyword] = frozenset(m.values)
    if query.study_uid is not None:
        scope["StudyInstanceUID"] = scope.get("StudyInstanceUID", frozenset({query.study_uid})) & {query.study_uid}
    if query.series_uid is not None:
        scope["SeriesInstanceUID"] = scope.get("SeriesInstanceUID", frozenset({query.series_uid})) & {query.series_uid}
    return scope


def _in_scope(row: Rejection, scope: dict[str, frozenset[str]]) -> bool:
    return all(value in scope[key] for key, value in (("StudyInstanceUID", row.study_uid),
               ("SeriesInstanceUID", row.series_uid), ("SOPInstanceUID", row.sop_uid)) if key in scope)


def rejected_entries(index: Index, query: Query, scope: dict[str, frozenset[str]],
                     allowed: Filter = UNRESTRICTED) -> list[dict]:
    """The DICOM JSON entries the answer gains (see the module docstring); ``scope`` from
    :func:`uid_scope`. A restricted caller (access rules, ``label=``) gets those of the
    studies it can see that still have a searchable instance (a wholly rejected study has
    no labels left to check)."""
    if query.offset:
        return []
    studies = scope.get("StudyInstanceUID")
    if studies is not None and len(studies) == 1:
        rows = index.rejections(next(iter(studies)), None)
    else:
        rows = index.rejections(None, None)
    rows = [r for r in rows if _in_scope(r, scope)]
    if not allowed.unrestricted:
        seen = {st: index.labels(st, allowed) is not None for st in {r.study_uid for r in rows}}
        rows = [r for r in rows if seen[r.study_uid]]
    rows.sort(key=lambda r: (r.study_uid, r.series_uid, r.sop_uid))
    if query.level == "instance":
        return [{**_uid("0020000D", r.study_uid), **_uid("0020000E", r.series_uid), **_uid("00080018", r.sop_uid),
                 **UNAVAILABLE} for r in rows]
    if query.level == "series":
        groups: dict[tuple[str, str], int] = {}
        for r in rows:
            groups[(r.study_uid, r.series_uid)] = groups.get((r.study_uid, r.series_uid), 0) + 1
        visible: dict[str, set[str]] = {}
        for study in {s for s, _ in groups}:
            visible[study] = {loc.series_uid for loc in index.instances(study)}
        return [{**_uid("0020000D", st), **_uid("0020000E", se), **_count("00201209", n), **UNAVAILABLE}
                for (st, se), n in groups.items() if se not in visible[st]]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.study_uid] = counts.get(r.study_uid, 0) + 1
    return [{**_uid("0020000D", st), **_count("00201208", n), **UNAVAILABLE}
            for st, n in counts.items() if not index.instances(st)]

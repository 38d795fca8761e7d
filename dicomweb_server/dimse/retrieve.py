"""C-GET and C-MOVE matching: the instances an identifier names, found with the
same query as C-FIND (PS3.4 C.4.2.2, C.4.3.2: the unique keys of the levels down to
the Query/Retrieve Level select studies, series or instances)."""

from __future__ import annotations

from collections.abc import Callable

from pydicom import uid as U
from pydicom.dataset import Dataset

from ..policy import transcode
from ..access.filter import UNRESTRICTED, Filter
from ..store.base import Index, InstanceLocation
from .find import query_level, search_all


def matching_instances(index: Index, identifier: Dataset, model: str, max_results: int,
                       allowed: Filter = UNRESTRICTED) -> list[InstanceLocation]:
    """Every stored instance under the entities the identifier matches, in index order,
    of the studies ``allowed`` lets through (access/filter.py)."""
    level = query_level(identifier, model)
    out: list[InstanceLocation] = []
    seen: set[str] = set()
    for _, hit in search_all(index, identifier, level, max_results, allowed):
        if level == "IMAGE":
            loc = index.locate(hit.sop_uid, allowed) if hit.sop_uid else None
            locs = [loc] if loc is not None else []
        elif level == "SERIES":
            locs = index.instances(hit.study_uid, hit.series_uid, allowed)
        else:
            locs = index.instances(hit.study_uid, None, allowed)
        for loc in locs:
            if loc.sop_uid not in seen:
                seen.add(loc.sop_uid)
                out.append(loc)
    return out


def proposed_syntaxes(stored_ts: str) -> list[str]:
    """Transfer syntaxes a C-MOVE proposes for instances stored in ``stored_ts``
    (PS3.4 C.4.3.3.1: the SCP proposes what it can send): the stored one, then
    Explicit and Implicit VR Little Endian and the lossless compressed syntaxes the
    archive can transcode to (policy/transcode.py), when it can decode the stored
    one. Lossy syntaxes are never proposed: a DIMSE peer cannot name them explicitly."""
    out = [stored_ts, U.ExplicitVRLittleEndian, U.ImplicitVRLittleEndian]
    if transcode.can_decode(stored_ts):
        out += [ts for ts in transcode.LOSSLESS_TARGETS if transcode.can_transcode(stored_ts, ts)]
    return list(dict.fromkeys(out))


def sendable_syntax(stored_ts: str, accepted: Callable[[str], bool]) -> str | None:
    """The syntax to send an instance stored in ``stored_ts`` in, given ``accepted(ts)``
    (a presentation context of its SOP class accepted with that syntax): the stored
    one, else the first of :func:`proposed_syntaxes` (Explicit VR LE first: decoding
    only, no encoder); None when no accepted syntax can be produced (PS3.4
    C.4.2.3.1/C.4.3.3.1: that sub-operation fails)."""
    for ts in proposed_syntaxes(stored_ts):
        if accepted(ts) and (ts == stored_ts or transcode.can_transcode(stored_ts, ts)):
            return ts
    return None


def sub_operation_syntax(stored_ts: str, accepted: list[str]) -> str | None:
    """The syntax to produce an instance stored in ``stored_ts`` in for a C-STORE
    sub-operation, its SOP class accepted with the syntaxes ``accepted`` (one per
    presentation context): :func:`sendable_syntax` (as stored, else decoded, else
    re-encoded losslessly); else, Deflated Explicit VR Little Endian accepted, Explicit
    VR Little Endian (pynetdicom deflates it as it sends it). Never a lossy syntax the
    instance is not stored in (policy/transcode.py). None: nothing accepted can be
    produced; that sub-operation fails (PS3.4 C.4.2.3.1, C.4.3.3.1)."""
    target = sendable_syntax(stored_ts, accepted.__contains__)
    if target is not None:
        return target
    if U.DeflatedExplicitVRLittleEndian in accepted and transcode.can_transcode(stored_ts, U.ExplicitVRLittleEndian):
        return U.ExplicitVRLittleEndian
    return None

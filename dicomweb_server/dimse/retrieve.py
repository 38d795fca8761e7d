"""C-GET and C-MOVE matching: the instances an identifier names.

Baseline (non-relational) retrieve, PS3.4 C.4.2.2.1 (C-MOVE) and C.4.3.2.1 (C-GET): the
unique key of each level above the Query/Retrieve Level holds a single value, the unique
key of that level one value or a list of UIDs (Patient ID, at the PATIENT level: one value,
C.4.2.1.4.1 Note); no wildcard, no universal matching. The SCP retrieves what those keys
identify (C.4.2.3.1, C.4.3.3.1). A unique key above the level that is absent or empty is
tolerated (the level's UIDs, unique by definition, name what is retrieved: SCUs send a Patient
Root STUDY retrieve without Patient ID); one with a value is matched, and must be single. Relational retrieve (C.4.2.2.2, C.4.3.2.2) needs SOP Class
Extended Negotiation, which this SCP does not accept: an identifier without those keys
fails with 0xA900 naming the key, and no sub-operation. Other keys are ignored (C.2.2.1:
only unique keys identify what is retrieved; SCUs send more)."""

from __future__ import annotations

from collections.abc import Callable

from pydicom import uid as U
from pydicom.datadict import tag_for_keyword
from pydicom.dataset import Dataset

from ..dicom.media_types import UNENCAPSULATED
from ..policy import transcode
from ..access.filter import UNRESTRICTED, Filter
from ..store.base import Index, InstanceLocation
from .find import (
    MODEL_LEVELS,
    UNIQUE_KEYS,
    WILDCARDS,
    IdentifierError,
    key_values,
    query_level,
    search_all,
    single_value,
)


def unique_keys(identifier: Dataset, model: str) -> tuple[str, Dataset]:
    """The Query/Retrieve Level and an identifier holding only its unique keys (with the
    level), checked for a baseline retrieve (module docstring); IdentifierError (0xA900)
    naming the first key missing or not of the allowed matching type."""
    level = query_level(identifier, model)
    levels = MODEL_LEVELS[model]
    keys = Dataset()
    keys.QueryRetrieveLevel = level
    for above in levels[:levels.index(level)]:
        # absent or zero length: tolerated, the level's own UIDs name what is retrieved (SCUs in
        # the field send a Patient Root STUDY retrieve by Study Instance UID alone); a value given
        # must be single, without wildcards (anything else is a relational retrieve)
        if key_values(identifier, UNIQUE_KEYS[above]):
            setattr(keys, UNIQUE_KEYS[above], single_value(identifier, UNIQUE_KEYS[above], f"above {level} level"))
    keyword = UNIQUE_KEYS[level]
    if level == "PATIENT":  # Single Value Matching only (C.4.2.1.4.1 Note)
        setattr(keys, keyword, single_value(identifier, keyword, f"at {level} level"))
        return level, keys
    values = key_values(identifier, keyword)  # one UID or a list of UIDs (C.2.2.2.2)
    tag = tag_for_keyword(keyword)
    if not values:  # absent, or zero length: universal matching
        raise IdentifierError(f"{keyword} {'missing' if values is None else 'empty'} (required at {level} level)", tag)
    if not all(values):
        raise IdentifierError(f"{keyword}: an empty UID in the list", tag)
    if any(w in v for v in values for w in WILDCARDS):
        raise IdentifierError(f"{keyword}: no wildcard matching at {level} level", tag)
    setattr(keys, keyword, values if len(values) > 1 else values[0])
    return level, keys


def matching_instances(index: Index, identifier: Dataset, model: str, max_results: int,
                       allowed: Filter = UNRESTRICTED) -> list[InstanceLocation]:
    """Every stored instance under the entities the identifier's unique keys name
    (:func:`unique_keys`), in index order, of the studies ``allowed`` lets through
    (access/filter.py)."""
    level, identifier = unique_keys(identifier, model)
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


def sending_contexts(pairs, room: int) -> list[tuple[str, list[str]]]:
    """The presentation contexts (abstract syntax, transfer syntaxes) the archive proposes to
    send stored instances of the (SOP class, stored transfer syntax) ``pairs`` (a C-MOVE's
    storage sub-operations, PS3.4 C.4.2.3.1), at most ``room`` of them.

    An instance stored in an encapsulated (compressed) syntax gets that syntax in a context
    of its own, plus a fallback context of its class with :func:`proposed_syntaxes` without
    it (Explicit, Implicit VR LE...): PS3.8 9.3.2.2 lets a requestor propose several
    contexts for one abstract syntax, and the acceptor answers each. One context
    [stored, Explicit VR LE, ...] lets the acceptor pick one syntax of the list, and an
    acceptor preferring lossless (this archive's own rule, dimse/negotiation.py, passes over
    a lossy first choice for a lossless one) took Explicit VR LE: a lossy JPEG or JPEG 2000
    instance was decoded to be sent. The fallback carries, decoded, the instances whose
    own context was rejected (:func:`sub_operation_syntax`). An uncompressed stored syntax:
    one context, :func:`proposed_syntaxes`, as before.

    Room: the pairs are first counted one context each (as before, the first ``room`` pairs
    kept); a compressed pair is split into its own context and the fallback only while that
    leaves room for one context for every pair after it; the pairs it does not leave room
    for keep the single context [stored, Explicit VR LE, ...] (pynetdicom proposes at most
    128 contexts, PS3.8 9.3.2.2: odd presentation context IDs 1-255)."""
    pairs = list(dict.fromkeys(pairs))[:room]
    out: dict[tuple[str, tuple[str, ...]], None] = {}
    for i, (sop_class, ts) in enumerate(pairs):
        syntaxes = tuple(proposed_syntaxes(ts))
        later = len(pairs) - i - 1  # one context each at most
        split = [(sop_class, (ts,)), (sop_class, syntaxes[1:])]
        new = [cx for cx in dict.fromkeys(split) if cx not in out]
        if ts not in UNENCAPSULATED and len(syntaxes) > 1 and len(out) + len(new) + later <= room:
            out.update(dict.fromkeys(new))
        else:
            out.setdefault((sop_class, syntaxes), None)
    return [(sop_class, list(syntaxes)) for sop_class, syntaxes in out]


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

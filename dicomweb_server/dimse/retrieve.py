"""C-GET and C-MOVE matching: the instances an identifier names, found with the
same query as C-FIND (PS3.4 C.4.2.2, C.4.3.2: the unique keys of the levels down to
the Query/Retrieve Level select studies, series or instances)."""

from __future__ import annotations

from pydicom.dataset import Dataset

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

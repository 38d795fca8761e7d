"""Build QIDO-RS result objects (DICOM JSON) from index hits.

References
----------
PS3.18 §10.6.3 (response: default return attributes per level, Tables 10.6.3-3 to
10.6.3-5; attributes used for matching are returned; ``includefield``), PS3.18
§8.3.4.3 (``includefield=all``).
"""

from __future__ import annotations

from typing import Any

import orjson

from .attributes import BY_KEYWORD, DEFAULT_RETURN, RETRIEVE_URL, SERIES_LEVEL_TAGS, STUDY_LEVEL_TAGS, Level
from .matching import Query

_VR = {
    "ModalitiesInStudy": "CS",
    "SOPClassesInStudy": "UI",
    "NumberOfStudyRelatedSeries": "IS",
    "NumberOfStudyRelatedInstances": "IS",
    "NumberOfSeriesRelatedInstances": "IS",
}
_COMPUTED_LEVEL = {
    "ModalitiesInStudy": "study",
    "SOPClassesInStudy": "study",
    "NumberOfStudyRelatedSeries": "study",
    "NumberOfStudyRelatedInstances": "study",
    "NumberOfSeriesRelatedInstances": "series",
}
_BULK_KEYS = ("BulkDataURI", "InlineBinary")
_UPPER_LEVEL_TAGS = STUDY_LEVEL_TAGS | SERIES_LEVEL_TAGS
#: InstanceAvailability (0008,0056), Tables 10.6.3-3 and -5: everything indexed is on line.
_AVAILABILITY = ("00080056", {"vr": "CS", "Value": ["ONLINE"]})


def _computed_json(keyword: str, value: object) -> dict[str, Any] | None:
    """A computed attribute as DICOM JSON; None for a list with no values.

    ModalitiesInStudy of a study whose instances have no Modality (and so on) is
    left out of the answer rather than sent as an element without ``Value``: both
    are valid JSON (PS3.18 F.2.5), but OHIF 3.13's study list reads
    ``ModalitiesInStudy.Value.length`` whenever the element is present, and fails.
    """
    vr = _VR[keyword]
    if isinstance(value, list):
        return {"vr": vr, "Value": value} if value else None
    return {"vr": vr, "Value": [value]}


def _without_bulk(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not any(b in v for b in _BULK_KEYS)}


def build_result(
    query: Query,
    study_json: bytes,
    series_json: bytes | None,
    instance_json: bytes | None,
    computed: dict[str, object],
    retrieve_url: str,
    own_levels: tuple[Level, ...],
) -> dict[str, Any]:
    """One QIDO-RS result object.

    Parameters
    ----------
    query
        The parsed query (its level, matching keys and includefields).
    study_json, series_json, instance_json
        Stored DICOM JSON of the hit's levels (bytes); ``instance_json`` is the
        whole instance for instance searches.
    computed
        Computed attributes (ModalitiesInStudy, counts, ...).
    retrieve_url
        Absolute RetrieveURL (0008,1190) of the matched entity.
    own_levels
        The levels whose default attributes are returned: e.g. ``("series",)`` for
        ``/studies/{s}/series``, ``("study", "series")`` for ``/series``.
    """
    level = query.level
    # every attribute available for this hit: the stored JSON of its levels, then computed.
    # Study- and series-level attributes always come from the study and series records
    # (the instance that speaks for them), also in instance answers: what is returned is
    # what was matched.
    available: dict[str, Any] = {}
    if instance_json is not None:
        available.update((k, v) for k, v in orjson.loads(instance_json).items() if k not in _UPPER_LEVEL_TAGS)
    available.update(orjson.loads(study_json))
    if series_json is not None:
        available.update(orjson.loads(series_json))
    for kw, value in computed.items():
        if _COMPUTED_LEVEL[kw] == "study" or level != "study":
            tag = BY_KEYWORD[kw].tag
            element = _computed_json(kw, value)
            if element is None:
                available.pop(tag, None)  # never a stored copy of a derived attribute
            else:
                available[tag] = element
    if level != "series":
        available[_AVAILABILITY[0]] = _AVAILABILITY[1]

    if query.include_all:  # bulk data is never part of a QIDO-RS answer
        out = _without_bulk(available)
    else:
        out = {}
        wanted: list[str] = [t for lv in own_levels for t in DEFAULT_RETURN[lv]]
        wanted += [m.attribute.tag for m in query.matches]
        wanted += list(query.includefields)
        for tag in wanted:
            v = available.get(tag)
            if v is not None and not any(b in v for b in _BULK_KEYS):
                out[tag] = v
    out[RETRIEVE_URL] = {"vr": "UR", "Value": [retrieve_url]}
    result = dict(sorted(out.items()))
    return result

"""Modality Worklist Information Model - FIND as C-FIND SCP (PS3.4 Annex K).

The identifier (no Query/Retrieve Level: K.6.1.1) is matched against the worklist
entries of the index (store/worklist.py) by dicom/worklist.py: the key columns
filter in SQL first, then every key, sequence matching in the Scheduled Procedure
Step Sequence included, is checked on the entry's DICOM JSON. Each match is a pending
response holding the requested keys (K.4.1.3.2); the final response is Success, Cancel
after a C-CANCEL, 0xA900 for an identifier that does not fit the model, 0xC000 when the
index cannot answer (K.4.1.1.4, C.4.1.1.4).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from pydicom.dataset import Dataset

from ..dicom.worklist import WorklistError, matches, parse_identifier, prefilter, response
from ..store.base import Index
from . import status as S

log = logging.getLogger("dicomweb_server.dimse")


def find(index: Index, identifier: Dataset, max_results: int,
         default_charset: tuple[str, ...] | None = None) -> Iterator[Dataset]:
    """The response identifiers of ``identifier`` (at most ``max_results``; 0: all), in
    the order the entries were added; ``default_charset``: the archive's preferred Specific
    Character Set (dicom/charset.py). Raises :class:`WorklistError` for a bad identifier."""
    keys = parse_identifier(identifier)
    n = 0
    for entry in index.worklist(prefilter(keys)):
        if matches(keys, entry):
            yield response(entry, identifier, default_charset)
            n += 1
            if max_results and n >= max_results:
                return


def on_find(index: Index, event, identifier: Dataset | None, why: str = "",
            default_charset: tuple[str, ...] | None = None):
    """The listener's ``EVT_C_FIND`` handler for this model (``identifier``: None when it
    does not decode or is truncated, ``why`` then the Error Comment): pending responses, then
    the final status."""
    if identifier is None:
        yield S.dataset(S.QR_UNABLE_TO_PROCESS, why or "identifier cannot be decoded"), None
        return
    try:
        for ds in find(index, identifier, 0, default_charset):
            if event.is_cancelled:
                yield S.CANCEL, None
                return
            yield S.PENDING, ds
    except WorklistError as e:
        yield S.dataset(S.QR_IDENTIFIER_MISMATCH, str(e)), None
    except Exception as e:  # noqa: BLE001 - a failure status, never a dead association thread
        log.exception("worklist C-FIND failed")
        yield S.dataset(S.QR_UNABLE_TO_PROCESS, str(e)), None


__all__ = ["find", "on_find", "WorklistError"]

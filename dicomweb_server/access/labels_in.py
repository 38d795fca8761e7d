"""Labels on arrival: the labels a newly stored instance's study gets, decided before the
commit that indexes it and written by that commit (``InstanceRecord.labels``; Index.add
puts them in its own transaction, store/labels.py), so an instance is never durable
without them.

Two sources, one mechanism:

- the routes file's ``[[rules]]`` with ``labels`` (routing/rules.py): their ``match``
  (QIDO-RS matching keys on the instance's attributes, the one matching of the rules and
  searches), the calling AE title of the C-STORE (``SourceApplicationEntityTitle`` in
  the ``match``) and the STOW-RS door (``stow_prefix``: ``POST {prefix}/{door}/studies``);
- a client restricted to labels (access/rules.py) that stores a new study: its write label,
  unless the rules' labels already let it see the study.

A restricted client posting to a door whose labels it may not see is refused
(:func:`door_refusal`): a client stores only into labels it may write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .rules import Access

if TYPE_CHECKING:
    from ..dicom.instance import InstanceRecord
    from ..routing.rules import Arrival, Routes


def rule_labels(routes: Routes | None, record: InstanceRecord, arrival: Arrival) -> set[str]:
    """The labels the routes file's rules give ``record``'s study, arriving so."""
    if routes is None or not routes.labelling:
        return set()
    return routes.labels_for(record, arrival)


def with_write_label(labels: set[str], access: Access, new_study: bool) -> set[str]:
    """``labels`` and, for a new study a restricted client stores, its write label when
    ``labels`` alone would not let it see the study."""
    if new_study and access.write_label is not None and not access.filter.allows(labels):
        return labels | {access.write_label}
    return labels


def door_refusal(access: Access, labels: frozenset[str]) -> str | None:
    """Why a client may not store through a STOW-RS door giving ``labels`` (None: it may).
    An unrestricted client may; a restricted one only when it may see every label of the
    door (a label it may not see is one it may not write)."""
    if access.filter.unrestricted:
        return None
    refused = sorted(label for label in labels if not access.filter.allows({label}))
    if refused:
        return f"not authorized to store into label {', '.join(refused)}"
    return None

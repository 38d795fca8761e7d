"""The one object every Index read takes to say which studies it may see
(:class:`Filter`), and the rule for a label's name.

A filter is a conjunction of clauses; each clause is a set of labels of which the
study must carry at least one. The access rules give one clause (the labels the
identity may see), a QIDO-RS ``label`` query parameter another; :data:`UNRESTRICTED`
has none, and adds nothing to a query (no join, no condition). The back ends apply it
inside their query (store/sql.py :func:`label_condition`, store/memory.py), so a
search's count, paging offset and limit are those of the allowed studies only, and a
study not allowed is, to every read, a study that does not exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a label: lower-case letters, digits, ``.``, ``_``, ``-``; starts with a letter or digit; 1-64 characters
LABEL_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def validate_label(label: str) -> str:
    """``label`` when it is a valid label name, else ValueError (the caller answers 400)."""
    if not isinstance(label, str) or LABEL_RE.fullmatch(label) is None:
        raise ValueError(f"invalid label {label!r}: 1 to 64 of a-z 0-9 . _ -, starting with a letter or digit")
    return label


@dataclass(frozen=True, slots=True)
class Filter:
    """Which studies a read may see: every clause must hold (the study carries one of
    its labels). No clause: every study (:data:`UNRESTRICTED`)."""

    clauses: tuple[frozenset[str], ...] = ()

    @property
    def unrestricted(self) -> bool:
        return not self.clauses

    def narrow(self, labels) -> Filter:
        """This filter and "carries one of ``labels``" (an empty ``labels``: no study)."""
        return Filter((*self.clauses, frozenset(labels)))

    def allows(self, labels) -> bool:
        """Whether a study carrying ``labels`` passes (the in-memory index's match)."""
        return all(not clause.isdisjoint(labels) for clause in self.clauses)


UNRESTRICTED = Filter()


def only(labels) -> Filter:
    """The filter of an identity allowed to see the studies carrying one of ``labels``."""
    return UNRESTRICTED.narrow(labels)

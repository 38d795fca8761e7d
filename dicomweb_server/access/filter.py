"""The one object every Index read takes to say which studies it may see
(:class:`Filter`), and the rule for a label's name.

A filter is a conjunction of clauses; each clause is a set of labels of which the
study must carry at least one. The access rules give one clause (the labels the
identity may see), a QIDO-RS ``label`` query parameter another. A share link's filter
(api/shares.py) names its one study instead (``studies``), in the same query.
:data:`UNRESTRICTED` has neither, and adds nothing to a query (no join, no condition). The back ends apply it
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
    its labels), and, when ``studies`` is given, the study is one of them (by Study
    Instance UID: a share link's). No clause, no ``studies``: every study
    (:data:`UNRESTRICTED`)."""

    clauses: tuple[frozenset[str], ...] = ()
    studies: frozenset[str] | None = None

    @property
    def unrestricted(self) -> bool:
        return not self.clauses and self.studies is None

    def narrow(self, labels) -> Filter:
        """This filter and "carries one of ``labels``" (an empty ``labels``: no study)."""
        return Filter((*self.clauses, frozenset(labels)), self.studies)

    def allows(self, labels, study_uid: str | None = None) -> bool:
        """Whether a study carrying ``labels`` (of UID ``study_uid``) passes (the in-memory
        index's match)."""
        return (self.studies is None or study_uid in self.studies) and \
            all(not clause.isdisjoint(labels) for clause in self.clauses)


UNRESTRICTED = Filter()


def only(labels) -> Filter:
    """The filter of an identity allowed to see the studies carrying one of ``labels``."""
    return UNRESTRICTED.narrow(labels)


def only_study(study_uid: str) -> Filter:
    """The filter of a share link: that one study (by its StudyInstanceUID), nothing else."""
    return Filter(studies=frozenset({study_uid}))

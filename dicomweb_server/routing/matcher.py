"""Which routing rules can match an instance, found without trying each one.

A rule is a list of alternatives, each a conjunction of QIDO-RS matching keys
(routing/rules.py). An alternative holding a single-value or list-of-values key on a
single-valued attribute (``Modality = "CT"``, ``AccessionNumber = ["A1", "A2"]``)
can only match an instance whose value of that attribute is one of those values
(PS3.4 C.2.2.2.1: single value matching is an exact match), so the rules are indexed
by (attribute, value) of such a key. For an instance, the candidates are the rules
under its values plus the rules with an alternative that has no such key (a wildcard,
a range, no match at all); each candidate is then tried in full, in the order of the
routes file, so the answer is exactly that of trying every rule in turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..dicom.attributes import Kind
from ..dicom.instance import InstanceRecord
from ..dicom.matching import Match


class _Rule(Protocol):
    alternatives: tuple[tuple[Match, ...], ...]

    def matches(self, record: InstanceRecord) -> bool: ...


def _exact(conj: tuple[Match, ...]) -> list[Match]:
    """The exact matching keys of a conjunction: any of them can index it."""
    return [m for m in conj if m.type in ("single", "list") and m.attribute.kind is not Kind.MULTI]


def _slot(m: Match) -> tuple[str, str]:
    return m.attribute.level, m.attribute.keyword


class RuleIndex:
    """Rules by the (level, keyword, value) of an exact key of each alternative: the
    key whose values the fewest alternatives share (``Modality = "CT"`` in every rule
    would make every rule a candidate; an AccessionNumber of its own makes one)."""

    def __init__(self, rules: Sequence[_Rule]) -> None:
        self.rules = rules
        self._by_value: dict[tuple[str, str], dict[object, set[int]]] = {}
        self._always: set[int] = set()
        shared: dict[tuple[tuple[str, str], object], int] = {}
        for rule in rules:
            for conj in rule.alternatives:
                for m in _exact(conj):
                    for v in m.values:
                        shared[(_slot(m), v)] = shared.get((_slot(m), v), 0) + 1
        for i, rule in enumerate(rules):
            keys = [_exact(conj) for conj in rule.alternatives]
            if not keys or not all(keys):
                self._always.add(i)
                continue
            for exact in keys:
                k = min(exact, key=lambda m: sum(shared[(_slot(m), v)] for v in m.values))
                values = self._by_value.setdefault(_slot(k), {})
                for v in k.values:
                    values.setdefault(v, set()).add(i)

    def matching(self, record: InstanceRecord) -> list[_Rule]:
        """The rules matching ``record``, in their order."""
        candidates = set(self._always)
        for (level, keyword), values in self._by_value.items():
            value = getattr(record, level).get(keyword)
            if isinstance(value, (str, int)):
                candidates.update(values.get(value, ()))
        return [self.rules[i] for i in sorted(candidates) if self.rules[i].matches(record)]

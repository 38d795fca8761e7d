"""LOAD-01's order of measurement and its ratios (loadtests.load01 ``--rounds``): each step's
targets measured back to back, the order reversed on every other round, and ours / peer as
the geometric mean of the rounds' ratios, as loadtests.capacity does for LOAD-03."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .load01 import StepResult


def step_order(targets: list, steps: list[int], rounds: int) -> list[tuple[int, int, list]]:
    """(associations, round, targets in the order measured) for every step: each step's
    targets back to back, so that drifting load hits ours and the peers alike, and with
    ``rounds`` > 1 the step again at once with the order reversed (A B, B A): on this
    machine the server measured first of a pair gained up to ~1.2x
    (loadtests/results/stow-balance-2026-12-07/), an effect that cancels in
    :func:`ratio_rows`' geometric mean of the rounds."""
    return [(n, rnd, targets if rnd % 2 == 0 else targets[::-1]) for n in steps for rnd in range(rounds)]


def step_name(n: int, rnd: int, rounds: int) -> str:
    """A step's name in its SOP Instance UIDs and Patient ID (``_dataset``): the association
    count, and with several rounds ``n.round`` (``4.1``, ``4.2``): each round's instances
    are new ones (nothing is deleted before the last step)."""
    return str(n) if rounds == 1 else f"{n}.{rnd + 1}"


RATIO_HEADERS = ["Peer", "Step (assocs)", "ours ops/s", "peer ops/s", "ours / peer", "per round",
                 "ours CPU ms/image", "peer CPU ms/image"]


def ratio_rows(results: list[StepResult]) -> list[list]:
    """Per peer and step: images/s of ours and of the peer (means over the rounds) and
    ours / peer, the geometric mean of the rounds' ratios ("-" when a round is missing on
    either side: one round alone carries the order effect); server CPU per image, the means
    of ``Server CPU %`` / images/s."""
    def cpu_ms(r: StepResult) -> float | None:
        return (10 * r.server_cpu * r.seconds / r.operations
                if r.server_cpu is not None and r.operations and r.seconds else None)

    def mean(vals):
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    ours = {(r.associations, r.round): r for r in results if r.target == "ours"}
    out = []
    for peer in dict.fromkeys(r.target for r in results if r.target != "ours"):
        theirs = {(r.associations, r.round): r for r in results if r.target == peer}
        for n in dict.fromkeys(k[0] for k in ours):
            rounds = sorted({k[1] for k in ours if k[0] == n} | {k[1] for k in theirs if k[0] == n})
            pairs = [(ours.get((n, rnd)), theirs.get((n, rnd))) for rnd in rounds]
            rate = [tuple(r.operations / r.seconds if r is not None and r.seconds else None for r in pair)
                    for pair in pairs]
            ratios = [x / y for x, y in rate if x and y]
            ratio = math.prod(ratios) ** (1 / len(ratios)) if ratios and len(ratios) == len(pairs) else None
            out.append([peer, n, mean(x for x, _ in rate), mean(y for _, y in rate),
                        f"{ratio:.2f}x" if ratio else "-",
                        " / ".join(f"{x:.2f}" for x in ratios) if len(ratios) > 1 else "-",
                        mean(cpu_ms(a) for a, _ in pairs if a is not None),
                        mean(cpu_ms(b) for _, b in pairs if b is not None)])
    return out

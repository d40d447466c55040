"""Bands judged out of sample: how often a band held for public cases it was not fitted on, and the narrowest
band per class that holds for at least 80% of them.

A case is left out twice over: its prediction comes from constants fitted without its group (benchmarks.perf_fit),
and the band it is judged against is fitted without its group too. Leaving out by source asks how a new write-up's
runs land; leaving out by model family, how a new model's do. The band that serves a left-out case is the one
kiln.planner.bands would pick from the cases that remain (its most specific class with enough cases).

Bands come in two sets. For a model whose family the corpus holds, a class's band is judged leaving out each source;
for any other model, leaving out each family (its ratios come from constants fitted without the family too).
A class's band widens down a ladder until the share reaches the goal: the 10th-90th percentile of the ratios
measured / predicted, then wider percentiles, then the full range stretched about its geometric middle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kiln.perf.simulate import percentile

GOAL = 0.8
# A class judged on fewer left-out cases is left out of kiln's table: its share would be little more than anecdote,
# and a coarser class, judged on more, serves its plans.
MIN_JUDGED = 8
# From the 10th-90th percentile to the full range, then the full range stretched (in log space) by these factors.
PERCENTILES = (0.10, 0.08, 0.06, 0.04, 0.02, 0.0)
STRETCHES = (1.1, 1.25, 1.5)  # beyond, a band says too little to be worth the promise
LADDER: tuple[tuple[float, float], ...] = (*((q, 1.0) for q in PERCENTILES), *((0.0, s) for s in STRETCHES))


Kind = Literal["source", "family"]


@dataclass(frozen=True)
class HeldCase:
    """One public case's out-of-sample ratio, measured / predicted, for each way of leaving it out."""

    keys: tuple[str, ...]  # its band classes, most specific first (kiln.planner.bands.class_keys)
    source: str
    family: str
    by_source: float  # predicted by constants fitted without its source
    by_family: float | None  # ... without its model family; None where that fit has no figure

    def group(self, kind: Kind) -> str:
        return self.source if kind == "source" else self.family

    def ratio(self, kind: Kind) -> float | None:
        return self.by_source if kind == "source" else self.by_family


@dataclass(frozen=True)
class Coverage:
    held: int
    judged: int

    @property
    def share(self) -> float | None:
        return self.held / self.judged if self.judged else None


@dataclass(frozen=True)
class ClassBand:
    key: str
    kind: Kind  # left out by source (a model family the corpus knows) or by family (one it does not)
    low: float
    high: float
    cases: int
    step: int  # the rung of LADDER chosen
    after: Coverage
    before: Coverage  # at the first rung (the 10th-90th percentile)
    widths: tuple[float, float]  # high / low at the first rung and at the chosen one

    @property
    def meets(self) -> bool:
        return not self.after.judged or (self.after.share or 0.0) >= GOAL


def band(ratios: Sequence[float], step: int) -> tuple[float, float]:
    q, stretch = LADDER[step]
    low, high = percentile(ratios, q * 100), percentile(ratios, (1 - q) * 100)
    middle, half = math.sqrt(low * high), math.log(high / low) / 2 * stretch
    return middle * math.exp(-half), middle * math.exp(half)


def serving_key(case: HeldCase, remaining: Sequence[HeldCase], min_cases: int) -> str | None:
    """The class kiln would take the case's band from, were the remaining cases all it knew."""
    for key in case.keys:
        if sum(key in other.keys for other in remaining) >= min_cases:
            return key
    return None


def judge(cases: Sequence[HeldCase], kind: Kind, min_cases: int) -> dict[str, list[tuple[float, list[float]]]]:
    """Per serving class: each left-out case's ratio beside the ratios of the class's remaining cases."""
    out: dict[str, list[tuple[float, list[float]]]] = {}
    for case in cases:
        mine = case.ratio(kind)
        if mine is None:
            continue
        remaining = [o for o in cases if o.group(kind) != case.group(kind) and o.ratio(kind) is not None]
        key = serving_key(case, remaining, min_cases)
        if key is None:
            continue
        out.setdefault(key, []).append((mine, [r for o in remaining if key in o.keys
                                               for r in (o.ratio(kind),) if r is not None]))
    return out


def coverage(judged: list[tuple[float, list[float]]], step: int) -> Coverage:
    held = 0
    for ratio, others in judged:
        low, high = band(others, step)
        held += low <= ratio <= high
    return Coverage(held, len(judged))


def fit_bands(cases: Sequence[HeldCase], min_cases: int, kind: Kind = "source") -> list[ClassBand]:
    """Per class with enough cases, the first rung whose band holds for the goal's share of the cases left out
    (the widest rung where none does), with the band over all its cases at that rung."""
    judged = judge(cases, kind, min_cases)
    fitted = []
    for key in sorted({k for c in cases for k in c.keys}):
        ratios = [r for c in cases if key in c.keys for r in (c.ratio(kind),) if r is not None]
        if len(ratios) < min_cases:
            continue
        mine = judged.get(key, [])
        step = next((s for s in range(len(LADDER)) if (coverage(mine, s).share or 0.0) >= GOAL or not mine),
                    len(LADDER) - 1)
        low, high = band(ratios, step)
        first = band(ratios, 0)
        fitted.append(ClassBand(key, kind, low, high, len(ratios), step, coverage(mine, step), coverage(mine, 0),
                                (first[1] / first[0], high / low)))
    return fitted

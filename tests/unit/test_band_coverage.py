"""Bands judged on cases left out of their fit (benchmarks.band_coverage)."""

from __future__ import annotations

import random
import statistics

import pytest
from benchmarks.band_coverage import (
    GOAL,
    LADDER,
    HeldCase,
    band,
    coverage,
    fit_bands,
    judge,
    serving_key,
)

KEYS = ("hopper/dense/high", "hopper/dense", "*/dense/high", "*/dense", "*")


def cases(offsets: dict[str, float], per_source: int = 12, seed: int = 1) -> list[HeldCase]:
    """Each source's ratios about its own offset, with a little spread; sources named after distinct families."""
    rng = random.Random(seed)
    out = []
    for source, offset in offsets.items():
        for _ in range(per_source):
            ratio = offset * rng.uniform(0.95, 1.05)
            out.append(HeldCase(KEYS, source, f"family-of-{source}", ratio, ratio))
    return out


def test_the_first_rung_is_the_10th_to_90th_percentile() -> None:
    ratios = [random.Random(2).uniform(0.5, 1.5) for _ in range(40)]
    deciles = statistics.quantiles(ratios, n=10, method="inclusive")
    assert band(ratios, 0) == pytest.approx((deciles[0], deciles[-1]))


def test_each_rung_is_at_least_as_wide_as_the_one_before() -> None:
    ratios = [random.Random(3).lognormvariate(0, 0.3) for _ in range(30)]
    widths = [band(ratios, step)[1] / band(ratios, step)[0] for step in range(len(LADDER))]
    assert widths == sorted(widths)


def test_sources_that_agree_keep_the_narrowest_band() -> None:
    fitted = {b.key: b for b in fit_bands(cases({"a": 1.0, "b": 1.0, "c": 1.0}), min_cases=10)}
    assert fitted["hopper/dense/high"].step == 0
    assert fitted["hopper/dense/high"].meets


def test_a_source_off_from_the_others_widens_the_band_until_it_holds() -> None:
    held = cases({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.3})
    chosen = {b.key: b for b in fit_bands(held, 10)}["hopper/dense/high"]
    before = chosen.before.share
    assert before is not None and before < GOAL  # the 10th-90th percentile of a..d misses e, and e's misses them
    assert chosen.step > 0 and chosen.widths[1] > chosen.widths[0]
    assert chosen.meets and (chosen.after.share or 0) >= GOAL
    # No wider than it needs: the rung below misses the goal.
    judged = judge(held, "source", 10)[chosen.key]
    assert (coverage(judged, chosen.step - 1).share or 0) < GOAL <= (coverage(judged, chosen.step).share or 0)


def test_a_left_out_case_takes_its_band_from_the_class_the_remaining_cases_fill() -> None:
    specific = HeldCase(KEYS, "x", "f", 1.0, 1.0)
    coarse_only = [HeldCase(("hopper/dense", "*"), "y", "g", 1.0, 1.0)] * 10
    assert serving_key(specific, coarse_only, min_cases=10) == "hopper/dense"
    assert serving_key(specific, coarse_only[:9], min_cases=10) is None


def test_a_case_without_a_family_fit_is_judged_by_source_alone() -> None:
    held = [HeldCase(c.keys, c.source, c.family, c.by_source, None) for c in cases({"a": 1.0, "b": 1.0, "c": 1.0})]
    by_source = {b.key: b for b in fit_bands(held, 10, "source")}["hopper/dense/high"]
    assert by_source.after.judged == len(held)
    assert fit_bands(held, 10, "family") == []  # no ratio of a fit without the family: no band to promise

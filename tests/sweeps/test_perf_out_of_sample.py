"""The performance engine judged on public measurements it was not fitted on: its fitted constants refitted
without each source and without each model family, each held-out case predicted (`python -m
benchmarks.perf_model_vs_public --out-of-sample` runs the full grid)."""

from __future__ import annotations

import pytest
from benchmarks.perf_fit import combos, out_of_sample
from benchmarks.perf_model_vs_public import CASES, lengths, load_cases
from tests.unit.test_perf_corpus import MIN_CASES

from kiln.wiring import Kiln

# A small grid keeps this quick; `python -m benchmarks.perf_model_vs_public --out-of-sample` runs the whole grid
# (benchmarks.perf_fit.GRID) and prints the figures kiln reports.
TEST_GRID = {"compute_efficiency": (0.25, 0.3), "moe_compute_efficiency": (0.2,), "overhead_per_rank_s": (0.0,)}
MIN_LOSO_WITHIN_25 = 0.62  # measured 65% with this grid (the full grid: 55%, its finer choice fits noise)
MIN_LOFO_WITHIN_25 = 0.62  # measured 65% (full grid 54%)
MAX_LOSO_MEDIAN_ERROR = 0.23  # measured 21% (full grid 24%)


def test_kilns_engine_holds_its_accuracy_out_of_sample(kiln: Kiln, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [{**c, "workload": lengths(c)} for c in load_cases(CASES)]
    results = out_of_sample(kiln, cases, combos(TEST_GRID))
    with capsys.disabled():
        print("\n  " + "; ".join(f"{name} {within:.0%} within ±25%, median |error| {median:.0%} ({n})"
                                 for name, (_, (within, median, n)) in results.items()))
    loso, lofo = results["leave-one-source-out"][1], results["leave-one-family-out"][1]
    assert loso[2] >= MIN_CASES and lofo[2] >= MIN_CASES
    assert loso[0] >= MIN_LOSO_WITHIN_25 and lofo[0] >= MIN_LOFO_WITHIN_25
    assert loso[1] <= MAX_LOSO_MEDIAN_ERROR
    # Out of sample can be no better than the fit on every case.
    assert loso[0] <= results["in-sample"][1][0] + 1e-9 or loso[1] >= results["in-sample"][1][1] - 1e-9

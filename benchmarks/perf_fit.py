"""Fit kiln's roofline constants (data/planner.yaml `roofline`) to the public cases, and print the fit beside
the constants in use.

Run: .venv/bin/python -m benchmarks.perf_fit
A grid over the dense compute efficiency (Hopper's and the rest, and Ampere's) and the host's cost per
tensor-parallel rank (the routed experts' efficiency comes from vLLM's MoE kernel timed on GPUs, data/planner.yaml,
not from this fit); the score is the share of cases within ±25%, then the median absolute error (the measures of
benchmarks.perf_model_vs_public). `out_of_sample` refits the grid without each source and each model family. The
grid is coarse on purpose: the cases are mixed, and a finer grid would fit their noise.
"""

from __future__ import annotations

import itertools
import statistics
import sys
from typing import Any

from benchmarks.public_cases import WITHIN, evaluate, load_cases
from kiln.setup.types import Constants
from kiln.wiring import Kiln

GRID: dict[str, tuple[Any, ...]] = {
    "compute_efficiency": (0.25, 0.3, 0.4),
    "overhead_per_rank_s": (0.0, 0.0005, 0.0015),
    "compute_efficiency_by_architecture": ({"ampere": 0.45}, {"ampere": 0.6}, {"ampere": 0.75}),
}


def score(kiln: Kiln, cases: list[dict[str, Any]]) -> tuple[float, float, int]:
    catalog = kiln.catalog()
    errors = [e for e in (evaluate(kiln, c, catalog).error("kiln") for c in cases) if e is not None]
    if not errors:
        return 0.0, float("inf"), 0
    return (sum(abs(e) <= WITHIN for e in errors) / len(errors), statistics.median(abs(e) for e in errors),
            len(errors))


def with_roofline(kiln: Kiln, values: dict[str, float]) -> Kiln:
    data = {**kiln.constants.data, "roofline": {**kiln.constants.data["roofline"], **values}}
    return Kiln(kiln.gpus, Constants(data), kiln.profile_dir)


Errors = list[float | None]  # per case: predicted / measured - 1, None where the case is not modeled


def family(model: str) -> str:
    """A model family: the architecture line a fit could learn from its relatives (gpt-oss, qwen3, deepseek...)."""
    return "gpt-oss" if model.startswith("gpt-oss") else model.split("-", maxsplit=1)[0]


def combos(grid: dict[str, tuple[Any, ...]] = GRID) -> list[dict[str, Any]]:
    return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]


def error_matrix(kiln: Kiln, cases: list[dict[str, Any]], grid: list[dict[str, Any]]) -> list[Errors]:
    """Each grid point's error on every case."""
    catalog = kiln.catalog()
    return [[evaluate(with_roofline(kiln, values), c, catalog).error("kiln") for c in cases] for values in grid]


def _rank(errors: Errors, keep: list[bool]) -> tuple[float, float]:
    kept = [abs(e) for e, k in zip(errors, keep, strict=True) if k and e is not None]
    if not kept:
        return 0.0, float("inf")
    return sum(e <= WITHIN for e in kept) / len(kept), -statistics.median(kept)


def best_point(matrix: list[Errors]) -> int:
    """The grid point that fits all the cases best."""
    everyone = [True] * len(matrix[0])
    return max(range(len(matrix)), key=lambda i: _rank(matrix[i], everyone))


def fitted_without(matrix: list[Errors], groups: list[str]) -> list[int]:
    """Per case, the grid point that fits best without the case's whole group."""
    chosen = [0] * len(groups)
    for group in sorted(set(groups)):
        keep = [g != group for g in groups]
        best = max(range(len(matrix)), key=lambda i: _rank(matrix[i], keep))
        for j, g in enumerate(groups):
            if g == group:
                chosen[j] = best
    return chosen


def held_out(matrix: list[Errors], groups: list[str]) -> Errors:
    """Every case predicted by the grid point that fits best without the case's whole group."""
    return [matrix[point][j] for j, point in enumerate(fitted_without(matrix, groups))]


def stats(errors: Errors) -> tuple[float, float, int]:
    found = [abs(e) for e in errors if e is not None]
    if not found:
        return 0.0, float("inf"), 0
    return sum(e <= WITHIN for e in found) / len(found), statistics.median(found), len(found)


def out_of_sample(kiln: Kiln, cases: list[dict[str, Any]], grid: list[dict[str, Any]]
                  ) -> dict[str, tuple[Errors, tuple[float, float, int]]]:
    """In-sample (the best grid point on all cases), leave-one-source-out and leave-one-family-out errors."""
    return out_of_sample_from(error_matrix(kiln, cases, grid), cases)


def out_of_sample_from(matrix: list[Errors], cases: list[dict[str, Any]]
                       ) -> dict[str, tuple[Errors, tuple[float, float, int]]]:
    sources = [str(c.get("source_group") or c["source"]) for c in cases]
    families = [family(c["model"]) for c in cases]
    everyone = matrix[best_point(matrix)]
    loso, lofo = held_out(matrix, sources), held_out(matrix, families)
    return {name: (errs, stats(errs)) for name, errs in
            (("in-sample", everyone), ("leave-one-source-out", loso), ("leave-one-family-out", lofo))}


def main() -> int:
    kiln = Kiln.create()
    cases = load_cases()
    current = {k: kiln.constants.get("roofline", k) for k in GRID}
    base = score(kiln, cases)
    results = []
    for combo in itertools.product(*GRID.values()):
        values = dict(zip(GRID, combo, strict=True))
        results.append((score(with_roofline(kiln, values), cases), values))
    results.sort(key=lambda r: (-r[0][0], r[0][1]))
    print(f"in use: {current}: {base[0]:.0%} within ±25%, median |error| {base[1]:.0%} ({base[2]} cases)")
    for (within, median, n), values in results[:5]:
        print(f"fit:    {values}: {within:.0%} within ±25%, median |error| {median:.0%} ({n} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

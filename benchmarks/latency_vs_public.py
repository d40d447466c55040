"""How well kiln's engine predicts TTFT and TPOT under load beside the public measurements: the figures a capacity
at a latency budget rests on (kiln.perf.capacity). Medians, as the sources publish them, case by case:
- in sample: the engine's constants as fitted on every case (benchmarks.perf_fit's grid, best on output tokens/s);
- out of sample: each case predicted by the constants fitted without its source, or without its model family.
Goals (the capacity issue): 70% of the cases within ±30% for TPOT and within ±50% for TTFT.

Run: .venv/bin/python -m benchmarks.latency_vs_public [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from benchmarks.perf_fit import best_point, combos, family, fitted_without, with_roofline
from benchmarks.public_cases import Row, evaluate, lengths, load_cases
from kiln.wiring import Kiln

GOALS = {"tpot": 0.30, "ttft": 0.50}


def latency_error(row: Row, what: str) -> float | None:
    predicted, measured = ((row.kiln_tpot_ms, row.measured_tpot_ms) if what == "tpot"
                           else (row.kiln_ttft_ms, row.measured_ttft_ms))
    if predicted is None or not measured:
        return None
    return float(predicted / measured - 1)


def summarize(errors: list[float | None], within: float) -> dict[str, Any]:
    found = [abs(e) for e in errors if e is not None]
    if not found:
        return {"cases": 0}
    signed = [e for e in errors if e is not None]
    return {"cases": len(found), "within": round(sum(e <= within for e in found) / len(found), 3),
            "median_abs_error": round(statistics.median(found), 3),
            "median_signed_error": round(statistics.median(signed), 3)}


def report(kiln: Kiln) -> dict[str, Any]:
    cases = [{**c, "workload": lengths(c)} for c in load_cases()]
    grid = combos()
    catalog = kiln.catalog()
    rows = [[evaluate(with_roofline(kiln, values), c, catalog) for c in cases] for values in grid]
    matrix = [[r.error("kiln") for r in point] for point in rows]
    fits = {"in-sample": [best_point(matrix)] * len(cases),
            "leave-one-source-out": fitted_without(matrix, [str(c.get("source_group") or c["source"])
                                                            for c in cases]),
            "leave-one-family-out": fitted_without(matrix, [family(c["model"]) for c in cases])}
    out: dict[str, Any] = {}
    for name, points in fits.items():
        chosen = [rows[p][j] for j, p in enumerate(points)]
        out[name] = {what: summarize([latency_error(r, what) for r in chosen], GOALS[what]) for what in GOALS}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = report(Kiln.create())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'fit':22} {'metric':6} {'cases':>5} {'within':>14} {'median |err|':>12} {'median err':>10}")
    for name, metrics in result.items():
        for what, s in metrics.items():
            if not s["cases"]:
                print(f"{name:22} {what:6} {0:>5}")
                continue
            goal = f"{s['within']:.0%} (±{GOALS[what]:.0%})"
            print(f"{name:22} {what:6} {s['cases']:>5} {goal:>14} {s['median_abs_error']:>12.0%} "
                  f"{s['median_signed_error']:>+10.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

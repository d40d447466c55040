"""Fit the CPU backend's step-time constants (data/planner.yaml `cpu`) to one `kiln bench` run of tiny-cpu, and
judge them on another run they were not fitted on.

Run: .venv/bin/python -m benchmarks.cpu_fit [FIT.json] [JUDGE.json]
The runs (tests/data/cpu_bench/) are `kiln bench` levels measured on a 2-core machine with `kiln up` serving tiny-cpu
on two instances. For each constant set of a grid, the engine predicts every level (output tokens/s, TTFT p50, TPOT
p50) for the plan kiln makes on this machine; the score is the median |log(predicted / measured)|. Prints the
constants in use and the best of the grid, each with its error on the fitted run and on the held-out run.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from kiln.bench.predicted import Level, predict_levels
from kiln.setup.types import Constants, Refusal
from kiln.wiring import Kiln

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "cpu_bench"
# Coarse on purpose: with 0.05 ms per layer and 0.1 ms per sequence added it fits the longer run closer (1.06x) and
# predicts the held-out one worse (1.37x).
GRID: dict[str, tuple[float, ...]] = {
    "compute_efficiency": (0.17, 0.35, 0.7, 1.0),
    "step_overhead_s": (0.0015, 0.0025, 0.0035),
    "overhead_per_layer_s": (0.0001, 0.00015, 0.00025),
    "overhead_per_seq_s": (0.0002, 0.0004, 0.0006),
}


def with_cpu(kiln: Kiln, values: dict[str, float]) -> Kiln:
    data = {**kiln.constants.data, "cpu": {**kiln.constants.data["cpu"], **values}}
    return Kiln(kiln.gpus, Constants(data), kiln.profile_dir)


def errors(kiln: Kiln, run: dict[str, Any]) -> list[float]:
    """log(predicted / measured) of every level's output tokens/s, TTFT p50 and TPOT p50."""
    levels = run["levels"]
    predicted = predict_levels(kiln.machine(None), kiln.catalog().get("tiny-cpu"), run["instances"],
                               [Level(lv["input_len"], lv["output_len"], lv["concurrency"], lv["completed"])
                                for lv in levels], kiln.constants)
    if isinstance(predicted, Refusal):
        raise SystemExit(f"no plan: {predicted.reason}")
    out = []
    for level, f in zip(levels, predicted[1], strict=True):
        out += [math.log(f.output_tokens_per_s / level["output_tokens_per_s"]),
                math.log(f.ttft_ms["p50"] / level["ttft_ms"]["p50"]),
                math.log(f.tpot_ms["p50"] / level["tpot_ms"]["p50"])]
    return out


def score(errs: list[float]) -> float:
    return statistics.median(abs(e) for e in errs)


def main(argv: list[str]) -> int:
    fit_path = Path(argv[0]) if argv else RUNS / "tiny-cpu-256-128.json"
    judge_path = Path(argv[1]) if len(argv) > 1 else RUNS / "tiny-cpu-32-16.json"
    try:
        fit_run, judge_run = (json.loads(p.read_text()) for p in (fit_path, judge_path))
    except (OSError, ValueError) as exc:
        print(f"cannot read a run: {exc}; give two results files of `kiln bench` with cores and instances, as in "
              f"{RUNS}")
        return 2
    kiln = Kiln.create()
    cores = kiln.machine(None).host.cpu_count
    if cores != fit_run["cores"]:
        print(f"these runs were measured on {fit_run['cores']} cores; this machine has {cores}: the plans differ")
        return 2
    current = {k: kiln.constants.get("cpu", k) for k in GRID}
    scored = []
    for combo in itertools.product(*GRID.values()):
        values = dict(zip(GRID, combo, strict=True))
        scored.append((score(errors(with_cpu(kiln, values), fit_run)), values))
    scored.sort(key=lambda s: s[0])
    best = scored[0][1]
    print(f"fitted on {fit_path.name}, judged on {judge_path.name} (median |log(predicted / measured)| of output "
          "tok/s, TTFT p50 and TPOT p50 over the levels, as a factor)")
    for name, values in (("in use", current), ("best fit", best)):
        fitted, held = score(errors(with_cpu(kiln, values), fit_run)), score(errors(with_cpu(kiln, values), judge_run))
        print(f"{name:9} {values}: fitted run {math.exp(fitted):.2f}x, held-out run {math.exp(held):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

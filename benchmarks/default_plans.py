"""The default plan (no workload: the `serve` preset) of every catalog profile on the GPU machine fixtures, with
the engine's predicted capacity at the preset's budget (requests/s and streams), the output at that load, its band,
and how long the search took.

Run: .venv/bin/python -m benchmarks.default_plans [--machines h100x1,h100x8,...]
"""

from __future__ import annotations

import argparse
import sys
import time

from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.setup.types import Plan
from kiln.wiring import Kiln

MACHINES = ("h100x1", "h100x8", "h200x8", "b300x8", "l40s")


def label(plan: Plan) -> str:
    e, spec = plan.engine, plan.engine.speculative_config
    split = f"{len(plan.instances)}xTP{e.tensor_parallel_size}" + (
        f"xDP{e.data_parallel_size}" if e.data_parallel_size > 1 else "") + ("+EP" if e.enable_expert_parallel else "")
    return f"{split} {plan.quantization}" + (f" {spec['method']} k={spec['num_speculative_tokens']}" if spec else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", default=",".join(MACHINES))
    args = parser.parse_args(argv)
    kiln = Kiln.create()
    catalog = kiln.catalog()
    print(f"{'machine':8} {'profile':32} {'plan':36} {'req/s':>7} {'streams':>7} {'output tok/s':>12}  "
          f"{'band':>19}  {'search':>7}")
    for name in args.machines.split(","):
        machine = kiln.machine(name)
        for profile_name in catalog.names():
            profile = catalog.get(profile_name)
            if profile.cpu_only:
                continue
            started = time.perf_counter()
            plan = make_plan(machine, profile, Choice(), kiln.constants)
            took = time.perf_counter() - started
            if not isinstance(plan, Plan):
                print(f"{name:8} {profile_name:32} refused: {plan.reason[:70]}")
                continue
            p, cap = plan.predicted, plan.predicted.capacity or {}
            band = f"{p.band.low:,.0f}-{p.band.high:,.0f}" if p.band else "-"
            rate = f"{cap['requests_per_s']:,.2f}" if cap else "-"
            streams = f"{cap['streams']:,}" if cap else "-"
            output = p.output_tokens_per_s or 0
            print(f"{name:8} {profile_name:32} {label(plan):36} {rate:>7} {streams:>7} {output:>12,.0f}  {band:>19}  "
                  f"{took:>6.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

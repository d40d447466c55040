"""Data-parallel ranks stepping together: kiln's pricing of one rank against the others (kiln.perf.lockstep)
beside stepping every rank one by one, and beside ranks that step alone, for the default plans that run a MoE
model over data-parallel ranks, at the streams each plan's capacity names, in one run.

Run: .venv/bin/python -m benchmarks.lockstep_vs_every_rank [--machines h200x8,b300x8] [--json]
"every rank" schedules each rank's own requests (its outputs in its own order), every step as long as the
slowest rank's; kiln simulates one rank and draws the others from its recent steps; "alone" is one rank as if it
stepped by itself. Figures are output tokens/s of the whole instance and TPOT p90.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from kiln.choice.schema import Choice
from kiln.cli.output import table
from kiln.perf.capacity import streams_load
from kiln.perf.predict import STEADY_SPREAD, drafting, kiln_steps, limits, loads, lockstep_ranks
from kiln.perf.simulate import Drafting, Engine, Limits, Load, Outcome, percentile, simulate
from kiln.perf.steps import StepModel
from kiln.perf.workload import spread_lengths
from kiln.planner.search import default_workload, make_plan
from kiln.setup.types import Plan
from kiln.wiring import Kiln


def every_rank_stepped(model: StepModel, limits: Limits, loads: list[Load], drafts: Drafting | None = None
                       ) -> list[Outcome]:
    """The reference: every rank scheduled at every step, the step as long as the slowest rank's, each rank's
    step seeing all ranks' tokens."""
    engines = [Engine(model, limits, load, drafts) for load in loads]
    for e in engines:
        e.start()
    now = 0.0
    while any(e.out.completed < e.sent for e in engines):
        planned = []
        for e in engines:
            e.t = now
            planned.append(e.prepare())
        running = [p for p in planned if p is not None]
        if not running:
            now = min(e.future[0].arrival for e in engines if e.future)
            continue
        together = sum(step.tokens for step, _ in running)
        dt = max(model.seconds(replace(step, ranks_tokens=together)) for step, _ in running)
        for e, p in zip(engines, planned, strict=True):
            if p is not None:
                e.advance(dt, p[1])
        now += dt
    for e in engines:
        e.out.duration_s = now
    return [e.out for e in engines]


def _figures(outcomes: list[Outcome], ranks: int) -> tuple[float, float]:
    """Output tokens/s of `ranks` ranks (the outcomes given, or one standing for all) and TPOT p90 in ms."""
    duration = max(o.duration_s for o in outcomes)
    output = sum(o.output_tokens for o in outcomes) * (ranks if len(outcomes) == 1 else 1)
    return output / duration, percentile([t * 1000 for o in outcomes for t in o.tpot_s], 90)


def compare(kiln: Kiln, machine_name: str, profile_name: str) -> dict[str, Any] | None:
    machine, profile = kiln.machine(machine_name), kiln.catalog().get(profile_name)
    plan = make_plan(machine, profile, Choice(), kiln.constants)
    if not isinstance(plan, Plan) or lockstep_ranks(plan) <= 1:
        return None
    ranks, c = lockstep_ranks(plan), kiln.constants
    streams = int((plan.predicted.capacity or {}).get("streams") or 0) or plan.engine.max_num_seqs
    workload = streams_load(default_workload(), streams)
    one = loads(workload, ranks, c)[0]
    own = [replace(one, output_lens=spread_lengths(one.output_len, one.num_prompts, STEADY_SPREAD, seed=r))
           for r in range(ranks)]
    steps, lim, drafts = kiln_steps(plan, machine, profile, c), limits(plan), drafting(plan, c)
    alone = _figures([simulate(steps, lim, one, drafts)], ranks)
    priced = _figures([simulate(steps, lim, one, drafts, ranks=ranks)], ranks)
    every = _figures(every_rank_stepped(steps, lim, own, drafts), ranks)
    return {"machine": machine_name, "profile": profile_name, "plan": plan.layout(), "streams": streams,
            "alone": alone, "kiln": priced, "every_rank": every,
            "kiln_over_every_rank": (priced[0] / every[0], priced[1] / every[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", default="h200x8,b300x8")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    kiln = Kiln.create()
    rows = [row for m in args.machines.split(",") for name in kiln.catalog().names()
            if (row := compare(kiln, m, name)) is not None]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(table(["machine", "profile", "plan", "streams", "alone: tok/s, TPOT p90", "kiln", "every rank",
                 "kiln / every rank"],
                [[r["machine"], r["profile"], r["plan"], str(r["streams"]),
                  *(f"{v[0]:,.0f}, {v[1]:.1f} ms" for v in (r["alone"], r["kiln"], r["every_rank"])),
                  f"{r['kiln_over_every_rank'][0]:.3f}, {r['kiln_over_every_rank'][1]:.3f}"] for r in rows]))
    ratios = [r["kiln_over_every_rank"][0] for r in rows]
    if ratios:
        print(f"output, kiln over stepping every rank: {min(ratios):.3f} to {max(ratios):.3f} over {len(rows)} plans")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Choosing a setup by its capacity at the workload's budget: the most requests/s while TTFT and TPOT hold. Pure.

Each setup's capacity is a search of simulated loads (kiln.perf.capacity), so the planner bounds the work:
- setups are tried in order of the requests/s they complete when every request is sent at once, more than any of
  them carries within a budget: one whose bound is below the best capacity found is skipped;
- one probe at the best setup's streams settles most others: a setup that misses the budget there while completing
  fewer requests/s cannot beat it (fewer streams complete fewer still).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kiln.perf.capacity import Capacity, capacity, ranking, streams_load
from kiln.perf.predict import Forecast, forecast
from kiln.perf.steps import StepModel
from kiln.perf.workload import Workload
from kiln.planner.explain import SHOWN, Option
from kiln.setup.types import Constants, Plan

StepsFor = Callable[[Plan], StepModel]
CAPACITY_TIE = 0.02  # requests/s this close are a tie, well within the model's error; output per GPU breaks it


@dataclass(frozen=True)
class Carried:
    option: Option  # its forecast: every request at once (the bound)
    capacity: Capacity


def layout_of(plan: Plan) -> tuple[object, ...]:
    """What a close call is between: precision, split and drafts on or off (not draft lengths or batch limits)."""
    e = plan.engine
    return (plan.quantization, e.tensor_parallel_size, e.data_parallel_size, len(plan.instances),
            bool(e.speculative_config))


def slots(plan: Plan) -> int:
    return plan.engine.max_num_seqs * plan.engine.schedulers * len(plan.instances)


def capacity_of(plan: Plan, workload: Workload, gpus: int, c: Constants, steps: StepModel,
                with_rate: bool = True, streams_found: Capacity | None = None, start: int = 1,
                known: Mapping[int, Forecast] | None = None) -> Capacity:
    return capacity(lambda w: forecast(plan, w, steps, c), workload, gpus, slots(plan), with_rate=with_rate,
                    streams_found=streams_found, start=start, known=known)


def carried(options: Sequence[Option], workload: Workload, gpus: int, c: Constants, steps_for: StepsFor
            ) -> list[Carried]:
    """The capacity of every setup that could beat the best found, best bound first (streams only)."""
    found: list[Carried] = []
    for option in sorted(options, key=lambda o: -o.forecast.requests_per_s):
        leader = max(found, key=lambda x: ranking(x.capacity), default=None)
        best = ranking(leader.capacity)[0] if leader else 0.0
        if option.forecast.requests_per_s < best:
            continue
        plan = option.plan
        start, known = max((x.capacity.streams for x in found), default=1), {}  # the search starts near the answers
        if leader is not None and leader.capacity.met:
            start = leader.capacity.streams
            there = forecast(plan, streams_load(workload, start), steps_for(plan), c)
            if not there.meets(workload) and there.requests_per_s <= best:
                continue
            known = {start: there}
        found.append(Carried(option, capacity_of(plan, workload, gpus, c, steps_for(plan), with_rate=False,
                                                 start=start, known=known)))
    return sorted(found, key=lambda x: ranking(x.capacity), reverse=True)


def settle(met: Sequence[Carried]) -> Carried:
    """Among setups within CAPACITY_TIE of the most requests/s, the one with the most output per GPU."""
    top = ranking(met[0].capacity)[0]
    close = [x for x in met if ranking(x.capacity)[0] >= top * (1 - CAPACITY_TIE)]
    return max(close, key=lambda x: x.capacity.tokens_per_s_per_gpu)


def at_one_stream(options: Sequence[Option], workload: Workload, c: Constants, steps_for: StepsFor
                  ) -> list[Option]:
    """Each setup with a single request in flight: how close it comes when none carries any load."""
    alone = streams_load(workload, 1)
    return [Option(o.plan, forecast(o.plan, alone, steps_for(o.plan), c)) for o in options]


def explain_capacity(best: Carried, ranked: Sequence[Carried], burst_best: Carried | None,
                     workload: Workload, predicted: int) -> list[str]:
    cap = best.capacity
    lines = [f"Workload: {workload.shape()}; {workload.budget()}.",
             f"Chosen for the most requests/s within the budget: {best.option.label}: {cap.headline()}."]
    rate = ranking(cap)[0]
    others, shown = [], {layout_of(best.option.plan)}
    for x in ranked:  # the best of each other split, precision and drafts on or off
        if layout_of(x.option.plan) not in shown:
            shown.add(layout_of(x.option.plan))
            others.append(x)
    for x in others[:SHOWN]:
        theirs = ranking(x.capacity)[0]
        verdict = (f"{theirs / rate:.2f}x the requests/s ({x.capacity.streams:,} streams)" if x.capacity.met and rate
                   else "misses the budget with one request alone")
        lines.append(f"Beaten: {x.option.label}: {verdict}.")
    rest = len(ranked) - len(others[:SHOWN]) - 1
    if rest > 0:
        lines.append(f"... and {rest} more searched: other batch limits and draft lengths of these.")
    if predicted > len(ranked):
        lines.append(f"{predicted - len(ranked)} more setups not searched: with every request sent at once they "
                     f"complete fewer requests/s than the chosen one carries within the budget, or at the streams "
                     f"it carries they miss the budget while completing fewer requests/s.")
    if burst_best is not None and burst_best.option.plan is not best.option.plan:
        b, theirs = burst_best, ranking(burst_best.capacity)[0]
        most, ours = b.option.forecast.output_tokens_per_s, best.option.forecast.output_tokens_per_s
        gain = f" ({(rate / theirs - 1) * 100:+.0f}% for the chosen one)." if theirs else "."
        lines.append(f"With every request sent at once, {b.option.label} gives the most output ({most:,.0f} tok/s "
                     f"against {ours:,.0f}), but within the budget it carries {theirs:,.2f} requests/s against "
                     f"{rate:,.2f}{gain}")
    return lines


def burst(workload: Workload) -> Workload:
    """The workload's requests all sent at once: each setup's most requests/s, the bound of its capacity. Without
    the TPOT budget, which only sizes smaller batch limits: at the capacity's load those queue requests (the search
    itself finds the load whose tokens are fast enough)."""
    return replace(workload, request_rate=math.inf, concurrency=None, tpot_ms=None, min_tokens_per_s_per_user=None)

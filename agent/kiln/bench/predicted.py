"""kiln's prediction of a sweep's levels (the plan for a profile on a machine, its instances simulated at each
level's request shape, concurrency and prompts) and of its capacity within a budget. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.perf.capacity import Capacity
from kiln.perf.predict import Forecast, forecast, kiln_steps
from kiln.perf.workload import Workload
from kiln.planner.by_capacity import capacity_of
from kiln.planner.search import capacity_band, capacity_report, make_plan
from kiln.profiles.schema import Profile
from kiln.setup.types import Constants, Plan, Refusal


@dataclass(frozen=True)
class Level:
    input_len: int
    output_len: int
    concurrency: int
    prompts: int


def predict_levels(machine: Machine, profile: Profile, instances: int | None, levels: Sequence[Level],
                   c: Constants) -> tuple[Plan, list[Forecast]] | Refusal:
    """The plan (with `instances`, else kiln's choice) and each level's forecast with kiln's engine."""
    plan = make_plan(machine, profile, Choice(instances=instances), c)
    if isinstance(plan, Refusal):
        return plan
    steps = kiln_steps(plan, machine, profile, c)
    return plan, [forecast(plan, Workload(lv.input_len, lv.output_len, concurrency=lv.concurrency,
                                          num_prompts=lv.prompts), steps, c) for lv in levels]


@dataclass(frozen=True)
class PredictedCapacity:
    plan: Plan
    capacity: Capacity
    report: dict[str, Any]  # the plan's `capacity` figures, band included, as `kiln plan --json` prints them


def predict_capacity(machine: Machine, profile: Profile, instances: int | None, workload: Workload,
                     c: Constants) -> PredictedCapacity | Refusal:
    """The plan (with `instances`, else kiln's choice) and its capacity within `workload`'s budget."""
    plan = make_plan(machine, profile, Choice(instances=instances), c)
    if isinstance(plan, Refusal):
        return plan
    steps = kiln_steps(plan, machine, profile, c)
    arch = machine.gpus[0].architecture.value if machine.gpus else "cpu"
    cap = capacity_of(plan, workload, max(sum(len(i.gpus) for i in plan.instances), 1), c, steps)
    return PredictedCapacity(plan, cap, capacity_report(cap, capacity_band(plan, profile, workload, cap, c, arch)))

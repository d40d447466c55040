"""Choosing a plan from predictions: every setup the machine allows, served the user's workload in simulation,
the best that meets the latency budget chosen. Pure: the engine's step times come in as a function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.perf.predict import forecast
from kiln.perf.steps import StepModel
from kiln.perf.workload import Workload
from kiln.planner.explain import Option, explain
from kiln.planner.plan import make_plan
from kiln.planner.types import Constants, Plan, Refusal
from kiln.planner.variants import choices, variants
from kiln.profiles.schema import Profile

StepsFor = Callable[[Plan], StepModel]
LOOSER = 1.05  # a suggested budget leaves this margin over the closest setup's prediction
OUTPUT_TIE = 0.02  # outputs this close are a tie, well within the model's error; faster tokens break it


@dataclass(frozen=True)
class Choosing:
    chosen: Option
    alternatives: tuple[Option, ...]  # the others that were predicted, best first
    explanation: tuple[str, ...]


def _score(option: Option, objective: str) -> tuple[float, float]:
    f = option.forecast
    if objective == "latency":
        return (-f.tpot_ms["p50"], f.output_tokens_per_s)
    return (f.output_tokens_per_s, -f.tpot_ms["p50"])


def _settle_ties(meeting: Sequence[Option], objective: str) -> Option:
    """Among setups within the model's error of the most output, the one whose tokens come fastest."""
    if objective == "latency":
        return meeting[0]
    top = meeting[0].forecast.output_tokens_per_s
    close = [o for o in meeting if o.forecast.output_tokens_per_s >= top * (1 - OUTPUT_TIE)]
    return min(close, key=lambda o: o.forecast.tpot_ms["p50"])


def _shortfall(option: Option, workload: Workload) -> float:
    """How far the forecast is over budget: the largest ratio of predicted to allowed."""
    f, worst = option.forecast, 1.0
    if workload.ttft_ms is not None:
        worst = max(worst, f.ttft_ms["p90"] / workload.ttft_ms)
    budget = workload.tpot_budget_ms
    if budget is not None:
        worst = max(worst, f.tpot_ms["p90"] / budget)
    return worst


def predict_options(machine: Machine, profile: Profile, choice: Choice, workload: Workload, c: Constants,
                    steps_for: StepsFor) -> tuple[list[Option], Refusal | None]:
    options: list[Option] = []
    refusal: Refusal | None = None
    for variant in choices(machine, profile, choice):
        made = make_plan(machine, profile, variant, c)
        if isinstance(made, Refusal):
            refusal = refusal or made
            continue
        for plan in variants(made, workload):
            if any(o.plan.engine == plan.engine and len(o.plan.instances) == len(plan.instances) for o in options):
                continue
            options.append(Option(plan, forecast(plan, workload, steps_for(plan), c)))
    return options, refusal


def choose(machine: Machine, profile: Profile, choice: Choice, workload: Workload, c: Constants,
           steps_for: StepsFor, alternatives: Sequence[Machine] = ()) -> Choosing | Refusal:
    """The setup with the most output (or, for the latency objective, the fastest tokens per user) whose
    prediction meets the workload's budget; the others it beat, and why, in numbers."""
    objective = choice.objective or "throughput"
    options, refusal = predict_options(machine, profile, choice, workload, c, steps_for)
    if not options:
        return refusal or Refusal(f"{profile.name} does not fit on {machine.name}")
    ranked = sorted(options, key=lambda o: _score(o, objective), reverse=True)
    meeting = [o for o in ranked if o.forecast.meets(workload)]
    if not meeting:
        return _refuse(machine, profile, choice, workload, c, steps_for, ranked, alternatives)
    best = _settle_ties(meeting, objective)
    others = tuple(o for o in ranked if o is not best)
    return Choosing(best, others, tuple(explain(best, others, workload, objective)))


def _refuse(machine: Machine, profile: Profile, choice: Choice, workload: Workload, c: Constants,
            steps_for: StepsFor, ranked: Sequence[Option], alternatives: Sequence[Machine]) -> Refusal:
    closest = min(ranked, key=lambda o: _shortfall(o, workload))
    suggestions = []
    for alt in alternatives:
        if alt.name == machine.name or alt.gpu_count < machine.gpu_count:
            continue
        found = choose(alt, profile, choice.model_copy(update={"tensor_parallel_size": None, "instances": None}),
                       workload, c, steps_for)
        if isinstance(found, Choosing):
            suggestions.append(f"a larger machine: {alt.name} meets it with {found.chosen.label} "
                               f"({found.chosen.numbers()})")
            break
    looser = [f"{term} {predicted * LOOSER:,.1f} ms" for term, predicted, _ in closest.forecast.overruns(workload)]
    if looser:
        suggestions.append(f"a looser budget: {' and '.join(looser)} is met by {closest.label}")
    shorter = workload
    for _ in range(4):
        if shorter.input_len < 64:
            break
        shorter = replace(shorter, input_len=shorter.input_len // 2, prefix_len=min(shorter.prefix_len,
                                                                                   shorter.input_len // 4))
        if forecast(closest.plan, shorter, steps_for(closest.plan), c).meets(workload):
            suggestions.append(f"shorter inputs: {shorter.input_len:,} tokens in meets it with {closest.label}")
            break
    return Refusal(f"no setup of {profile.name} on {machine.name} meets {workload.budget()} at "
                   f"{workload.load}: the closest, {closest.label}, predicts {closest.numbers()}",
                   tuple(suggestions))

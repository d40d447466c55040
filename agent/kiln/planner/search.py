"""Choosing a plan from predictions: every setup the machine allows, served the user's workload in simulation,
the best that meets the latency budget chosen. Pure: the engine's step times come in as a function."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.perf.capacity import Capacity, streams_load
from kiln.perf.predict import Forecast, forecast, kiln_steps
from kiln.perf.steps import StepModel
from kiln.perf.workload import DEFAULT_PRESET, PRESETS, Workload, resolve
from kiln.planner.bands import band_for
from kiln.planner.by_capacity import (
    Carried,
    at_one_stream,
    burst,
    capacity_of,
    carried,
    explain_capacity,
    layout_of,
    settle,
)
from kiln.planner.explain import Option, explain
from kiln.planner.plan import describe, fit_plans
from kiln.planner.startup import with_cold_start
from kiln.planner.topology import valid_tp_sizes
from kiln.planner.variants import choices, variants
from kiln.profiles.schema import Profile
from kiln.setup.types import Band, Constants, Plan, Refusal

StepsFor = Callable[[Plan], StepModel]
LOOSER = 1.05  # a suggested budget leaves this margin over the closest setup's prediction
WIDENED_SPLITS = 2  # the draft-length search covers the best this many splits with drafts on
OUTPUT_TIE = 0.02  # outputs this close are a tie, well within the model's error; faster tokens break it


@dataclass(frozen=True)
class Choosing:
    chosen: Option
    alternatives: tuple[Option, ...]  # the others that were predicted, best first
    explanation: tuple[str, ...]
    capacity: Capacity | None = None  # a workload that finds its load: the chosen setup's, at its budget


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
    """Every setup that fits, predicted: first each split, precision and drafts on/off at the profile's draft
    length over the batch limits; then, for the best few of those with drafts on, the other draft lengths."""
    options: list[Option] = []
    refusal: Refusal | None = None
    seen: set[str] = set()
    objective = choice.objective or "throughput"

    def add(plans: Sequence[Plan]) -> None:
        for plan in plans:
            key = repr((plan.engine, len(plan.instances)))
            if key not in seen:
                seen.add(key)
                options.append(Option(plan, forecast(plan, workload, steps_for(plan), c)))

    fitted: list[Plan] = []
    for variant in choices(machine, profile, choice):
        made = fit_plans(machine, profile, variant, c, shortest_context=workload.request_tokens)
        if isinstance(made, Refusal):
            refusal = refusal or made
            continue
        fitted += made
        for plan in made:
            add(variants(plan, workload, drafts=False))
    drafting = [o for o in options if o.plan.engine.speculative_config]
    best = sorted(drafting, key=lambda o: (o.forecast.meets(workload), _score(o, objective)), reverse=True)
    widened: list[tuple[str, int, int]] = []
    for o in best:
        e = o.plan.engine
        split = (o.plan.quantization, e.tensor_parallel_size, e.data_parallel_size)
        if split in widened:
            continue
        widened.append(split)
        base = next(p for p in fitted if (p.quantization, p.engine.tensor_parallel_size,
                                          p.engine.data_parallel_size) == split and p.engine.speculative_config)
        add(variants(base, workload))
        if len(widened) >= WIDENED_SPLITS:
            break
    return options, refusal


def default_workload() -> Workload:
    """What kiln plans for when the user names no workload (kiln.perf.workload, the `serve` preset)."""
    return PRESETS[DEFAULT_PRESET].workload


def choose(machine: Machine, profile: Profile, choice: Choice, workload: Workload, c: Constants,
           steps_for: StepsFor, alternatives: Sequence[Machine] = (), closest: bool = False) -> Choosing | Refusal:
    """The setup with the most output (or, for the latency objective, the fastest tokens per user) whose
    prediction meets the workload's budget; the others it beat, and why, in numbers. When none meets it: a
    refusal saying what would, or with `closest` the setup nearest the budget."""
    objective = choice.objective or "throughput"
    if workload.finds_capacity and objective == "latency":
        # The fastest tokens per user within the TPOT budget, every request sent at once (a capacity is a count of
        # requests, which the latency objective does not maximise).
        workload = replace(workload, request_rate=math.inf, ttft_ms=None)
    elif workload.finds_capacity:
        return _choose_by_capacity(machine, profile, choice, workload, c, steps_for, alternatives, closest)
    options, refusal = predict_options(machine, profile, choice, workload, c, steps_for)
    if not options:
        whole = fit_plans(machine, profile, choice, c, alternatives, workload.request_tokens)
        return whole if isinstance(whole, Refusal) else (refusal or Refusal(
            f"{profile.name} does not fit on {machine.name}"))
    ranked = sorted(options, key=lambda o: _score(o, objective), reverse=True)
    meeting = [o for o in ranked if o.forecast.meets(workload)]
    if not meeting and not closest:
        return _refuse(machine, profile, choice, workload, c, steps_for, ranked, alternatives)
    best = _settle_ties(meeting, objective) if meeting else min(ranked, key=lambda o: _shortfall(o, workload))
    others = tuple(o for o in ranked if o is not best)
    lines = explain(best, others, workload, objective)
    if not meeting:
        lines.insert(1, f"No setup meets {workload.budget()}: the closest is chosen.")
    return Choosing(best, others, tuple(lines))


def _choose_by_capacity(machine: Machine, profile: Profile, choice: Choice, workload: Workload, c: Constants,
                        steps_for: StepsFor, alternatives: Sequence[Machine], closest: bool) -> Choosing | Refusal:
    """The setup that carries the most requests/s within the budget (kiln.planner.by_capacity)."""
    options, refusal = predict_options(machine, profile, choice, burst(workload), c, steps_for)
    if not options:
        whole = fit_plans(machine, profile, choice, c, alternatives, workload.request_tokens)
        return whole if isinstance(whole, Refusal) else (refusal or Refusal(
            f"{profile.name} does not fit on {machine.name}"))
    ranked = carried(options, workload, machine.gpu_count, c, steps_for)
    met = [x for x in ranked if x.capacity.met]
    alone = streams_load(workload, 1)
    if not met:
        singles = at_one_stream(options, workload, c, steps_for)
        if not closest:
            return _refuse(machine, profile, choice, alone, c, steps_for, singles, alternatives)
        near = min(singles, key=lambda o: _shortfall(o, alone))
        cap = capacity_of(near.plan, workload, machine.gpu_count, c, steps_for(near.plan))
        lines = [f"Workload: {workload.shape()}; {workload.budget()}.",
                 f"No setup meets {workload.budget()} even with one request at a time: the closest is chosen, "
                 f"{near.label}: alone it predicts {near.numbers()}."]
        return Choosing(near, tuple(o for o in singles if o is not near), tuple(lines), cap)
    best = settle(met)
    full = capacity_of(best.option.plan, workload, machine.gpu_count, c, steps_for(best.option.plan),
                       streams_found=best.capacity)
    most_output = max(options, key=lambda o: o.forecast.output_tokens_per_s)
    burst_best = next((x for x in ranked if x.option is most_output), None)
    if burst_best is None:  # skipped by the bound: searched now, to say what capacity changed
        burst_best = Carried(most_output, capacity_of(most_output.plan, workload, machine.gpu_count, c,
                                                      steps_for(most_output.plan), with_rate=False))
    lines = explain_capacity(Carried(best.option, full), [x if x is not best else Carried(best.option, full)
                                                          for x in ranked], burst_best, workload, len(options))
    chosen = Option(best.option.plan, full.at_streams or best.option.forecast)
    searched = [x.option for x in ranked if x is not best]
    others = (*searched, *(o for o in options if o is not best.option and o not in searched))
    return Choosing(chosen, others, tuple(lines), full)


def make_plan(machine: Machine, profile: Profile, choice: Choice, c: Constants,
              alternatives: Sequence[Machine] = (), workload: Workload | None = None,
              steps_for: StepsFor | None = None) -> Plan | Refusal:
    """Decide how to serve `profile` on `machine` for the user's `choice`: every setup that fits in memory,
    predicted by kiln's engine for the workload (the argument, else the choice's, else kiln's default), the best
    that meets its budget chosen. Without a workload of the user's, the setup nearest the default's per-user
    floor is chosen when none meets it, so a machine always gets a plan when the model fits."""
    own = workload or (resolve(choice.workload) if choice.workload is not None else None)
    work = own or default_workload()
    steps = steps_for or (lambda p: kiln_steps(p, machine, profile, c))
    if profile.cpu_only:
        made = fit_plans(machine, profile, choice, c, alternatives)
        if isinstance(made, Refusal):
            return made
        plan = made[0]
        return with_forecast(plan, forecast(plan, work, steps(plan), c), work, profile, c, plan.explanation, "cpu")
    if not profile.generates:
        return pooling_plan(machine, profile, choice, c, alternatives)
    found = choose(machine, profile, choice, work, c, steps, alternatives, closest=own is None)
    if isinstance(found, Refusal):
        return found
    return plan_of(machine, profile, choice, found, work, c)


def pooling_plan(machine: Machine, profile: Profile, choice: Choice, c: Constants,
                 alternatives: Sequence[Machine] = ()) -> Plan | Refusal:
    """An embedding or reranking model: the fitting setup with the most servers (each request is one forward
    pass over its input, so servers add up). The engine models generation, not pooling: no figure is predicted."""
    made = fit_plans(machine, profile, choice, c, alternatives)
    if isinstance(made, Refusal):
        return made
    plan = max(made, key=lambda p: (len(p.instances), p.engine.max_model_len))
    lines = [*describe(machine, profile, plan),
             f"A {profile.task} model: kiln's engine predicts generation, not pooling, so this plan predicts no "
             "throughput, latency or capacity; measure it with `kiln bench` against the running endpoint."]
    return replace(plan, explanation=tuple(lines))


def with_forecast(plan: Plan, f: Forecast, workload: Workload, profile: Profile, c: Constants,
                  explanation: Sequence[str], architecture: str) -> Plan:
    """The plan with the engine's figures for `workload`, and the band they are likely to land in."""
    predicted = replace(plan.predicted, output_tokens_per_s=f.output_tokens_per_s,
                        tokens_per_s_per_user=f.tokens_per_s_per_user, ttft_ms_p90=f.ttft_ms["p90"],
                        tpot_ms_p90=f.tpot_ms["p90"], engine=f.engine,
                        band=band_for(plan, profile, workload, f.output_tokens_per_s, c, architecture))
    described = {**workload.as_dict(), "description": f"{workload.shape()}; {workload.budget()}"}
    return with_cold_start(replace(plan, predicted=predicted, workload=described, explanation=tuple(explanation)),
                           profile, c)


def plan_of(machine: Machine, profile: Profile, choice: Choice, found: Choosing, workload: Workload,
            c: Constants) -> Plan:
    """The chosen setup as a plan: its memory facts, the engine's figures, and why, each line true of it."""
    plan = found.chosen.plan
    lines = describe(machine, profile, plan)
    if choice.speculative_decoding is not None:
        lines.append(f"Speculative decoding {'on' if plan.engine.speculative_config else 'off'}, as asked.")
    elif not profile.speculative:
        lines.append("Speculative decoding off: the profile has no draft model, EAGLE head or MTP layer.")
    lines += _unfit_lines(machine, profile, choice, found, c)
    architecture = machine.gpus[0].architecture.value if machine.gpus else "cpu"
    if found.capacity is not None:
        chosen = with_capacity(plan, found.chosen.forecast, found.capacity, workload, profile, c, architecture)
        return replace(chosen, explanation=tuple([*lines, *found.explanation]))
    chosen = with_forecast(plan, found.chosen.forecast, workload, profile, c, (), architecture)
    lines += found.explanation
    lines += _close_calls(chosen, found.alternatives, workload)
    return replace(chosen, explanation=tuple(lines))


def with_capacity(plan: Plan, at_streams: Forecast, cap: Capacity, workload: Workload, profile: Profile,
                  c: Constants, architecture: str) -> Plan:
    """The plan with its capacity at the budget: the engine's figures are those at that load, and its band
    scales the requests/s and the output alike (the errors the band comes from are of output at a load)."""
    at = streams_load(workload, max(cap.streams, 1))
    shown = with_forecast(plan, at_streams, at, profile, c, (), architecture)
    figures = capacity_report(cap, shown.predicted.band)
    described = {**workload.as_dict(), "description": f"{workload.shape()}; {workload.budget()}"}
    return replace(shown, workload=described, predicted=replace(shown.predicted, capacity=figures))


def capacity_band(plan: Plan, profile: Profile, workload: Workload, cap: Capacity, c: Constants,
                  architecture: str) -> Band | None:
    """The output band at the capacity's load (its class: the load regime of those streams)."""
    return band_for(plan, profile, streams_load(workload, max(cap.streams, 1)), cap.output_tokens_per_s, c,
                    architecture)


def capacity_report(cap: Capacity, band: Band | None) -> dict[str, Any]:
    """The capacity's figures under one name, with its band: the output's band scales the requests/s alike (the
    errors it comes from are of output at a load)."""
    figures = cap.as_dict()
    figures["band"] = None
    if band is not None and cap.output_tokens_per_s:
        low, high = band.low / cap.output_tokens_per_s, band.high / cap.output_tokens_per_s
        figures["band"] = {"requests_per_s": [round(cap.requests_per_s * low, 3), round(cap.requests_per_s * high, 3)],
                           "output_tokens_per_s": [round(band.low, 1), round(band.high, 1)],
                           "held": band.as_dict()["held"],
                           "source": band.source}
    return figures


def _unfit_lines(machine: Machine, profile: Profile, choice: Choice, found: Choosing, c: Constants) -> list[str]:
    """The tensor-parallel splits of the chosen precision that do not fit in memory."""
    if choice.tensor_parallel_size or choice.data_parallel_size or choice.expert_parallel or choice.instances:
        return []
    plan = found.chosen.plan
    fitted = {o.plan.tensor_parallel_size for o in (found.chosen, *found.alternatives)
              if o.plan.quantization == plan.quantization and o.plan.engine.data_parallel_size == 1}
    unfit = [t for t in valid_tp_sizes(profile.architecture, machine.gpu_count) if t not in fitted]
    if not unfit:
        return []
    listed = ", ".join(f"TP{t}" for t in unfit)
    return [f"{plan.quantization}: {listed}, each holding a whole copy of the model, "
            f"{'does' if len(unfit) == 1 else 'do'} not fit in memory."]


def _close_calls(chosen: Plan, others: Sequence[Option], workload: Workload) -> list[str]:
    """Alternatives that meet the budget and whose predicted output lies inside the chosen one's band."""
    band = chosen.predicted.band
    if band is None:
        return []
    close = [o for o in others if o.forecast.meets(workload) and band.low <= o.forecast.output_tokens_per_s
             <= band.high and layout_of(o.plan) != layout_of(chosen)]
    if not close:
        return []
    o = max(close, key=lambda x: x.forecast.output_tokens_per_s)
    return [f"A close call: {o.label} predicts {o.forecast.output_tokens_per_s:,.0f} tok/s, inside the chosen "
            f"setup's band of {band.low:,.0f} to {band.high:,.0f}; measuring both would settle it."]


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

"""`kiln predict`: what a fixed setup delivers for a workload, as `vllm bench serve` would measure it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.cli import planargs
from kiln.cli.output import print_json, table
from kiln.errors import KilnError
from kiln.hardware.model import Machine
from kiln.perf.capacity import streams_load
from kiln.perf.engines import engine_for
from kiln.perf.predict import Forecast, forecast
from kiln.perf.steps import StepModel
from kiln.perf.workload import Workload
from kiln.planner.bands import band_for
from kiln.planner.by_capacity import capacity_of
from kiln.planner.explain import Option
from kiln.planner.search import Choosing, capacity_band, capacity_report, choose, make_plan
from kiln.profiles.schema import Profile
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

MAX_DRAFTS = 16  # drafted tokens per step kiln predicts for


def add_arguments(_name: str, p: argparse.ArgumentParser) -> None:
    planargs.add_target_options(p)
    planargs.add_setting_options(p)
    p.add_argument("--max-num-seqs", type=int, help="vLLM's batch limit, instead of the plan's")
    p.add_argument("--max-num-batched-tokens", type=int, help="vLLM's token budget per step, instead of the plan's")
    p.add_argument("--num-speculative-tokens", type=int, help="drafted tokens per step (with --speculative on)")
    p.add_argument("--engine", choices=["auto", "kiln", "aiconfigurator"], default="auto",
                   help="whose step times: AIConfigurator's measured kernels where it covers the GPU, else kiln's")
    planargs.add_workload_options(p)
    p.add_argument("--json", action="store_true", help="print JSON for programs")


def _with_limits(plan: Plan, args: argparse.Namespace) -> Plan:
    engine = plan.engine
    if args.num_speculative_tokens is not None:
        if not engine.speculative_config:
            raise KilnError("--num-speculative-tokens needs speculative decoding",
                            fix="add --speculative on (the profile must have a draft model, EAGLE head or MTP)")
        if not 1 <= args.num_speculative_tokens <= MAX_DRAFTS:
            raise KilnError(f"--num-speculative-tokens must be 1 to {MAX_DRAFTS}", fix="e.g. 2")
        engine = dataclasses.replace(engine, speculative_config={
            **engine.speculative_config, "num_speculative_tokens": args.num_speculative_tokens})
    for flag in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise KilnError(f"--{flag.replace('_', '-')} must be at least 1", fix="e.g. 256")
    if args.max_num_seqs:
        engine = dataclasses.replace(engine, max_num_seqs=args.max_num_seqs,
                                     max_num_batched_tokens=max(engine.max_num_batched_tokens, args.max_num_seqs))
    if args.max_num_batched_tokens:
        if args.max_num_batched_tokens < engine.max_num_seqs:
            raise KilnError(f"--max-num-batched-tokens {args.max_num_batched_tokens} is below max_num_seqs "
                            f"{engine.max_num_seqs}", fix="vLLM needs at least one token per sequence per step")
        engine = dataclasses.replace(engine, max_num_batched_tokens=args.max_num_batched_tokens)
    return dataclasses.replace(plan, engine=engine)


def steps_for(kiln: Kiln, engine: str, machine: Machine, profile: Profile) -> Callable[[Plan], StepModel]:
    """The engine a command asked for, as the planner's search takes it: one step model per plan."""
    wants_aic = engine == "aiconfigurator" or (engine == "auto" and kiln.constants.get("aiconfigurator", "preferred"))
    estimator = kiln.aiconfigurator() if wants_aic else None
    return lambda plan: engine_for(engine, plan, machine, profile, kiln.constants, estimator)


def option_dict(o: Option) -> dict[str, Any]:
    return {"instances": len(o.plan.instances), "tensor_parallel_size": o.plan.tensor_parallel_size,
            "data_parallel_size": o.plan.engine.data_parallel_size,
            "enable_expert_parallel": o.plan.engine.enable_expert_parallel,
            "quantization": o.plan.quantization, "speculative_config": o.plan.engine.speculative_config,
            "max_num_seqs": o.plan.engine.max_num_seqs, "predicted": o.forecast.as_dict()}


def plot_options(choosing: Choosing, machine: Machine, out: Path) -> None:
    """Each setup the search predicted: output tok/s per GPU against tok/s per user, the chosen one marked,
    and the Pareto front of the two."""
    import matplotlib  # noqa: PLC0415 - only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    gpus = max(machine.gpu_count, 1)
    options = [choosing.chosen, *choosing.alternatives]
    points = [(o.forecast.tokens_per_s_per_user, o.forecast.output_tokens_per_s / gpus, o) for o in options]
    front = sorted((p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)),
                   key=lambda p: p[0])
    fig, ax = plt.subplots(figsize=(8, 5))
    for user, per_gpu, o in points:
        ax.scatter(user, per_gpu, color="tab:red" if o is choosing.chosen else "tab:blue")
        ax.annotate(o.label.split(",")[0] + (" +spec" if o.plan.engine.speculative_config else ""),
                    (user, per_gpu), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:gray", linestyle="--", label="Pareto front")
    ax.set_xlabel("output tok/s per user")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title(f"{choosing.chosen.plan.profile} on {machine.name}: predicted setups")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def forecast_text(plan: Plan, workload: Workload, f: Forecast) -> str:
    spec = plan.engine.speculative_config
    e = plan.engine
    split = f"TP{e.tensor_parallel_size}" + (f" x DP{e.data_parallel_size}" if e.data_parallel_size > 1 else "") + (
        " + EP" if e.enable_expert_parallel else "")
    lines = [
        f"Setup: {plan.profile} on {plan.machine}: {len(plan.instances)} x {split}, "
        f"{plan.quantization}, KV {plan.kv_cache_dtype}, speculative "
        f"{spec['method'] + ' k=' + str(spec['num_speculative_tokens']) if spec else 'off'}, max_num_seqs "
        f"{plan.engine.max_num_seqs}, max_num_batched_tokens {plan.engine.max_num_batched_tokens}",
        f"Workload: {workload.shape()}; {workload.num_prompts} requests; {workload.budget()}",
        f"Engine: {f.engine}",
        "",
        table(["metric", "predicted"], [
            ["output tokens/s", f"{f.output_tokens_per_s:,.0f}"],
            ["total tokens/s", f"{f.total_tokens_per_s:,.0f}"],
            ["requests/s", f"{f.requests_per_s:,.2f}"],
            ["tokens/s per user", f"{f.tokens_per_s_per_user:,.1f}"],
            ["TTFT p50 / p90 / p99 ms", " / ".join(f"{f.ttft_ms[k]:,.0f}" for k in ("p50", "p90", "p99"))],
            ["TPOT p50 / p90 ms", " / ".join(f"{f.tpot_ms[k]:,.1f}" for k in ("p50", "p90"))],
            ["ITL p50 ms", f"{f.itl_ms['p50']:,.1f}"],
        ]),
    ]
    misses = f.misses(workload)
    if workload.has_budget:
        lines.append("")
        lines.append("Budget: " + ("met" if not misses else "missed: " + "; ".join(misses)))
    lines += [f"note: {n}" for n in f.notes]
    return "\n".join(lines)


def setup_dict(plan: Plan) -> dict[str, Any]:
    return {"machine": plan.machine, "profile": plan.profile, "instances": len(plan.instances),
            "tensor_parallel_size": plan.tensor_parallel_size, "quantization": plan.quantization,
            "data_parallel_size": plan.engine.data_parallel_size,
            "enable_expert_parallel": plan.engine.enable_expert_parallel,
            "kv_cache_dtype": plan.kv_cache_dtype, "speculative_config": plan.engine.speculative_config,
            "max_num_seqs": plan.engine.max_num_seqs, "max_num_batched_tokens": plan.engine.max_num_batched_tokens,
            "max_model_len": plan.engine.max_model_len}


def _predict_capacity(kiln: Kiln, args: argparse.Namespace, plan: Plan, profile: Profile, workload: Workload,
                      steps: StepModel, arch: str) -> int:
    """A workload with a budget and no load: the setup's capacity within it, then the figures at that load."""
    gpus = max(sum(len(i.gpus) for i in plan.instances), 1)
    cap = capacity_of(plan, workload, gpus, kiln.constants, steps)
    report = capacity_report(cap, capacity_band(plan, profile, workload, cap, kiln.constants, arch))
    if args.json:
        print_json({"capacity": report, "engine": steps.name, "workload": workload.as_dict(),
                    "setup": setup_dict(plan), "meets_budget": cap.met})
        return 0
    alone = cap.at_streams or forecast(plan, streams_load(workload, 1), steps, kiln.constants)
    print(f"Capacity: {cap.headline()}")
    band = report.get("band")
    if band:
        print(f"likely: {band['requests_per_s'][0]:,.1f} to {band['requests_per_s'][1]:,.1f} requests/s, "
              f"{band['output_tokens_per_s'][0]:,.0f} to {band['output_tokens_per_s'][1]:,.0f} output tok/s "
              f"({band['source']})")
    print("")
    print(forecast_text(plan, streams_load(workload, max(cap.streams, 1)), alone))
    return 0


def cmd_predict(kiln: Kiln, args: argparse.Namespace) -> int:
    """The setup the settings fix (what they leave open, kiln's search fills in for this workload, as a plan
    would), predicted for the workload."""
    machine = kiln.machine(args.machine)
    profile = kiln.profile(args.profile, args.model, revision=getattr(args, "revision", None))
    workload = planargs.workload_from(args)
    choice = planargs.plan_choice(args)
    ours = steps_for(kiln, "kiln", machine, profile)
    if profile.cpu_only:
        made = make_plan(machine, profile, choice, kiln.constants, workload=workload)
        found: Plan | Refusal = made
    else:
        chosen = choose(machine, profile, choice, workload, kiln.constants, ours, closest=True)
        found = chosen.chosen.plan if isinstance(chosen, Choosing) else chosen
    if isinstance(found, Refusal):
        return planargs.refused(args, found, "predict")
    plan = _with_limits(found, args)
    steps = steps_for(kiln, args.engine, machine, profile)(plan)
    arch = machine.gpus[0].architecture.value if machine.gpus else "cpu"
    if workload.finds_capacity and not profile.cpu_only:
        return _predict_capacity(kiln, args, plan, profile, workload, steps, arch)
    result = forecast(plan, workload, steps, kiln.constants)
    band = band_for(plan, profile, workload, result.output_tokens_per_s, kiln.constants, arch)
    if args.json:
        print_json({**result.as_dict(), "band": band.as_dict() if band else None, "workload": workload.as_dict(),
                    "setup": setup_dict(plan), "meets_budget": result.meets(workload)})
    else:
        print(forecast_text(plan, workload, result))
        if band:
            print(f"likely output tok/s: {band.low:,.0f} to {band.high:,.0f} ({band.source})")
    return 0

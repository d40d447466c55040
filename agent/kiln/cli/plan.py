"""`kiln plan`: the setup kiln would serve a profile or model with on a machine, and its command lines."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.cli import planargs, predict
from kiln.cli.output import print_json
from kiln.cli.views import plan_text
from kiln.planner.search import Choosing, choose, make_plan, plan_of
from kiln.render.systemd import instance_dropin
from kiln.render.vllm import Runtime, plan_document, render_instances
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln


def add_arguments(_name: str, plan: argparse.ArgumentParser) -> None:
    planargs.add_target_options(plan, config=True)
    planargs.add_setting_options(plan)
    planargs.add_workload_options(plan)
    plan.add_argument("--engine", choices=["auto", "kiln", "aiconfigurator"], default="auto",
                      help="whose step times the workload's predictions use")
    plan.add_argument("--plot", type=Path, metavar="FILE",
                      help="with a workload: draw the setups' tok/s per GPU against tok/s per user as a PNG")
    plan.add_argument("--launcher", choices=["image", "module"], default="image",
                      help="vLLM command: the image's `vllm serve`, or `python -m` for a source checkout")
    plan.add_argument("--models-dir", default=Runtime.models_dir, help="where locally made models live")
    plan.add_argument("--systemd", action="store_true", help="print the instances as systemd units")
    planargs.add_cluster_options(plan)
    plan.add_argument("--json", action="store_true", help="print JSON for programs")


def cmd_plan(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.nodes is not None:  # --nodes 0 or 1 is refused there, not read as "one machine"
        from kiln.cli import cluster  # noqa: PLC0415 - the cluster planner loads only for a plan across machines

        return cluster.cmd_plan_nodes(kiln, args)
    if args.config:
        from kiln.cli import plan_config  # noqa: PLC0415 - the placement of several models loads only for a file

        return plan_config.cmd_plan_config(kiln, args)
    machine = kiln.machine(args.machine)
    profile = kiln.profile(args.profile, args.model, revision=args.revision)
    choice = planargs.plan_choice(args)
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    choosing = None
    if planargs.workload_given(args) and not profile.cpu_only and profile.generates:
        workload = planargs.workload_from(args)
        found = choose(machine, profile, choice, workload, kiln.constants,
                       predict.steps_for(kiln, args.engine, machine, profile), alternatives)
        plan: Plan | Refusal = plan_of(machine, profile, choice, found, workload, kiln.constants) if isinstance(
            found, Choosing) else found
        choosing = found if isinstance(found, Choosing) else None
    else:
        plan = make_plan(machine, profile, choice, kiln.constants, alternatives,
                         steps_for=predict.steps_for(kiln, args.engine, machine, profile))
    if isinstance(plan, Refusal):
        return planargs.refused(args, plan)
    runtime = planargs.runtime_for(args)
    local = profile.local_model  # a local directory (its checkpoint marked local), never a Hub id
    rendered = render_instances(plan, runtime, local_model=local)
    if choosing is not None and args.plot:
        predict.plot_options(choosing, machine, args.plot)
    if args.systemd:
        print("\n".join(instance_dropin(r, profile=plan.profile) for r in rendered))
    elif args.json:
        data = plan_document(plan, rendered, machine.gpu_count)
        if choosing is not None:
            data["predicted_for_workload"] = choosing.chosen.forecast.as_dict()
            data["alternatives"] = [predict.option_dict(o) for o in choosing.alternatives]
            data["workload_explanation"] = list(choosing.explanation)
        if args.model:
            data["model_settings"] = profile.description
        print_json(data)
    else:
        print(plan_text(plan, rendered))
        if args.model:  # no catalog profile: where its parsers and speculator came from
            print(f"\nSettings: {profile.description}")
    return 0

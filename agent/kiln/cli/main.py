"""`kiln`: detect the machine, browse profiles, plan vLLM serving."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from kiln import __version__
from kiln.choice.resolve import resolve_choice
from kiln.choice.schema import SECRET_FIELDS
from kiln.choice.select import select_profile
from kiln.choice.sources import SourceReader
from kiln.cli import bench, cluster, doctor, fleet, image, keys, models, planargs, predict, serving
from kiln.cli.output import print_json, table
from kiln.cli.views import machine_dict, machine_text, plan_text, profile_row
from kiln.errors import KilnError
from kiln.hardware.fixtures import fixture_names
from kiln.planner.search import Choosing, choose, make_plan, plan_of
from kiln.profiles.catalog import find_profile_dir, validate_paths
from kiln.render.systemd import instance_dropin
from kiln.render.vllm import Runtime, plan_document, render_instances
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

EXIT_REFUSED = planargs.EXIT_REFUSED


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON for programs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("--profiles-dir", type=Path, help="profile catalog folder (default: found automatically)")
    sub = parser.add_subparsers(dest="command", required=True)

    detect = sub.add_parser("detect", help="show this machine's GPUs, or a named machine fixture")
    detect.add_argument("--machine", help=f"a fixture ({', '.join(fixture_names())}) or a machine file")
    detect.add_argument("--list", action="store_true", help="list the machine fixtures")
    detect.add_argument("--record", type=Path, metavar="FILE",
                        help="write what NVML and the host answer as a machine file (read back with --machine FILE)")
    _add_json(detect)

    profiles = sub.add_parser("profiles", help="list, show and validate model profiles")
    psub = profiles.add_subparsers(dest="action", required=True)
    _add_json(psub.add_parser("list", help="every profile in the catalog"))
    show = psub.add_parser("show", help="one profile in full")
    show.add_argument("name")
    _add_json(show)
    val = psub.add_parser("validate", help="check profile files (default: the catalog)")
    val.add_argument("paths", nargs="*", type=Path)
    _add_json(val)

    plan = sub.add_parser("plan", help="plan vLLM serving for a profile on a machine")
    planargs.add_target_options(plan)
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
    cluster.add_options(plan)
    _add_json(plan)

    choice = sub.add_parser("choice", help="show the user's choice as the agent reads it at boot")
    choice.add_argument("--root", type=Path, default=Path("/"), help="read the sources under this folder")
    _add_json(choice)
    serving.add_parsers(sub)
    doctor.add_parsers(sub)
    bench.add_parsers(sub)
    image.add_parsers(sub)
    models.add_parsers(sub)
    keys.add_parsers(sub)
    predict.add_parsers(sub)
    fleet.add_parsers(sub)
    return parser


def cmd_detect(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.list:
        machines = kiln.fixtures()
        if args.json:
            print_json([machine_dict(m) for m in machines])
        else:
            print(table(["Fixture", "Droplet size", "GPUs", "Description"],
                        [[m.name, m.droplet_size or "-", f"{m.gpu_count}x {m.gpus[0].name}" if m.gpus else "-",
                          m.description] for m in machines]))
        return 0
    if args.record:
        return record(kiln, args)
    machine = kiln.machine(args.machine)
    print_json(machine_dict(machine)) if args.json else print(machine_text(machine))
    return 0


def record(kiln: Kiln, args: argparse.Namespace) -> int:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    name = (args.machine and Path(args.machine).stem) or socket.gethostname()
    data = kiln.record(args.machine, name, f"recorded by `kiln detect --record` on {name}, {when}")
    text = yaml.safe_dump(data, sort_keys=False, width=120, default_flow_style=None)
    args.record.write_text(f"# {data['description']}\n" + text, encoding="utf-8")
    gpus = len((data["nvml"] or {}).get("devices", []))
    if args.json:
        print_json({"file": str(args.record), "gpus": gpus, "nvml": data["nvml"] is not None})
    else:
        print(f"recorded {gpus} GPU(s) to {args.record}" + ("" if data["nvml"] else " (NVML did not start)")
              + f"; read it back with `kiln detect --machine {args.record}`")
    return 0


def cmd_profiles(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.action == "validate":
        paths = args.paths or [kiln.profile_dir or find_profile_dir()]
        errors = validate_paths(paths, kiln.gpus.specs)
        if args.json:
            print_json({"ok": not errors, "errors": [e.as_dict() for e in errors]})
        else:
            for e in errors:
                print(e.message(), file=sys.stderr)
            print(f"{len(errors)} problem(s)" if errors else "all profiles valid")
        return EXIT_REFUSED if errors else 0
    catalog = kiln.catalog()
    if args.action == "list":
        profiles = [catalog.profiles[n] for n in catalog.names()]
        if args.json:
            print_json([p.model_dump(mode="json") for p in profiles])
        else:
            print(table(["Profile", "Params", "Checkpoints", "Context", "Speculative"],
                        [profile_row(p) for p in profiles]))
        return 0
    profile = catalog.get(args.name)
    if args.json:
        print_json(profile.model_dump(mode="json"))
    else:
        path = catalog.directory / f"{profile.name}.yaml"
        print(path.read_text(encoding="utf-8"))
    return 0


def cmd_plan(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.nodes is not None:  # --nodes 0 or 1 is refused there, not read as "one machine"
        return cluster.cmd_plan_nodes(kiln, args)
    machine = kiln.machine(args.machine)
    profile = kiln.profile(args.profile, args.model, revision=args.revision)
    choice = planargs.plan_choice(args)
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    choosing = None
    if planargs.workload_given(args) and not profile.cpu_only:
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


def cmd_choice(kiln: Kiln, args: argparse.Namespace) -> int:
    resolved = resolve_choice(SourceReader(root=args.root).read())
    choice = resolved.choice
    profile, selection_problems = select_profile(choice, kiln.catalog(), lambda model: kiln.profile(
        None, model, choice.hf_token, choice.revision))
    problems = [*resolved.problems, *selection_problems]
    if args.json:
        print_json({"choice": json.loads(resolved.choice.model_dump_json(exclude=set(SECRET_FIELDS))),
                    "api_key_set": resolved.choice.api_key is not None,
                    "hf_token_set": resolved.choice.hf_token is not None, "origins": dict(resolved.origins),
                    "profile": profile.name, "problems": [p.as_dict() for p in problems]})
        return 0
    values = resolved.choice.model_dump(exclude_none=True, exclude=set(SECRET_FIELDS))
    rows = [[k, v, resolved.origins.get(k, "")] for k, v in values.items()]
    rows += [[k, "(set, hidden)", resolved.origins.get(k, "")] for k in sorted(SECRET_FIELDS)
             if getattr(resolved.choice, k)]
    print(table(["Setting", "Value", "From"], rows) if rows else "No choice found: the image defaults apply.")
    print(f"\nServes: {profile.name}")
    for p in problems:
        print(f"problem: {p.text()}", file=sys.stderr)
    return 0


COMMANDS = {"detect": cmd_detect, "profiles": cmd_profiles, "plan": cmd_plan, "choice": cmd_choice,
            "agent": serving.cmd_agent, "up": serving.cmd_up, "status": serving.cmd_status, "bench": bench.cmd_bench,
            "image": image.cmd_image, "doctor": doctor.cmd_doctor, "models": models.cmd_models,
            "keys": keys.cmd_keys, "reload": keys.cmd_reload, "predict": predict.cmd_predict,
            "fleet": fleet.cmd_fleet}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        kiln = Kiln.create(args.profiles_dir)
        return COMMANDS[args.command](kiln, args)
    except KilnError as exc:
        if getattr(args, "json", False):
            print_json(exc.as_dict())
        print(f"kiln: {exc.message()}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`kiln plan --json | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

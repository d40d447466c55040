"""`kiln doctor`: the pre-flight the agent runs before starting vLLM, on demand."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln.choice.schema import Choice
from kiln.cli.locate import locate
from kiln.cli.output import print_json
from kiln.doctor.facts import Needs
from kiln.doctor.needs import needs_of
from kiln.doctor.report import Report
from kiln.doctor.startup_oom import check_start_oom
from kiln.hardware.fixtures import fixture_names
from kiln.hardware.model import Machine
from kiln.planner.search import make_plan
from kiln.render.vllm import find_vllm_python
from kiln.serve.caches import place_caches
from kiln.serve.layout import ServeLayout
from kiln.setup.types import Plan
from kiln.wiring import Kiln

EXIT_BLOCKED = 2


def add_arguments(_name: str, doctor: argparse.ArgumentParser) -> None:
    doctor.add_argument("--machine", help=f"a fixture ({', '.join(fixture_names())}) or a recorded machine file "
                                          "instead of this machine")
    doctor.add_argument("--profile", help="check what this profile's plan needs (default: the agent's current plan)")
    doctor.add_argument("--state-dir", type=Path,
                        help="the agent's state folder, for its plan and model cache (default: the running agent's)")
    doctor.add_argument("--startup-log", type=Path, help="a vLLM start-up log (`journalctl -u UNIT -o cat`, or the "
                                                         "state folder's logs/): where a failed start ran out of GPU "
                                                         "memory, and the setting to lower")
    doctor.add_argument("--json", action="store_true", help="print JSON for programs")


def _profile_name(args: argparse.Namespace, layout: ServeLayout) -> str | None:
    if args.profile:
        return str(args.profile)
    try:
        plan = json.loads(layout.plan_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(plan.get("profile")) if isinstance(plan, dict) and plan.get("profile") else None


def _needs(kiln: Kiln, machine: Machine, profile_name: str | None) -> Needs | None:
    if profile_name is None:
        return None
    profile = kiln.catalog().get(profile_name)
    plan = make_plan(machine, profile, Choice(), kiln.constants, [])
    return needs_of(plan, profile) if isinstance(plan, Plan) else None


def cmd_doctor(kiln: Kiln, args: argparse.Namespace) -> int:
    agent = locate(args.state_dir)
    if not args.json:
        print(agent.said(), file=sys.stderr)
    layout = agent.layout
    cache = layout.hf_home
    machine, _ = kiln.doctor(args.machine, cache)
    profile = _profile_name(args, layout)
    needs = _needs(kiln, machine, profile)
    if profile and needs is None:
        print(f"kiln: {profile} cannot be planned on {machine.name} (`kiln plan --profile {profile}` says why); "
              "the checks that depend on the plan are skipped", file=sys.stderr)
    if args.machine is None:  # the disk the agent would put the model on, as it chooses it at boot
        repos = [needs.model] if needs and needs.model else []
        cache = place_caches(kiln.mounts(), layout.state_dir, repos).hf_home
    _, report = kiln.doctor(args.machine, cache, needs, find_vllm_python())
    if args.startup_log:
        try:
            lines = args.startup_log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            print(f"kiln: cannot read {args.startup_log}: {exc.strerror}", file=sys.stderr)
            return 1
        report = Report(report.machine, (*report.checks, check_start_oom(lines)))
    if args.json:
        print_json({**report.as_dict(), "profile": profile if needs else None})
    else:
        print(report.text())
    return EXIT_BLOCKED if report.blocking else 0

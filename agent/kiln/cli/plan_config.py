"""`kiln plan --config FILE`: a settings file planned as the agent plans it at boot, for one model or several."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from kiln.choice.resolve import settings_file_layer
from kiln.choice.schema import Choice
from kiln.cli import planargs
from kiln.cli.output import gib, print_json, table
from kiln.errors import KilnError
from kiln.planner.placement import Placed, Placement
from kiln.render.vllm import RenderedInstance, plan_document, render_instances
from kiln.serve.decide import plan_settings
from kiln.setup.headline import headline_of
from kiln.wiring import Kiln


def read_settings(path: Path) -> tuple[Choice, list[str]]:
    """The file's settings, validated as `kiln up --config` reads them; each problem as a line."""
    layer = settings_file_layer(path, "give a readable settings file of `key: value` lines (docs/user-data.md)")
    return Choice(**layer.values), [p.text() for p in layer.problems]


def cmd_plan_config(kiln: Kiln, args: argparse.Namespace) -> int:
    check_alone(args)
    machine = kiln.machine(args.machine)
    choice, problems = read_settings(Path(args.config))
    if not (choice.models or choice.profile or choice.model or problems):
        problems.append(f"{args.config}: names no model (fix: set `profile`, `model` or `models`)")
    several = plan_settings(kiln, machine, choice, source=str(args.config))
    problems += [p.text() for p in several.problems]
    placement = several.placement
    runtime = planargs.runtime_for(args)
    rendered = {p.wanted.position: render_instances(p.plan, runtime, local_model=p.wanted.profile.local_model)
                for p in placement.placed}
    if args.json:
        print_json(placement_document(placement, rendered, problems))
    elif placement.placed:
        print(placement_text(placement, rendered, problems))
    if not placement.placed:  # what would be served is nothing: say why where errors go, as a refused plan does
        print(f"kiln: cannot plan {args.config}: no model can be served from it", file=sys.stderr)
        print("\n".join(f"  - {line}" for line in problems), file=sys.stderr)
        return planargs.EXIT_REFUSED
    return 0


def placement_document(placement: Placement, rendered: dict[int, list[RenderedInstance]],
                       problems: list[str]) -> dict[str, Any]:
    gpu_map = placement.gpu_map()
    return {
        "machine": placement.machine.name,
        "gpus": [{"gpu": g, "models": [{"name": n, "memory_share": s} for n, s in on]} for g, on in gpu_map.items()],
        "models": [{"position": p.wanted.position, "name": p.wanted.name, "profile": p.wanted.profile.name,
                    "task": p.wanted.profile.task, "gpus": list(p.gpus), "memory_share": p.share,
                    "shares_gpu_with": list(p.shares_with),
                    "plan": plan_document(p.plan, rendered[p.wanted.position], len(p.gpus))}
                   for p in placement.placed],
        "not_served": [{"position": u.wanted.position, "name": u.wanted.name, "error": u.reason,
                        "suggestions": list(u.suggestions)} for u in placement.refused],
        "notes": list(placement.notes),
        "problems": problems,
    }


def _share_text(share: float | None) -> str:
    return "whole" if share is None else f"{share:g} of its memory"


def _figures(p: Placed) -> str:
    capacity = p.plan.predicted.capacity
    if capacity is not None:
        line = headline_of(capacity)
    elif p.plan.predicted.output_tokens_per_s is not None:
        workload = (p.plan.workload or {}).get("description")
        line = f"{p.plan.predicted.output_tokens_per_s:,.0f} output tok/s for {workload}"
    else:
        line = f"{p.wanted.profile.task}: no throughput predicted (kiln's engine models generation)"
    if p.shares_with:
        line += (f"; predicted with the GPU's compute to itself: while {', '.join(p.shares_with)} is busy too, "
                 "they share it and each carries less")
    return line


def placement_text(placement: Placement, rendered: dict[int, list[RenderedInstance]], problems: list[str]) -> str:
    gpu_rows = [[g, ", ".join(f"{n} ({_share_text(s)})" for n, s in on) or "(idle)"]
                for g, on in placement.gpu_map().items()]
    model_rows = []
    for p in placement.placed:
        pred = p.plan.predicted
        model_rows.append([p.wanted.name, p.wanted.profile.task, ",".join(map(str, p.gpus)), p.plan.layout(),
                           p.plan.quantization, gib(pred.weight_bytes_per_gpu), gib(pred.kv_cache_bytes_per_gpu),
                           f"{p.plan.engine.max_model_len:,}"])
    parts = [f"Plan      {len(placement.placed)} model(s) on {placement.machine.name}",
             table(["GPU", "Models (memory)"], gpu_rows),
             table(["Model", "Task", "GPUs", "Serving", "Precision", "Weights/GPU", "KV cache/GPU", "Context"],
                   model_rows),
             "Predicted\n" + "\n".join(f"  {p.wanted.name}: {_figures(p)}" for p in placement.placed)]
    if placement.refused:
        parts.append("Not served\n" + "\n".join(f"  - {u.text()}" for u in placement.refused))
    if placement.notes:
        parts.append("Notes\n" + "\n".join(f"  - {n}" for n in placement.notes))
    if problems:
        parts.append("Problems\n" + "\n".join(f"  - {p}" for p in problems))
    commands = [f"  {r.name} ({p.wanted.name}): " + shlex.join(r.argv)
                for p in placement.placed for r in rendered[p.wanted.position]]
    parts.append("Commands\n" + "\n".join(commands))
    return "\n\n".join(parts)


def check_alone(args: argparse.Namespace) -> None:
    """--config names its own settings; a setting flag beside it is refused, never silently dropped."""
    given = [name for name in (*planargs.SETTING_FIELDS, *planargs.WORKLOAD_FIELDS, "workload", "speculative")
             if getattr(args, name, None) is not None]
    if given:
        short = {"tensor_parallel_size": "tp", "data_parallel_size": "dp"}
        flags = ", ".join("--" + short.get(name, name).replace("_", "-") for name in given)
        raise KilnError(f"--config plans the file's own settings, so {flags} cannot be given with it",
                        fix="put the settings in the file (per model under `models:`, or at the top level)")

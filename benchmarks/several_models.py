"""Several models on one machine: each model's GPUs, memory and capacity in a mix, beside its one-model plan on the
whole machine (the baseline), in one run.

Run: .venv/bin/python -m benchmarks.several_models
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kiln.choice.schema import Choice, validate_fields
from kiln.cli.plan_config import plan_settings
from kiln.planner.search import make_plan
from kiln.setup.types import Plan
from kiln.wiring import Kiln

# The mixes issue 34 asks to plan: a retrieval service, two teams' chat models sharing one GPU, adapters on a base.
MIXES: dict[str, tuple[str, dict[str, Any]]] = {
    "rag": ("h100x8", {"models": ["llama-3.3-70b-instruct", "qwen3-embedding-8b", "qwen3-reranker-8b"]}),
    "two-chats": ("h200x1", {"models": ["qwen3-8b", "gpt-oss-20b"]}),
    "adapters": ("l40s", {"models": [{"profile": "llama-3.1-8b-instruct", "lora": [
        {"name": "llama324", "source": "kevin009/llama324"}, {"name": "yara", "source": "vtriple/Llama-3.1-8B-yara"},
        {"name": "raft", "source": "phatvo/Meta-Llama3.1-8B-Instruct-RAFT"},
        {"name": "rerank-keywords", "source": "AnkitSatpute/Llama-3.1-ReRank-keywrds"}]}]}),
}


def capacity(plan: Plan) -> float | None:
    figures = plan.predicted.capacity
    return None if figures is None else float(figures["requests_per_s"])


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixes", default=",".join(MIXES))
    args = parser.parse_args(argv)
    kiln = Kiln.create()
    print(f"{'mix':10} {'machine':8} {'model':24} {'GPUs':8} {'share':>5} {'setup':10} {'req/s':>7} "
          f"{'alone':>7} {'ratio':>5}")
    for mix in args.mixes.split(","):
        machine_name, settings = MIXES[mix]
        machine = kiln.machine(machine_name)
        layer = validate_fields(settings, source=mix)
        started = time.perf_counter()
        several = plan_settings(kiln, machine, Choice(**layer.values), source=mix)
        took = time.perf_counter() - started
        for p in several.placement.placed:
            alone = make_plan(machine, p.wanted.profile, Choice(), kiln.constants)
            in_mix, by_itself = capacity(p.plan), capacity(alone) if isinstance(alone, Plan) else None
            ratio = f"{in_mix / by_itself:.2f}" if in_mix and by_itself else "-"
            share = "-" if p.share is None else f"{p.share:g}"
            gpus = ",".join(map(str, p.gpus))
            print(f"{mix:10} {machine_name:8} {p.wanted.name:24} {gpus:8} {share:>5} {p.plan.layout():10} "
                  f"{shown(in_mix):>7} {shown(by_itself):>7} {ratio:>5}")
        for u in several.placement.refused:
            print(f"{mix:10} {machine_name:8} {u.wanted.name:24} not placed: {u.reason}")
        for problem in several.problems:
            if problem.field.endswith(".lora"):
                print(f"{mix:10} {machine_name:8} {'':24} {problem.what}")
        print(f"{mix:10} placed in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

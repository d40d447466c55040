"""Several models on one machine: each model's GPUs, memory and capacity in a mix, beside its one-model plan on the
whole machine (the baseline), in one run.

Run: .venv/bin/python -m benchmarks.several_models
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kiln.choice.schema import Choice, validate_fields
from kiln.planner.search import make_plan
from kiln.serve.decide import plan_settings
from kiln.setup.capacity import lora_bytes
from kiln.setup.types import Plan
from kiln.wiring import Kiln

# Four public LoRA adapters of Llama 3.1 8B and the rank (`r`) their adapter_config.json gives on the Hub. The Hub
# cannot be reached here, so each is planned from a folder holding that file (and an empty weights file): planning
# reads only the rank.
ADAPTERS = (("llama324", "kevin009/llama324", 16), ("yara", "vtriple/Llama-3.1-8B-yara", 32),
            ("raft", "phatvo/Meta-Llama3.1-8B-Instruct-RAFT", 64),
            ("rerank-keywords", "AnkitSatpute/Llama-3.1-ReRank-keywrds", 16))


def adapter_folders(root: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """The mix with each Hub adapter replaced by a folder of its adapter_config.json."""
    ranks = {repo: rank for _, repo, rank in ADAPTERS}
    models = []
    for item in settings["models"]:
        if isinstance(item, dict) and item.get("lora"):
            lora = []
            for adapter in item["lora"]:
                folder = root / adapter["name"]
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "adapter_config.json").write_text(json.dumps(
                    {"peft_type": "LORA", "r": ranks[adapter["source"]], "bias": "none", "use_dora": False}))
                (folder / "adapter_model.safetensors").touch()
                lora.append({**adapter, "source": str(folder)})
            item = {**item, "lora": lora}  # noqa: PLW2901 -- the same item with local folders
        models.append(item)
    return {**settings, "models": models}


# The mixes issue 34 asks to plan: a retrieval service, two teams' chat models sharing one GPU, adapters on a base.
MIXES: dict[str, tuple[str, dict[str, Any]]] = {
    "rag": ("h100x8", {"models": ["llama-3.3-70b-instruct", "qwen3-embedding-8b", "qwen3-reranker-8b"]}),
    "two-chats": ("h200x1", {"models": ["qwen3-8b", "gpt-oss-20b"]}),
    "adapters": ("l40s", {"models": [{"profile": "llama-3.1-8b-instruct", "lora": [
        {"name": name, "source": repo} for name, repo, _ in ADAPTERS]}]}),
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
    scratch = tempfile.mkdtemp(prefix="kiln-adapters-")
    print(f"{'mix':10} {'machine':8} {'model':24} {'GPUs':8} {'share':>5} {'setup':10} {'req/s':>7} "
          f"{'alone':>7} {'ratio':>5}")
    for mix in args.mixes.split(","):
        machine_name, settings = MIXES[mix]
        machine = kiln.machine(machine_name)
        layer = validate_fields(adapter_folders(Path(scratch), settings), source=mix)
        started = time.perf_counter()
        several = plan_settings(kiln, machine, Choice(**layer.values), source=mix)
        took = time.perf_counter() - started
        for p in several.placement.placed:
            # alone: the model on the whole machine, without adapters
            bare = p.wanted.profile.model_copy(update={"serving": p.wanted.profile.serving.model_copy(
                update={"lora_adapters": 0, "max_lora_rank": 0})})
            alone = make_plan(machine, bare, Choice(), kiln.constants)
            in_mix, by_itself = capacity(p.plan), capacity(alone) if isinstance(alone, Plan) else None
            ratio = f"{in_mix / by_itself:.2f}" if in_mix and by_itself else "-"
            share = "-" if p.share is None else f"{p.share:g}"
            gpus = ",".join(map(str, p.gpus))
            print(f"{mix:10} {machine_name:8} {p.wanted.name:24} {gpus:8} {share:>5} {p.plan.layout():10} "
                  f"{shown(in_mix):>7} {shown(by_itself):>7} {ratio:>5}")
        for u in several.placement.refused:
            print(f"{mix:10} {machine_name:8} {u.wanted.name:24} not placed: {u.reason}")
        for problem in several.problems:
            if ".lora" in problem.field:
                print(f"{mix:10} {machine_name:8} {'':24} {problem.what}")
        for p in several.placement.placed:
            if p.plan.engine.lora_modules:
                print(f"{mix:10} {machine_name:8} {p.wanted.name:24} {len(p.plan.engine.lora_modules)} adapters, "
                      f"--max-lora-rank {p.plan.engine.max_lora_rank}: "
                      f"{lora_bytes(p.wanted.profile) / 2**30:.2f} GiB of adapter buffers per instance")
        print(f"{mix:10} placed in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

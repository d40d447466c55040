"""What kiln reads from each family's published config.json, and the plan it makes on two machines, side by side.

Run: .venv/bin/python -m benchmarks.model_families [MACHINE ...]   (default: h100x8 b300x8)
     .venv/bin/python -m benchmarks.model_families --catalog      (every catalog profile on every machine fixture)
The configs are tests/data/hub/<org>/<name>/ (each with a SOURCE note). A plan is shown as instances x TP, weight
precision, context and KV-cache tokens per instance; a refusal as its reason and the first suggestion.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kiln.choice.schema import Choice
from kiln.errors import KilnError
from kiln.planner.search import make_plan
from kiln.profiles.hf_config import profile_from_model_dir
from kiln.profiles.schema import Profile
from kiln.setup.capacity import kv_layout
from kiln.setup.types import Plan
from kiln.wiring import Kiln

HUB = Path(__file__).resolve().parents[1] / "tests" / "data" / "hub"


def facts(profile: Profile) -> str:
    a = profile.architecture
    parts = [f"{a.num_layers} layers", f"{a.num_attention_heads}/{a.num_kv_heads} heads x {a.head_dim}"]
    if a.linear_attention:
        parts.append(f"{a.linear_attention.layers} linear-attention")
    if a.sliding_window:
        parts.append(f"{a.sliding_window.layers} sliding ({a.sliding_window.window})")
    if a.moe:
        shared = f" + {a.moe.num_shared_experts} shared" if a.moe.num_shared_experts else ""
        parts.append(f"{a.moe.num_experts} experts top-{a.moe.experts_per_token}{shared}")
    if a.mla:
        parts.append(f"MLA {a.mla.kv_lora_rank}+{a.mla.qk_rope_head_dim}")
    if a.sparse_attention:
        parts.append(f"indexer {a.sparse_attention.index_head_dim}")
    if a.compressed_attention:
        ratios = a.compressed_attention.ratios
        parts.append(f"compressed {ratios.count(4)} x 4 + {ratios.count(128)} x 128, "
                     f"window {a.compressed_attention.window}")
    if a.mtp_layers:
        parts.append(f"{a.mtp_layers} MTP")
    parts.append("/".join(profile.checkpoints))
    parts.append(f"{a.params_total / 1e9:.0f}B, KV {kv_layout(a, 1, 'auto').bytes_per_token_instance:,} B/token")
    return ", ".join(parts)


def planned(kiln: Kiln, machine: str, profile: Profile) -> str:
    result = make_plan(kiln.machine(machine), profile, Choice(), kiln.constants,
                       sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus)))
    if isinstance(result, Plan):
        return (f"{result.layout()} {result.quantization}, "
                f"ctx {result.engine.max_model_len:,}, {result.predicted.kv_cache_tokens_per_instance:,} KV tokens")
    hint = f" ({result.suggestions[0]})" if result.suggestions else ""
    return f"refused: {result.reason}{hint}"


def families(kiln: Kiln, machines: list[str]) -> None:
    for folder in sorted(HUB.glob("*/*")):
        repo = f"{folder.parent.name}/{folder.name}"
        try:
            profile = profile_from_model_dir(folder)
        except KilnError as exc:
            print(f"{repo}\n  refused: {exc.what}\n")
            continue
        print(f"{repo} [{profile.description.split(' read from')[0]}]\n  reads: {facts(profile)}")
        for machine in machines:
            print(f"  {machine}: {planned(kiln, machine, profile)}")
        print()


def catalog(kiln: Kiln) -> None:
    machines = [m.name for m in kiln.fixtures() if m.name != "cpu-only"]
    for name in kiln.catalog().names():
        profile = kiln.catalog().get(name)
        if profile.cpu_only:
            continue
        print(name)
        for machine in machines:
            print(f"  {machine}: {planned(kiln, machine, profile)}")
        print()


def main(argv: list[str]) -> int:
    kiln = Kiln.create()
    if argv[:1] == ["--catalog"]:
        catalog(kiln)
    else:
        families(kiln, argv or ["h100x8", "b300x8"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

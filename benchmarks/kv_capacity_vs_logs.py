"""kiln's KV-cache capacity model beside real vLLM start-up logs, side by side.

Run: .venv/bin/python -m benchmarks.kv_capacity_vs_logs
The logs (tests/data/kv_cache_observations.yaml) give, per run, vLLM's "Model loading took",
"Available KV cache memory" and "GPU KV cache size: N tokens". For each, kiln predicts the same
three figures from the profile's architecture facts and the machine fixture, with vLLM's settings
of that run (utilization, context, batch limits, block size, and whether that version subtracted
its CUDA-graph estimate).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kiln.planner import capacity as cap
from kiln.planner.types import Constants
from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
OBSERVATIONS = REPO / "tests" / "data" / "kv_cache_observations.yaml"
GIB = 2**30

# Logged model -> (kiln profile with the same architecture, weight precision of the logged checkpoint).
PROFILE_FOR = {
    "meta-llama/Llama-3.1-8B-Instruct": ("llama-3.1-8b-instruct", "bf16"),
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": ("llama-3.3-70b-instruct", "fp8"),
    "meta-llama/Llama-3.1-70B": ("llama-3.3-70b-instruct", "bf16"),
    # INT8 W8A8 weights take one byte per parameter, as FP8 does.
    "RedHatAI/Mistral-Small-3.1-24B-Instruct-2503-quantized.w8a8": ("mistral-small-3.2-24b-instruct", "fp8"),
    "mistralai/Mistral-Small-3.2-24B-Instruct-2506": ("mistral-small-3.2-24b-instruct", "bf16"),
    "Qwen/Qwen3-32B": ("qwen3-32b", "bf16"),
    "openai/gpt-oss-20b": ("gpt-oss-20b", "mxfp4"),
    "openai/gpt-oss-120b": ("gpt-oss-120b", "mxfp4"),
}
# vLLM's defaults on an H100 for the OpenAI server (vllm/engine/arg_utils.py, >= 70 GiB and not A100).
H100_DEFAULT_SEQS, H100_DEFAULT_BATCHED = 1024, 8192


@dataclass(frozen=True)
class Row:
    id: str
    hybrid: bool
    logged_weights_gib: float | None
    predicted_weights_gib: float
    logged_available_gib: float | None
    predicted_available_gib: float
    logged_tokens: int | None
    predicted_tokens: int
    tokens_from_logged_memory: int | None  # kiln's bytes->tokens step applied to vLLM's own available memory

    @staticmethod
    def error(predicted: float, logged: float | None) -> float | None:
        return None if not logged else (predicted - logged) / logged


def _version_at_least(version: str | None, major: int, minor: int) -> bool:
    if not version:
        return False
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


def compare(obs: dict[str, Any], kiln: Kiln) -> Row | None:
    mapped = PROFILE_FOR.get(obs["model"])
    if mapped is None or "H100" not in str(obs["gpu"]):
        return None
    profile = kiln.catalog().get(mapped[0])
    h100 = kiln.machine("h100x1").gpus[0]
    block = 128 if "block128" in obs["id"] or "block_size 128" in str(obs.get("notes")) else 16
    data: dict[str, Any] = {**kiln.constants.data, "vllm": {
        **kiln.constants.data["vllm"], "block_size": block,
        "subtract_cudagraph_estimate": _version_at_least(obs.get("vllm_version"), 0, 21)}}
    constants = Constants(data)
    gpu_memory = h100.memory_bytes - constants.get("vllm", "driver_reserved_bytes")
    kwargs = dict(precision=mapped[1], tp=obs["tensor_parallel_size"], gpu_memory_bytes=gpu_memory,
                  utilization=obs["gpu_memory_utilization"], max_model_len=obs["max_model_len"],
                  max_num_seqs=obs.get("max_num_seqs") or H100_DEFAULT_SEQS,
                  max_num_batched_tokens=obs.get("max_num_batched_tokens") or H100_DEFAULT_BATCHED,
                  kv_dtype=obs["kv_cache_dtype"], c=constants)
    predicted = cap.kv_capacity(profile, **kwargs)  # type: ignore[arg-type]
    from_logged = None
    if obs.get("available_kv_cache_gib"):
        from_logged, _ = cap.kv_cache_tokens(int(obs["available_kv_cache_gib"] * GIB), predicted.layout,
                                             obs["max_model_len"], block, kwargs["max_num_batched_tokens"])
    return Row(
        id=obs["id"], hybrid=profile.architecture.sliding_window is not None,
        logged_weights_gib=obs.get("model_loading_gib"),
        predicted_weights_gib=predicted.weight_bytes_per_gpu / GIB,
        logged_available_gib=obs.get("available_kv_cache_gib"),
        predicted_available_gib=predicted.kv_cache_bytes_per_gpu / GIB,
        logged_tokens=obs.get("kv_cache_tokens"), predicted_tokens=predicted.tokens,
        tokens_from_logged_memory=from_logged,
    )


def compare_all(kiln: Kiln) -> list[tuple[dict[str, Any], Row]]:
    observations = yaml.safe_load(OBSERVATIONS.read_text())["observations"]
    rows = []
    for obs in observations:
        row = compare(obs, kiln)
        if row is not None:
            rows.append((obs, row))
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main() -> int:
    kiln = Kiln.create(REPO / "profiles")
    header = ("observation", "weights GiB log/kiln", "KV GiB log/kiln (err)", "KV tokens log", "kiln (err)",
              "kiln from logged GiB (err)")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for _obs, r in compare_all(kiln):
        print(" | ".join([
            r.id + (" (hybrid)" if r.hybrid else ""),
            f"{_num(r.logged_weights_gib, '.2f')} / {r.predicted_weights_gib:.2f}",
            f"{_num(r.logged_available_gib, '.2f')} / {r.predicted_available_gib:.2f} "
            f"({_pct(Row.error(r.predicted_available_gib, r.logged_available_gib))})",
            _num(r.logged_tokens, ","),
            f"{r.predicted_tokens:,} ({_pct(Row.error(r.predicted_tokens, r.logged_tokens))})",
            f"{_num(r.tokens_from_logged_memory, ',')} "
            f"({_pct(Row.error(r.tokens_from_logged_memory or 0, r.logged_tokens))})",
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""kiln's KV-cache capacity model beside real vLLM start-up logs, side by side.

Run: .venv/bin/python -m benchmarks.kv_capacity_vs_logs
The logs (tests/data/kv_cache_observations.yaml) give, per run, vLLM's "Model loading took",
"Available KV cache memory" and "GPU KV cache size: N tokens". For each, kiln predicts the same
three figures from the profile's architecture facts and the machine fixture, with vLLM's settings
of that run (utilization, context, batch limits, block size, and whether that version subtracted
its CUDA-graph estimate).

Each log is judged on its KV capacity: "GPU KV cache size" in tokens where the log prints it, else
"Available KV cache memory". The summary gives the share within ±10% in sample (planner.yaml's
constants as they are) and held out: for each source, the two constants fitted to logs (non-torch
memory at TP1, its extra under tensor parallelism) are refitted on the other sources' logs alone,
as the median gap between kiln and those logs, and the source's own logs are predicted with them.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kiln.setup import capacity as cap
from kiln.setup.types import Constants
from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
OBSERVATIONS = REPO / "tests" / "data" / "kv_cache_observations.yaml"
GIB = 2**30
TOLERANCE = 0.10

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
    "Qwen/Qwen3-8B": ("qwen3-8b", "bf16"),
    "Qwen/Qwen3-30B-A3B": ("qwen3-30b-a3b", "bf16"),
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8": ("llama-3.1-8b-instruct", "fp8"),
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16": ("llama-3.1-8b-instruct", "int4"),
    "redhatai/Llama-3.3-70B-Instruct-quantized.w8a8": ("llama-3.3-70b-instruct", "fp8"),
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": ("mistral-small-3.2-24b-instruct", "bf16"),
}
# The logged checkpoint's weight format -> kiln's precision (INT8 W8A8 weights take one byte per parameter).
PRECISION_FOR = {"bf16": "bf16", "fp8": "fp8", "int8-w8a8": "fp8", "int4": "int4", "mxfp4": "mxfp4"}
# vLLM's defaults on an H100 for the OpenAI server (vllm/engine/arg_utils.py, >= 70 GiB and not A100).
H100_DEFAULT_SEQS, H100_DEFAULT_BATCHED = 1024, 8192


@dataclass(frozen=True)
class Row:
    id: str
    hybrid: bool
    moe: bool
    logged_weights_gib: float | None
    predicted_weights_gib: float
    logged_available_gib: float | None
    predicted_available_gib: float
    logged_tokens: int | None
    predicted_tokens: int
    tokens_from_logged_memory: int | None  # kiln's bytes->tokens step applied to vLLM's own available memory
    tp: int
    logged_graphs_gib: float | None  # "Estimated CUDA graph memory: N GiB total"
    predicted_graphs_gib: float  # what vLLM 0.32's profile reserves for these capture sizes, as kiln models it

    @staticmethod
    def error(predicted: float, logged: float | None) -> float | None:
        return None if not logged else (predicted - logged) / logged


def _version_at_least(version: str | None, major: int, minor: int) -> bool:
    if not version:
        return False
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


def _constants(obs: dict[str, Any], kiln: Kiln, shift: dict[str, int] | None = None) -> Constants:
    """planner.yaml's constants with this log's block size and CUDA-graph accounting, and refitted
    non-torch constants when `shift` is given (the held-out fit)."""
    block = 128 if "block128" in obs["id"] or "block_size 128" in str(obs.get("notes")) else 16
    major, minor = (int(x) for x in str(kiln.constants.get("vllm", "cudagraph_estimate_subtracted_since")).split("."))
    vllm = {**kiln.constants.data["vllm"], "block_size": block,
            "subtract_cudagraph_estimate": _version_at_least(obs.get("vllm_version"), major, minor)}
    if shift:
        vllm["non_torch_bytes"] += shift["non_torch_bytes"]
        vllm["tensor_parallel_extra_bytes"] += shift["tensor_parallel_extra_bytes"]
    return Constants({**kiln.constants.data, "vllm": vllm})


def compare(obs: dict[str, Any], kiln: Kiln, shift: dict[str, int] | None = None) -> Row | None:
    mapped = PROFILE_FOR.get(obs["model"])
    total_gib = obs.get("total_memory_gib")
    if mapped is None or (total_gib is None and "H100" not in str(obs["gpu"])):
        return None
    profile = kiln.catalog().get(mapped[0])
    constants = _constants(obs, kiln, shift)
    block = constants.get("vllm", "block_size")
    if total_gib is not None:  # the log's own total_memory (cudaMemGetInfo)
        gpu_memory = int(total_gib * GIB)
    else:
        gpu_memory = kiln.machine("h100x1").gpus[0].memory_bytes - constants.get("vllm", "driver_reserved_bytes")
    precision = PRECISION_FOR.get(str(obs.get("weights_dtype")), mapped[1])
    kwargs = dict(precision=precision, tp=obs["tensor_parallel_size"], gpu_memory_bytes=gpu_memory,
                  utilization=obs["gpu_memory_utilization"], max_model_len=obs["max_model_len"],
                  max_num_seqs=obs.get("max_num_seqs") or H100_DEFAULT_SEQS,
                  max_num_batched_tokens=obs.get("max_num_batched_tokens") or H100_DEFAULT_BATCHED,
                  kv_dtype=obs["kv_cache_dtype"], c=constants)
    predicted = cap.kv_capacity(profile, **kwargs)  # type: ignore[arg-type]
    seqs, batched = kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]
    piecewise = cap.cudagraph_capture_count(min(2 * seqs, 512), batched)  # type: ignore[operator, arg-type]
    full = cap.cudagraph_capture_count(min(2 * seqs, 512), batched, seqs) - piecewise  # type: ignore[operator, arg-type]
    graphs = cap.cudagraph_reserve_bytes(obs["tensor_parallel_size"], piecewise, full, constants)
    from_logged = None
    if obs.get("available_kv_cache_gib"):
        from_logged, _ = cap.kv_cache_tokens(int(obs["available_kv_cache_gib"] * GIB), predicted.layout,
                                             obs["max_model_len"], block, kwargs["max_num_batched_tokens"])
    return Row(
        id=obs["id"], hybrid=profile.architecture.sliding_window is not None, moe=profile.architecture.moe is not None,
        logged_weights_gib=obs.get("model_loading_gib"),
        predicted_weights_gib=predicted.weight_bytes_per_gpu / GIB,
        logged_available_gib=obs.get("available_kv_cache_gib"),
        predicted_available_gib=predicted.kv_cache_bytes_per_gpu / GIB,
        logged_tokens=obs.get("kv_cache_tokens"), predicted_tokens=predicted.tokens,
        tokens_from_logged_memory=from_logged, tp=obs["tensor_parallel_size"],
        logged_graphs_gib=obs.get("cudagraph_estimate_gib"), predicted_graphs_gib=graphs / GIB,
    )


def load_observations() -> list[dict[str, Any]]:
    observations: list[dict[str, Any]] = yaml.safe_load(OBSERVATIONS.read_text())["observations"]
    return observations


def compare_all(kiln: Kiln) -> list[tuple[dict[str, Any], Row]]:
    rows = []
    for obs in load_observations():
        row = compare(obs, kiln)
        if row is not None:
            rows.append((obs, row))
    return rows


def capacity_error(row: Row) -> float | None:
    """The error on KV capacity: on the token count where the log prints it, else on the KV memory."""
    if row.logged_tokens:
        return Row.error(row.predicted_tokens, row.logged_tokens)
    return Row.error(row.predicted_available_gib, row.logged_available_gib)


def _source(obs: dict[str, Any]) -> str:
    return str(obs["source"]).split("/blob/")[0]


def _refit(train: list[tuple[dict[str, Any], Row]]) -> dict[str, int]:
    """Refit non_torch_bytes (TP1 logs) and tensor_parallel_extra_bytes (TP>1 logs) to `train`: the median
    of kiln's KV memory minus the logged one is the overhead kiln missed. A group without logs keeps its value."""
    def gap(multi_gpu: bool) -> int:
        gaps = [r.predicted_available_gib - r.logged_available_gib for o, r in train
                if r.logged_available_gib and (o["tensor_parallel_size"] > 1) == multi_gpu]
        return int(statistics.median(gaps) * GIB) if gaps else 0
    single = gap(False)
    multi = gap(True) if any(o["tensor_parallel_size"] > 1 and r.logged_available_gib for o, r in train) else single
    return {"non_torch_bytes": single, "tensor_parallel_extra_bytes": multi - single}


@dataclass(frozen=True)
class Summary:
    judged: int
    in_sample_within: int
    held_out_within: int

    def share(self, within: int) -> float:
        return within / self.judged if self.judged else 0.0


def summarize(kiln: Kiln, rows: list[tuple[dict[str, Any], Row]] | None = None) -> Summary:
    """In-sample and leave-one-source-out counts of logs whose KV capacity kiln predicts within ±10%."""
    rows = compare_all(kiln) if rows is None else rows
    judged = [(o, r) for o, r in rows if capacity_error(r) is not None]

    def within(r: Row | None) -> bool:
        return r is not None and abs(capacity_error(r) or 0) <= TOLERANCE

    in_sample = sum(1 for _, r in judged if within(r))
    held_out = 0
    for source in {_source(o) for o, _ in judged}:
        shift = _refit([(o, r) for o, r in judged if _source(o) != source])
        held_out += sum(1 for o, _ in judged if _source(o) == source and within(compare(o, kiln, shift)))
    return Summary(len(judged), in_sample, held_out)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main() -> int:
    kiln = Kiln.create(REPO / "profiles")
    header = ("observation", "weights GiB log/kiln", "KV GiB log/kiln (err)", "KV tokens log", "kiln (err)",
              "kiln from logged GiB (err)", "CUDA graphs GiB log/kiln")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    rows = compare_all(kiln)
    for _obs, r in rows:
        print(" | ".join([
            r.id + (" (hybrid)" if r.hybrid else ""),
            f"{_num(r.logged_weights_gib, '.2f')} / {r.predicted_weights_gib:.2f}",
            f"{_num(r.logged_available_gib, '.2f')} / {r.predicted_available_gib:.2f} "
            f"({_pct(Row.error(r.predicted_available_gib, r.logged_available_gib))})",
            _num(r.logged_tokens, ","),
            f"{r.predicted_tokens:,} ({_pct(Row.error(r.predicted_tokens, r.logged_tokens))})",
            f"{_num(r.tokens_from_logged_memory, ',')} "
            f"({_pct(Row.error(r.tokens_from_logged_memory or 0, r.logged_tokens))})",
            f"{_num(r.logged_graphs_gib, '.2f')} / {r.predicted_graphs_gib:.2f}",
        ]))
    summary = summarize(kiln, rows)
    print(f"\nKV capacity within ±{TOLERANCE:.0%} of the log, of {summary.judged} logs: "
          f"in sample {summary.in_sample_within} ({summary.share(summary.in_sample_within):.0%}), "
          f"held out by source {summary.held_out_within} ({summary.share(summary.held_out_within):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""kiln's engine beside kernels timed on a real GPU: what the roofline assumes for each measured shape, side by side.

Run: .venv/bin/python -m benchmarks.engine_vs_gpu [FILE]
FILE is what `benchmarks/gpu_kernels.py` wrote on a GPU machine (default: tests/data/recorded/h200-kernels.json,
one H200, PyTorch 2.11). Each row prints the measured time, the engine's, and measured / engine: above 1 the engine
assumes the GPU faster than it ran.

The timings are PyTorch's kernels (cuBLAS GEMMs, CUTLASS grouped GEMMs, flash attention, unfused norms and
routing), not vLLM's fused ones, and the decode steps have no scheduler, sampler or detokenizer: they bound what
the engine's kernel terms assume, while its fitted step overheads stand for the host work these leave out.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.public_cases import gpu_memory_gib, model_profile
from kiln.perf.predict import efficiency, hardware, kiln_steps
from kiln.perf.setup import Fixed, fixed_plan, machine_of
from kiln.perf.steps import Efficiency, Hardware, RooflineSteps, Step
from kiln.setup import capacity as cap
from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "tests" / "data" / "recorded" / "h200-kernels.json"
GPU_CLASS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100"}
# The stacks gpu_kernels.py times, as the engine knows them: (profile, or a tests/data/perf_models file; its
# tensor-parallel width; the measured stack's layers over the model's, for a one-GPU share).
STACK_PROFILES = {"llama-3.1-8b": ("llama-3.1-8b-instruct", 1), "qwen3-30b-a3b": ("qwen3-30b-a3b", 1),
                  "glm-4.6-tp8-share": ("glm-4.6", 8)}
BYTES = {"bf16": 2, "fp8": 1}
AMPLE_GIB = 1024


def _roof(hw: Hardware, e: Efficiency) -> tuple[float, float]:
    """Bandwidth and dense tensor-core FLOP/s as the engine reaches them."""
    return hw.bandwidth_bytes_s * e.memory, (hw.flops or 0.0) * e.compute


def _ratio(measured: float, engine: float) -> str:
    return f"{measured / engine:6.2f}" if engine > 0 else "     -"


def kernels(kiln: Kiln, data: dict[str, Any], gpu: str) -> None:
    spec = kiln.gpus.specs[gpu]
    machine = machine_of(spec, 1, gpu_memory_gib(kiln, gpu))
    e = efficiency(kiln.constants, "cuda", spec.architecture.value)
    mem = data["memory"]
    peak_bw = spec.memory_bandwidth_gb_s * 1e9
    read, copy = mem["bytes"] / mem["read_s"] / peak_bw, 2 * mem["bytes"] / mem["copy_s"] / peak_bw
    print(f"memory: reading {mem['bytes'] / 2**30:.0f} GiB reached {read:.2f} of the "
          f"{spec.memory_bandwidth_gb_s:,.0f} GB/s datasheet, a copy {copy:.2f} (read + write); the engine assumes "
          f"{e.memory:.2f}")
    print(f"\n{'dense GEMM':30} {'dtype':>5} {'tokens':>6} {'measured us':>12} {'engine us':>10} {'meas/eng':>8}"
          f" {'of peak':>8}")
    for row in data["dense"]:
        dense_hw = hardware(machine, row["dtype"], 1, 1, kiln.constants)
        bw, flops = _roof(dense_hw, e)
        work = 2 * row["m"] * row["k"] * row["n"]
        engine = max(row["k"] * row["n"] * BYTES[row["dtype"]] / bw, work / flops)
        peak = dense_hw.flops or 1.0
        print(f"{row['shape']:30} {row['dtype']:>5} {row['m']:6} {row['seconds'] * 1e6:12.1f} {engine * 1e6:10.1f} "
              f"{_ratio(row['seconds'], engine):>8} {work / row['seconds'] / peak:8.2f}")
    print(f"\n{'routed experts (grouped GEMM)':30} {'part':>7} {'tok/exp':>7} {'measured us':>12} {'engine us':>10} "
          f"{'meas/eng':>8} {'of peak BW':>10}")
    hw = hardware(machine, "bf16", 1, 1, kiln.constants)
    bw, flops = _roof(hw, e)
    for row in data["experts"]:
        weights = row["experts"] * row["k"] * row["n"] * 2
        work = 2 * row["experts"] * row["tokens_per_expert"] * row["k"] * row["n"]
        engine = max(weights / bw, work / ((hw.flops or 0.0) * e.compute_moe))
        print(f"{row['shape']:30} {row['part']:>7} {row['tokens_per_expert']:7} {row['seconds'] * 1e6:12.1f} "
              f"{engine * 1e6:10.1f} {_ratio(row['seconds'], engine):>8} {weights / row['seconds'] / peak_bw:10.2f}")
    vllm_moe(data, hw, e, peak_bw)
    print(f"\n{'attention (one layer)':48} {'measured us':>12} {'engine us':>10} {'meas/eng':>8}")
    for row in data["attention"]:
        if row["kind"] == "decode":
            kv = row["seqs"] * row["context"] * row["kv_heads"] * row["head_dim"] * 2 * 2
            # PyTorch's flash kernel splits no sequence across blocks: one sequence leaves most of the GPU idle
            lone = " (one sequence, unsplit)" if row["seqs"] == 1 else ""
            what, engine = f"decode {row['seqs']} x {row['context']} tokens{lone}", kv / bw
        else:
            work = 2 * row["tokens"] ** 2 * row["heads"] * row["head_dim"]  # causal: half of 4 x T^2 x H x D
            what, engine = f"prefill {row['tokens']} tokens, causal", work / flops
        print(f"{what:48} {row['seconds'] * 1e6:12.1f} {engine * 1e6:10.1f} {_ratio(row['seconds'], engine):>8}")


def vllm_moe(data: dict[str, Any], hw: Hardware, e: Efficiency, peak_bw: float) -> None:
    """vLLM's own Triton MoE kernel (BF16): the engine reads the experts the tokens hit at its bandwidth share, or
    computes their FLOPs at its MoE share of peak, whichever is longer."""
    rows = data.get("vllm_moe", [])
    if not rows:
        return
    print(f"\n{'vLLM MoE kernel, one layer':28} {'tokens':>6} {'config':>7} {'measured us':>12} {'engine us':>10} "
          f"{'meas/eng':>8} {'of peak BW':>10}")
    for row in rows:
        per_expert = 3 * row["hidden"] * row["width"] * 2
        hit = cap.experts_hit(row["experts"], row["top_k"], row["tokens"])
        work = 2 * row["tokens"] * row["top_k"] * 3 * row["hidden"] * row["width"]
        engine = max(hit * per_expert / (hw.bandwidth_bytes_s * e.memory), work / ((hw.flops or 0.0) * e.compute_moe))
        print(f"{row['shape']:28} {row['tokens']:6} {row['config_source']:>7} {row['gemms_s'] * 1e6:12.1f} "
              f"{engine * 1e6:10.1f} {_ratio(row['gemms_s'], engine):>8} "
              f"{hit * per_expert / row['gemms_s'] / peak_bw:10.2f}")


def steps(kiln: Kiln, data: dict[str, Any], gpu: str) -> None:
    spec = kiln.gpus.specs[gpu]
    print(f"\n{'whole steps (share of the layers)':46} {'measured ms':>22} {'engine ms':>22} {'meas/kernels':>13}")
    print(f"{'':46} {'graph':>10} {'eager':>11} {'kernels':>10} {'with fixed':>11}")
    for stack in data["stacks"]:
        key, tp = STACK_PROFILES[stack["name"]]
        profile = model_profile(kiln, key, stack["precision"])
        if isinstance(profile, str):
            print(f"{stack['name']}: {profile}")
            continue
        # Ample memory: a step's time does not depend on capacity, and a one-GPU share need not fit the whole model.
        machine = machine_of(spec, tp, AMPLE_GIB)
        plan = fixed_plan(machine, profile, Fixed(precision=stack["precision"], tp=tp), kiln.constants)
        if isinstance(plan, str):
            print(f"{stack['name']}: {plan}")
            continue
        model = kiln_steps(plan, machine, profile, kiln.constants)
        assert isinstance(model, RooflineSteps)
        # One GPU's kernels: no all-reduce, no fixed cost; a share of the layers where the stack timed a slice.
        alone = replace(model, hardware=replace(model.hardware, allreduce_us=(), allreduce_latency_s=0.0,
                                                link_bytes_s=float("inf")),
                        efficiency=replace(model.efficiency, step_overhead_s=0.0, overhead_per_layer_s=0.0,
                                           overhead_per_seq_s=0.0, overhead_per_rank_s=0.0))
        share = stack["arch"]["layers"] / profile.architecture.num_layers
        label = f"{stack['name']} {stack['precision']}" + (f" ({share:.0%})" if share < 1 else "")
        for row in stack["decode"] + stack["prefill"]:
            if "seqs" in row:
                step = Step(row["seqs"], float(row["seqs"] * row["context"]))
                what = f"decode {row['seqs']} x {row['context']}"
            else:
                step = Step(0, 0.0, prefill_tokens=row["tokens"], prefill_context=row["tokens"] ** 2 / 2)
                what = f"prefill {row['tokens']}"
            if "error" in row:
                print(f"{label + ': ' + what:46} not measured: {row['error'].split('.')[0]}")
                continue
            kernels_s = alone.seconds(step) * share
            full = model.seconds(step) * share
            graph = row.get("graph_s")
            graphed = f"{graph * 1e3:10.2f}" if graph else f"{'-':>10}"
            print(f"{label + ': ' + what:46} {graphed} {row['eager_s'] * 1e3:11.2f} "
                  f"{kernels_s * 1e3:10.2f} {full * 1e3:11.2f} {_ratio(graph or row['eager_s'], kernels_s):>13}")


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else MEASURED
    try:
        data = json.loads(path.read_text())
        device = data["device"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"it holds no {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"cannot read the timings: {why}; give a file `python -m benchmarks.gpu_kernels --out FILE` wrote, "
              f"as {MEASURED}", file=sys.stderr)
        return 2
    gpu = GPU_CLASS.get(device.get("gpu", ""))
    if gpu is None:
        print(f"{path}: no kiln GPU class for {device.get('gpu')!r}", file=sys.stderr)
        return 2
    print(f"{path.name}: {device['gpu']}, PyTorch {device['torch']}, CUDA {device.get('cuda')}, "
          f"measured {device.get('measured', '?')}; the engine as data/planner.yaml sets it\n")
    kiln = Kiln.create()
    kernels(kiln, data, gpu)
    steps(kiln, data, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())

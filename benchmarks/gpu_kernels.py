"""Time, on one GPU, the kernels kiln's engine prices with its roofline: dense GEMMs (BF16 and FP8), the routed
experts' grouped GEMMs at real models' shapes (PyTorch's, and with --vllm-moe vLLM's own Triton kernel), decode and
prefill attention, and whole decode and prefill steps (all-reduce free: one GPU), eager and as a CUDA graph.

Needs PyTorch (and Triton for --vllm-moe), no vLLM install and no kiln, so it runs on a bare GPU machine:

    python -m benchmarks.gpu_kernels --out gpu_kernels.json \
        [--vllm-moe SITE_PACKAGES/vllm/model_executor/layers/fused_moe/fused_moe.py]

The JSON holds each shape and its measured seconds; `python -m benchmarks.engine_vs_gpu FILE` puts the engine's
assumptions beside them. `--smoke` runs tiny shapes on the CPU to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.nn import functional

sdpa = functional.scaled_dot_product_attention

# Llama 3.3 70B's MLP at tensor parallelism 2 (hidden 8192, intermediate 28672 split in two): gate+up, down.
DENSE_SHAPES = {"llama-70b-tp2-gate-up": (8192, 28672), "llama-70b-tp2-down": (14336, 8192)}
DENSE_TOKENS = (1, 16, 64, 256, 1024, 4096, 8192)
# Routed experts, gate+up and down, as one GPU holds them: (experts, hidden, intermediate per GPU).
EXPERT_SHAPES = {
    "qwen3-30b-a3b-tp1": (128, 2048, 768),
    "glm-4.6-tp8": (160, 5120, 192),
    "deepseek-v3-tp8": (256, 7168, 256),
}
TOKENS_PER_EXPERT = (1, 4, 16, 64, 256)
# vLLM's own Triton MoE kernel (--vllm-moe): (experts, hidden, intermediate per GPU, experts per token).
VLLM_MOE_SHAPES = {
    "qwen3-30b-a3b-tp1": (128, 2048, 768, 8),
    "qwen3-235b-a22b-tp4": (128, 4096, 384, 8),
    "qwen3-235b-a22b-tp8": (128, 4096, 192, 8),
    "glm-4.6-tp8": (160, 5120, 192, 8),
    "deepseek-v3-tp8": (256, 7168, 256, 8),
}
VLLM_MOE_TOKENS = (1, 8, 32, 128, 512, 1024, 4096, 8192)
# Llama 3.1 8B: layers, hidden, query heads, KV heads, head dim, intermediate, vocabulary.
LLAMA_8B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 14336,
            "vocab": 128256}
# Qwen3-30B-A3B: every layer routes each token to 8 of 128 experts of width 768.
QWEN3_30B_A3B = {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "experts": 128,
                 "experts_per_token": 8, "expert_intermediate": 768, "vocab": 151936}
# One GPU's share of GLM-4.6 at tensor parallelism 8 (12 of 96 query heads, 1 of 8 KV heads, each of 160 experts
# 192 wide, an eighth of the vocabulary), 24 of its 92 layers: the step less its all-reduces; the shared expert and
# the 3 dense layers are left out.
GLM_46_TP8_SHARE = {"layers": 24, "hidden": 5120, "heads": 12, "kv_heads": 1, "head_dim": 128, "experts": 160,
                    "experts_per_token": 8, "expert_intermediate": 192, "vocab": 18944}
STACKS = (("llama-3.1-8b", LLAMA_8B, "bf16"), ("llama-3.1-8b", LLAMA_8B, "fp8"),
          ("qwen3-30b-a3b", QWEN3_30B_A3B, "bf16"), ("glm-4.6-tp8-share", GLM_46_TP8_SHARE, "bf16"))
STEP_BATCHES = (1, 8, 32, 128, 256, 512)  # vLLM captures decode CUDA graphs up to 512 sequences by default
STEP_CONTEXT = 1024
PROMPTS = (2048, 8192)
DECODE_ATTENTION = ((1, 8192), (64, 2048), (256, 2048))  # (sequences, context)
PREFILL_TOKENS = 8192


class Clock:
    """Seconds per call, the median over repeats of a timed loop (CUDA events on a GPU)."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def __call__(self, fn: Callable[[], object], inner: int = 5) -> float:
        for _ in range(2):
            fn()
        samples = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3 / inner)
            else:
                began = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - began) / inner)
        return statistics.median(samples)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def memory_copy(clock: Clock, device: torch.device, gib: float) -> dict[str, Any]:
    n = int(gib * 2**30) // 2
    src = torch.ones(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    copy_s = clock(lambda: dst.copy_(src))
    read_s = clock(lambda: torch.sum(src, dtype=torch.float32))
    return {"bytes": n * 2, "copy_s": copy_s, "read_s": read_s}


def dense_gemms(clock: Clock, device: torch.device, shapes: dict[str, tuple[int, int]],
                tokens: tuple[int, ...]) -> list[dict[str, Any]]:
    out = []
    fp8 = device.type == "cuda" and hasattr(torch, "float8_e4m3fn")
    for name, (k, n) in shapes.items():
        weight = torch.randn(n, k, dtype=torch.bfloat16, device=device) * 0.02
        weight8 = weight.to(torch.float8_e4m3fn) if fp8 else None
        scale_b = torch.ones(1, n, dtype=torch.float32, device=device)
        for m in tokens:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            out.append({"shape": name, "m": m, "k": k, "n": n, "dtype": "bf16",
                        "seconds": clock(lambda x=x, w=weight: x @ w.t())})
            if weight8 is not None:
                x8 = x.to(torch.float8_e4m3fn)
                scale_a = torch.ones(m, 1, dtype=torch.float32, device=device)
                out.append({"shape": name, "m": m, "k": k, "n": n, "dtype": "fp8", "scaling": "rowwise",
                            "seconds": clock(lambda x8=x8, s=scale_a, w=weight8, sb=scale_b: torch._scaled_mm(
                                x8, w.t(), scale_a=s, scale_b=sb, out_dtype=torch.bfloat16))})
        progress(f"dense {name}: {len(tokens)} token counts")
    return out


def grouped_gemms(clock: Clock, device: torch.device, shapes: dict[str, tuple[int, int, int]],
                  per_expert: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every expert gets the same tokens: the grouped GEMM's best case (real routing is uneven)."""
    out = []
    for name, (experts, hidden, inter) in shapes.items():
        for part, (k, n) in {"gate-up": (hidden, 2 * inter), "down": (inter, hidden)}.items():
            weight = (torch.randn(experts, n, k, dtype=torch.bfloat16, device=device) * 0.02).transpose(1, 2)
            for m in per_expert:
                x = torch.randn(experts * m, k, dtype=torch.bfloat16, device=device)
                offs = torch.arange(m, experts * m + 1, m, dtype=torch.int32, device=device)
                kernel = "grouped_mm"
                try:
                    torch._grouped_mm(x, weight, offs=offs)
                    run: Callable[[], object] = lambda x=x, o=offs, w=weight: torch._grouped_mm(x, w, offs=o)  # noqa: E731
                except (RuntimeError, AttributeError, NotImplementedError):
                    kernel = "bmm"
                    x3 = x.view(experts, m, k)
                    run = lambda x3=x3, w=weight: torch.bmm(x3, w)  # noqa: E731
                out.append({"shape": name, "part": part, "experts": experts, "tokens_per_expert": m, "k": k,
                            "n": n, "kernel": kernel, "seconds": clock(run)})
        progress(f"experts {name}")
    return out


def vllm_moe(clock: Clock, device: torch.device, kernels: ModuleType, fused_moe_py: Path,
             shapes: dict[str, tuple[int, int, int, int]], token_counts: tuple[int, ...],
             dtype: torch.dtype) -> list[dict[str, Any]]:
    """One MoE layer's routed experts through vLLM's Triton kernel (`kernels`, loaded from `fused_moe_py`, whose
    configs/ give the tiles): its two GEMMs with the activation between, and with the sum over each token's experts.
    The first shape is checked against plain PyTorch."""
    from benchmarks.vllm_moe_kernel import VllmMoe  # noqa: PLC0415

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = []
    for shape, (experts, hidden, width, top_k) in shapes.items():
        for tokens in token_counts:
            layer = VllmMoe(kernels, fused_moe_py, name, hidden, width, experts, top_k, tokens, device, dtype)
            row: dict[str, Any] = {"shape": shape, "experts": experts, "hidden": hidden, "width": width,
                                   "top_k": top_k, "tokens": tokens, "config": layer.config,
                                   "config_source": layer.config_source,
                                   "gemms_s": clock(layer.gemms), "layer_s": clock(layer.layer)}
            if not out:
                reference = layer.reference()
                row["max_error"] = float((layer.layer().float() - reference).abs().max() / reference.abs().max())
            out.append(row)
        progress(f"vLLM MoE kernel {shape}")
    return out


def attention(clock: Clock, device: torch.device, arch: dict[str, int],
              decode: tuple[tuple[int, int], ...], prefill_tokens: int) -> list[dict[str, Any]]:
    """One layer's attention. Decode: each sequence's query heads, grouped by KV head, read its whole cache.
    Prefill: causal over one prompt."""
    heads, kv_heads, dim = arch["heads"], arch["kv_heads"], arch["head_dim"]
    group = heads // kv_heads
    out = []
    for seqs, context in decode:
        q = torch.randn(seqs, kv_heads, group, dim, dtype=torch.bfloat16, device=device)
        k = torch.randn(seqs, kv_heads, context, dim, dtype=torch.bfloat16, device=device)
        v = torch.randn_like(k)
        out.append({"kind": "decode", "seqs": seqs, "context": context, "heads": heads, "kv_heads": kv_heads,
                    "head_dim": dim, "seconds": clock(lambda q=q, k=k, v=v: sdpa(q, k, v))})
    q = torch.randn(1, heads, prefill_tokens, dim, dtype=torch.bfloat16, device=device)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out.append({"kind": "prefill", "tokens": prefill_tokens, "heads": heads, "head_dim": dim,
                "seconds": clock(lambda: sdpa(q, k, v, is_causal=True), inner=2)})
    progress("attention")
    return out


class Stack:
    """A decoder-only model on one GPU, every layer's norms, projections, attention and MLP (dense, or routed
    experts through grouped GEMMs), then the LM head: a decode step over each sequence's cache, or a prompt's
    prefill. Linear layers in BF16 or FP8 (per-token dynamic scales, as vLLM quantizes activations); experts in
    BF16. Random weights: timing only."""

    def __init__(self, arch: dict[str, int], precision: str, device: torch.device) -> None:
        self.arch, self.fp8 = arch, precision == "fp8"
        h, d, heads, kv = arch["hidden"], arch["head_dim"], arch["heads"], arch["kv_heads"]

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, dtype=torch.bfloat16, device=device) * 0.02

        def linear(n: int, k: int) -> torch.Tensor:
            weight = w(n, k)
            return weight.to(torch.float8_e4m3fn) if self.fp8 else weight

        self.layers: list[dict[str, torch.Tensor]] = []
        for _ in range(arch["layers"]):
            layer = {"norm1": torch.ones(h, dtype=torch.bfloat16, device=device),
                     "qkv": linear((heads + 2 * kv) * d, h), "o": linear(h, heads * d),
                     "norm2": torch.ones(h, dtype=torch.bfloat16, device=device)}
            if arch.get("experts"):
                e, inter = arch["experts"], arch["expert_intermediate"]
                layer |= {"router": w(e, h), "gate_up": w(e, 2 * inter, h).transpose(1, 2),
                          "down": w(e, h, inter).transpose(1, 2)}
            else:
                layer |= {"gate_up": linear(2 * arch["intermediate"], h), "down": linear(h, arch["intermediate"])}
            self.layers.append(layer)
        self.lm_head = w(arch["vocab"], h)
        widths = {t.shape[0] for layer in self.layers for t in layer.values() if t.dtype == torch.float8_e4m3fn}
        self.scales = {n: torch.ones(1, n, dtype=torch.float32, device=device) for n in widths}

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values()) + (
            self.lm_head.numel() * 2)

    @staticmethod
    def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + 1e-5)).to(x.dtype) * weight

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if not self.fp8:
            return x @ weight.t()
        scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-6) / 448.0
        quantized = (x / scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(quantized, weight.t(), scale_a=scale, scale_b=self.scales[weight.shape[0]],
                                out_dtype=torch.bfloat16)

    def _experts(self, x: torch.Tensor, layer: dict[str, torch.Tensor]) -> torch.Tensor:
        a = self.arch
        top = a["experts_per_token"]
        weights, ids = torch.topk(torch.softmax((x @ layer["router"].t()).float(), dim=-1), top)
        flat = ids.flatten()
        order = torch.argsort(flat)
        counts = torch.zeros(a["experts"], dtype=torch.int32, device=x.device).scatter_add_(
            0, flat.int(), torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        source = order // top
        gate, up = torch._grouped_mm(x[source], layer["gate_up"], offs=offs).chunk(2, dim=-1)
        out = torch._grouped_mm((functional.silu(gate) * up).contiguous(), layer["down"], offs=offs)
        out = out * weights.flatten()[order].unsqueeze(-1).to(out.dtype)
        return torch.zeros_like(x).index_add_(0, source, out)

    def _mlp(self, x: torch.Tensor, layer: dict[str, torch.Tensor]) -> torch.Tensor:
        if "router" in layer:
            return self._experts(x, layer)
        gate, up = self._linear(x, layer["gate_up"]).chunk(2, dim=-1)
        return self._linear((functional.silu(gate) * up).contiguous(), layer["down"])

    def decode(self, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        a = self.arch
        seqs, d, kv = x.shape[0], a["head_dim"], a["kv_heads"]
        group = a["heads"] // kv
        for layer, (k_cache, v_cache) in zip(self.layers, caches, strict=True):
            qkv = self._linear(self._norm(x, layer["norm1"]), layer["qkv"])
            q = qkv[:, : a["heads"] * d].reshape(seqs, kv, group, d)
            attended = sdpa(q, k_cache, v_cache).reshape(seqs, a["heads"] * d)
            x = x + self._linear(attended, layer["o"])
            x = x + self._mlp(self._norm(x, layer["norm2"]), layer)
        return x @ self.lm_head.t()

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """One prompt, causal attention over itself; the LM head for its last token only, as vLLM samples."""
        a = self.arch
        tokens, d, heads, kv = x.shape[0], a["head_dim"], a["heads"], a["kv_heads"]
        for layer in self.layers:
            qkv = self._linear(self._norm(x, layer["norm1"]), layer["qkv"])
            q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
            # (1, heads, tokens, head_dim): the fused kernels' layout (3-D inputs fall back to the unfused math)
            q = q.reshape(1, tokens, heads, d).transpose(1, 2)
            k = k.reshape(1, tokens, kv, d).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
            v = v.reshape(1, tokens, kv, d).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
            attended = sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape(tokens, heads * d)
            x = x + self._linear(attended, layer["o"])
            x = x + self._mlp(self._norm(x, layer["norm2"]), layer)
        return x[-1:] @ self.lm_head.t()


def _graphed(clock: Clock, run: Callable[[], object]) -> float:
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return clock(graph.replay, inner=3)


def stack_steps(clock: Clock, device: torch.device, name: str, arch: dict[str, int], precision: str,
                batches: tuple[int, ...], context: int, prompts: tuple[int, ...]) -> dict[str, Any]:
    """Decode steps of `batches` sequences with `context` tokens cached each (eager, and replayed as a CUDA
    graph), and prefill steps of one prompt of each length in `prompts` (eager: vLLM graphs no long prefill)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    stack = Stack(arch, precision, device)
    out: dict[str, Any] = {"name": name, "arch": arch, "precision": precision, "weight_bytes": stack.weight_bytes(),
                           "decode": [], "prefill": []}
    shape = (arch["kv_heads"], context, arch["head_dim"])
    for seqs in batches:
        try:
            caches = [(torch.randn(seqs, *shape, dtype=torch.bfloat16, device=device),
                       torch.randn(seqs, *shape, dtype=torch.bfloat16, device=device)) for _ in range(arch["layers"])]
            x = torch.randn(seqs, arch["hidden"], dtype=torch.bfloat16, device=device)
            row: dict[str, Any] = {"seqs": seqs, "context": context,
                                   "eager_s": clock(lambda x=x, c=caches, s=stack: s.decode(x, c), inner=3)}
        except (RuntimeError, torch.OutOfMemoryError) as e:
            row = {"seqs": seqs, "context": context, "error": str(e).splitlines()[0][:200]}
        if device.type == "cuda" and "error" not in row:
            try:
                row["graph_s"] = _graphed(clock, lambda x=x, c=caches, s=stack: s.decode(x, c))
            except (RuntimeError, torch.OutOfMemoryError) as e:
                row["graph_error"] = str(e).splitlines()[0][:200]
        out["decode"].append(row)
        caches = []
        if device.type == "cuda":
            torch.cuda.empty_cache()
        progress(f"{name} {precision}: decode step, {seqs} sequences")
    for tokens in prompts:
        x = torch.randn(tokens, arch["hidden"], dtype=torch.bfloat16, device=device)
        try:
            out["prefill"].append({"tokens": tokens, "eager_s": clock(lambda x=x, s=stack: s.prefill(x), inner=1)})
        except (RuntimeError, torch.OutOfMemoryError) as e:
            out["prefill"].append({"tokens": tokens, "error": str(e).splitlines()[0][:200]})
        progress(f"{name} {precision}: prefill of {tokens} tokens")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script, not a GPU")
    parser.add_argument("--vllm-moe", type=Path, metavar="FUSED_MOE_PY",
                        help="also time vLLM's Triton MoE kernel, read from this vllm/model_executor/layers/fused_moe/"
                             "fused_moe.py (with TRITON_INTERPRET=1 under --smoke)")
    args = parser.parse_args()
    kernels = None
    if args.vllm_moe:
        from benchmarks.vllm_moe_kernel import load  # noqa: PLC0415

        try:
            kernels = load(args.vllm_moe)
        except (OSError, SyntaxError, ValueError, ImportError) as exc:
            parser.error(f"--vllm-moe {args.vllm_moe}: {exc}; give an installed vLLM's "
                         "vllm/model_executor/layers/fused_moe/fused_moe.py (Triton installed)")
    if args.smoke:
        device, clock = torch.device("cpu"), Clock(torch.device("cpu"), 2)
        tiny = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "vocab": 1024}
        arch = {**tiny, "intermediate": 512}
        stacks: tuple[tuple[str, dict[str, int], str], ...] = (
            ("tiny", arch, "bf16"),
            ("tiny-moe", {**tiny, "experts": 8, "experts_per_token": 2, "expert_intermediate": 128}, "bf16"))
        dense: dict[str, tuple[int, int]] = {"tiny": (256, 512)}
        experts: dict[str, tuple[int, int, int]] = {"tiny": (4, 128, 64)}
        dense_tokens, per_expert, batches, prompts = (1, 16), (1, 4), (1, 4), (64,)
        moe_shapes: dict[str, tuple[int, int, int, int]] = {"tiny": (8, 64, 32, 2)}
        moe_tokens, moe_dtype = (5, 40), torch.float16  # Triton's interpreter runs no bfloat16
        decode: tuple[tuple[int, int], ...] = ((2, 128),)
        prefill, context, copy_gib = 256, 128, 0.01
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run on a GPU machine, or with --smoke", file=sys.stderr)
            return 2
        device, clock = torch.device("cuda"), Clock(torch.device("cuda"), 7)
        arch, stacks, dense, dense_tokens = LLAMA_8B, STACKS, DENSE_SHAPES, DENSE_TOKENS
        experts, per_expert, decode, prefill = EXPERT_SHAPES, TOKENS_PER_EXPERT, DECODE_ATTENTION, PREFILL_TOKENS
        batches, context, prompts, copy_gib = STEP_BATCHES, STEP_CONTEXT, PROMPTS, 4
        moe_shapes, moe_tokens, moe_dtype = VLLM_MOE_SHAPES, VLLM_MOE_TOKENS, torch.bfloat16
    torch.manual_seed(0)
    facts: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                             "measured": time.strftime("%Y-%m-%d", time.gmtime())}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update({"gpu": props.name, "memory_bytes": props.total_memory,
                      "multiprocessors": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
                      "cuda": torch.version.cuda})
    result: dict[str, Any] = {"device": facts, "memory": memory_copy(clock, device, copy_gib)}
    progress("memory")
    result["dense"] = dense_gemms(clock, device, dense, dense_tokens)
    result["experts"] = grouped_gemms(clock, device, experts, per_expert)
    if kernels is not None:
        result["vllm_moe"] = vllm_moe(clock, device, kernels, args.vllm_moe, moe_shapes, moe_tokens, moe_dtype)
    result["attention"] = attention(clock, device, arch, decode, prefill)
    result["stacks"] = [stack_steps(clock, device, name, a, precision, batches, context, prompts)
                        for name, a, precision in stacks]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    copy = result["memory"]
    print(f"{facts.get('gpu', 'cpu')}: copy {2 * copy['bytes'] / copy['copy_s'] / 1e12:.2f} TB/s (read + write), "
          f"read {copy['bytes'] / copy['read_s'] / 1e12:.2f} TB/s")
    for row in result["dense"]:
        flops = 2 * row["m"] * row["k"] * row["n"]
        print(f"dense {row['shape']:22} {row['dtype']:4} m={row['m']:5}: {row['seconds'] * 1e6:9.1f} us "
              f"{flops / row['seconds'] / 1e12:7.1f} TFLOP/s")
    for row in result["experts"]:
        flops = 2 * row["experts"] * row["tokens_per_expert"] * row["k"] * row["n"]
        print(f"experts {row['shape']:18} {row['part']:7} {row['tokens_per_expert']:4}/expert ({row['kernel']}): "
              f"{row['seconds'] * 1e6:9.1f} us {flops / row['seconds'] / 1e12:7.1f} TFLOP/s")
    for row in result.get("vllm_moe", []):
        flops = 2 * row["tokens"] * row["top_k"] * row["hidden"] * 3 * row["width"]
        print(f"vLLM MoE kernel {row['shape']:20} {row['tokens']:5} tokens ({row['config_source']}): GEMMs "
              f"{row['gemms_s'] * 1e6:9.1f} us, layer {row['layer_s'] * 1e6:9.1f} us "
              f"{flops / row['gemms_s'] / 1e12:7.1f} TFLOP/s" + (
                  f"; relative error {row['max_error']:.1e}" if "max_error" in row else ""))
    for row in result["attention"]:
        print(f"attention {json.dumps({k: v for k, v in row.items() if k != 'seconds'})}: "
              f"{row['seconds'] * 1e6:.1f} us")
    for stack in result["stacks"]:
        for row in stack["decode"] + stack["prefill"]:
            what = f"decode {row['seqs']} x {row['context']}" if "seqs" in row else f"prefill {row['tokens']}"
            timing = row.get("error") or (f"eager {row['eager_s'] * 1e3:.2f} ms" + (
                f", graph {row['graph_s'] * 1e3:.2f} ms" if "graph_s" in row else ""))
            print(f"{stack['name']} {stack['precision']}: {what}: {timing}")
    return 0 if all(math.isfinite(r["seconds"]) for r in result["dense"]) else 1


if __name__ == "__main__":
    sys.exit(main())

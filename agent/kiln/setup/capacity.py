"""The capacity model: weights and KV cache from architecture facts. Pure.

It mirrors how vLLM sizes its KV cache at start-up (vllm/v1/worker/gpu_worker.py
determine_available_memory; vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity):
    available = total × gpu_memory_utilization − weights − non-torch − peak activation − CUDA-graph estimate
    tokens    = blocks / blocks-per-request × max_model_len
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kiln.profiles.schema import Architecture as ModelArch
from kiln.profiles.schema import Profile
from kiln.setup.types import Constants

# Bytes per parameter of quantized linear weights, scales included:
# FP8: 1 byte; NVFP4: 4 bits + one FP8 scale per 16 values; MXFP4: 4 bits + one E8M0 scale per 32;
# INT4 (AWQ/GPTQ, group 128): 4 bits + fp16 scale and zero per 128.
BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32, "int4": 0.5 + 4 / 128}
KV_DTYPE_BYTES = {"auto": 2, "fp8": 1, "bf16": 2}
# DeepSeek sparse MLA with an FP8 cache stores 656 bytes per token and layer: 512 FP8 latent values,
# 4 float32 scales and 64 bf16 RoPE values (vLLM's fp8_ds_mla layout).
FP8_DS_MLA_BYTES = 656

# vLLM's default ceiling on the batch sizes it captures as CUDA graphs (1,024 on Blackwell is not used).
MAX_CAPTURE_SIZE = 512


def embedding_params(arch: ModelArch) -> int:
    return arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)


# vLLM's MXFP4 MoE kernels pad the experts' hidden dimension to a multiple of 256: gpt-oss-120b
# (hidden 2880 -> 3072) loads as 64.38 GiB on an H100 (tests/data/kv_cache_observations.yaml).
MXFP4_HIDDEN_ALIGN = 256


def expert_params(arch: ModelArch) -> int:
    """Parameters in routed experts (gate, up and down projections of every expert of every layer)."""
    if arch.moe is None or arch.moe.moe_intermediate_size is None:
        return 0
    return arch.num_layers * arch.moe.num_experts * 3 * arch.hidden_size * arch.moe.moe_intermediate_size


def weight_bytes(profile: Profile, precision: str) -> int:
    """Weights in GPU memory: the recorded size when the profile has it, else from parameter counts.

    Embeddings and the LM head stay in bf16 in quantized checkpoints; MXFP4 checkpoints (gpt-oss)
    quantize only the routed experts and keep attention in bf16.
    """
    recorded = profile.checkpoints.get(precision)  # type: ignore[call-overload]
    if recorded is not None and recorded.weight_bytes:
        return int(recorded.weight_bytes)
    arch = profile.architecture
    if precision == "mxfp4" and expert_params(arch):
        experts = min(expert_params(arch), arch.params_total)
        padded = -(-arch.hidden_size // MXFP4_HIDDEN_ALIGN) * MXFP4_HIDDEN_ALIGN / arch.hidden_size
        return int(experts * padded * BYTES_PER_PARAM["mxfp4"] + (arch.params_total - experts) * 2)
    embed = embedding_params(arch)
    body = max(arch.params_total - embed, 0)
    return int(embed * 2 + body * BYTES_PER_PARAM[precision])


def expert_weight_bytes(profile: Profile, precision: str) -> int:
    """The share of the weights that sits in routed experts (what expert parallelism spreads over its ranks)."""
    arch = profile.architecture
    experts = min(expert_params(arch), arch.params_total)
    if not experts:
        return 0
    if precision == "mxfp4":
        padded = -(-arch.hidden_size // MXFP4_HIDDEN_ALIGN) * MXFP4_HIDDEN_ALIGN / arch.hidden_size
        return int(experts * padded * BYTES_PER_PARAM["mxfp4"])
    return int(weight_bytes(profile, precision) * experts / arch.params_total)


def weight_bytes_per_gpu(profile: Profile, precision: str, tp: int, expert_ranks: int = 1) -> int:
    """Weights on each GPU: everything split `tp` ways, except that with expert parallelism the routed experts
    are split over all `expert_ranks` (tp x data-parallel ranks) while attention stays split by tp."""
    total = weight_bytes(profile, precision)
    if expert_ranks <= 1:
        return total // tp
    experts = expert_weight_bytes(profile, precision)
    return (total - experts) // tp + experts // expert_ranks


def active_weight_bytes(profile: Profile, precision: str, batch: int) -> float:
    """Bytes of weights one decode step reads: all dense weights, and for MoE the experts hit.

    With `batch` sequences each routing to k of E experts, the expected number of distinct
    experts hit is E × (1 − (1 − k/E)^batch).
    """
    total = weight_bytes(profile, precision)
    moe = profile.architecture.moe
    if moe is None:
        return float(total)
    arch = profile.architecture
    expert_share = (arch.params_total - arch.params_active) / arch.params_total
    per_expert_fraction = expert_share / max(moe.num_experts - moe.experts_per_token, 1)
    hit = moe.num_experts * (1 - (1 - moe.experts_per_token / moe.num_experts) ** max(batch, 1))
    unread_experts = max(moe.num_experts - hit, 0.0)
    return total * max(1 - unread_experts * per_expert_fraction, arch.params_active / arch.params_total)


@dataclass(frozen=True)
class KvLayout:
    """KV-cache bytes per token, and how vLLM groups layers into pages."""

    bytes_per_token_per_gpu: int  # all layers that hold full context
    bytes_per_token_instance: int
    full_layers: int
    sliding_layers: int
    sliding_window: int


def kv_layout(arch: ModelArch, tp: int, kv_dtype: str) -> KvLayout:
    elem = KV_DTYPE_BYTES.get(kv_dtype, 1)
    sliding = arch.sliding_window.layers if arch.sliding_window else 0
    window = arch.sliding_window.window if arch.sliding_window else 0
    full = arch.num_layers - sliding
    if arch.mla is not None:
        # MLA caches one latent vector per token and layer, replicated on every TP rank.
        per_layer = (FP8_DS_MLA_BYTES if elem == 1 else
                     (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * elem)
        if arch.sparse_attention is not None:
            per_layer += arch.sparse_attention.index_head_dim + 4  # FP8 indexer key + its scale
        return KvLayout(per_layer * arch.num_layers, per_layer * arch.num_layers, arch.num_layers, 0, 0)
    heads_per_gpu = max(arch.num_kv_heads // tp, 1)  # KV heads replicate when tp > num_kv_heads
    per_layer_gpu = 2 * heads_per_gpu * arch.head_dim * elem
    per_layer_instance = 2 * arch.num_kv_heads * arch.head_dim * elem
    return KvLayout(per_layer_gpu * full, per_layer_instance * full, full, sliding, window)


def overhead_bytes_per_gpu(profile: Profile, tp: int, max_num_seqs: int, max_num_batched_tokens: int,
                           capture_sizes: int, c: Constants, full_graphs: int = 0) -> int:
    """What vLLM's start-up profiling takes besides weights: non-torch, activations, logits, and the CUDA-graph
    estimate for `capture_sizes` PIECEWISE and `full_graphs` FULL graphs (cudagraph_reserve_bytes)."""
    arch = profile.architecture
    v = c.get("vllm")
    mlp_width = arch.moe.moe_intermediate_size if arch.moe and arch.moe.moe_intermediate_size else (
        arch.intermediate_size)
    activation = max_num_batched_tokens * (arch.hidden_size * v["activation_bytes_per_token_per_hidden"]
                                           + 2 * mlp_width // tp * v["activation_bytes_per_token_per_mlp"])
    logits = max_num_seqs * arch.vocab_size * v["logits_bytes_per_seq_per_vocab"]
    parallel = v["tensor_parallel_extra_bytes"] if tp > 1 else 0
    graphs = cudagraph_reserve_bytes(tp, capture_sizes, full_graphs, c) if v["subtract_cudagraph_estimate"] else 0
    return int(v["non_torch_bytes"] + parallel + activation + logits + graphs)


def cudagraph_reserve_bytes(tp: int, piecewise_graphs: int, full_graphs: int, c: Constants) -> int:
    """The CUDA-graph memory vLLM 0.32 takes out of the KV cache before sizing it.

    Worker.determine_available_memory (vllm/v1/worker/gpu_worker.py) subtracts
    GPUModelRunner.profile_cudagraph_memory() (vllm/v1/worker/gpu_model_runner.py): per mode it captures the two
    largest graphs, and reserves the larger first capture plus, for every further graph of either mode, the second
    capture's cost ("first-capture + (n-1) x per-graph" in its DEBUG log). Under tensor parallelism each PIECEWISE
    graph also holds its custom all-reduce buffers.
    """
    if piecewise_graphs + full_graphs == 0:
        return 0
    v = c.get("vllm")
    per_graph = v["cudagraph_bytes_per_graph"]
    per_piecewise = per_graph + (v["cudagraph_tensor_parallel_bytes_per_piecewise_graph"] if tp > 1 else 0)
    return int(v["cudagraph_first_capture_bytes"] + max(piecewise_graphs - 1, 0) * per_piecewise
               + max(full_graphs - 1, 0) * per_graph)


def max_utilization_for_capture(gpu_memory_bytes: int, c: Constants) -> float:
    """The highest gpu_memory_utilization that still leaves room outside vLLM's budget for the capture to overrun
    its own estimate: the real capture runs after the full KV cache is allocated and can take more than the
    profile measured (vllm#57475: an OOM at 0.98 on a 24 GB GPU, none at 0.97)."""
    return 1 - float(c.get("vllm", "cudagraph_capture_overrun_bytes")) / gpu_memory_bytes


def cudagraph_capture_sizes(max_capture_size: int, max_num_batched_tokens: int | None = None) -> list[int]:
    """The batch sizes (tokens) vLLM 0.32 captures for a given max_cudagraph_capture_size: 1, 2, 4, every 8 below
    256, every 16 from 256, and max_num_batched_tokens itself when it fits (vllm/config/vllm.py,
    VllmConfig._set_cudagraph_sizes); the ceiling is first cut to max_num_batched_tokens."""
    top = min(max_capture_size, max_num_batched_tokens) if max_num_batched_tokens else max_capture_size
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if max_num_batched_tokens and max_num_batched_tokens <= top:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def cudagraph_capture_count(max_capture_size: int, max_num_batched_tokens: int | None = None,
                            max_num_seqs: int | None = None, decode_query_len: int = 1) -> int:
    """How many CUDA graphs vLLM 0.32 captures. Under FULL_AND_PIECEWISE (kiln's plans), a PIECEWISE graph for
    every capture size and, given max_num_seqs, a FULL decode graph for every size from decode_query_len to
    max_num_seqs x decode_query_len (vllm/v1/cudagraph_dispatcher.py, initialize_cudagraph_keys): the start-up log
    says "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)"."""
    sizes = cudagraph_capture_sizes(max_capture_size, max_num_batched_tokens)
    if max_num_seqs is None:
        return len(sizes)
    full = [s for s in sizes if decode_query_len <= s <= max_num_seqs * decode_query_len]
    return len(sizes) + len(full)


def kv_cache_tokens(kv_bytes_per_gpu: int, layout: KvLayout, max_model_len: int, block_size: int,
                    max_num_batched_tokens: int) -> tuple[int, float]:
    """(tokens vLLM reports as "GPU KV cache size", max concurrency at max_model_len).

    Sliding-window layers form their own page groups; a request needs only the window's worth
    of their blocks (vLLM's hybrid KV-cache manager).
    """
    if kv_bytes_per_gpu <= 0 or layout.bytes_per_token_per_gpu <= 0:
        return 0, 0.0
    if layout.sliding_layers and layout.full_layers:
        group = min(layout.full_layers, layout.sliding_layers)
        if max(layout.full_layers, layout.sliding_layers) % group:
            group = max(layout.full_layers, layout.sliding_layers)
        per_layer = layout.bytes_per_token_per_gpu // layout.full_layers
        page = per_layer * group * block_size
        blocks = kv_bytes_per_gpu // page
        full_groups = math.ceil(layout.full_layers / group)
        sliding_groups = math.ceil(layout.sliding_layers / group)
        window = min(layout.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        per_request = (full_groups * math.ceil(max_model_len / block_size)
                       + sliding_groups * (math.ceil(window / block_size) + 1))
    else:
        blocks = kv_bytes_per_gpu // (layout.bytes_per_token_per_gpu * block_size)
        per_request = math.ceil(max_model_len / block_size)
    concurrency = blocks / per_request
    return int(concurrency * max_model_len), concurrency


@dataclass(frozen=True)
class KvCapacity:
    weight_bytes_per_gpu: int
    overhead_bytes_per_gpu: int
    kv_cache_bytes_per_gpu: int
    layout: KvLayout
    tokens: int  # vLLM's "GPU KV cache size: N tokens"
    concurrency: float  # vLLM's "Maximum concurrency for max_model_len tokens per request"


def kv_capacity(profile: Profile, *, precision: str, tp: int, gpu_memory_bytes: int, utilization: float,
                max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, kv_dtype: str,
                c: Constants, draft_params: int = 0, weight_bytes_override: int | None = None,
                max_capture_size: int | None = None) -> KvCapacity:
    """The KV cache vLLM will find room for at start-up, per GPU and in tokens per instance.

    `max_capture_size` defaults to vLLM's own: min(2 x max_num_seqs, 512).
    """
    weights = (weight_bytes_override if weight_bytes_override is not None
               else weight_bytes(profile, precision) // tp) + draft_params * 2 // tp
    capture = cudagraph_capture_count(max_capture_size or min(max_num_seqs * 2, 512), max_num_batched_tokens)
    full = cudagraph_capture_count(max_capture_size or min(max_num_seqs * 2, 512), max_num_batched_tokens,
                                   max_num_seqs) - capture
    overhead = overhead_bytes_per_gpu(profile, tp, max_num_seqs, max_num_batched_tokens, capture, c, full)
    kv_bytes = int(gpu_memory_bytes * utilization) - weights - overhead
    layout = kv_layout(profile.architecture, tp, kv_dtype)
    tokens, concurrency = kv_cache_tokens(max(kv_bytes, 0), layout, max_model_len, c.get("vllm", "block_size"),
                                          max_num_batched_tokens)
    return KvCapacity(weights, overhead, kv_bytes, layout, tokens, concurrency)

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
# 4 float32 scales and 64 bf16 RoPE values (vLLM's fp8_ds_mla layout). vLLM turns an FP8 cache into it only for its
# sparse MLA backends (vllm/model_executor/layers/attention/mla_attention.py, _canonicalize_sparse_mla_kv_cache_dtype);
# dense MLA (DeepSeek-V3/R1, Kimi-K2) keeps the plain FP8 latent, kv_lora_rank + qk_rope_head_dim bytes (576).
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
    layers = arch.moe.layers or arch.num_layers
    return layers * arch.moe.num_experts * 3 * arch.hidden_size * arch.moe.moe_intermediate_size


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


def experts_hit(experts: int, per_token: int, tokens: int) -> float:
    """The expected number of distinct experts `tokens` tokens route to, each to `per_token` of `experts`."""
    return experts * (1 - (1 - per_token / experts) ** max(tokens, 1))


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
    hit = experts_hit(moe.num_experts, moe.experts_per_token, batch)
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
    state_layers: int = 0  # linear-attention layers: a fixed state per sequence, no per-token K/V
    state_bytes_per_layer_per_gpu: int = 0  # one such layer's state for one sequence
    # DeepSeek-V4's compressed caches: the model's own block (tokens) and the bytes of one such block over all
    # compressed layers; and its per-request windowed caches as (window, block tokens, page bytes, layers).
    block_tokens: int = 0
    block_bytes_per_gpu: int = 0
    windows: tuple[tuple[int, int, int, int], ...] = ()


# Pages of each linear-attention layer a request holds: vLLM turns prefix caching on by default and then keeps
# its Mamba-style states in "align" mode, 2 pages per request (vllm/model_executor/models/config.py
# MambaModelConfig; vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes).
STATE_PAGES_PER_REQUEST = 2
# The attention kernels' block granularity vLLM rounds a hybrid model's block size to
# (vllm/platforms/interface.py _align_hybrid_block_size).
KERNEL_BLOCK = 16


def linear_state_bytes(arch: ModelArch, tp: int) -> int:
    """One Gated DeltaNet layer's state for one sequence on one GPU, as vLLM allocates it
    (vllm/model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape): a conv state of
    (kernel - 1) x conv_dim in bf16, conv_dim = 2 x key heads x key dim + value heads x value dim, and a recurrent
    state of value heads x value dim x key dim in the config's mamba_ssm_dtype; both split tp ways."""
    lin = arch.linear_attention
    if lin is None:
        return 0
    conv_dim = 2 * lin.num_key_heads * lin.key_head_dim + lin.num_value_heads * lin.value_head_dim
    conv = conv_dim // tp * (lin.conv_kernel - 1) * 2
    recurrent = lin.num_value_heads // tp * lin.value_head_dim * lin.key_head_dim * lin.state_dtype_bytes
    return conv + recurrent


# DeepSeek-V4 on NVIDIA GPUs (FlashMLA, vllm/models/deepseek_v4/nvidia/flashmla.py) always stores its attention
# cache in the fp8_ds_mla layout (vllm/models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype): per state
# 448 FP8 NoPE values + 64 bf16 RoPE values + 8 bytes of scales = 584 bytes, pages rounded up to 576 bytes.
DSV4_BLOCK = 256  # the only block size its sparse-MLA and indexer backends take (get_supported_kernel_block_sizes)
DSV4_STATE_BYTES = 584
DSV4_PAGE_ALIGN = 576
DSV4_SWA_BLOCK = 64  # DeepseekV4SWACache block_size (vllm/v1/attention/backends/mla/sparse_swa.py)


def _aligned(page: int) -> int:
    return -(-page // DSV4_PAGE_ALIGN) * DSV4_PAGE_ALIGN


def _deepseek_v4_layout(arch: ModelArch) -> KvLayout:
    """DeepSeek-V4's caches as vLLM 0.32 declares them (vllm/models/deepseek_v4/attention.py, compressor.py;
    vllm/v1/attention/backends/mla/sparse_swa.py), one copy on every GPU (max_tp_shards 1):
    - a layer with compress ratio r > 1: MLAAttentionSpec of 256 / r states of 584 bytes per 256-token block;
    - r = 4 also: the indexer's keys, 256 / 4 states of index_head_dim FP8 bytes + a 4-byte scale per 128;
    - every layer: a 128-token sliding window (SlidingWindowMLASpec, 64-token blocks of 584-byte rows);
    - r > 1: the compressor's float32 state (2 x (1 + [r = 4]) x head_dim values per token) over a window of
      (1 + [r = 4]) x r tokens in blocks of 4 (r = 4) or 8 (r = 128) tokens; r = 4 also the indexer's compressor.
    Every page is rounded up to 576 bytes (the fp8_ds_mla alignment)."""
    ca = arch.compressed_attention
    assert ca is not None  # its head_dim is 512: CompressedAttention refuses any other at the boundary
    index_row = ca.index_head_dim + ca.index_head_dim // 128 * 4
    block_bytes = 0
    windows: dict[tuple[int, int, int], int] = {}

    def window(size: int, block: int, page: int) -> None:
        windows[(size, block, page)] = windows.get((size, block, page), 0) + 1

    for ratio in ca.ratios:
        window(ca.window, DSV4_SWA_BLOCK, _aligned(DSV4_SWA_BLOCK * DSV4_STATE_BYTES))
        if ratio <= 1:
            continue
        block_bytes += _aligned(DSV4_BLOCK // ratio * DSV4_STATE_BYTES)
        coff = 2 if ratio == 4 else 1
        state_block = 4 if ratio == 4 else 8
        window(coff * ratio, state_block, _aligned(state_block * 2 * coff * ca.head_dim * 4))
        if ratio == 4:
            block_bytes += _aligned(DSV4_BLOCK // ratio * index_row)
            window(coff * ratio, state_block, _aligned(state_block * 2 * coff * ca.index_head_dim * 4))
    compressed = sum(1 for r in ca.ratios if r > 1)
    per_token = block_bytes // DSV4_BLOCK
    return KvLayout(per_token, per_token, compressed, 0, 0, block_tokens=DSV4_BLOCK, block_bytes_per_gpu=block_bytes,
                    windows=tuple((w, b, p, n) for (w, b, p), n in windows.items()))


def kv_layout(arch: ModelArch, tp: int, kv_dtype: str) -> KvLayout:
    """Per-token cache bytes as vLLM lays them out (vllm/v1/kv_cache_interface.py):
    full attention (FullAttentionSpec): 2 (K and V) x KV heads on this GPU x head_dim x dtype bytes per layer;
    MLA (MLAAttentionSpec): one latent of kv_lora_rank + qk_rope_head_dim per layer, the same on every TP rank;
    DeepSeek sparse attention stores an FP8 latent as fp8_ds_mla (656 bytes) and adds the indexer's FP8 key
    (index_head_dim + a 4-byte scale per 128 values);
    linear-attention layers keep no per-token bytes, only their per-sequence state."""
    if arch.compressed_attention is not None:
        return _deepseek_v4_layout(arch)
    elem = KV_DTYPE_BYTES.get(kv_dtype, 1)
    sliding = arch.sliding_window.layers if arch.sliding_window else 0
    window = arch.sliding_window.window if arch.sliding_window else 0
    linear = arch.linear_attention.layers if arch.linear_attention else 0
    full = arch.num_layers - sliding - linear
    if arch.mla is not None:
        # MLA caches one latent vector per token and layer, replicated on every TP rank.
        per_layer = (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * elem
        if arch.sparse_attention is not None:
            if elem == 1:
                per_layer = FP8_DS_MLA_BYTES
            per_layer += arch.sparse_attention.index_head_dim + 4  # FP8 indexer key + its scale
        return KvLayout(per_layer * arch.num_layers, per_layer * arch.num_layers, arch.num_layers, 0, 0)
    heads_per_gpu = max(arch.num_kv_heads // tp, 1)  # KV heads replicate when tp > num_kv_heads
    per_layer_gpu = 2 * heads_per_gpu * arch.head_dim * elem
    per_layer_instance = 2 * arch.num_kv_heads * arch.head_dim * elem
    return KvLayout(per_layer_gpu * full, per_layer_instance * full, full, sliding, window,
                    linear, linear_state_bytes(arch, tp))


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
    if layout.block_tokens:
        return _compressed_tokens(kv_bytes_per_gpu, layout, max_model_len, max_num_batched_tokens)
    if layout.state_layers:
        return _hybrid_state_tokens(kv_bytes_per_gpu, layout, max_model_len, block_size)
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


def _compressed_tokens(kv_bytes_per_gpu: int, layout: KvLayout, max_model_len: int,
                       max_num_batched_tokens: int) -> tuple[int, float]:
    """DeepSeek-V4: a request at max_model_len takes ceil(len / 256) blocks of every compressed cache, and for each
    windowed cache the blocks vLLM reserves for it (SlidingWindowSpec.max_admission_blocks_per_request: the window
    less one plus the tokens in flight, in blocks, plus one). vLLM's packing of these groups into one pool
    (kv_cache_utils._get_packed_kv_cache_groups) may pad pages further; that padding is not counted."""
    per_request = math.ceil(max_model_len / layout.block_tokens) * layout.block_bytes_per_gpu
    for window, block, page, layers in layout.windows:
        tokens = min(window - 1 + max_num_batched_tokens, max_model_len)
        per_request += layers * (math.ceil(tokens / block) + 1) * page
    concurrency = kv_bytes_per_gpu / per_request
    return int(concurrency * max_model_len), concurrency


def _hybrid_state_tokens(kv_bytes_per_gpu: int, layout: KvLayout, max_model_len: int,
                         block_size: int) -> tuple[int, float]:
    """Full-attention layers beside linear-attention layers (vLLM's hybrid KV-cache manager): the attention block
    grows until one layer's page holds a linear layer's state, every page is that size, and layers form groups of
    equal size; a request takes ceil(len / block) pages per full group and a fixed few per linear group."""
    per_layer_token = layout.bytes_per_token_per_gpu // layout.full_layers
    block = max(block_size, KERNEL_BLOCK * -(-layout.state_bytes_per_layer_per_gpu // (KERNEL_BLOCK * per_layer_token)))
    page = block * per_layer_token
    # Group size (vllm/v1/core/kv_cache_utils.py, layers of each kind split into equal groups, the last padded):
    # the smaller count, or the larger when it is under 1.5 times the smaller.
    small, large = sorted((layout.full_layers, layout.state_layers))
    group = large if large < small * 1.5 else small
    blocks = kv_bytes_per_gpu // (page * group)
    per_request = (math.ceil(layout.full_layers / group) * math.ceil(max_model_len / block)
                   + math.ceil(layout.state_layers / group) * STATE_PAGES_PER_REQUEST)
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


def lora_bytes(profile: Profile) -> int:
    """The buffers vLLM allocates for --max-loras adapters of --max-lora-rank, at 16 bits, whatever the adapters
    adapt: A and B of every linear layer of every decoder layer (q, k, v, o, gate, up, down), and of the embeddings
    and the output head (vllm/lora/layers: lora_a_stacked, lora_b_stacked)."""
    s = profile.serving
    if not s.lora_adapters:
        return 0
    a = profile.architecture
    h, inter = a.hidden_size, a.intermediate_size
    q, kv = a.num_attention_heads * a.head_dim, a.num_kv_heads * a.head_dim
    per_rank = a.num_layers * (7 * h + 2 * q + 2 * kv + 3 * inter) + 2 * (a.vocab_size + h)
    return 2 * s.lora_adapters * s.max_lora_rank * per_rank


def kv_capacity(profile: Profile, *, precision: str, tp: int, gpu_memory_bytes: int, utilization: float,
                max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, kv_dtype: str,
                c: Constants, draft_params: int = 0, weight_bytes_override: int | None = None,
                max_capture_size: int | None = None) -> KvCapacity:
    """The KV cache vLLM will find room for at start-up, per GPU and in tokens per instance.

    `max_capture_size` defaults to vLLM's own: min(2 x max_num_seqs, 512).
    """
    weights = (weight_bytes_override if weight_bytes_override is not None
               else weight_bytes(profile, precision) // tp) + draft_params * 2 // tp + lora_bytes(profile) // tp
    capture = cudagraph_capture_count(max_capture_size or min(max_num_seqs * 2, 512), max_num_batched_tokens)
    full = cudagraph_capture_count(max_capture_size or min(max_num_seqs * 2, 512), max_num_batched_tokens,
                                   max_num_seqs) - capture
    overhead = overhead_bytes_per_gpu(profile, tp, max_num_seqs, max_num_batched_tokens, capture, c, full)
    kv_bytes = int(gpu_memory_bytes * utilization) - weights - overhead
    layout = kv_layout(profile.architecture, tp, kv_dtype)
    tokens, concurrency = kv_cache_tokens(max(kv_bytes, 0), layout, max_model_len, c.get("vllm", "block_size"),
                                          max_num_batched_tokens)
    return KvCapacity(weights, overhead, kv_bytes, layout, tokens, concurrency)

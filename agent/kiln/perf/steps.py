"""How long one engine step takes: the interface every performance engine gives the simulator, and kiln's own
engine, a roofline calibrated on public measurements. Pure.

A vLLM step runs one forward pass over every scheduled token: one (or, verifying drafts, k+1) for each
decoding sequence, plus the prompt chunks chunked prefill mixes in.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

from kiln.profiles.schema import Profile
from kiln.setup import capacity as cap


@dataclass(frozen=True)
class Roofline:
    bandwidth_bytes_s: float  # achievable memory bandwidth, per GPU
    flops: float | None  # achievable dense FLOP/s per GPU at the weight precision
    allreduce_latency_s: float  # one small all-reduce
    link_bytes_s: float  # one direction of the GPU-to-GPU link, per GPU


AllreduceTable = tuple[tuple[int, tuple[tuple[int, float], ...]], ...]  # (GPUs, ((elements, microseconds), ...))

# Bytes per hidden-state element vLLM's expert-parallel dispatch gathers: activations quantized before the
# exchange where the experts take them quantized (FP8 block scales; NVFP4 with a scale per 16), else bf16
# (vllm/model_executor/layers/fused_moe/prepare_finalize/naive_dp_ep.py, _quantize_and_setup_dispatch).
_DISPATCH_BYTES = {"fp8": 1.0, "nvfp4": 0.5 + 1 / 16}


def allreduce_seconds(tokens: int, hidden: int, tp: int, roof: Roofline, table: AllreduceTable = ()) -> float:
    """One all-reduce of `tokens` bf16 hidden states across `tp` GPUs: from measured times by message size where
    the table has this GPU count, else a latency plus the ring's 2(n-1)/n x payload over one link direction."""
    if tp <= 1:
        return 0.0
    points = next((p for n, p in table if n == tp), None)
    if points:
        return _log_interpolate(points, max(tokens * hidden, 1)) * 1e-6
    payload = tokens * hidden * 2
    return roof.allreduce_latency_s + 2 * (tp - 1) / tp * payload / roof.link_bytes_s


def _log_interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    """Through the points in log-log; flat below the first, proportional to x past the last."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1] * x / points[-1][0]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    return points[-1][1]


def _by_length(table: tuple[tuple[int, float], ...], length: float) -> float:
    """A share of peak from (sequence length, share) points: linear in log length between them, flat outside."""
    if length <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(table):
        if length <= x1:
            return y0 + (y1 - y0) * math.log(length / x0) / math.log(x1 / x0)
    return table[-1][1]


def draft_seconds(profile: Profile, precision: str, tp: int, k: int, roof: Roofline) -> float:
    """k draft passes of an EAGLE/MTP head: about one decoder layer plus the LM head, memory-bound."""
    arch = profile.architecture
    one_layer = cap.active_weight_bytes(profile, precision, 1) / arch.num_layers
    lm_head = arch.vocab_size * arch.hidden_size * 2
    return k * (one_layer + lm_head) / tp / roof.bandwidth_bytes_s


@functools.cache
def expected_max_normal(count: int) -> float:
    """The expected largest of `count` independent standard normal draws (1.42 for 8), by numerical integration
    of x * count * pdf(x) * cdf(x) ** (count - 1)."""
    normal, step = statistics.NormalDist(), 0.01
    return sum(x * count * normal.pdf(x) * normal.cdf(x) ** (count - 1) * step
               for x in (i * step for i in range(-1000, 1001)))


def speculative_tokens_per_step(acceptance: float, k: int) -> float:
    """Expected tokens emitted per verification step with k drafted tokens (geometric acceptance)."""
    if acceptance >= 1:
        return float(k + 1)
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


@dataclass(frozen=True)
class Step:
    decode_seqs: int
    decode_context: float  # tokens in the KV cache of all decoding sequences together
    prefill_tokens: int = 0
    prefill_context: float = 0.0  # over prefilled tokens, the sum of the positions each attends to
    tokens_per_seq: int = 1  # k + 1 when speculative decoding verifies k drafts
    prefill_seqs: int = 0  # prompts the prefill tokens belong to (0: one, where there are prefill tokens)
    # Tokens all data-parallel ranks of a MoE model send through their experts in this step, where the ranks step
    # together and each brings its own batch (0: every rank as many as this one).
    ranks_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.decode_seqs * self.tokens_per_seq + self.prefill_tokens

    @property
    def sampled(self) -> int:
        """Positions the LM head computes logits for: every decoding token, and the last of each prompt chunk
        (vllm/v1/worker/gpu_model_runner.py, logits_indices)."""
        prompts = (self.prefill_seqs or 1) if self.prefill_tokens else 0
        return self.decode_seqs * self.tokens_per_seq + prompts


class StepModel(Protocol):
    """An engine's step time. `name` says which engine and data it is."""

    @property
    def name(self) -> str: ...

    def seconds(self, step: Step) -> float: ...


@dataclass(frozen=True)
class Hardware:
    """What the roofline needs of the GPUs one instance runs on (or of the CPU cores)."""

    bandwidth_bytes_s: float  # peak memory bandwidth per GPU
    flops: float | None  # peak dense FLOP/s per GPU at the weights' precision
    allreduce_latency_s: float
    link_bytes_s: float  # one direction of the GPU-to-GPU link
    allreduce_us: AllreduceTable = ()  # measured all-reduce times over this machine's links, when kiln has them
    sparse_mla_min_heads: int = 0  # query heads a sparse-MLA decode kernel runs per GPU at least (padding)
    sparse_mla_prefill_min_heads: int = 0  # the same for its prefill kernel (0: as the decode kernel)
    expert_flops: float | None = None  # the routed experts' kernel's peak, where not the weights' precision's
    attention_flops: float | None = None  # BF16 peak per GPU, which attention runs at (None: the weights' peak)


@dataclass(frozen=True)
class Efficiency:
    """The calibrated fractions of peak, and the fixed cost of a step (data/planner.yaml `roofline`)."""

    memory: float
    compute: float
    compute_moe: float  # the same for routed experts' grouped GEMMs, which reach far less of the peak
    step_overhead_s: float  # scheduling, sampling, launches: what a step costs with no work in it
    overhead_per_layer_s: float  # kernel launches and small ops per decoder layer
    overhead_per_seq_s: float = 0.0  # per scheduled sequence: sampling, detokenizing, streaming its output
    overhead_per_rank_s: float = 0.0  # per tensor-parallel rank beyond the first: one worker process per GPU
    attention_by_length: tuple[tuple[int, float], ...] = ()  # attention kernels' share of peak by sequence length


@dataclass(frozen=True)
class _PerModel:
    table: int  # LM head parameters
    per_token: float  # dense parameters every token passes through, LM head aside
    expert: float  # routed experts' parameters one token passes through
    moe_flops: float  # what the routed experts' kernels reach per GPU
    layers_s: float  # the per-layer overhead of a step
    ranks_s: float  # handing a step to the tensor-parallel ranks
    draft_s: float  # the draft passes of a verifying step
    indexer_bytes: int  # per cached token, the sparse indexer's key
    attention_cap: float  # tokens one query attends to at most


@dataclass(frozen=True)
class RooflineSteps:
    """kiln's engine: a step is bounded by memory (weights read once, every sequence's KV cache) or by tensor
    cores (2 FLOPs per active parameter per token, the LM head's only where logits are sampled, plus attention),
    plus the all-reduces of tensor parallelism and a fixed cost per step."""

    profile: Profile
    precision: str
    tp: int
    kv_bytes_per_token_gpu: int
    hardware: Hardware
    efficiency: Efficiency
    draft_tokens: int = 0  # k of speculative decoding; its draft passes run in every step that verifies
    label: str = "kiln"
    data_parallel: int = 1  # ranks stepping together (their MoE layers exchange tokens)
    expert_parallel: bool = False  # routed experts spread over tp x data_parallel GPUs
    # Across nodes the all-to-all runs at the network's pace, not NVLink's: (bytes/s per GPU, latency), or None.
    all_to_all_link: tuple[float, float] | None = None
    # Sparse attention in vLLM releases that computed all index_topk keys of every query, valid or not; with a BF16
    # KV cache they ran decoding tokens through the same prefill kernel (data/planner.yaml
    # sparse_mla_valid_topk_since). Set for sparse-attention models only.
    sparse_full_topk: bool = False
    sparse_decode_in_prefill_kernel: bool = False
    # vLLM's async scheduling: the engine schedules the next step and hands it to the TP ranks while the GPUs run
    # this one, so the ranks' hand-over costs a step only where it outlasts the step's GPU time.
    async_scheduling: bool = False
    # What a step costs that depends on its token count alone (weights read, communication), and what depends on
    # nothing of the step: a simulation asks for tens of thousands of steps with a few hundred distinct counts.
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.label

    def _roof(self) -> Roofline:
        if "roof" not in self._memo:
            h, e = self.hardware, self.efficiency
            self._memo["roof"] = Roofline(h.bandwidth_bytes_s * e.memory, h.flops * e.compute if h.flops else None,
                                          h.allreduce_latency_s, h.link_bytes_s)
        roof: Roofline = self._memo["roof"]
        return roof

    def _by_tokens(self, tokens: int, ranks_tokens: int, roof: Roofline) -> tuple[float, float]:
        """A step of `tokens` here and `ranks_tokens` on all data-parallel ranks together: the weight bytes it
        reads, and its all-reduces' and all-to-alls' seconds. What depends on this rank's tokens alone is kept;
        with expert parallelism the experts read and exchanged depend on every rank's."""
        if (memo := self._memo.get(tokens)) is None:
            arch = self.profile.architecture
            read = (self._dense_bytes() if self.expert_parallel
                    else cap.active_weight_bytes(self.profile, self.precision, max(tokens, 1))) / self.tp
            memo = self._memo[tokens] = (read - self._input_embedding_bytes(), 2 * arch.num_layers * allreduce_seconds(
                tokens, arch.hidden_size, self.tp, roof, self.hardware.allreduce_us))
        weights, comm_s = memo
        if self.expert_parallel:
            weights += self._experts_read(ranks_tokens)
            if self.profile.architecture.moe is not None:
                comm_s += self._all_to_all_seconds(ranks_tokens - tokens, roof)
        return weights, comm_s

    def _draft_seconds(self, roof: Roofline) -> float:
        if "draft" not in self._memo:
            self._memo["draft"] = draft_seconds(self.profile, self.precision, self.tp, self.draft_tokens, roof) + (
                self.draft_tokens * self.efficiency.overhead_per_layer_s)
        drafted: float = self._memo["draft"]
        return drafted

    def _fixed(self) -> _PerModel:
        """What every step's time uses that depends on the model and hardware alone, worked out once."""
        fixed: _PerModel | None = self._memo.get("fixed")
        if fixed is not None:
            return fixed
        arch, h, e, roof = self.profile.architecture, self.hardware, self.efficiency, self._roof()
        expert = self._active_expert_params()
        table = arch.vocab_size * arch.hidden_size
        peak = h.expert_flops or (roof.flops / e.compute if roof.flops else None)
        fixed = self._memo["fixed"] = _PerModel(
            table=table, per_token=max(arch.params_active - expert - table * (1 if arch.tie_word_embeddings else 2), 0),
            expert=expert, moe_flops=peak * e.compute_moe if peak else 0.0,
            layers_s=e.overhead_per_layer_s * arch.num_layers, ranks_s=e.overhead_per_rank_s * (self.tp - 1),
            draft_s=self._draft_seconds(roof) if self.draft_tokens else 0.0,
            indexer_bytes=self._indexer_bytes_per_token(), attention_cap=self._attention_cap())
        return fixed

    def seconds(self, step: Step) -> float:
        roof, fixed = self._roof(), self._fixed()
        tokens = step.tokens
        ranks_tokens = step.ranks_tokens or tokens * self.data_parallel
        weights, comm_s = self._by_tokens(tokens, ranks_tokens, roof)
        # Decoding reads each sequence's cache once per step; a prefill chunk reads its own earlier cache.
        prefill_reads = step.prefill_context / max(step.prefill_tokens, 1) if step.prefill_tokens else 0.0
        kv = self._kv_read(step.decode_seqs, step.decode_context) + prefill_reads * self.kv_bytes_per_token_gpu
        memory_s = (weights + kv) / roof.bandwidth_bytes_s
        compute_s = 0.0
        if roof.flops:
            dense = (tokens * fixed.per_token + step.sampled * fixed.table) * 2 / self.tp
            # With expert parallelism each GPU runs its experts on its share of every rank's tokens, and the
            # busiest GPU sets the pace.
            expert_tokens = ranks_tokens / self.data_parallel if self.expert_parallel else tokens
            experts = expert_tokens * 2 * fixed.expert / self.tp * self._busiest(ranks_tokens)[1]
            compute_s = dense / roof.flops + self._attention_seconds(step, roof) + experts / fixed.moe_flops
        e = self.efficiency
        fixed_s = e.step_overhead_s + e.overhead_per_seq_s * (step.decode_seqs + (1 if step.prefill_tokens else 0))
        draft_s = fixed.draft_s if step.tokens_per_seq > 1 else 0.0
        device_s = max(memory_s, compute_s) + comm_s + fixed.layers_s + draft_s
        return (max(device_s, fixed.ranks_s) if self.async_scheduling else device_s + fixed.ranks_s) + fixed_s

    def _attention_cap(self) -> float:
        """Tokens one query attends to at most: the indexer's top-k under sparse attention, else all its context."""
        sparse = self.profile.architecture.sparse_attention
        return float(sparse.index_topk) if sparse is not None and sparse.index_topk else math.inf

    def _attended(self, context_per_seq: float) -> float:
        """Tokens one query attends to."""
        return min(context_per_seq, self._fixed().attention_cap)

    def _queries_attended(self, step: Step, cap: float) -> tuple[float, float]:
        """Tokens the step's prompt chunks and its decoding sequences attend to in one layer, each query at most
        `cap`: (prefill, decode)."""
        decode_per_seq = step.decode_context / step.decode_seqs if step.decode_seqs else 0.0
        decode = step.decode_seqs * step.tokens_per_seq * min(decode_per_seq, cap)
        prefill = (min(step.prefill_context / step.prefill_tokens, cap) * step.prefill_tokens
                   if step.prefill_tokens else 0.0)
        return prefill, decode

    def _indexer_bytes_per_token(self) -> int:
        sparse = self.profile.architecture.sparse_attention
        return (sparse.index_head_dim + 4) * self.profile.architecture.num_layers if sparse is not None else 0

    def _kv_read(self, seqs: int, context: float) -> float:
        """Bytes of KV cache decoding reads: every cached token, or under sparse attention the top-k tokens' latents
        plus every token's indexer key."""
        if not seqs:
            return 0.0
        indexer = self._fixed().indexer_bytes
        per_seq = context / seqs
        return seqs * self._attended(per_seq) * (self.kv_bytes_per_token_gpu - indexer) + context * indexer

    def _attention_seconds(self, step: Step, roof: Roofline) -> float:
        """Attention time of the step's prompt chunks and of its decoding sequences, each at the share of the BF16
        peak attention kernels reach at its sequence length (twice the mean context a query attends to)."""
        table, peak = self.efficiency.attention_by_length, self.hardware.attention_flops
        prefill, decode = self._attention_parts(step)
        if not table or not peak:
            return (prefill + decode) / roof.flops if roof.flops else 0.0
        prefill_keys, decode_keys = self._keys_per_query(step)
        seconds = 0.0
        if step.prefill_tokens:
            seconds += prefill / (peak * _by_length(table, 2 * prefill_keys))
        if step.decode_seqs:
            seconds += decode / (peak * _by_length(table, 2 * decode_keys))
        return seconds

    def _keys_per_query(self, step: Step) -> tuple[float, float]:
        """Keys the attention kernel computes per prompt token and per decoding token: the context, at most the
        indexer's top-k under sparse attention, or all index_topk of them where the release computed every one."""
        cap = self._fixed().attention_cap
        prefill = ((cap if self.sparse_full_topk else min(step.prefill_context / step.prefill_tokens, cap))
                   if step.prefill_tokens else 0.0)
        decode = ((cap if self.sparse_decode_in_prefill_kernel else min(step.decode_context / step.decode_seqs, cap))
                  if step.decode_seqs else 0.0)
        return prefill, decode

    def _attention_parts(self, step: Step) -> tuple[float, float]:
        """Attention FLOPs per GPU of the prompt chunks and of the decoding sequences. Multi-head: 4 x heads x
        head_dim per attended token. MLA: decoding absorbed, as vLLM decodes it, 2 x heads x (2 x kv_lora_rank +
        rope dims) per attended token; prompts as multi-head attention over the up-projected keys and values,
        2 x heads x (qk head dim + v head dim), as vLLM prefills them. Sparse MLA: see `_sparse_mla_parts`."""
        arch = self.profile.architecture
        layers = arch.num_layers
        if arch.mla is not None and arch.sparse_attention is not None:
            return self._sparse_mla_parts(step)
        prefill, decode = self._queries_attended(step, self._fixed().attention_cap)
        if arch.mla is None:
            # Sliding-window layers attend to their window only (gpt-oss: 128 tokens in every other layer); linear-
            # attention layers keep a fixed state instead of attending to the context.
            sliding = arch.sliding_window
            full = layers - (sliding.layers if sliding else 0) - (
                arch.linear_attention.layers if arch.linear_attention else 0)
            per_token = 4 * arch.num_attention_heads * arch.head_dim / self.tp
            if sliding is None:
                return per_token * full * prefill, per_token * full * decode
            prefill_windowed, decode_windowed = self._queries_attended(step, float(sliding.window))
            return (per_token * (full * prefill + sliding.layers * prefill_windowed),
                    per_token * (full * decode + sliding.layers * decode_windowed))
        heads = arch.num_attention_heads / self.tp
        mla = arch.mla
        absorbed = 2 * mla.kv_lora_rank + mla.qk_rope_head_dim
        unabsorbed = (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim
                      if mla.qk_nope_head_dim and mla.v_head_dim else absorbed)
        return 2 * layers * heads * unabsorbed * prefill, 2 * layers * heads * absorbed * decode

    def _sparse_mla_parts(self, step: Step) -> tuple[float, float]:
        """Sparse MLA (DeepSeek sparse attention) as vLLM runs it: absorbed throughout, 2 x heads x absorbed dims
        per key computed (`_keys_per_query`), its prefill kernel at least `sparse_mla_prefill_min_heads` heads per
        GPU and its decode kernel `sparse_mla_min_heads`; the lightning indexer, replicated on every rank ("no
        tensor parallel, just replicated"), scores every cached token, 2 x index heads x index head dim each."""
        arch, h = self.profile.architecture, self.hardware
        sparse, mla, layers = arch.sparse_attention, arch.mla, arch.num_layers
        assert sparse is not None and mla is not None
        heads, absorbed = arch.num_attention_heads / self.tp, 2 * mla.kv_lora_rank + mla.qk_rope_head_dim
        prefill_heads = max(heads, float(h.sparse_mla_prefill_min_heads or h.sparse_mla_min_heads))
        decode_heads = (prefill_heads if self.sparse_decode_in_prefill_kernel
                        else max(heads, float(h.sparse_mla_min_heads)))
        prefill_keys, decode_keys = self._keys_per_query(step)
        per_scored = 2 * layers * (sparse.index_n_heads or 64) * sparse.index_head_dim
        prefill = (2 * layers * prefill_heads * absorbed * prefill_keys * step.prefill_tokens
                   + per_scored * step.prefill_context)
        decode = (2 * layers * decode_heads * absorbed * decode_keys * step.decode_seqs * step.tokens_per_seq
                  + per_scored * step.decode_context * step.tokens_per_seq) if step.decode_seqs else 0.0
        return prefill, decode

    def _input_embedding_bytes(self) -> float:
        """A separate input embedding table is gathered, a row per token, not read whole (a tied one is read whole
        as the LM head); it stays in bf16 in quantized checkpoints."""
        arch = self.profile.architecture
        return 0.0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size * 2 / self.tp

    def _active_expert_params(self) -> float:
        """Parameters of the routed experts one token passes through."""
        arch = self.profile.architecture
        if arch.moe is None:
            return 0.0
        total = min(cap.expert_params(arch), arch.params_total)
        return total * arch.moe.experts_per_token / arch.moe.num_experts

    def _dense_bytes(self) -> float:
        """The weights outside the routed experts."""
        if "dense" not in self._memo:
            self._memo["dense"] = cap.weight_bytes(self.profile, self.precision) - cap.expert_weight_bytes(
                self.profile, self.precision)
        dense: float = self._memo["dense"]
        return dense

    def _experts_read(self, ranks_tokens: int) -> float:
        """With expert parallelism, this GPU's share of the routed experts that all ranks' tokens hit."""
        key = ("experts", ranks_tokens)
        if (memo := self._memo.get(key)) is None:
            active = cap.active_weight_bytes(self.profile, self.precision, max(ranks_tokens, 1))
            memo = self._memo[key] = (max(active - self._dense_bytes(), 0.0) / (self.tp * self.data_parallel)
                                      * self._busiest(ranks_tokens)[0])
        read: float = memo
        return read

    def _busiest(self, ranks_tokens: int) -> tuple[float, float]:
        """With expert parallelism each GPU holds whole experts, so the GPU whose experts are hit most sets the
        pace: over the mean GPU, the distinct experts it reads and the routed tokens it computes, as uniform routing
        of `ranks_tokens` tokens spreads them (each a binomial; the busiest of the GPUs the expected maximum of that
        many normal draws). Real routing is skewed, so this is the least imbalance there is."""
        if not self.expert_parallel:
            return 1.0, 1.0
        moe, gpus = self.profile.architecture.moe, self.tp * self.data_parallel
        if moe is None or gpus <= 1:
            return 1.0, 1.0
        key = ("busiest", ranks_tokens)
        if (memo := self._memo.get(key)) is None:
            tokens, spread = max(ranks_tokens, 1), expected_max_normal(gpus)
            held = moe.num_experts / gpus
            hit = 1 - (1 - moe.experts_per_token / moe.num_experts) ** tokens
            reads = min(held, held * hit + spread * math.sqrt(held * hit * (1 - hit))) / (held * hit)
            routes = tokens * moe.experts_per_token
            computes = 1 + spread * math.sqrt((gpus - 1) / routes)
            memo = self._memo[key] = (reads, computes)
        busiest: tuple[float, float] = memo
        return busiest

    def _all_to_all_seconds(self, others: int, roof: Roofline) -> float:
        """Expert parallelism across data-parallel ranks, as vLLM's default backend (allgather_reducescatter)
        exchanges tokens in every MoE layer: each rank gathers the other ranks' hidden states (`others` tokens), in
        the precision its experts take activations in, runs its own experts on all of them, and reduce-scatters the
        bf16 outputs back; each a latency like an all-reduce's plus its bytes over one link direction. With one
        data-parallel rank (TP + EP) vLLM runs no exchange: the experts' outputs meet in tensor parallelism's
        all-reduce."""
        ranks = self.data_parallel
        if ranks <= 1:
            return 0.0
        arch = self.profile.architecture
        elements = others * arch.hidden_size
        payload = elements * _DISPATCH_BYTES.get(self.precision, 2.0) + elements * 2
        link_bytes_s, latency_s = self.all_to_all_link or (roof.link_bytes_s, roof.allreduce_latency_s)
        return arch.num_layers * (2 * latency_s + payload / link_bytes_s)


@dataclass(frozen=True)
class PipelineSteps:
    """Pipeline parallelism across nodes: a batch passes every stage in turn, so its step takes the whole model's
    time (`stage` models all layers at the stage's tensor-parallel width) plus one hand-over of the hidden states
    between consecutive stages. vLLM keeps one batch in flight per stage, which `EngineSettings.schedulers`
    counts, so the stages stay busy."""

    stage: StepModel
    stages: int
    hidden_size: int
    link_bytes_s: float  # between nodes, per node
    latency_s: float

    @property
    def name(self) -> str:
        return self.stage.name

    def seconds(self, step: Step) -> float:
        hand_over = self.latency_s + step.tokens * self.hidden_size * 2 / self.link_bytes_s
        return self.stage.seconds(step) + (self.stages - 1) * hand_over

"""The profile schema: a model, its architecture facts, checkpoints and serving defaults."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["bf16", "fp8", "nvfp4", "mxfp4", "int4"]
# chat: generates (completions, chat, responses); embed and rerank: vLLM's pooling runner (embeddings; score/rerank)
Task = Literal["chat", "embed", "rerank"]
SpecMethod = Literal["eagle3", "eagle", "draft_model", "mtp", "deepseek_mtp", "ngram"]
GPU_KEYS = {"hopper", "ada", "blackwell", "ampere", "cpu"}
NAME_PATTERN = r"^[a-z0-9][a-z0-9.\-]*$"
REVISION_PATTERN = re.compile(r"^([0-9a-f]{40}|[A-Za-z0-9._\-/]+)$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Checkpoint(Strict):
    hf_id: str = Field(min_length=1)
    revision: str = "main"
    weight_bytes: int | None = Field(default=None, gt=0)
    local: bool = False  # generated on the machine (tiny-cpu), never downloaded


class ModelRef(Strict):
    hf_id: str = Field(min_length=1)
    revision: str = "main"
    gated: bool = False
    license: str = ""

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str) -> str:
        if not REVISION_PATTERN.match(value):
            raise ValueError("must be a 40-hex commit SHA, a branch or a tag")
        return value


class Moe(Strict):
    num_experts: int = Field(gt=0)
    experts_per_token: int = Field(gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    params_active: int = Field(gt=0)
    layers: int | None = Field(default=None, gt=0)  # layers with routed experts (None: every layer)


class Mla(Strict):
    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    q_lora_rank: int | None = None


class SlidingWindow(Strict):
    window: int = Field(gt=0)
    layers: int = Field(gt=0)


class LinearAttention(Strict):
    """Gated DeltaNet layers (Qwen3.5, Qwen3-Next): a fixed recurrent state per sequence instead of per-token K/V."""

    layers: int = Field(gt=0)
    num_key_heads: int = Field(gt=0)
    num_value_heads: int = Field(gt=0)
    key_head_dim: int = Field(gt=0)
    value_head_dim: int = Field(gt=0)
    conv_kernel: int = Field(gt=1)
    state_dtype_bytes: int = Field(default=2, gt=0)  # the recurrent state (mamba_ssm_dtype); the conv state is bf16


class SparseAttention(Strict):
    index_head_dim: int = Field(gt=0)
    index_n_heads: int | None = None
    index_topk: int | None = None


class CompressedAttention(Strict):
    """DeepSeek-V4: every layer attends over a sliding window of raw keys; layers with a compress ratio r > 1 also
    cache one compressed state per r tokens (compress_ratios), those with r = 4 with a lightning indexer."""

    window: int = Field(gt=0)  # sliding_window
    head_dim: int = Field(gt=0)
    index_head_dim: int = Field(gt=0)
    ratios: tuple[int, ...]  # per decoder layer: 0 (window only), 4 or 128

    @model_validator(mode="after")
    def _sizable(self) -> CompressedAttention:
        # vLLM 0.32 stores every state as a 584-byte fp8_ds_mla row, which holds exactly 512 values
        # (vllm/models/deepseek_v4/attention.py); another width has no layout kiln can size.
        if self.head_dim != 512:
            raise ValueError(f"DeepSeek-V4 head_dim {self.head_dim}: vLLM's fp8_ds_mla cache row (584 bytes) holds "
                             "head_dim 512, so kiln cannot size this cache")
        return self


class Architecture(Strict):
    hf_architecture: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(gt=0)
    torch_dtype: str = "bfloat16"
    params_total: int = Field(gt=0)
    moe: Moe | None = None
    mla: Mla | None = None
    sliding_window: SlidingWindow | None = None
    sparse_attention: SparseAttention | None = None
    linear_attention: LinearAttention | None = None
    compressed_attention: CompressedAttention | None = None
    mtp_layers: int = Field(default=0, ge=0)  # multi-token-prediction layers (num_nextn_predict_layers)

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.sliding_window and self.sliding_window.layers > self.num_layers:
            raise ValueError("sliding_window.layers cannot exceed num_layers")
        other = (self.sliding_window.layers if self.sliding_window else 0) + (
            self.linear_attention.layers if self.linear_attention else 0)
        if other >= self.num_layers:
            raise ValueError("sliding-window and linear-attention layers leave no full-attention layer")
        if self.compressed_attention and len(self.compressed_attention.ratios) != self.num_layers:
            raise ValueError("compressed_attention.ratios needs one ratio per layer")
        if self.moe and self.moe.params_active > self.params_total:
            raise ValueError("moe.params_active cannot exceed params_total")
        return self

    @property
    def params_active(self) -> int:
        return self.moe.params_active if self.moe else self.params_total


class Speculative(Strict):
    method: SpecMethod
    model: str | None = None
    num_speculative_tokens: int = Field(ge=1, le=16)
    draft_params: int | None = Field(default=None, gt=0)
    source: str = ""

    @model_validator(mode="after")
    def _needs_model(self) -> Speculative:
        if self.method in ("eagle3", "eagle", "draft_model") and not self.model:
            raise ValueError(f"method {self.method} needs `model` (the draft or head checkpoint)")
        return self


# vLLM flags kiln renders from the plan (kiln.render.vllm, and kiln.render.cluster across nodes): vLLM takes the later
# of two values and a store-true flag cannot be unset, so an extra flag among these would run something other than
# what the plan predicted, or break a cluster's wiring. tests/unit/test_profile_flags.py holds the renderers to it.
PLANNED_FLAGS = frozenset({
    "--model", "--revision", "--served-model-name", "--host", "--port", "--max-model-len", "--max-num-seqs",
    "--max-num-batched-tokens", "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp",
    "--tensor-parallel-size", "-tp", "--enable-expert-parallel", "--gpu-memory-utilization", "--kv-cache-dtype",
    "--quantization", "-q", "--enable-prefix-caching", "--no-enable-prefix-caching", "--runner",
    "--speculative-config", "--compilation-config", "-O", "--max-cudagraph-capture-size", "--trust-remote-code",
    "--tool-call-parser", "--reasoning-parser", "--enable-auto-tool-choice", "--enable-lora", "--max-loras",
    "--max-cpu-loras", "--max-lora-rank", "--lora-modules", "--middleware", "--nnodes", "--node-rank",
    "--master-addr", "--master-port", "--data-parallel-size-local", "--data-parallel-address",
    "--data-parallel-rpc-port", "--data-parallel-start-rank", "--headless"})


def _planned(arg: str) -> str | None:
    """The planned flag `arg` sets, in any spelling vLLM takes (`--a_b=1`, `--a-b.c 1`), or None."""
    arg = arg.strip()
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0]
    name = name.replace("_", "-").split(".", 1)[0]
    return name if name in PLANNED_FLAGS else None


def _leave_planned_flags(extra_args: tuple[str, ...] | None) -> tuple[str, ...] | None:
    taken = sorted({flag for arg in extra_args or () if (flag := _planned(arg))})
    if taken:
        raise ValueError(f"extra_args set {', '.join(taken)}, which kiln plans itself and renders from the plan; "
                         "remove them (a profile's settings for these are the planner's to choose)")
    return extra_args


class Serving(Strict):
    max_model_len: int = Field(gt=0)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    trust_remote_code: bool = False
    extra_args: tuple[str, ...] = ()
    # LoRA adapters served with the model (set from the owner's `lora:`, never in a catalog file): their count and
    # vLLM's --max-lora-rank, which size the adapters' buffers and slow each step
    lora_adapters: int = Field(default=0, ge=0)
    max_lora_rank: int = Field(default=0, ge=0)

    _extra_args = field_validator("extra_args")(_leave_planned_flags)


class ServingOverride(Strict):
    max_model_len: int | None = Field(default=None, gt=0)
    extra_args: tuple[str, ...] | None = None

    _extra_args = field_validator("extra_args")(_leave_planned_flags)


class GpuOverride(Strict):
    serving: ServingOverride | None = None
    speculative: tuple[Speculative, ...] | None = None
    fp8_kv_cache: bool | None = None


class Profile(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    task: Task = "chat"
    model: ModelRef
    architecture: Architecture
    checkpoints: dict[Precision, Checkpoint] = Field(min_length=1)
    online_fp8: bool = True
    fp8_kv_cache: bool = True
    speculative: tuple[Speculative, ...] = ()
    serving: Serving
    gpu_overrides: dict[str, GpuOverride] = Field(default_factory=dict)
    cpu_only: bool = False  # served by vLLM's CPU backend (the tiny test model)
    sources: tuple[str, ...] = ()

    @property
    def generates(self) -> bool:
        """A chat model: the engine predicts it. An embedding or reranking model runs vLLM's pooling runner."""
        return self.task == "chat"

    @model_validator(mode="after")
    def _checks(self) -> Profile:
        if not self.generates and self.speculative:
            raise ValueError(f"a {self.task} model generates nothing, so it has no speculative decoding")
        if self.serving.max_model_len > self.architecture.max_position_embeddings:
            raise ValueError(
                f"serving.max_model_len ({self.serving.max_model_len}) exceeds the model's "
                f"max_position_embeddings ({self.architecture.max_position_embeddings})"
            )
        return self

    @property
    def local_model(self) -> bool:
        """The model is made on the machine (the tiny test model), not read from the Hub."""
        return any(c.local for c in self.checkpoints.values())

    def override_for(self, gpu_class: str, architecture: str) -> GpuOverride | None:
        """The most specific override: GPU class (h100) before architecture (hopper)."""
        return self.gpu_overrides.get(gpu_class) or self.gpu_overrides.get(architecture)

"""A model outside the catalog: the profile facts read from its Hugging Face config.json. Pure but for reading a
local directory's files (`read_model_dir`); the Hub's files come through kiln.hub.client.

What is read, per family (data/model_families.yaml): layers and heads, from `text_config` when the config wraps a text
model (Kimi-K2.5, Llama 4, Gemma 3, Qwen3.5); MoE experts, shared experts and which layers are MoE; MLA ranks and
DeepSeek's sparse-attention indexer; linear-attention (Gated DeltaNet) and sliding-window layers beside full ones;
multi-token-prediction layers; the model's own context length; and the checkpoint's precision from its
quantization_config or hf_quant_config.json. A family kiln cannot size is refused before anything downloads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import datafiles
from kiln.errors import ConfigError
from kiln.profiles.names import normalize_name
from kiln.profiles.schema import Precision, Profile
from kiln.validation import validate

FIX = "point --model at a Hugging Face model directory holding config.json (and its safetensors), or a Hub id ORG/NAME"
# The files planning reads; none of them is a weight file.
PLANNING_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "hf_quant_config.json",
                  "tokenizer_config.json", "modules.json", "config_sentence_transformers.json")
# A sentence-transformers model ships these beside config.json: it embeds (vLLM reads its pooling from modules.json).
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json")
# NVFP4: 4 bits + one FP8 scale per 16 values (ModelOpt). INT4 (compressed-tensors, AWQ, GPTQ): 4 bits + a 16-bit
# scale per group (and a zero point when asymmetric).
NVFP4_BYTES = 0.5 + 1 / 16
FP8_BLOCK = 128 * 128  # one float32 scale per 128 x 128 block (quantization_config.weight_block_size)


@dataclass(frozen=True)
class ModelFiles:
    """The small files of a model repository that planning reads, from a local directory or the Hub."""

    where: str  # the directory, or ORG/NAME
    config: Mapping[str, Any]
    hf_id: str
    revision: str = "main"
    local: bool = False
    hf_quant: Mapping[str, Any] | None = None
    index_total_bytes: int | None = None  # model.safetensors.index.json metadata.total_size
    safetensors_bytes: int | None = None  # the weight files' sizes, where no index says
    generation: Mapping[str, Any] | None = None
    tokenizer: Mapping[str, Any] | None = None
    has_chat_template_file: bool = False
    notes: tuple[str, ...] = field(default=())
    sentence_transformers: bool = False  # modules.json or config_sentence_transformers.json is there


@dataclass(frozen=True)
class Family:
    key: str
    label: str
    recipe: str | None
    serving: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)  # what the family's configs leave to transformers

    def filled(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The config with the family's defaults where it leaves a field out."""
        if not self.defaults:
            return dict(raw)
        if isinstance(raw.get("text_config"), Mapping):
            return {**raw, "text_config": {**self.defaults, **raw["text_config"]}}
        return {**self.defaults, **raw}


def _families() -> tuple[dict[str, Family], dict[str, Family], dict[str, str]]:
    data = datafiles.read_yaml("model_families.yaml")
    by_arch: dict[str, Family] = {}
    by_type: dict[str, Family] = {}
    for key, entry in data["families"].items():
        family = Family(key, entry["label"], entry.get("recipe"), entry.get("serving") or {},
                        entry.get("defaults") or {})
        for arch in entry["architectures"]:
            by_arch[arch] = family
        for model_type in entry.get("model_types") or ():
            by_type[model_type] = family
    return by_arch, by_type, dict(data.get("refused") or {})


def known_families() -> list[str]:
    by_arch, _, _ = _families()
    return sorted({f.label for f in by_arch.values()})


def family_of(raw: Mapping[str, Any], where: str) -> Family:
    """The family a config.json belongs to, or a refusal naming what it read and the families kiln knows."""
    by_arch, by_type, refused = _families()
    archs = [str(a) for a in raw.get("architectures") or ()]
    model_type = str(raw.get("model_type") or "")
    text_type = str((raw.get("text_config") or {}).get("model_type") or "")
    for t in (model_type, text_type):
        if t in by_type:
            return by_type[t]
    for arch in archs:
        if arch in refused:
            raise ConfigError(f"{arch}: {refused[arch]}", where=f"{where}: architectures",
                              fix="serve it with vLLM directly, or choose a model of a family kiln sizes")
        if arch in by_arch:
            return by_arch[arch]
        # A reranker is the causal model's backbone with a scoring head: sized as that backbone.
        backbone = arch.replace("ForSequenceClassification", "ForCausalLM")
        if backbone in by_arch:
            return by_arch[backbone]
    read = f"architectures {archs or 'none'}, model_type {model_type or 'none'!r}"
    raise ConfigError(
        f"kiln cannot size this architecture ({read}); it never guesses a KV cache",
        where=f"{where}: config.json",
        fix="kiln sizes these families: " + "; ".join(known_families()) + ". Choose one of them or a catalog profile",
    )


def checkpoint_precision(quant: Mapping[str, Any] | None, hf_quant: Mapping[str, Any] | None = None) -> Precision:
    """The weight precision a config.json's quantization_config (or ModelOpt's hf_quant_config.json) declares."""
    if hf_quant:
        algo = str((hf_quant.get("quantization") or hf_quant).get("quant_algo", "")).upper()
        if algo in ("NVFP4", "FP8"):
            return "nvfp4" if algo == "NVFP4" else "fp8"
        raise ConfigError(f"hf_quant_config.json quant_algo {algo!r} is not one kiln can size",
                          where="hf_quant_config.json", fix="use an FP8 or NVFP4 ModelOpt checkpoint")
    if not quant:
        return "bf16"
    method = str(quant.get("quant_method", "")).lower()
    algo = str(quant.get("quant_algo", "")).upper()
    fmt = str(quant.get("format", "")).lower()
    if method == "mxfp4":
        return "mxfp4"
    if method in ("fp8", "fbgemm_fp8") or algo == "FP8" or "float-quantized" in fmt:
        return "fp8"
    if algo == "NVFP4" or "nvfp4" in fmt:
        return "nvfp4"
    if method == "modelopt":
        return "nvfp4" if "FP4" in algo else "fp8"
    if method == "compressed-tensors":
        for group in (quant.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            if weights.get("num_bits") == 8 and weights.get("type") == "float":
                return "fp8"
            if weights.get("num_bits") == 4:
                return "nvfp4" if weights.get("type") == "float" else "int4"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin") and int(quant.get("bits", 4)) == 4:
        return "int4"
    raise ConfigError(
        f"quantization_config with quant_method {method!r} is not one kiln can size",
        where="config.json: quantization_config",
        fix="use a bf16, FP8, NVFP4, MXFP4 or 4-bit AWQ/GPTQ checkpoint",
    )


@dataclass(frozen=True)
class Params:
    """Parameter counts of the decoder (MTP layers excluded: vLLM loads them only as a speculator)."""

    total: int
    active: int
    embeddings: int  # input embeddings and, when untied, the LM head
    experts: int  # routed experts, all layers
    mtp_layer: int  # one MTP layer (a decoder layer and its input projection)
    # Kept out of a quantized checkpoint's quantized linears (DeepSeek-V4): float32 and bf16 parameters, and the
    # routed experts' own format ("fp4": MXFP4, 4 bits and an E8M0 scale per 32) where it differs from the rest.
    fp32: int = 0
    bf16: int = 0
    expert_dtype: str = ""


def text_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    return raw.get("text_config") or raw


def _int(cfg: Mapping[str, Any], *names: str, default: int | None = None) -> int:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return int(value)
    if default is None:
        raise KeyError(names[0])
    return default


def layer_kinds(cfg: Mapping[str, Any], family: str) -> tuple[int, int, int]:
    """(sliding-window, linear-attention, full-attention) layer counts, from `layer_types` where the config lists
    them, else from the family's rule (Gemma 3: one full layer in `sliding_window_pattern`; gpt-oss: every other
    layer slides; Qwen3.5: one full layer in `full_attention_interval`)."""
    layers = _int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        sliding = sum(1 for t in types if t in ("sliding_attention", "sliding_window"))
        linear = sum(1 for t in types if t == "linear_attention")
        return sliding, linear, layers - sliding - linear
    if family == "qwen3_5":
        linear = layers - layers // _int(cfg, "full_attention_interval", default=4)
        return 0, linear, layers - linear
    if family == "gemma3" and cfg.get("sliding_window"):
        sliding = layers - layers // _int(cfg, "sliding_window_pattern", default=6)
        return sliding, 0, layers - sliding
    if family == "gpt_oss" and cfg.get("sliding_window"):
        return layers // 2 + layers % 2, 0, layers // 2  # even layers (0, 2, ...) slide
    return 0, 0, layers


def moe_shape(cfg: Mapping[str, Any], family: str) -> tuple[int, int, int, int, int]:
    """(experts, experts per token, expert width, shared-expert width, MoE layers); zeros for a dense model."""
    experts = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    if not experts:
        return 0, 0, 0, 0, 0
    layers = _int(cfg, "num_hidden_layers")
    k = _int(cfg, "num_experts_per_tok", "experts_per_token", default=1)
    width = _int(cfg, "moe_intermediate_size", "intermediate_size")
    if family == "llama4":  # experts of intermediate_size, one shared expert of the same width
        shared = width
        moe_layers = layers // _int(cfg, "interleave_moe_layer_step", default=1)
    else:
        shared = _int(cfg, "shared_expert_intermediate_size", default=0) or (
            _int(cfg, "n_shared_experts", default=0) * width)
        moe_layers = layers - _int(cfg, "first_k_dense_replace", default=0) - len(cfg.get("mlp_only_layers") or ())
    return experts, k, width, shared, moe_layers


def _count_deepseek_v4(cfg: Mapping[str, Any]) -> Params:
    """DeepSeek-V4's parameters module by module as vLLM 0.32 builds them (vllm/models/deepseek_v4/attention.py,
    compressor.py, nvidia/model.py). Per layer: attention fused_wqa_wkv (hidden x (q_lora + head_dim)), wq_b
    (q_lora x heads x head_dim), wo_a (heads x head_dim / o_groups x o_groups x o_lora), wo_b (o_groups x o_lora x
    hidden), all FP8; norms (q_lora, head_dim, 2 x hidden) and the compressors' linears (hidden x 2 x coff x dim) and
    the indexer's weights_proj (hidden x index heads) in bf16 with the router (hidden x experts); float32 attention
    sinks (heads), compressor position biases (ratio x coff x dim), hyper-connection mixes (2 x (2 + hc) x hc x (hc x
    hidden + 1) + 6) and router score biases (experts, on the layers past num_hash_layers); the indexer's wq_b (q_lora
    x index heads x index_head_dim) FP8; shared experts FP8, routed experts in expert_dtype. The hash layers' token
    tables (vocab x experts per token, int32) are counted as float32-sized. MTP layers are left out."""
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    head_dim, q_lora = _int(cfg, "head_dim"), _int(cfg, "q_lora_rank")
    o_lora, o_groups = _int(cfg, "o_lora_rank"), _int(cfg, "o_groups")
    idx_dim, idx_heads = _int(cfg, "index_head_dim"), _int(cfg, "index_n_heads")
    vocab, layers = _int(cfg, "vocab_size"), _int(cfg, "num_hidden_layers")
    experts, k = _int(cfg, "n_routed_experts"), _int(cfg, "num_experts_per_tok")
    width, shared = _int(cfg, "moe_intermediate_size"), _int(cfg, "n_shared_experts", default=0)
    hc, hash_layers = _int(cfg, "hc_mult", default=1), _int(cfg, "num_hash_layers", default=0)
    ratios = [int(r) for r in cfg["compress_ratios"]][:layers]
    fp8 = bf16 = fp32 = 0
    for layer, ratio in enumerate(ratios):
        fp8 += hidden * (q_lora + head_dim) + q_lora * heads * head_dim + heads * head_dim * o_lora + (
            o_groups * o_lora * hidden) + shared * 3 * hidden * width
        bf16 += q_lora + head_dim + 2 * hidden + hidden * experts
        fp32 += heads + 2 * (2 + hc) * hc * (hc * hidden + 1) + 6
        fp32 += vocab * k if layer < hash_layers else experts
        if ratio > 1:
            coff = 2 if ratio == 4 else 1
            bf16 += hidden * 2 * coff * head_dim + head_dim
            fp32 += ratio * coff * head_dim
        if ratio == 4:
            fp8 += q_lora * idx_heads * idx_dim
            bf16 += hidden * idx_heads + hidden * 2 * 2 * idx_dim + idx_dim
            fp32 += 4 * 2 * idx_dim
    routed = layers * experts * 3 * hidden * width
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    total = embeddings + hidden + fp8 + bf16 + fp32 + routed
    one_layer = (fp8 + bf16 + fp32 + routed) // layers
    return Params(total, total - routed + layers * k * 3 * hidden * width, embeddings, routed,
                  one_layer + 2 * hidden * hidden, fp32=fp32, bf16=bf16 + hidden,
                  expert_dtype=str(cfg.get("expert_dtype") or ""))


def count_params(raw: Mapping[str, Any], family: str) -> Params:
    """Parameters from the config, layer by layer: embeddings, attention, MLP or experts, and the RMS norms (two per
    layer and a final one); biases and MLA's small latent norms are left out (under 0.01%)."""
    cfg = text_config(raw)
    if family == "deepseek_v4":
        return _count_deepseek_v4(cfg)
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    kv = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
    vocab = _int(cfg, "vocab_size")
    tied = bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    sliding, linear, full = layer_kinds(cfg, family)
    if cfg.get("kv_lora_rank"):
        nope, rope = _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim")
        v_dim, kv_rank = _int(cfg, "v_head_dim"), _int(cfg, "kv_lora_rank")
        q_rank = _int(cfg, "q_lora_rank", default=0)
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attention = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
        if cfg.get("index_head_dim"):  # DeepSeek V3.2's indexer: its query, key and head weights
            idx_dim, idx_heads = _int(cfg, "index_head_dim"), _int(cfg, "index_n_heads")
            attention += q_rank * idx_heads * idx_dim + hidden * idx_dim + hidden * idx_heads
    else:
        gate = 2 if cfg.get("attn_output_gate") else 1  # Qwen3.5 gates the attention output with a second query
        attention = hidden * heads * head_dim * gate + 2 * hidden * kv * head_dim + heads * head_dim * hidden
    attention_total = attention * (full + sliding)
    if linear:
        nk, nv = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
        dk, dv = _int(cfg, "linear_key_head_dim"), _int(cfg, "linear_value_head_dim")
        conv_dim = 2 * nk * dk + nv * dv
        attention_total += linear * (hidden * (2 * nk * dk + 2 * nv * dv) + hidden * 2 * nv
                                     + conv_dim * _int(cfg, "linear_conv_kernel_dim") + nv * dv * hidden)
    layers = _int(cfg, "num_hidden_layers")
    experts, k, width, shared, moe_layers = moe_shape(cfg, family)
    dense_width = _int(cfg, "intermediate_size_mlp", "intermediate_size", default=0) if family == "llama4" else (
        _int(cfg, "intermediate_size", default=0))
    dense = (layers - moe_layers) * 3 * hidden * dense_width
    routed = moe_layers * experts * 3 * hidden * width
    per_moe_layer_fixed = hidden * experts + 3 * hidden * shared  # router and shared expert
    embeddings = vocab * hidden * (1 if tied else 2)
    norms = layers * 2 * hidden + hidden
    total = embeddings + norms + attention_total + dense + routed + moe_layers * per_moe_layer_fixed
    active = embeddings + norms + attention_total + dense + moe_layers * (per_moe_layer_fixed + k * 3 * hidden * width)
    one_layer = attention + (experts * 3 * hidden * width + per_moe_layer_fixed if experts
                             else 3 * hidden * dense_width)
    return Params(total, active, embeddings, routed, one_layer + 2 * hidden * hidden)


def _keeps_attention_in_bf16(quant: Mapping[str, Any] | None, hf_quant: Mapping[str, Any] | None) -> bool:
    """A 4-bit checkpoint that leaves attention (and the shared parts) unquantized says so in its ignore list."""
    listed: list[str] = []
    if quant:
        listed += [str(x) for x in (quant.get("ignore") or quant.get("modules_to_not_convert") or ())]
    if hf_quant:
        listed += [str(x) for x in ((hf_quant.get("quantization") or hf_quant).get("exclude_modules") or ())]
    return any("attn" in x for x in listed)


def estimated_weight_bytes(params: Params, precision: Precision, quant: Mapping[str, Any] | None,
                           hf_quant: Mapping[str, Any] | None) -> int | None:
    """Checkpoint bytes from the parameter counts, where no safetensors index gives them. Embeddings and the LM head
    stay bf16 in quantized checkpoints. None for MXFP4, which the capacity model sizes itself (padded experts)."""
    body = params.total - params.embeddings
    if precision == "bf16":
        return 2 * params.total
    if precision == "fp8" and params.expert_dtype == "fp4":
        # DeepSeek-V4-Flash: MXFP4 experts; FP8 linears with one E8M0 byte of scale per 128 x 128 block
        # (vllm/models/deepseek_v4/quant_config.py: FP4 checkpoints store FP8 linear scales as e8m0fnu).
        fp8 = body - params.experts - params.fp32 - params.bf16
        return int(2 * (params.embeddings + params.bf16) + 4 * params.fp32 + params.experts * (0.5 + 1 / 32)
                   + fp8 * (1 + 1 / FP8_BLOCK))
    if precision == "fp8":
        return int(2 * params.embeddings + body * (1 + 4 / FP8_BLOCK))
    if precision == "mxfp4":
        return None
    if precision == "nvfp4":
        rate = NVFP4_BYTES
    else:
        groups = [g.get("weights") or {} for g in ((quant or {}).get("config_groups") or {}).values()]
        group = int((groups[0].get("group_size") if groups else None) or (quant or {}).get("group_size") or 128)
        symmetric = bool(groups[0].get("symmetric", True)) if groups else not (quant or {}).get("zero_point", True)
        rate = 0.5 + (2 if symmetric else 4) / group
    rest = body - params.experts
    rest_bytes = 2 if params.experts and _keeps_attention_in_bf16(quant, hf_quant) else rate
    return int(2 * params.embeddings + params.experts * rate + rest * rest_bytes)


def read_architecture(raw: Mapping[str, Any], family: Family, params: Params) -> dict[str, Any]:
    """The profile's `architecture` block from a config.json."""
    cfg = text_config(raw)
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    sliding, linear, _ = layer_kinds(cfg, family.key)
    mla = bool(cfg.get("kv_lora_rank"))
    head_dim = (_int(cfg, "qk_nope_head_dim") + _int(cfg, "qk_rope_head_dim")) if mla else (
        _int(cfg, "head_dim", default=hidden // heads))
    experts, k, width, shared, moe_layers = moe_shape(cfg, family.key)
    context = cfg.get("max_position_embeddings") or raw.get("max_position_embeddings")
    if not context:
        raise KeyError("max_position_embeddings")
    arch: dict[str, Any] = {
        "hf_architecture": (raw.get("architectures") or ["unknown"])[0],
        "num_layers": _int(cfg, "num_hidden_layers"),
        "hidden_size": hidden,
        "intermediate_size": _int(cfg, "intermediate_size_mlp", "intermediate_size", "moe_intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": heads if mla else _int(cfg, "num_key_value_heads", default=heads),
        "head_dim": head_dim,
        "vocab_size": _int(cfg, "vocab_size"),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        "max_position_embeddings": int(context),
        "torch_dtype": str(cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or "bfloat16"),
        "params_total": params.total,
        "mtp_layers": _int(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or (
            _int(cfg, "num_mtp_modules", default=0) if cfg.get("use_mtp") else 0),
    }
    if experts:
        arch["moe"] = {"num_experts": experts, "experts_per_token": k, "moe_intermediate_size": width,
                       "num_shared_experts": _int(cfg, "n_shared_experts", default=1 if shared else 0),
                       "params_active": params.active, "layers": moe_layers}
    if mla:
        arch["mla"] = {"kv_lora_rank": _int(cfg, "kv_lora_rank"), "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
                       "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim"), "v_head_dim": _int(cfg, "v_head_dim"),
                       "q_lora_rank": cfg.get("q_lora_rank")}
        if cfg.get("index_head_dim"):
            arch["sparse_attention"] = {"index_head_dim": _int(cfg, "index_head_dim"),
                                        "index_n_heads": cfg.get("index_n_heads"), "index_topk": cfg.get("index_topk")}
    if cfg.get("compress_ratios"):
        arch["compressed_attention"] = {
            "window": _int(cfg, "sliding_window"), "head_dim": _int(cfg, "head_dim"),
            "index_head_dim": _int(cfg, "index_head_dim"),
            "ratios": [int(r) for r in cfg["compress_ratios"]][:arch["num_layers"]]}
    elif sliding:
        arch["sliding_window"] = {"window": _int(cfg, "sliding_window"), "layers": sliding}
    if linear:
        ssm_dtype = str(cfg.get("mamba_ssm_dtype") or "bfloat16")
        arch["linear_attention"] = {
            "layers": linear, "num_key_heads": _int(cfg, "linear_num_key_heads"),
            "num_value_heads": _int(cfg, "linear_num_value_heads"), "key_head_dim": _int(cfg, "linear_key_head_dim"),
            "value_head_dim": _int(cfg, "linear_value_head_dim"), "conv_kernel": _int(cfg, "linear_conv_kernel_dim"),
            "state_dtype_bytes": 4 if ssm_dtype in ("float32", "fp32") else 2}
    return arch


def serving_for(family: Family, mtp_layers: int, mtp_params: int) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The serving block and speculators a model of the family gets without a profile, and where they come from."""
    settings = family.serving
    # Not trust_remote_code: a Hub repository's code runs only where the owner says so (user-data
    # `trust_remote_code: true`) or the catalog's profile names the repository; the origin says what the recipe does.
    serving: dict[str, Any] = {key: settings[key] for key in ("tool_call_parser", "reasoning_parser")
                               if key in settings}
    if settings.get("extra_args"):
        serving["extra_args"] = list(settings["extra_args"])
    speculative: list[dict[str, Any]] = []
    mtp = settings.get("mtp")
    if mtp and mtp_layers:
        speculative.append({"method": mtp["method"], "num_speculative_tokens": int(mtp["num_speculative_tokens"]),
                            "draft_params": mtp_params, "source": family.recipe or ""})
    origin = (f"settings of the {family.label} family from vLLM's recipe {family.recipe}" if family.recipe
              else f"no vLLM recipe for the {family.label} family: no parsers and no speculator (safe defaults)")
    if settings.get("trust_remote_code"):
        origin += ("; the recipe runs the repository's own code (--trust-remote-code), which kiln allows only with "
                   "trust_remote_code: true in your settings")
    return serving, speculative, origin


def task_of(files: ModelFiles) -> str:
    """What the repository says the model does: a sequence classifier scores pairs (rerank), a sentence-transformers
    model embeds, anything else generates (chat). The owner's `task` overrides it."""
    archs = [str(a) for a in files.config.get("architectures") or ()]
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return "rerank"
    return "embed" if files.sentence_transformers else "chat"


def profile_from_files(files: ModelFiles) -> Profile:
    """A profile from a model's config files: the architecture read, the family's serving settings."""
    where = files.where
    family = family_of(files.config, where)
    raw = family.filled(files.config)
    try:
        params = count_params(raw, family.key)
        quant = raw.get("quantization_config") or text_config(raw).get("quantization_config")
        precision = checkpoint_precision(quant, files.hf_quant)
        arch = read_architecture(raw, family, params)
        weight = files.index_total_bytes or files.safetensors_bytes or estimated_weight_bytes(
            params, precision, quant, files.hf_quant)
        serving, speculative, origin = serving_for(family, arch["mtp_layers"], params.mtp_layer)
        template = bool((files.tokenizer or {}).get("chat_template")) or files.has_chat_template_file
        notes = [origin, *files.notes]
        if files.tokenizer is not None and not template:
            notes.append("no chat template in tokenizer_config.json: serve completions, or pass --chat-template")
        checkpoint: dict[str, Any] = {"hf_id": files.hf_id, "revision": files.revision, "local": files.local}
        if weight:
            checkpoint["weight_bytes"] = int(weight)
        data: dict[str, Any] = {
            "name": normalize_name(files.hf_id.rstrip("/").split("/")[-1]) or "model",
            "task": (task := task_of(files)),
            "description": f"{family.label} read from {files.where}'s config.json; {origin}",
            "model": {"hf_id": files.hf_id, "revision": files.revision},
            "architecture": arch,
            "checkpoints": {precision: checkpoint},
            "online_fp8": precision == "bf16",
            "speculative": speculative if task == "chat" else (),
            "serving": {"max_model_len": arch["max_position_embeddings"], **serving},
            "sources": notes,
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"config.json lacks or mangles a field kiln needs: {exc}",
                          where=f"{where}: config.json", fix=FIX) from None
    return validate(Profile, data, where=f"{where}: config.json", fix=FIX)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", where=str(path), fix=FIX) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno}", where=str(path), fix=FIX) from None


def read_model_dir(model_dir: Path, hf_id: str | None = None, revision: str = "main",
                   local: bool = True) -> ModelFiles:
    """The planning files of a model directory (a local model, or the Hub's files fetched into one)."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError("no config.json here", where=str(model_dir), fix=FIX)
    raw = _read_json(config_path)
    if not isinstance(raw, dict):
        raise ConfigError("config.json is not a JSON object", where=str(config_path), fix=FIX)

    def optional(name: str) -> Any:
        path = model_dir / name
        return _read_json(path) if path.is_file() else None

    index = optional("model.safetensors.index.json") or {}
    total = (index.get("metadata") or {}).get("total_size")
    files = list(model_dir.glob("*.safetensors"))
    return ModelFiles(
        where=hf_id or str(model_dir), config=raw, hf_id=hf_id or str(model_dir.resolve()), revision=revision,
        local=local,
        hf_quant=optional("hf_quant_config.json"),
        index_total_bytes=int(total) if isinstance(total, int) and total > 0 else None,
        safetensors_bytes=sum(f.stat().st_size for f in files) or None,
        generation=optional("generation_config.json"), tokenizer=optional("tokenizer_config.json"),
        has_chat_template_file=(model_dir / "chat_template.jinja").is_file(),
        sentence_transformers=any((model_dir / name).is_file() for name in SENTENCE_TRANSFORMERS_FILES))


def profile_from_model_dir(model_dir: Path) -> Profile:
    """A profile for a local model directory, its facts read from config.json."""
    return profile_from_files(read_model_dir(model_dir))

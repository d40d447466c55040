"""A user's own model: the profile facts read from a local directory's config.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError
from kiln.profiles.catalog import normalize_name
from kiln.profiles.schema import Precision, Profile
from kiln.validation import validate

FIX = "point --model at a Hugging Face model directory holding config.json (and its safetensors)"
DEFAULT_CONTEXT = 32768


def checkpoint_precision(quant: Mapping[str, Any] | None) -> Precision:
    """The weight precision a config.json's quantization_config declares."""
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


def count_params(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(total, active) parameters of a decoder-only transformer from its config."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    vocab = int(cfg["vocab_size"])
    attention = hidden * head_dim * (2 * heads + 2 * kv)
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    if experts:
        moe_inter = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        per_expert = 3 * hidden * moe_inter
        k = int(cfg.get("num_experts_per_tok") or 1)
        mlp_total, mlp_active = experts * per_expert + hidden * experts, k * per_expert + hidden * experts
    else:
        mlp_total = mlp_active = 3 * hidden * int(cfg["intermediate_size"])
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    total = layers * (attention + mlp_total + 2 * hidden) + embeddings + hidden
    active = layers * (attention + mlp_active + 2 * hidden) + embeddings + hidden
    return total, active


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", where=str(path), fix=FIX) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno}", where=str(path), fix=FIX) from None


def profile_from_model_dir(model_dir: Path) -> Profile:
    """A profile for a local model directory, its facts read from config.json."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError("no config.json here", where=str(model_dir), fix=FIX)
    raw = _read_json(config_path)
    if not isinstance(raw, dict):
        raise ConfigError("config.json is not a JSON object", where=str(config_path), fix=FIX)
    cfg = raw.get("text_config") or raw
    try:
        total, active = count_params(cfg)
        precision = checkpoint_precision(raw.get("quantization_config") or cfg.get("quantization_config"))
        heads = int(cfg["num_attention_heads"])
        experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
        max_pos = int(cfg.get("max_position_embeddings") or DEFAULT_CONTEXT)
        data: dict[str, Any] = {
            "name": normalize_name(model_dir.name) or "model",
            "description": f"local model at {model_dir}",
            "model": {"hf_id": str(model_dir)},
            "architecture": {
                "hf_architecture": (raw.get("architectures") or ["unknown"])[0],
                "num_layers": int(cfg["num_hidden_layers"]),
                "hidden_size": int(cfg["hidden_size"]),
                "intermediate_size": int(cfg.get("intermediate_size") or cfg["moe_intermediate_size"]),
                "num_attention_heads": heads,
                "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
                "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
                "vocab_size": int(cfg["vocab_size"]),
                "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
                "max_position_embeddings": max_pos,
                "torch_dtype": str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
                "params_total": total,
            },
            "checkpoints": {precision: {"hf_id": str(model_dir), "local": True,
                                        "weight_bytes": _weight_bytes(model_dir)}},
            "online_fp8": precision == "bf16",
            "serving": {"max_model_len": min(max_pos, DEFAULT_CONTEXT)},
        }
        if experts:
            data["architecture"]["moe"] = {
                "num_experts": experts,
                "experts_per_token": int(cfg.get("num_experts_per_tok") or 1),
                "moe_intermediate_size": cfg.get("moe_intermediate_size"),
                "params_active": active,
            }
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"config.json lacks or mangles a field kiln needs: {exc}",
                          where=str(config_path), fix=FIX) from None
    return validate(Profile, data, where=str(config_path), fix=FIX)


def _weight_bytes(model_dir: Path) -> int | None:
    """Exact checkpoint size from the safetensors index, or the files themselves."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        meta = _read_json(index).get("metadata") or {}
        if isinstance(meta.get("total_size"), int) and meta["total_size"] > 0:
            return int(meta["total_size"])
    files = list(model_dir.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    return size or None

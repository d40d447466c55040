#!/usr/bin/env python3
"""Estimate vLLM serving performance with NVIDIA AIConfigurator, offline, for many cases in one process.

This script runs with the AIConfigurator virtualenv's python (ci/aiconfigurator.sh makes .venv-aic), never
with kiln's: it must not import kiln, and kiln must not import AIConfigurator. kiln/perf/aiconfigurator.py
is the other side of this boundary.

    estimate.py < requests.json > results.json    one result per request, in order
    estimate.py --list                            what it knows offline: databases and model ids

A request is a JSON object:
    model           an HF id whose config.json AIConfigurator ships, or a directory holding config.json
    system          an AIConfigurator system, e.g. h100_sxm
    backend_version optional: a vLLM database version ("current" when left out)
    isl, osl, batch_size, tp      integers; batch_size counts per pipeline stage and per attention-DP rank
    pp, dp, ep      optional integers: pipeline parallel, attention data parallel, MoE expert parallel
                    (for MoE models; without ep the experts are tensor-sharded, vLLM's default)
    gemm_quant      optional: bf16 | fp8 | fp8_block | fp8_static | nvfp4 | int4_wo | int8_wo | ... (AIC's names)
    kvcache_quant   optional: bf16 | fp8
    moe_quant       optional: bf16 | fp8 | fp8_block | nvfp4 | w4a16_mxfp4 | ...
    nextn, nextn_accepted   optional: MTP/speculative draft length and mean accepted drafts per step
    mode            optional: agg (default: continuous batching), static, static_gen (decode steps alone) or
                    static_ctx (prefill alone)
The quantizations AIConfigurator infers from the model's config when they are left out.

A result is {"ok": true, "ttft_ms", "tpot_ms", "output_tokens_per_s" (the whole engine), "tokens_per_s_per_user",
"concurrency" (requests in flight: batch_size x pp x dp), "gpus", "memory_gb" (per GPU), "kv_cache_warning"
(null or text), "aic_version", "database": "system/backend/version"}
or {"ok": false, "error": "..."}. Only JSON goes to stdout; AIConfigurator's logs go to stderr.
The Hugging Face Hub is never asked: a model id that AIConfigurator does not ship is an error.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

BACKEND = "vllm"
# agg: continuous batching, prefill mixed into decode; static_gen: decode steps alone; static_ctx: prefill alone.
MODES = ("agg", "static", "static_gen", "static_ctx")
# Architectures AIConfigurator lacks whose decoder is exactly one it has (vLLM runs Mistral with its Llama code).
ARCHITECTURE_STAND_INS = {"MistralForCausalLM": "LlamaForCausalLM"}
QUANT_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "none": None, "": None}


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout, by Python or by native code, to stderr while the block runs."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def aic_version() -> str:
    return metadata.version("aiconfigurator")


def bundled_models() -> dict[str, Path]:
    """HF ids whose config.json ships with AIConfigurator, each with its file."""
    common = importlib.import_module("aiconfigurator_core.sdk.common")
    utils = importlib.import_module("aiconfigurator_core.sdk.utils")
    root = Path(str(utils._get_model_config_path()))
    found = {}
    for hf_id in sorted(common.DefaultHFModels):
        path = root / f"{hf_id.replace('/', '--')}_config.json"
        if path.is_file():
            found[hf_id] = path
    return found


def databases() -> dict[str, list[str]]:
    perf_database = importlib.import_module("aiconfigurator_core.sdk.perf_database")
    supported = perf_database.get_supported_databases()
    return {system: list(supported[system][BACKEND]) for system in sorted(supported) if supported[system].get(BACKEND)}


class Models:
    """Resolves request models to what AIConfigurator accepts, without the network."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.known = bundled_models()
        self.resolved: dict[str, str] = {}

    def resolve(self, model: str) -> str:
        if model not in self.resolved:
            self.resolved[model] = self._resolve(model)
        return self.resolved[model]

    def _resolve(self, model: str) -> str:
        if os.path.isdir(model):
            config_path = Path(model) / "config.json"
            if not config_path.is_file():
                raise ValueError(f"{model} holds no config.json")
            config = json.loads(config_path.read_text())
            archs = config.get("architectures") or []
            if archs and archs[0] in ARCHITECTURE_STAND_INS:
                stand_in = ARCHITECTURE_STAND_INS[archs[0]]
                logging.getLogger("kiln-aic").info("%s: modelling %s as %s", model, archs[0], stand_in)
                copy = self.scratch / f"model{len(self.resolved)}"
                copy.mkdir()
                for extra in ("hf_quant_config.json",):
                    if (Path(model) / extra).is_file():
                        shutil.copy(Path(model) / extra, copy / extra)
                config["architectures"] = [stand_in, *archs[1:]]
                (copy / "config.json").write_text(json.dumps(config))
                return str(copy)
            return model
        if model in self.known:
            return model
        raise ValueError(
            f"model {model!r} is not one AIConfigurator ships a config for, and not a directory holding "
            "config.json (the Hub is not asked)"
        )


def quant(request: dict[str, Any], field: str, enum: Any) -> str | None:
    """The request's quantization `field` as a member name of AIConfigurator's `enum`; None: inferred."""
    value = request.get(field)
    if value is None:
        return None
    text = str(value).strip().lower()
    name = QUANT_ALIASES.get(text, text)
    if name is not None and name not in enum.__members__:
        raise ValueError(f"{field} {value!r} is not one of {', '.join(enum.__members__)}")
    return name


def positive_int(request: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = request.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return value


def estimate_one(request: dict[str, Any], models: Models, version: str) -> dict[str, Any]:
    api = importlib.import_module("aiconfigurator.cli.api")
    common = importlib.import_module("aiconfigurator_core.sdk.common")

    if not isinstance(request, dict):
        raise ValueError("a request must be a JSON object")
    for key in ("model", "system"):
        if not isinstance(request.get(key), str) or not request[key]:
            raise ValueError(f"{key} is required")
    model = models.resolve(request["model"])
    system = request["system"]
    known = databases_cache()
    if system not in known:
        raise ValueError(f"no {BACKEND} database for system {system!r}; there are: {', '.join(known)}")
    isl = positive_int(request, "isl")
    osl = positive_int(request, "osl")
    batch_size = positive_int(request, "batch_size")
    tp = positive_int(request, "tp")
    if isl is None or osl is None or batch_size is None or tp is None:
        raise ValueError("isl, osl, batch_size and tp are required")
    pp = positive_int(request, "pp", 1) or 1
    dp = positive_int(request, "dp", 1) or 1
    ep = positive_int(request, "ep")
    moe_ep = None
    if api.check_is_moe(model):
        # vLLM shards experts by tensor parallelism unless expert parallelism is on (then EP spans TP x DP).
        moe_ep = ep or 1
    elif ep not in (None, 1):
        raise ValueError(f"ep={ep} asked for a dense model")
    nextn = request.get("nextn") or 0
    nextn_accepted = request.get("nextn_accepted")
    mode = request.get("mode", "agg")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    result = api.cli_estimate(
        model,
        system,
        mode=mode,
        backend_name=BACKEND,
        backend_version=request.get("backend_version"),
        isl=isl,
        osl=osl,
        batch_size=batch_size,
        tp_size=tp,
        pp_size=pp,
        attention_dp_size=dp,
        moe_ep_size=moe_ep,
        gemm_quant_mode=quant(request, "gemm_quant", common.GEMMQuantMode),
        kvcache_quant_mode=quant(request, "kvcache_quant", common.KVCacheQuantMode),
        moe_quant_mode=quant(request, "moe_quant", common.MoEQuantMode),
        nextn=nextn,
        nextn_accepted=nextn_accepted,
    )
    raw = result.raw
    return {
        "ok": True,
        "ttft_ms": float(result.ttft),
        "tpot_ms": float(result.tpot),
        "output_tokens_per_s": float(raw["tokens/s"]),
        "tokens_per_s_per_user": float(raw["tokens/s/user"]),
        "concurrency": int(raw["concurrency"]),
        "gpus": int(raw["num_total_gpus"]),
        "memory_gb": float(raw["memory"]),
        "kv_cache_warning": result.kv_cache_warning,
        "aic_version": version,
        "database": f"{result.system_name}/{result.backend_name}/{result.backend_version}",
    }


_DATABASES: dict[str, list[str]] = {}


def databases_cache() -> dict[str, list[str]]:
    if not _DATABASES:
        _DATABASES.update(databases())
    return _DATABASES


def describe(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, ValueError | RuntimeError) else f"{type(error).__name__}: {text}"


def main(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    out = sys.stdout
    if argv[1:] == ["--list"]:
        with stdout_to_stderr():
            answer: Any = {"aic_version": aic_version(), "databases": databases_cache(),
                           "models": list(bundled_models())}
        out.write(json.dumps(answer) + "\n")
        return 0
    if argv[1:]:
        sys.stderr.write(__doc__ or "")
        return 2
    try:
        requests = json.load(sys.stdin)
    except ValueError as error:
        sys.stderr.write(f"stdin is not JSON: {error}\n")
        return 2
    if not isinstance(requests, list):
        sys.stderr.write("stdin must hold a JSON list of requests\n")
        return 2
    results: list[dict[str, Any]] = []
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="kiln-aic-") as scratch:
        version = aic_version()
        models = Models(Path(scratch))
        for request in requests:
            try:
                results.append(estimate_one(request, models, version))
            except Exception as error:  # one bad case must not sink the others
                results.append({"ok": False, "error": describe(error)})
    out.write(json.dumps(results) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

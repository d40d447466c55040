"""NVIDIA AIConfigurator as a second performance engine: vLLM latency and throughput from its kernel timing
databases (measured per GPU, vLLM version, kernel and shape), offline.

AIConfigurator lives in a virtualenv of its own (.venv-aic, made by ci/aiconfigurator.sh) and runs as a
subprocess: kiln/data/aiconfigurator/estimate.py reads the requests as JSON on stdin and answers on stdout,
all of them in one process so its database loads once. This module is that one I/O boundary.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PYTHON_ENV = "KILN_AICONFIGURATOR_PYTHON"
VENV = ".venv-aic"
SCRIPT = Path(__file__).resolve().parent.parent / "data" / "aiconfigurator" / "estimate.py"

# kiln's GPU classes (data/gpus.yaml) that AIConfigurator has vLLM databases for. Its a100_sxm, h100_sxm and
# b200_sxm are the 80, 80 and 180 GiB SXM parts, as kiln's classes are; gb300 is the Grace-Blackwell node
# (4 GPUs each). No database: rtx4000ada, rtx6000ada, mi300x, h20, h20-3e, h800.
SYSTEMS: dict[str, str] = {
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb300": "gb300",
    "l40s": "l40s",
    "a100-80gb": "a100_sxm",
}

STARTUP_S = 60.0  # interpreter, imports and the first database load
PER_REQUEST_S = 10.0  # about 1 s each on a busy 2-core machine; databases of other systems load on first use


@dataclass(frozen=True)
class AicRequest:
    """One aggregated (not disaggregated) vLLM engine serving `batch_size` concurrent requests of isl+osl tokens.

    `model`: an HF id AIConfigurator ships a config for (e.g. meta-llama/Meta-Llama-3.1-70B, Qwen/Qwen3-32B,
    openai/gpt-oss-120b, deepseek-ai/DeepSeek-V3) or a directory holding config.json. `batch_size` counts
    per pipeline stage and per attention-DP rank: the engine's whole concurrency comes back in the estimate.
    `ep`: MoE expert parallelism across tp x dp (vLLM's --enable-expert-parallel); None shards experts by TP.
    Quantizations use AIConfigurator's names (bf16, fp8, fp8_block, nvfp4, w4a16_mxfp4...); None: inferred
    from the model's config. `nextn`/`nextn_accepted`: MTP or other drafting, k drafts and mean accepted.
    """

    model: str
    system: str
    isl: int
    osl: int
    batch_size: int
    tp: int
    pp: int = 1
    dp: int = 1
    ep: int | None = None
    gemm_quant: str | None = None
    kvcache_quant: str | None = None
    moe_quant: str | None = None
    backend_version: str | None = None
    nextn: int = 0
    nextn_accepted: float | None = None
    mode: str = "agg"  # agg: continuous batching; static_gen / static_ctx: decode or prefill alone

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class AicEstimate:
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float  # the whole engine, all its concurrent requests
    tokens_per_s_per_user: float
    database: str  # system/backend/version, e.g. h100_sxm/vllm/0.24.0
    concurrency: int = 0  # requests in flight in the engine: batch_size x pp x dp
    gpus: int = 0
    memory_gb: float = 0.0  # per GPU: weights, activations and the KV cache of the batch
    kv_cache_warning: str | None = None  # the batch outgrows AIConfigurator's KV cache estimate
    aic_version: str = ""


def find_python(root: Path) -> Path | None:
    """AIConfigurator's interpreter: $KILN_AICONFIGURATOR_PYTHON, else root/.venv-aic/bin/python; None: neither."""
    configured = os.environ.get(PYTHON_ENV)
    candidate = Path(configured) if configured else root / VENV / "bin" / "python"
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _number(answer: dict[str, Any], key: str) -> float:
    value = answer[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} is {value!r}")
    return float(value)


def _estimate(answer: object) -> AicEstimate | str:
    if not isinstance(answer, dict):
        return f"AIConfigurator answered {answer!r}"
    if not answer.get("ok"):
        return str(answer.get("error") or "AIConfigurator gave no reason")
    try:
        warning = answer.get("kv_cache_warning")
        return AicEstimate(
            ttft_ms=_number(answer, "ttft_ms"),
            tpot_ms=_number(answer, "tpot_ms"),
            output_tokens_per_s=_number(answer, "output_tokens_per_s"),
            tokens_per_s_per_user=_number(answer, "tokens_per_s_per_user"),
            database=str(answer["database"]),
            concurrency=int(_number(answer, "concurrency")),
            gpus=int(_number(answer, "gpus")),
            memory_gb=_number(answer, "memory_gb"),
            kv_cache_warning=str(warning) if warning else None,
            aic_version=str(answer.get("aic_version", "")),
        )
    except (KeyError, ValueError) as error:
        return f"AIConfigurator's answer is malformed ({error}): {answer!r}"


class AiConfigurator:
    """Runs estimate.py with AIConfigurator's python, once per batch of requests."""

    def __init__(self, python: Path, script: Path = SCRIPT) -> None:
        self.python = python
        self.script = script

    def estimate(self, requests: Sequence[AicRequest], timeout_s: float | None = None) -> list[AicEstimate | str]:
        """One result per request, in order: an estimate, or why there is none (also when the run fails)."""
        if not requests:
            return []
        timeout = timeout_s if timeout_s is not None else STARTUP_S + PER_REQUEST_S * len(requests)
        payload = json.dumps([request.to_json() for request in requests])
        try:
            done = subprocess.run(
                [str(self.python), str(self.script)], input=payload, capture_output=True, text=True,
                errors="replace", check=False, timeout=timeout,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
            )
        except subprocess.TimeoutExpired:
            return [f"AIConfigurator took longer than {timeout:.0f} s"] * len(requests)
        except OSError as error:
            return [f"AIConfigurator could not start ({self.python}): {error}"] * len(requests)
        try:
            answers = json.loads(done.stdout)
        except ValueError:
            answers = None
        if done.returncode != 0 or not isinstance(answers, list) or len(answers) != len(requests):
            tail = (done.stderr.strip().splitlines() or [f"no output, exit status {done.returncode}"])[-1]
            return [f"AIConfigurator failed (exit status {done.returncode}): {tail}"] * len(requests)
        return [_estimate(answer) for answer in answers]


def find(root: Path) -> AiConfigurator | None:
    """AIConfigurator as installed beside the repository (or where $KILN_AICONFIGURATOR_PYTHON says)."""
    python = find_python(root)
    return AiConfigurator(python) if python else None

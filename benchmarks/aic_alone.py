"""AIConfigurator alone on the public cases: its static-batch estimate at each case's batch, as its own CLI
(`aiconfigurator cli estimate`) gives it, for benchmarks.perf_model_vs_public's `aic` column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.public_cases import Row, lengths
from kiln.perf.aiconfigurator import SYSTEMS, AicEstimate, AicRequest
from kiln.perf.engines import quantization
from kiln.wiring import Kiln


def request_for(kiln: Kiln, case: dict[str, Any], row: Row) -> AicRequest | None:
    """The case as AIConfigurator's question, or None where it has no database for the GPU or no model."""
    system = SYSTEMS.get(case["gpu"])
    model = kiln.constants.get("aiconfigurator", "models").get(case["model"])
    if system is None or model is None or row.problem:
        return None
    w = lengths(case)
    replicas = int(case.get("instances") or 1) * int(case.get("dp") or 1)
    in_flight = int(w.get("concurrency") or w.get("num_prompts") or 1)
    per_replica = max(1, min(-(-in_flight // replicas), int(case.get("max_num_seqs") or 1024)))
    moe = model.lower().startswith(("qwen/qwen3-30b", "openai/gpt-oss", "deepseek"))
    gemm, kv, experts = quantization(case["precision"], case.get("kv_cache_dtype") or "auto", moe)
    return AicRequest(model, system, isl=int(w["input_len"]), osl=int(w["output_len"]), batch_size=per_replica,
                      tp=int(case.get("tp") or 1), gemm_quant=gemm, kvcache_quant=kv, moe_quant=experts)


def fill_aic(kiln: Kiln, cases: Sequence[dict[str, Any]], rows: Sequence[Row]) -> None:
    """Ask AIConfigurator every case it covers in one run; leave the others empty."""
    estimator = kiln.aiconfigurator()
    if estimator is None:
        return
    asked = [(row, case, request_for(kiln, case, row)) for case, row in zip(cases, rows, strict=True)]
    pending = [(row, case, req) for row, case, req in asked if req is not None]
    answers = estimator.estimate([req for _, _, req in pending])
    for (row, case, _), answer in zip(pending, answers, strict=True):
        if isinstance(answer, AicEstimate):
            replicas = int(case.get("instances") or 1) * int(case.get("dp") or 1)
            w = lengths(case)
            isl, osl = int(w["input_len"]), int(w["output_len"])
            if row.metric == "total":  # every token of a request over its whole latency
                latency_s = (answer.ttft_ms + answer.tpot_ms * (osl - 1)) / 1000
                row.aic = answer.concurrency * (isl + osl) / latency_s * replicas
            else:
                row.aic = answer.output_tokens_per_s * replicas
        else:
            row.notes.append(f"AIConfigurator: {answer}")

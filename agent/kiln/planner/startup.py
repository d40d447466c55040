"""A plan's predicted cold start: the plan's shape handed to kiln.perf.coldstart with the measured constants."""

from __future__ import annotations

import dataclasses
from typing import Any

from kiln.perf.coldstart import predict_cold_starts
from kiln.profiles.schema import Profile
from kiln.setup.capacity import cudagraph_capture_count, weight_bytes
from kiln.setup.startup import ColdStarts, StartShape
from kiln.setup.types import Constants, Plan

GBIT_PER_GIB = 8 * (1 << 30) / 1e9


def start_shape(plan: Plan, profile: Profile) -> StartShape:
    engine, arch = plan.engine, profile.architecture
    # Online quantization (--quantization fp8) downloads the BF16 checkpoint.
    checkpoint = weight_bytes(profile, "bf16" if engine.quantization else plan.quantization)
    graphs = 0
    capture = (engine.compilation_config or {}).get("max_cudagraph_capture_size")
    if engine.device == "cuda" and capture:
        query_len = 1 + int((engine.speculative_config or {}).get("num_speculative_tokens", 0))
        graphs = cudagraph_capture_count(int(capture), engine.max_num_batched_tokens, engine.max_num_seqs, query_len)
    return StartShape(device=engine.device, checkpoint_bytes=checkpoint,
                      weight_bytes_per_gpu=plan.predicted.weight_bytes_per_gpu, num_layers=arch.num_layers,
                      tensor_parallel_size=engine.tensor_parallel_size * engine.pipeline_parallel_size,
                      cuda_graphs=graphs, params_b=arch.params_total / 1e9)


def cold_starts_of(plan: Plan, profile: Profile, data: dict[str, Any]) -> ColdStarts:
    link = data.get("public_link_gbps")
    return predict_cold_starts(start_shape(plan, profile), data,
                               link_gib_per_s=link / GBIT_PER_GIB if link else None)


def with_cold_start(plan: Plan, profile: Profile, constants: Constants) -> Plan:
    """The plan with its predicted cold start, when the constants carry data/coldstart.yaml."""
    data = constants.data.get("cold_start")
    if not data:
        return plan
    return dataclasses.replace(plan, cold_start=cold_starts_of(plan, profile, data))

"""The plan's values: what to start, with what settings, and what it should deliver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.perf.coldstart import ColdStarts


@dataclass(frozen=True)
class Constants:
    """The planner's tuning constants (data/planner.yaml)."""

    data: dict[str, Any]

    def get(self, *path: str) -> Any:
        node: Any = self.data
        for key in path:
            node = node[key]
        return node


@dataclass(frozen=True)
class InstancePlan:
    name: str
    gpus: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    device_minors: tuple[int, ...]
    port: int
    numa_node: int | None
    cpus: tuple[int, ...]
    omp_cpus: tuple[int, ...] = ()  # CPU backend: the cores of the OpenMP threads; the rest of `cpus` is spare


@dataclass(frozen=True)
class EngineSettings:
    model: str
    revision: str
    served_model_names: tuple[str, ...]
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    quantization: str | None  # online quantization flag; None: the checkpoint says
    enable_prefix_caching: bool
    speculative_config: dict[str, Any] | None
    compilation_config: dict[str, Any] | None
    tool_call_parser: str | None
    reasoning_parser: str | None
    trust_remote_code: bool
    extra_args: tuple[str, ...]
    device: str  # cuda | cpu
    data_parallel_size: int = 1  # engine ranks inside one server, each with its own scheduler and KV cache
    enable_expert_parallel: bool = False  # routed experts spread over tp x dp GPUs instead of split by tp
    pipeline_parallel_size: int = 1  # stages of layers, one per node in a cluster

    @property
    def schedulers(self) -> int:
        """Batches stepping at once: one per data-parallel rank, and per rank one in flight per pipeline stage."""
        return self.data_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class Prediction:
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int  # one token of context, whole instance, at the chosen KV dtype
    kv_bytes_per_token_per_gpu: int
    kv_cache_bytes_per_gpu: int
    kv_cache_tokens_per_instance: int  # all its data-parallel ranks together
    max_concurrency_per_instance: float
    decode_tokens_per_s_per_seq: float
    batch_per_instance: int
    output_tokens_per_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_cache_bytes_per_gpu": self.kv_cache_bytes_per_gpu,
            "kv_cache_tokens_per_instance": self.kv_cache_tokens_per_instance,
            "max_concurrency_per_instance": round(self.max_concurrency_per_instance, 2),
            "decode_tokens_per_s_per_seq": round(self.decode_tokens_per_s_per_seq, 1),
            "batch_per_instance": self.batch_per_instance,
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
        }


@dataclass(frozen=True)
class Plan:
    machine: str
    profile: str
    objective: str
    quantization: str
    kv_cache_dtype: str
    engine: EngineSettings
    instances: tuple[InstancePlan, ...]
    predicted: Prediction
    explanation: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    cold_start: ColdStarts | None = None  # predicted start-up, weights baked and downloaded (planner/startup.py)

    @property
    def tensor_parallel_size(self) -> int:
        return self.engine.tensor_parallel_size

    def as_dict(self) -> dict[str, Any]:
        """The plan's own fields for --json and /status; the rendered instances are the renderer's to add."""
        return {
            "machine": self.machine,
            "profile": self.profile,
            "objective": self.objective,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.engine.pipeline_parallel_size,
            "data_parallel_size": self.engine.data_parallel_size,
            "max_model_len": self.engine.max_model_len,
            "model": self.engine.model,
            "speculative_config": self.engine.speculative_config,
            "predicted": self.predicted.as_dict(),
            "explanation": " ".join(self.explanation),
            "explanation_lines": list(self.explanation),
            "warnings": list(self.warnings),
            **({"cold_start": self.cold_start.as_dict()} if self.cold_start else {}),
        }


@dataclass(frozen=True)
class Refusal:
    """Nothing fits: why, and what would."""

    reason: str
    suggestions: tuple[str, ...] = field(default_factory=tuple)

    def text(self) -> str:
        lines = [self.reason]
        lines += [f"  - {s}" for s in self.suggestions]
        return "\n".join(lines)

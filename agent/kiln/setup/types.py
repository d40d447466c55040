"""The plan's values: what to start, with what settings, and what it should deliver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.setup.headline import held_phrase
from kiln.setup.startup import ColdStarts


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


# The ranks vLLM takes for --max-lora-rank (vllm/config/lora.py).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraModule:
    """A LoRA adapter served with its base model: the name clients ask for, its folder (or Hub id), its rank."""

    name: str
    path: str
    rank: int


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
    task: str = "chat"  # chat: generates; embed or rerank: vLLM's pooling runner
    lora_modules: tuple[LoraModule, ...] = ()  # adapters served beside the base model, under their own names

    @property
    def max_lora_rank(self) -> int:
        """The largest adapter's rank, rounded up to one vLLM takes."""
        largest = max((m.rank for m in self.lora_modules), default=0)
        return next((r for r in LORA_RANKS if r >= largest), LORA_RANKS[-1])

    @property
    def served_and_adapters(self) -> tuple[str, ...]:
        """Every name a request may give in `model` for this engine."""
        return (*self.served_model_names, *(m.name for m in self.lora_modules))

    @property
    def schedulers(self) -> int:
        """Batches stepping at once: one per data-parallel rank, and per rank one in flight per pipeline stage."""
        return self.data_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class Band:
    """Where the measured output tok/s should land: the prediction scaled by the out-of-sample errors of its class."""

    low: float
    high: float
    source: str  # the class and the cases the errors come from
    held: float | None = None  # the share of public cases, left out of its fit, that landed inside

    def as_dict(self) -> dict[str, Any]:
        held = None if self.held is None else round(self.held, 3)
        return {"low": round(self.low, 1), "high": round(self.high, 1), "held": held, "source": self.source}

    def promise(self) -> str:
        """How often a band like it held on cases it was not fitted on."""
        return held_phrase(self.held)


@dataclass(frozen=True)
class Prediction:
    """The memory facts the planner fits, and the figures kiln's performance engine predicts for `Plan.workload`
    (None until the engine has predicted them)."""

    weight_bytes_per_gpu: int
    kv_bytes_per_token: int  # one token of context, whole instance, at the chosen KV dtype
    kv_bytes_per_token_per_gpu: int
    kv_cache_bytes_per_gpu: int
    kv_cache_tokens_per_instance: int  # all its data-parallel ranks together
    max_concurrency_per_instance: float
    output_tokens_per_s: float | None = None
    tokens_per_s_per_user: float | None = None
    ttft_ms_p90: float | None = None
    tpot_ms_p90: float | None = None
    band: Band | None = None
    engine: str | None = None
    # A workload with a budget and no load: the most it carries within the budget (kiln.perf.capacity), and the
    # figures above are those at that load, shown under this one name.
    capacity: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None, digits: int = 1) -> float | None:
            return None if v is None else round(v, digits)
        memory = {
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_cache_bytes_per_gpu": self.kv_cache_bytes_per_gpu,
            "kv_cache_tokens_per_instance": self.kv_cache_tokens_per_instance,
            "max_concurrency_per_instance": round(self.max_concurrency_per_instance, 2),
        }
        if self.capacity is not None:
            return {**memory, "capacity": self.capacity, "engine": self.engine}
        return {
            **memory,
            "output_tokens_per_s": r(self.output_tokens_per_s),
            "tokens_per_s_per_user": r(self.tokens_per_s_per_user),
            "ttft_ms_p90": r(self.ttft_ms_p90),
            "tpot_ms_p90": r(self.tpot_ms_p90, 2),
            "band": self.band.as_dict() if self.band else None,
            "engine": self.engine,
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
    workload: dict[str, Any] | None = None  # what `predicted`'s throughput and latency are for

    @property
    def tensor_parallel_size(self) -> int:
        return self.engine.tensor_parallel_size

    def layout(self) -> str:
        """How the GPUs are split, for people: "4 x TP2", "1 x TP1 x DP8 + EP", "1 x TP8 x PP2"."""
        e = self.engine
        split = [f"TP{e.tensor_parallel_size}"] + [f"{name}{n}" for name, n in
                                                   (("PP", e.pipeline_parallel_size), ("DP", e.data_parallel_size))
                                                   if n > 1]
        return f"{len(self.instances)} x {' x '.join(split)}" + (" + EP" if e.enable_expert_parallel else "")

    def as_dict(self) -> dict[str, Any]:
        """The plan's own fields for --json and /status; the rendered instances are the renderer's to add."""
        return {
            "machine": self.machine,
            "profile": self.profile,
            "task": self.engine.task,
            "objective": self.objective,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.engine.pipeline_parallel_size,
            "data_parallel_size": self.engine.data_parallel_size,
            "enable_expert_parallel": self.engine.enable_expert_parallel,
            "max_model_len": self.engine.max_model_len,
            "max_num_seqs": self.engine.max_num_seqs,
            "max_num_batched_tokens": self.engine.max_num_batched_tokens,
            "gpu_memory_utilization": self.engine.gpu_memory_utilization,
            "model": self.engine.model,
            "speculative_config": self.engine.speculative_config,
            "workload": self.workload,
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

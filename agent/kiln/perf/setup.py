"""A setup fixed by its settings rather than chosen by the planner: what a public benchmark ran, as a Plan the
simulator can serve. It sizes the KV cache as vLLM would; it applies none of the planner's policy. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kiln.hardware.model import Gpu, GpuSpec, Host, Machine
from kiln.profiles.schema import Profile
from kiln.setup import capacity as cap
from kiln.setup.capacity import MAX_CAPTURE_SIZE
from kiln.setup.types import Constants, EngineSettings, InstancePlan, Plan, Prediction

GIB = 2**30


def machine_of(spec: GpuSpec, count: int, memory_gib: float, name: str = "") -> Machine:
    """`count` GPUs of one class, all NVLink-connected (an HGX board), for a benchmark's setup."""
    gpus = tuple(Gpu(index=i, name=spec.class_name, uuid=f"GPU-{i}", memory_bytes=int(memory_gib * GIB),
                     compute_capability=(9, 0), pci_bus_id=f"0000:{i:02x}:00.0", numa_node=0, cpus=(),
                     mig_enabled=None, nvlink_links=18 if count > 1 else 0, spec=replace(spec, supported=True))
                 for i in range(count))
    linked = tuple(tuple(True for _ in range(count)) for _ in range(count))
    return Machine(name=name or f"{spec.class_name}x{count}", source="benchmark setup", gpus=gpus,
                   host=Host(cpu_count=128, memory_bytes=2048 * GIB, disk_free_bytes=0), nvlink=linked)


@dataclass(frozen=True)
class Fixed:
    precision: str
    tp: int
    instances: int = 1
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 256  # the benchmarks pass vLLM's own default for the GPU (vllm/engine/arg_utils.py)
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    speculative: dict[str, object] | None = None
    gpu_memory_utilization: float = 0.9
    data_parallel: int = 1  # engine ranks of each instance, tp GPUs each
    expert_parallel: bool = False  # the routed experts spread over all tp x data_parallel GPUs


def fixed_plan(machine: Machine, profile: Profile, s: Fixed, c: Constants) -> Plan | str:
    """The plan of a fixed setup, or why its weights do not fit."""
    reserved = int(c.get("vllm", "driver_reserved_bytes"))
    memory = min(g.memory_bytes for g in machine.gpus) - reserved
    per_step = int(s.speculative["num_speculative_tokens"]) + 1 if s.speculative else 1  # type: ignore[call-overload]
    ranks = s.tp * s.data_parallel
    weights = cap.weight_bytes_per_gpu(profile, s.precision, s.tp, ranks) if s.expert_parallel else None
    found = cap.kv_capacity(profile, precision=s.precision, tp=s.tp, gpu_memory_bytes=memory,
                            utilization=s.gpu_memory_utilization, max_model_len=s.max_model_len,
                            max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                            kv_dtype=s.kv_cache_dtype, c=c, weight_bytes_override=weights,
                            max_capture_size=min(s.max_num_seqs * per_step, MAX_CAPTURE_SIZE))
    if found.kv_cache_bytes_per_gpu <= 0 or found.tokens <= 0:
        return (f"TP{s.tp} {s.precision}: weights {found.weight_bytes_per_gpu / GIB:.1f} GiB per GPU leave no KV "
                f"cache in {memory * s.gpu_memory_utilization / GIB:.1f} GiB")
    engine = EngineSettings(
        model=profile.model.hf_id, revision="main", served_model_names=(profile.name,), tensor_parallel_size=s.tp,
        max_model_len=s.max_model_len, gpu_memory_utilization=s.gpu_memory_utilization, max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens, kv_cache_dtype=s.kv_cache_dtype, quantization=None,
        enable_prefix_caching=True, speculative_config=s.speculative, compilation_config=None, tool_call_parser=None,
        reasoning_parser=None, trust_remote_code=False, extra_args=(), device="cuda" if machine.gpus else "cpu",
        data_parallel_size=s.data_parallel, enable_expert_parallel=s.expert_parallel)
    instances = tuple(InstancePlan(name=f"vllm-{i}", gpus=tuple(range(i * ranks, (i + 1) * ranks)), gpu_uuids=(),
                                   device_minors=(), port=8100 + i, numa_node=None, cpus=())
                      for i in range(s.instances))
    predicted = Prediction(
        weight_bytes_per_gpu=found.weight_bytes_per_gpu, kv_bytes_per_token=found.layout.bytes_per_token_instance,
        kv_bytes_per_token_per_gpu=found.layout.bytes_per_token_per_gpu,
        kv_cache_bytes_per_gpu=found.kv_cache_bytes_per_gpu,
        kv_cache_tokens_per_instance=found.tokens * s.data_parallel,
        max_concurrency_per_instance=found.concurrency)
    return Plan(machine=machine.name, profile=profile.name, objective="throughput", quantization=s.precision,
                kv_cache_dtype=s.kv_cache_dtype, engine=engine, instances=instances, predicted=predicted,
                explanation=())

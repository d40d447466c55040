"""Plans for vLLM's CPU backend: the tiny test model on a laptop or a machine without a GPU. Pure."""

from __future__ import annotations

from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.profiles.schema import Profile
from kiln.setup import capacity as cap
from kiln.setup.types import Constants, EngineSettings, InstancePlan, Plan, Prediction, Refusal


def make_cpu_plan(machine: Machine, profile: Profile, choice: Choice, c: Constants) -> Plan | Refusal:
    cores = machine.host.cpu_count
    reserved = c.get("cpu", "reserved_cores_per_instance")
    instances = choice.instances or max(1, min(c.get("cpu", "default_instances"), cores // (1 + reserved)))
    if instances > cores:
        return Refusal(f"{instances} CPU instances need at least {instances} cores; this machine has {cores}",
                       (f"ask for at most {cores} instances",))
    if choice.tensor_parallel_size and choice.tensor_parallel_size > 1:
        return Refusal("the CPU profile runs one process per instance; tensor_parallel_size must be 1",
                       ("drop tensor_parallel_size",))
    arch = profile.architecture
    context = min(choice.max_model_len or profile.serving.max_model_len, arch.max_position_embeddings)
    precision = next(iter(profile.checkpoints))
    checkpoint = profile.checkpoints[precision]
    kv_space = c.get("vllm", "cpu_kvcache_space_gib") * 2**30
    layout = cap.kv_layout(arch, 1, "auto")
    batched = c.get("planning", "max_num_batched_tokens", "cpu")
    tokens, concurrency = cap.kv_cache_tokens(kv_space, layout, context, c.get("vllm", "block_size"), batched)
    if tokens < context:
        return Refusal(f"a {context}-token context needs more than the {kv_space / 2**30:.0f} GiB CPU KV cache",
                       ("ask for a shorter max_model_len",))
    seqs = c.get("planning", "max_num_seqs", "cpu")
    weights = cap.weight_bytes(profile, precision)
    per_core = cores // instances
    omp_reserve = reserved if per_core > reserved else 0  # an instance on one core cannot spare it
    engine = EngineSettings(
        model=checkpoint.hf_id, revision=checkpoint.revision, served_model_names=(profile.name,),
        tensor_parallel_size=1, max_model_len=context, gpu_memory_utilization=0.0, max_num_seqs=seqs,
        max_num_batched_tokens=batched, kv_cache_dtype="auto", quantization=None, enable_prefix_caching=True,
        speculative_config=None, compilation_config=None, tool_call_parser=profile.serving.tool_call_parser,
        reasoning_parser=profile.serving.reasoning_parser, trust_remote_code=profile.serving.trust_remote_code,
        extra_args=profile.serving.extra_args, device="cpu", task=profile.task,
    )
    first_port = c.get("planning", "first_instance_port")
    plans = tuple(
        InstancePlan(name=f"vllm-{i}", gpus=(), gpu_uuids=(), device_minors=(), port=first_port + i, numa_node=None,
                     cpus=tuple(range(i * per_core, (i + 1) * per_core)),
                     omp_cpus=tuple(range(i * per_core, (i + 1) * per_core - omp_reserve)))
        for i in range(instances)
    )
    predicted = Prediction(
        weight_bytes_per_gpu=weights, kv_bytes_per_token=layout.bytes_per_token_instance,
        kv_bytes_per_token_per_gpu=layout.bytes_per_token_per_gpu, kv_cache_bytes_per_gpu=kv_space,
        kv_cache_tokens_per_instance=tokens, max_concurrency_per_instance=concurrency,
    )
    explanation = (
        f"Machine: {cores} CPU cores, no GPU used: {profile.name} runs on vLLM's CPU backend.",
        f"{instances} instance(s), {per_core} core(s) each, {per_core - omp_reserve} of them for OpenMP "
        f"(VLLM_CPU_OMP_THREADS_BIND) and {omp_reserve} for the engine's scheduler.",
        f"KV cache: VLLM_CPU_KVCACHE_SPACE={kv_space // 2**30} GiB = {tokens:,} tokens at "
        f"{layout.bytes_per_token_instance:,} bytes per token.",
        "Prefix caching on; no quantization or speculative decoding on the CPU.",
    )
    return Plan(machine=machine.name, profile=profile.name, objective=choice.objective or "throughput",
                quantization=precision, kv_cache_dtype="auto", engine=engine, instances=plans,
                predicted=predicted, explanation=explanation)

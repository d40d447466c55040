"""make_plan: machine × profile × choice -> Plan | Refusal. Pure: no I/O, no clock."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kiln.choice.schema import Choice
from kiln.hardware.model import Architecture, Machine
from kiln.planner.cpu import make_cpu_plan
from kiln.planner.precision import NATIVE_FP8, PrecisionOption, forced_option, precision_options
from kiln.planner.topology import gpu_groups, group_numa, tp_problem, valid_tp_sizes
from kiln.profiles.schema import Profile, Speculative
from kiln.setup import capacity as cap
from kiln.setup.types import Constants, EngineSettings, InstancePlan, Plan, Prediction, Refusal

GIB = 2**30


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class Candidate:
    """One way to run the model: a precision, a TP size and drafts on or off, with the memory it fits in."""

    option: PrecisionOption
    tp: int
    instances: int
    kv_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    speculative: Speculative | None
    spec_reason: str
    weight_bytes_per_gpu: int
    kv_cache_bytes_per_gpu: int
    layout: cap.KvLayout
    kv_tokens: int
    concurrency: float


@dataclass(frozen=True)
class Context:
    machine: Machine
    profile: Profile
    choice: Choice
    c: Constants
    objective: str
    utilization: float
    shortest_context: int = 0  # the workload's longest request: vLLM refuses it past max_model_len

    @property
    def dp(self) -> int:
        """Data-parallel ranks per server: asked for, or every GPU the split leaves when expert parallelism is."""
        if self.choice.data_parallel_size:
            return self.choice.data_parallel_size
        if self.choice.expert_parallel:  # the recipes' DP + EP: attention on one GPU per rank unless tp is asked
            return max(self.machine.gpu_count // (self.choice.tensor_parallel_size or 1), 1)
        return 1

    @property
    def expert_parallel(self) -> bool:
        return self.profile.architecture.moe is not None and self.dp > 1 and self.choice.expert_parallel is not False

    @property
    def gpu_memory(self) -> int:
        """Memory CUDA offers per GPU (the smallest GPU's), as vLLM's total_memory."""
        reserved = int(self.c.get("vllm", "driver_reserved_bytes"))
        return min(g.memory_bytes for g in self.machine.gpus) - reserved


def _speculative_options(ctx: Context) -> tuple[Speculative, ...]:
    spec = ctx.machine.gpus[0].spec if ctx.machine.gpus else None
    override = ctx.profile.override_for(spec.class_name, spec.architecture.value) if spec else None
    if override and override.speculative is not None:
        return override.speculative
    return ctx.profile.speculative


def _kv_dtype(ctx: Context) -> str:
    if ctx.choice.kv_cache_dtype:
        return ctx.choice.kv_cache_dtype
    spec = ctx.machine.gpus[0].spec
    override = ctx.profile.override_for(spec.class_name, spec.architecture.value)
    allowed = override.fp8_kv_cache if override and override.fp8_kv_cache is not None else (
        ctx.profile.fp8_kv_cache)
    if allowed and spec.architecture in NATIVE_FP8 and ctx.objective == "throughput":
        return "fp8"
    return "auto"


def _capture_size(max_num_seqs: int, tokens_per_step: int) -> int:
    """Largest CUDA-graph batch: every sequence's tokens in one step (drafts included), at most 512."""
    return min(max_num_seqs * tokens_per_step, cap.MAX_CAPTURE_SIZE)


def _pow2_floor(n: float) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _speculative_settings(ctx: Context, options: tuple[Speculative, ...]) -> list[tuple[Speculative | None, str]]:
    """Drafts on, off, or both for the engine to compare; each with why it is offered."""
    if not options:
        return [(None, "requested, but the profile has no speculative-decoding option"
                 if ctx.choice.speculative_decoding else
                 "off: the profile has no draft model, EAGLE head or MTP layer")]
    if ctx.choice.speculative_decoding is False:
        return [(None, "off, as asked")]
    if ctx.choice.speculative_decoding:
        return [(options[0], "on, as asked")]
    return [(None, "off"), (options[0], "on")]


def _evaluate(ctx: Context, option: PrecisionOption, tp: int, kv_dtype: str, context: int
              ) -> list[Candidate] | str:
    """Fit one (precision, TP, context) in memory, with drafts on and off as the choice allows; a string says why
    it does not fit."""
    c, profile = ctx.c, ctx.profile
    plan_c = c.get("planning")
    typical = min(plan_c["typical_prompt_tokens"] + plan_c["typical_output_tokens"], context)
    seq_cap = plan_c["max_num_seqs"][ctx.objective]
    batched = plan_c["max_num_batched_tokens"][ctx.objective]
    spec_options = _speculative_options(ctx)
    # Size memory as if drafts run (their weights and larger CUDA graphs), so turning them on never overflows.
    draft = spec_options[0] if spec_options and ctx.choice.speculative_decoding is not False else None
    per_step = draft.num_speculative_tokens + 1 if draft else 1

    weights = cap.weight_bytes_per_gpu(profile, option.precision, tp, tp * ctx.dp) if ctx.expert_parallel else None

    def capacity(max_num_seqs: int) -> cap.KvCapacity:
        return cap.kv_capacity(
            profile, precision=option.precision, tp=tp, gpu_memory_bytes=ctx.gpu_memory,
            utilization=ctx.utilization, max_model_len=context, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=batched, kv_dtype=kv_dtype, c=c,
            draft_params=(draft.draft_params or 0) if draft else 0, weight_bytes_override=weights,
            max_capture_size=_capture_size(max_num_seqs, per_step))

    found = capacity(seq_cap)
    if found.kv_cache_bytes_per_gpu <= 0:
        usable = int(ctx.gpu_memory * ctx.utilization)
        return (f"TP{tp} {option.precision}: weights {_gb(found.weight_bytes_per_gpu)} + runtime "
                f"{_gb(found.overhead_bytes_per_gpu)} per GPU exceed the {_gb(usable)} vLLM may use "
                f"({ctx.utilization:.2f} of {_gb(ctx.gpu_memory)})")
    needed = max(context, plan_c["min_concurrency"] * typical)
    if found.tokens < needed:
        return (f"TP{tp} {option.precision}: KV cache holds {found.tokens:,} tokens, fewer than the {needed:,} "
                f"needed for {plan_c['min_concurrency']} requests of {typical:,} tokens at a {context:,}-token context")

    max_num_seqs = max(8, min(seq_cap, _pow2_floor(found.tokens / typical)))
    if max_num_seqs < seq_cap:
        found = capacity(max_num_seqs)  # fewer sequences: smaller sampler warm-up and graphs, more KV
    instances = ctx.choice.instances or ctx.machine.gpu_count // (tp * ctx.dp)
    return [Candidate(
        option=option, tp=tp, instances=instances, kv_dtype=kv_dtype, max_model_len=context,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max(batched, max_num_seqs), speculative=spec,
        spec_reason=reason, weight_bytes_per_gpu=found.weight_bytes_per_gpu,
        kv_cache_bytes_per_gpu=found.kv_cache_bytes_per_gpu, layout=found.layout, kv_tokens=found.tokens,
        concurrency=found.concurrency) for spec, reason in _speculative_settings(ctx, spec_options)]


def _contexts(ctx: Context, target: int) -> list[int]:
    """The context to try: the target, then halves down to the floor unless the user fixed it; never shorter than
    the workload's longest request, which is the last one tried where it lies above the floor."""
    if ctx.choice.max_model_len:
        return [target]
    floor = max(min(ctx.c.get("planning", "min_context_tokens"), target), ctx.shortest_context)
    out = [target]
    while out[-1] // 2 >= floor:
        out.append(out[-1] // 2)
    if out[-1] > floor == ctx.shortest_context:
        out.append(floor)
    return out


def _search(ctx: Context, options: Sequence[PrecisionOption], tps: Sequence[int], target: int
            ) -> tuple[list[Candidate], list[str]]:
    """Every candidate of the preferred precision that fits, at the longest context any split fits with;
    otherwise why the preferred precision does not fit, at the widest split and shortest context tried, last."""
    reasons: list[str] = []
    kv_dtype = _kv_dtype(ctx)
    for rank, option in enumerate(options):
        for context in _contexts(ctx, target):
            fitting: list[Candidate] = []
            for tp in tps:
                result = _evaluate(ctx, option, tp, kv_dtype, context)
                if isinstance(result, str):
                    if rank == 0:
                        reasons.append(result)
                else:
                    fitting += result
            if fitting:
                return fitting, reasons
    return [], reasons


def links(m: Machine) -> str:
    if m.gpu_count <= 1:
        return "one GPU"
    return "NVLink between all GPUs" if all(m.linked(0, j) for j in range(m.gpu_count)) else "PCIe only"


def describe(machine: Machine, profile: Profile, plan: Plan) -> list[str]:
    """What the plan is and the memory it fits in, from the plan's own fields (the engine's lines say why)."""
    m, gpu, e, p = machine, machine.gpus[0], plan.engine, plan.predicted
    precision_text = (f"{plan.quantization} (quantized online from {e.model})" if e.quantization
                      else f"{plan.quantization} ({e.model})")
    target = _target_context(profile, machine, None)
    split = f"TP{e.tensor_parallel_size}" + (f" x DP{e.data_parallel_size}" if e.data_parallel_size > 1 else "")
    lines = [
        f"Machine: {m.gpu_count}x {gpu.name} ({gpu.architecture.value}, {gpu.memory_gib:.0f} GiB, "
        f"{gpu.spec.memory_bandwidth_gb_s:.0f} GB/s each), {links(m)}.",
        f"Precision: {precision_text}; " + {
            Architecture.HOPPER: "Hopper has FP8 tensor cores",
            Architecture.ADA: "Ada has FP8 tensor cores",
            Architecture.BLACKWELL: "Blackwell has FP4 tensor cores",
        }.get(gpu.architecture, "no low-precision tensor cores on this GPU") +
        f"; weights {_gb(p.weight_bytes_per_gpu)} per GPU at {split}"
        + (", the routed experts spread over all its GPUs (expert parallel)." if e.enable_expert_parallel else "."),
    ]
    if len(plan.instances) > 1:
        lines.append(f"{len(plan.instances)} instances of {split}: independent replicas behind one endpoint "
                     f"(concurrent instances), each on {len(plan.instances[0].gpus)} GPU(s).")
    kv_word = "fp8 (half the bytes of bf16)" if plan.kv_cache_dtype == "fp8" else "the model's dtype"
    lines.append(f"KV cache in {kv_word}: {p.kv_bytes_per_token:,} bytes per token; "
                 f"{p.kv_cache_tokens_per_instance:,} tokens per instance, {p.max_concurrency_per_instance:.1f} "
                 "requests at full context.")
    if e.max_model_len < target:
        lines.append(f"Context shortened from {target:,} to {e.max_model_len:,} tokens so the KV cache holds "
                     f"enough concurrent requests; ask for more with max_model_len on a larger machine.")
    lines.append("Prefix caching on: requests that share a system prompt or chat history skip its prefill.")
    lines.append(f"Batch limits: max_num_seqs {e.max_num_seqs}, max_num_batched_tokens {e.max_num_batched_tokens}.")
    return lines


def _target_context(profile: Profile, machine: Machine, choice: Choice | None) -> int:
    if choice is not None and choice.max_model_len:
        return choice.max_model_len
    gpu = machine.gpus[0] if machine.gpus else None
    override = profile.override_for(gpu.spec.class_name, gpu.architecture.value) if gpu else None
    return (override.serving.max_model_len if override and override.serving and override.serving.max_model_len
            else profile.serving.max_model_len)


def _refuse(ctx: Context, reasons: Sequence[str], alternatives: Sequence[Machine], target: int) -> Refusal:
    p = ctx.profile
    suggestions: list[str] = []
    if ctx.choice.max_model_len:
        relaxed = ctx.choice.model_copy(update={"max_model_len": None})
        plans = fit_plans(ctx.machine, p, relaxed, ctx.c, shortest_context=ctx.shortest_context)
        if not isinstance(plans, Refusal):
            suggestions.append(f"a shorter context: max_model_len {plans[0].engine.max_model_len} fits on this "
                               "machine")
    if ctx.choice.quantization and ctx.choice.quantization != "auto":
        relaxed = ctx.choice.model_copy(update={"quantization": None})
        plans = fit_plans(ctx.machine, p, relaxed, ctx.c, shortest_context=ctx.shortest_context)
        if not isinstance(plans, Refusal):
            suggestions.append(f"a lower precision: quantization {plans[0].quantization} fits on this machine")
    if ctx.choice.gpu_memory_utilization:
        relaxed = ctx.choice.model_copy(update={"gpu_memory_utilization": None})
        plans = fit_plans(ctx.machine, p, relaxed, ctx.c, shortest_context=ctx.shortest_context)
        if not isinstance(plans, Refusal):
            suggestions.append(f"more of each GPU: gpu_memory_utilization {plans[0].engine.gpu_memory_utilization:g} "
                               f"fits on this machine (now {ctx.choice.gpu_memory_utilization:g})")
    arch = ctx.machine.gpus[0].architecture
    if "nvfp4" in p.checkpoints and arch is not Architecture.BLACKWELL:
        suggestions.append("an NVFP4 checkpoint exists for this model: it needs a Blackwell machine (B300)")
    for alt in alternatives:
        if alt.name == ctx.machine.name:
            continue
        plans = fit_plans(alt, p, ctx.choice.model_copy(update={"tensor_parallel_size": None, "instances": None}),
                          ctx.c, shortest_context=ctx.shortest_context)
        if not isinstance(plans, Refusal):
            suggestions.append(f"a larger machine: {alt.name} fits it ({plans[0].quantization}, from "
                               f"TP{plans[0].tensor_parallel_size} up)")
            break
    detail = reasons[-1] if reasons else "no configuration fits"
    return Refusal(f"{p.name} does not fit on {ctx.machine.name}: {detail}", tuple(suggestions))


def fit_plans(machine: Machine, profile: Profile, choice: Choice, constants: Constants,
              alternatives: Sequence[Machine] = (), shortest_context: int = 0) -> list[Plan] | Refusal:
    """Every way the user's `choice` leaves to serve `profile` on `machine` that fits in memory: the preferred
    precision, the longest context that fits, each tensor-parallel split, drafts on and off. Their throughput
    and latency are the engine's to predict (kiln.planner.search ranks them).

    `alternatives` are other machines to suggest when nothing fits here. `shortest_context` is the workload's
    longest request (input + output): no plan's context is shorter, since vLLM would refuse it.
    """
    if profile.cpu_only:
        made = make_cpu_plan(machine, profile, choice, constants)
        return made if isinstance(made, Refusal) else [made]
    problem = machine.accelerator_problem()
    if problem:
        return Refusal(problem, ("on a machine without a supported GPU, `kiln up --profile tiny-cpu` serves a "
                                 "tiny model on the CPU",
                                 "for real models launch an NVIDIA GPU Droplet (H100, H200, L40S or B300)"))
    unknown = next((g for g in machine.gpus if g.spec.memory_bandwidth_gb_s <= 0), None)
    if unknown is not None:
        return Refusal(f"{unknown.name} is not in kiln's hardware data and NVML reports no memory clock, so its "
                       "memory bandwidth is unknown",
                       ("describe the machine in a file with memory_bandwidth_gb_s and pass it as --machine PATH",))
    ctx = Context(machine, profile, choice, constants, choice.objective or "throughput",
                  choice.gpu_memory_utilization or constants.get("vllm", "default_gpu_memory_utilization"),
                  shortest_context)
    ceiling = math.floor(cap.max_utilization_for_capture(ctx.gpu_memory, constants) * 100) / 100
    if ctx.utilization > ceiling:  # the owner's share would leave the CUDA-graph capture no room (fault: vllm#57475)
        ctx = replace(ctx, utilization=ceiling)
    arch = machine.gpus[0].architecture

    if choice.quantization and choice.quantization != "auto":
        forced = forced_option(profile, arch, choice.quantization)
        if isinstance(forced, str):
            return Refusal(forced, ("set quantization: auto to let kiln pick",))
        options = [forced]
    else:
        options = precision_options(profile, arch)
    if not options:
        return Refusal(f"{profile.name} has no checkpoint that runs on {arch.value} GPUs",
                       (f"its checkpoints: {', '.join(profile.checkpoints)}",))

    model_max = profile.architecture.max_position_embeddings
    if choice.max_model_len and choice.max_model_len > model_max:
        return Refusal(f"max_model_len {choice.max_model_len} exceeds {profile.name}'s maximum context "
                       f"{model_max}", (f"set max_model_len to {model_max} or less",))
    requests = f"the workload's requests of {shortest_context:,} tokens (input + output)"
    if shortest_context > model_max:
        return Refusal(f"{requests} exceed {profile.name}'s maximum context of {model_max:,} tokens",
                       (f"shorten the workload's input_len + output_len to {model_max:,} tokens or less",))
    if choice.max_model_len and choice.max_model_len < shortest_context:
        return Refusal(f"{requests} exceed max_model_len {choice.max_model_len:,}",
                       (f"raise max_model_len to {shortest_context:,} or more ({profile.name} allows {model_max:,})",
                        f"or shorten the workload's input_len + output_len to {choice.max_model_len:,} tokens"))
    target = max(_target_context(profile, machine, choice), shortest_context)

    if choice.tensor_parallel_size:
        tp = choice.tensor_parallel_size
        why = tp_problem(profile.architecture, tp) or (
            f"tensor_parallel_size {tp} needs {tp} GPUs; this machine has {machine.gpu_count}"
            if tp > machine.gpu_count else None)
        if why:
            valid = valid_tp_sizes(profile.architecture, machine.gpu_count)
            return Refusal(why, (f"valid tensor_parallel_size here: {', '.join(map(str, valid))}",))
        tps = [tp]
    else:
        tps = valid_tp_sizes(profile.architecture, machine.gpu_count)
    if ctx.dp > 1:
        tps = [t for t in (tps if choice.tensor_parallel_size or not choice.expert_parallel else [1])
               if t * ctx.dp * (choice.instances or 1) <= machine.gpu_count]
        if not tps:
            return Refusal(f"data_parallel_size {ctx.dp} x tensor_parallel_size "
                           f"{choice.tensor_parallel_size or 1} needs more than the {machine.gpu_count} GPUs here",
                           (f"ask for data_parallel_size {machine.gpu_count // (choice.tensor_parallel_size or 1)} "
                            "or less",))
    if choice.instances:
        tps = [t for t in tps if t * choice.instances <= machine.gpu_count]
        if not tps:
            return Refusal(f"{choice.instances} instances do not fit on {machine.gpu_count} GPUs",
                           (f"ask for at most {machine.gpu_count // (choice.tensor_parallel_size or 1)} "
                            "instances",))

    fitting, reasons = _search(ctx, options, tps, target)
    if not fitting:
        return _refuse(ctx, reasons, alternatives, target)
    plans = []
    for cand in fitting:
        groups = gpu_groups(machine, cand.tp * ctx.dp, cand.instances)
        if groups is None:
            reasons.append(f"cannot form {cand.instances} NVLink-connected groups of {cand.tp * ctx.dp} GPUs on "
                           f"{machine.name}")
            continue
        plans.append(_build_plan(ctx, cand, groups))
    if not plans:
        return Refusal(reasons[-1], ("ask for fewer instances or a smaller tensor_parallel_size",))
    return plans


def served_names(profile: Profile) -> tuple[str, ...]:
    names = [profile.name]
    if profile.model.hf_id != profile.name and not profile.model.hf_id.startswith("/"):
        names.append(profile.model.hf_id)
    return tuple(names)


def _speculative_json(spec: Speculative) -> dict[str, Any]:
    config: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.model:
        config["model"] = spec.model
    return config


def device_minor(m: Machine, gpu: int) -> int:
    """/dev/nvidiaN of the machine's GPU `gpu`: NVML's minor number, else its index."""
    minor = m.gpus[gpu].minor_number
    return gpu if minor is None else minor


def _build_plan(ctx: Context, best: Candidate, groups: list[tuple[int, ...]]) -> Plan:
    m, p, c = ctx.machine, ctx.profile, ctx.c
    gpu = m.gpus[0]
    override = p.override_for(gpu.spec.class_name, gpu.architecture.value)
    extra = override.serving.extra_args if override and override.serving and override.serving.extra_args \
        is not None else p.serving.extra_args
    per_step = best.speculative.num_speculative_tokens + 1 if best.speculative else 1
    engine = EngineSettings(
        model=best.option.checkpoint.hf_id,
        revision=best.option.checkpoint.revision,
        served_model_names=served_names(p),
        tensor_parallel_size=best.tp,
        max_model_len=best.max_model_len,
        gpu_memory_utilization=ctx.utilization,
        max_num_seqs=best.max_num_seqs,
        max_num_batched_tokens=best.max_num_batched_tokens,
        kv_cache_dtype=best.kv_dtype,
        quantization=best.option.online,
        enable_prefix_caching=p.generates,  # a pooling model's cache reuse depends on its pooling; vLLM's call
        speculative_config=_speculative_json(best.speculative) if best.speculative else None,
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE",
                            "max_cudagraph_capture_size": _capture_size(best.max_num_seqs, per_step)},
        tool_call_parser=p.serving.tool_call_parser if p.generates else None,
        reasoning_parser=p.serving.reasoning_parser if p.generates else None,
        trust_remote_code=p.serving.trust_remote_code,
        extra_args=tuple(extra),
        device="cuda",
        data_parallel_size=ctx.dp,
        enable_expert_parallel=ctx.expert_parallel,
        task=p.task,
    )
    first_port = c.get("planning", "first_instance_port")
    instances = []
    for i, group in enumerate(groups):
        node, cpus = group_numa(m, group)
        instances.append(InstancePlan(
            name=f"vllm-{i}", gpus=group, gpu_uuids=tuple(m.gpus[g].uuid for g in group),
            device_minors=tuple(device_minor(m, g) for g in group),
            port=first_port + i, numa_node=node, cpus=cpus))
    predicted = Prediction(
        weight_bytes_per_gpu=best.weight_bytes_per_gpu,
        kv_bytes_per_token=best.layout.bytes_per_token_instance,
        kv_bytes_per_token_per_gpu=best.layout.bytes_per_token_per_gpu,
        kv_cache_bytes_per_gpu=best.kv_cache_bytes_per_gpu,
        kv_cache_tokens_per_instance=best.kv_tokens * ctx.dp,
        max_concurrency_per_instance=best.concurrency,
    )
    warnings = []
    asked = ctx.choice.gpu_memory_utilization
    if asked and ctx.utilization < asked:
        warnings.append(f"gpu_memory_utilization {asked:g} leaves CUDA-graph capture too little room on a "
                        f"{ctx.gpu_memory / GIB:.1f} GiB GPU (it overruns its estimate by up to "
                        f"{c.get('vllm', 'cudagraph_capture_overrun_bytes') / GIB:.1f} GiB, vllm#57475); "
                        f"planned with {ctx.utilization:g}")
    if len({g.name for g in m.gpus}) > 1:
        warnings.append("the GPUs differ; kiln planned for the smallest")
    plan = Plan(
        machine=m.name, profile=p.name, objective=ctx.objective, quantization=best.option.precision,
        kv_cache_dtype=best.kv_dtype, engine=engine, instances=tuple(instances), predicted=predicted,
        explanation=(), warnings=tuple(warnings),
    )
    return replace(plan, explanation=tuple(describe(m, p, plan)))

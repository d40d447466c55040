"""make_plan: machine × profile × choice -> Plan | Refusal. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln.choice.schema import Choice
from kiln.hardware.model import Architecture, Machine
from kiln.planner import capacity as cap
from kiln.planner.cpu import make_cpu_plan
from kiln.planner.precision import NATIVE_FP8, PrecisionOption, forced_option, precision_options
from kiln.planner.startup import with_cold_start
from kiln.planner.topology import gpu_groups, group_numa, tp_problem, valid_tp_sizes
from kiln.planner.types import Constants, EngineSettings, InstancePlan, Plan, Prediction, Refusal
from kiln.profiles.schema import Profile, Speculative

GIB = 2**30
MAX_CAPTURE_SIZE = 512


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class Candidate:
    """One way to run the model: a precision and a TP size, with its modeled capacity."""

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
    batch: int
    decode_tps_per_seq: float
    output_tps: float


@dataclass(frozen=True)
class Context:
    machine: Machine
    profile: Profile
    choice: Choice
    c: Constants
    objective: str
    utilization: float

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

    def roofline(self, precision: str) -> cap.Roofline:
        spec = self.machine.gpus[0].spec
        eff_bw = self.c.get("roofline", "memory_bandwidth_efficiency")
        flops_key = {"nvfp4": "fp4", "mxfp4": "fp4", "int4": "bf16"}.get(precision, precision)
        tflops = spec.tflops(flops_key) or spec.tflops("bf16")
        nvlink = self.machine.gpu_count > 1 and all(self.machine.linked(0, j) for j in range(self.machine.gpu_count))
        link = "nvlink" if nvlink else "pcie"
        link_gb_s = spec.nvlink_gb_s / 2 if nvlink and spec.nvlink_gb_s else self.c.get("roofline", "pcie_gb_s")
        return cap.Roofline(
            bandwidth_bytes_s=spec.memory_bandwidth_gb_s * 1e9 * eff_bw,
            flops=None if not tflops else tflops * 1e12 * self.c.get("roofline", "compute_efficiency"),
            allreduce_latency_s=self.c.get("roofline", "allreduce_latency_s", link),
            link_bytes_s=link_gb_s * 1e9,
        )


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
    return min(max_num_seqs * tokens_per_step, MAX_CAPTURE_SIZE)


def _pow2_floor(n: float) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


@dataclass(frozen=True)
class Workload:
    """The planner's typical request on one instance: step times from the capacity model."""

    profile: Profile
    precision: str
    tp: int
    roof: cap.Roofline
    kv_per_token_gpu: int
    context: int  # average tokens in a running sequence's KV cache
    prefill: float  # prompt tokens prefilled per generated token

    def step(self, batch: int, tokens_per_seq: int = 1, *, with_prefill: bool = True) -> float:
        return cap.decode_step_seconds(self.profile, self.precision, self.tp, batch, self.context,
                                       self.kv_per_token_gpu, self.roof, tokens_per_seq,
                                       prefill_per_seq=self.prefill if with_prefill else 0.0)

    def speculative_step(self, batch: int, k: int, *, with_prefill: bool = True) -> float:
        return self.step(batch, k + 1, with_prefill=with_prefill) + cap.draft_seconds(
            self.profile, self.precision, self.tp, k, self.roof)


def _decide_speculative(ctx: Context, options: tuple[Speculative, ...], work: Workload, batch: int
                        ) -> tuple[Speculative | None, str]:
    """Whether drafts pay for themselves at this batch, and why."""
    if not options:
        return None, ("requested, but the profile has no speculative-decoding option"
                      if ctx.choice.speculative_decoding else
                      "off: the profile has no draft model, EAGLE head or MTP layer")
    if ctx.choice.speculative_decoding is False:
        return None, "off, as the user asked"
    spec = options[0]
    k = spec.num_speculative_tokens
    emitted = cap.speculative_tokens_per_step(ctx.c.get("roofline", "acceptance_rate").get(spec.method, 0.5), k)
    plain, verify = work.step(batch), work.speculative_step(batch, k)
    gain = emitted * plain / verify
    if ctx.choice.speculative_decoding:
        return spec, "on, as the user asked"
    if ctx.objective == "latency":
        return spec, (f"on: it cuts per-token latency; a verify step emits ~{emitted:.1f} tokens for little "
                      "more than one step's time")
    if gain >= ctx.c.get("roofline", "speculative_min_gain"):
        return spec, (f"on: at batch {batch} decode is memory-bound, so drafting and verifying {k + 1} tokens per "
                      f"step costs {verify / plain:.2f}x a plain step and yields {gain:.2f}x the tokens")
    return None, (f"off: at batch {batch} a step that drafts and verifies {k + 1} tokens costs "
                  f"{verify / plain:.2f}x a plain one and would yield only {gain:.2f}x the tokens")


def _evaluate(ctx: Context, option: PrecisionOption, tp: int, kv_dtype: str, context: int) -> Candidate | str:
    """Model one (precision, TP, context) candidate; a string says why it does not fit."""
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
    batch = max(1, min(max_num_seqs, found.tokens // typical))
    work = Workload(profile, option.precision, tp, ctx.roofline(option.precision),
                    found.layout.bytes_per_token_per_gpu,
                    context=plan_c["typical_prompt_tokens"] + plan_c["typical_output_tokens"] // 2,
                    prefill=plan_c["typical_prompt_tokens"] / plan_c["typical_output_tokens"])
    spec, spec_reason = _decide_speculative(ctx, spec_options, work, batch)
    if spec is None:
        emitted, single, loaded = 1.0, work.step(1, with_prefill=False), work.step(batch)
    else:
        k = spec.num_speculative_tokens
        emitted = cap.speculative_tokens_per_step(c.get("roofline", "acceptance_rate").get(spec.method, 0.5), k)
        single, loaded = work.speculative_step(1, k, with_prefill=False), work.speculative_step(batch, k)
    instances = ctx.choice.instances or ctx.machine.gpu_count // (tp * ctx.dp)
    return Candidate(
        option=option, tp=tp, instances=instances, kv_dtype=kv_dtype, max_model_len=context,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max(batched, max_num_seqs), speculative=spec,
        spec_reason=spec_reason, weight_bytes_per_gpu=found.weight_bytes_per_gpu,
        kv_cache_bytes_per_gpu=found.kv_cache_bytes_per_gpu, layout=found.layout, kv_tokens=found.tokens,
        concurrency=found.concurrency, batch=batch, decode_tps_per_seq=emitted / single,
        output_tps=instances * batch * emitted / loaded,
    )


def _contexts(ctx: Context, target: int) -> list[int]:
    """The context to try: the target, then halves down to the floor unless the user fixed it."""
    if ctx.choice.max_model_len:
        return [target]
    floor = min(ctx.c.get("planning", "min_context_tokens"), target)
    out = [target]
    while out[-1] // 2 >= floor:
        out.append(out[-1] // 2)
    return out


def _better(ctx: Context, a: Candidate, b: Candidate) -> bool:
    """Is a better than b for the objective? A wider split must win by the margin to be chosen."""
    margin = 1 + float(ctx.c.get("planning", "wider_split_margin"))
    score_a, score_b = ((a.decode_tps_per_seq, b.decode_tps_per_seq) if ctx.objective == "latency"
                        else (a.output_tps, b.output_tps))
    if a.tp > b.tp:
        return score_a > score_b * margin
    if a.tp < b.tp:
        return score_a * margin >= score_b
    return score_a > score_b


def _search(ctx: Context, options: Sequence[PrecisionOption], tps: Sequence[int], target: int
            ) -> tuple[Candidate | None, list[str], list[Candidate]]:
    """The best candidate: the preferred precision that fits, the longest context it fits with,
    the TP size the objective likes best. Otherwise why the preferred precision does not fit,
    at the widest split and shortest context tried, last."""
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
                    fitting.append(result)
            if fitting:
                best = fitting[0]
                for cand in fitting[1:]:
                    if _better(ctx, cand, best):
                        best = cand
                return best, reasons, fitting
    return None, reasons, []


def _explain(ctx: Context, best: Candidate, others: Sequence[Candidate], target: int) -> list[str]:
    m, p = ctx.machine, ctx.profile
    gpu = m.gpus[0]
    links = "NVLink between all GPUs" if m.gpu_count > 1 and all(
        m.linked(0, j) for j in range(m.gpu_count)) else ("PCIe only" if m.gpu_count > 1 else "one GPU")
    lines = [
        f"Machine: {m.gpu_count}x {gpu.name} ({gpu.architecture.value}, {gpu.memory_gib:.0f} GiB, "
        f"{gpu.spec.memory_bandwidth_gb_s:.0f} GB/s each), {links}.",
        f"Precision: {best.option.describe()}; " + {
            Architecture.HOPPER: "Hopper has FP8 tensor cores",
            Architecture.ADA: "Ada has FP8 tensor cores",
            Architecture.BLACKWELL: "Blackwell has FP4 tensor cores",
        }.get(gpu.architecture, "no low-precision tensor cores on this GPU") +
        f"; weights {_gb(best.weight_bytes_per_gpu)} per GPU at TP{best.tp}.",
    ]
    alt = [o for o in others if o.tp != best.tp]
    margin = round(ctx.c.get("planning", "wider_split_margin") * 100)
    if ctx.objective == "throughput":
        top = max(others, key=lambda o: o.output_tps)
        why = f"TP{best.tp} x {best.instances} instance(s) " + (
            f"gives the highest modeled throughput ({best.output_tps:,.0f} tok/s)" if top is best else
            f"models {best.output_tps:,.0f} tok/s, within {margin}% of TP{top.tp}'s {top.output_tps:,.0f} with a "
            "narrower split (less all-reduce, more replicas)")
        if alt:
            why += "; vs " + ", ".join(f"TP{o.tp} x {o.instances}: {o.output_tps:,.0f} tok/s" for o in alt)
    else:
        top = max(others, key=lambda o: o.decode_tps_per_seq)
        why = f"TP{best.tp} " + (
            f"gives the lowest modeled per-token latency ({1000 / best.decode_tps_per_seq:.1f} ms)" if top is best
            else f"models {1000 / best.decode_tps_per_seq:.1f} ms per token, within {margin}% of TP{top.tp}'s "
            f"{1000 / top.decode_tps_per_seq:.1f} ms with a narrower split")
        if alt:
            why += "; vs " + ", ".join(f"TP{o.tp}: {1000 / o.decode_tps_per_seq:.1f} ms" for o in alt)
    smaller = [t for t in valid_tp_sizes(p.architecture, m.gpu_count) if t < best.tp and t not in
               {o.tp for o in others}]
    if smaller:
        listed = ", ".join(f"TP{t}" for t in smaller)
        why += f"; {listed} {'does' if len(smaller) == 1 else 'do'} not fit"
    lines.append(why + ".")
    if best.instances > 1:
        lines.append(f"{best.instances} instances of TP{best.tp}: the model fits in fewer GPUs than the machine "
                     "has, so independent replicas serve in parallel behind one endpoint (concurrent "
                     "optimization) instead of paying all-reduce cost across every GPU.")
    kv_word = "fp8 (half the bytes of bf16)" if best.kv_dtype == "fp8" else "the model's dtype"
    lines.append(f"KV cache in {kv_word}: {best.layout.bytes_per_token_instance:,} bytes per token; "
                 f"{best.kv_tokens:,} tokens per instance, {best.concurrency:.1f} requests at full context.")
    if best.max_model_len < target:
        lines.append(f"Context shortened from {target:,} to {best.max_model_len:,} tokens so the KV cache holds "
                     f"enough concurrent requests; ask for more with max_model_len on a larger machine.")
    lines.append(f"Speculative decoding {best.spec_reason}.")
    lines.append("Prefix caching on: requests that share a system prompt or chat history skip its prefill.")
    lines.append(f"Batch limits for {ctx.objective}: max_num_seqs {best.max_num_seqs}, "
                 f"max_num_batched_tokens {best.max_num_batched_tokens}.")
    return lines


def _refuse(ctx: Context, reasons: Sequence[str], alternatives: Sequence[Machine], target: int) -> Refusal:
    p = ctx.profile
    suggestions: list[str] = []
    if ctx.choice.max_model_len:
        relaxed = ctx.choice.model_copy(update={"max_model_len": None})
        plan = make_plan(ctx.machine, p, relaxed, ctx.c)
        if isinstance(plan, Plan):
            suggestions.append(f"a shorter context: max_model_len {plan.engine.max_model_len} fits on this machine")
    if ctx.choice.quantization and ctx.choice.quantization != "auto":
        relaxed = ctx.choice.model_copy(update={"quantization": None})
        plan = make_plan(ctx.machine, p, relaxed, ctx.c)
        if isinstance(plan, Plan):
            suggestions.append(f"a lower precision: quantization {plan.quantization} fits on this machine")
    arch = ctx.machine.gpus[0].architecture
    if "nvfp4" in p.checkpoints and arch is not Architecture.BLACKWELL:
        suggestions.append("an NVFP4 checkpoint exists for this model: it needs a Blackwell machine (B300)")
    for alt in alternatives:
        if alt.name == ctx.machine.name:
            continue
        plan = make_plan(alt, p, ctx.choice.model_copy(update={"tensor_parallel_size": None, "instances": None}),
                         ctx.c)
        if isinstance(plan, Plan):
            suggestions.append(f"a larger machine: {alt.name} fits it ({plan.quantization}, "
                               f"TP{plan.tensor_parallel_size} x {len(plan.instances)})")
            break
    detail = reasons[-1] if reasons else "no configuration fits"
    return Refusal(f"{p.name} does not fit on {ctx.machine.name}: {detail}", tuple(suggestions))


def make_plan(machine: Machine, profile: Profile, choice: Choice, constants: Constants,
              alternatives: Sequence[Machine] = ()) -> Plan | Refusal:
    """Decide how to serve `profile` on `machine` for the user's `choice`.

    `alternatives` are other machines to suggest when nothing fits here.
    """
    if profile.cpu_only:
        cpu = make_cpu_plan(machine, profile, choice, constants)
        return with_cold_start(cpu, profile, constants) if isinstance(cpu, Plan) else cpu
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
                  choice.gpu_memory_utilization or constants.get("vllm", "default_gpu_memory_utilization"))
    arch = machine.gpus[0].architecture
    gpu_class = machine.gpus[0].spec.class_name
    override = profile.override_for(gpu_class, arch.value)

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
    target = choice.max_model_len or (override.serving.max_model_len if override and override.serving
                                      and override.serving.max_model_len else profile.serving.max_model_len)

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

    best, reasons, fitting = _search(ctx, options, tps, target)
    if best is None:
        return _refuse(ctx, reasons, alternatives, target)
    groups = gpu_groups(machine, best.tp * ctx.dp, best.instances)
    if groups is None:
        return Refusal(f"cannot form {best.instances} NVLink-connected groups of {best.tp} GPUs on {machine.name}",
                       ("ask for fewer instances or a smaller tensor_parallel_size",))
    return with_cold_start(_build_plan(ctx, best, fitting, groups, target), profile, constants)


def _served_names(profile: Profile) -> tuple[str, ...]:
    names = [profile.name]
    if profile.model.hf_id != profile.name and not profile.model.hf_id.startswith("/"):
        names.append(profile.model.hf_id)
    return tuple(names)


def _speculative_json(spec: Speculative) -> dict[str, Any]:
    config: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.model:
        config["model"] = spec.model
    return config


def _minor(m: Machine, gpu: int) -> int:
    minor = m.gpus[gpu].minor_number
    return gpu if minor is None else minor


def _build_plan(ctx: Context, best: Candidate, fitting: Sequence[Candidate], groups: list[tuple[int, ...]],
                target: int) -> Plan:
    m, p, c = ctx.machine, ctx.profile, ctx.c
    gpu = m.gpus[0]
    override = p.override_for(gpu.spec.class_name, gpu.architecture.value)
    extra = override.serving.extra_args if override and override.serving and override.serving.extra_args \
        is not None else p.serving.extra_args
    per_step = best.speculative.num_speculative_tokens + 1 if best.speculative else 1
    engine = EngineSettings(
        model=best.option.checkpoint.hf_id,
        revision=best.option.checkpoint.revision,
        served_model_names=_served_names(p),
        tensor_parallel_size=best.tp,
        max_model_len=best.max_model_len,
        gpu_memory_utilization=ctx.utilization,
        max_num_seqs=best.max_num_seqs,
        max_num_batched_tokens=best.max_num_batched_tokens,
        kv_cache_dtype=best.kv_dtype,
        quantization=best.option.online,
        enable_prefix_caching=True,
        speculative_config=_speculative_json(best.speculative) if best.speculative else None,
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE",
                            "max_cudagraph_capture_size": _capture_size(best.max_num_seqs, per_step)},
        tool_call_parser=p.serving.tool_call_parser,
        reasoning_parser=p.serving.reasoning_parser,
        trust_remote_code=p.serving.trust_remote_code,
        extra_args=tuple(extra),
        device="cuda",
        data_parallel_size=ctx.dp,
        enable_expert_parallel=ctx.expert_parallel,
    )
    first_port = c.get("planning", "first_instance_port")
    instances = []
    for i, group in enumerate(groups):
        node, cpus = group_numa(m, group)
        instances.append(InstancePlan(
            name=f"vllm-{i}", gpus=group, gpu_uuids=tuple(m.gpus[g].uuid for g in group),
            device_minors=tuple(_minor(m, g) for g in group),
            port=first_port + i, numa_node=node, cpus=cpus))
    predicted = Prediction(
        weight_bytes_per_gpu=best.weight_bytes_per_gpu,
        kv_bytes_per_token=best.layout.bytes_per_token_instance,
        kv_bytes_per_token_per_gpu=best.layout.bytes_per_token_per_gpu,
        kv_cache_bytes_per_gpu=best.kv_cache_bytes_per_gpu,
        kv_cache_tokens_per_instance=best.kv_tokens * ctx.dp,
        max_concurrency_per_instance=best.concurrency,
        decode_tokens_per_s_per_seq=best.decode_tps_per_seq,
        batch_per_instance=best.batch,
        output_tokens_per_s=best.output_tps,
    )
    warnings = []
    if len({g.name for g in m.gpus}) > 1:
        warnings.append("the GPUs differ; kiln planned for the smallest")
    return Plan(
        machine=m.name, profile=p.name, objective=ctx.objective, quantization=best.option.precision,
        kv_cache_dtype=best.kv_dtype, engine=engine, instances=tuple(instances), predicted=predicted,
        explanation=tuple(_explain(ctx, best, fitting, target)), warnings=tuple(warnings),
    )

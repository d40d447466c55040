"""The setups the planner's search predicts: precisions, splits (tensor, data and expert parallel), draft lengths,
batch limits and tokens per step. The context stays the planner's: it changes how many requests the KV cache
holds, which the simulation's admission already accounts for. Pure."""

from __future__ import annotations

from dataclasses import replace

from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.perf.workload import Workload
from kiln.planner.precision import precision_options
from kiln.planner.topology import valid_tp_sizes
from kiln.profiles.schema import Profile
from kiln.setup.capacity import MAX_CAPTURE_SIZE
from kiln.setup.types import Plan

SMALLEST_BATCH_LIMIT, BATCH_LIMIT_VARIANTS = 16, 3
MAX_DRAFT_TOKENS = 4  # drafts beyond the profile's own are tried up to this many
MIN_TOKEN_BUDGET, MAX_TOKEN_BUDGET = 2048, 32768  # tokens per step the search tries between


def precisions(machine: Machine, profile: Profile, choice: Choice) -> list[str | None]:
    """The precisions to compare: the user's, or the best two the GPU runs natively (e.g. FP8 and BF16)."""
    if choice.quantization and choice.quantization != "auto":
        return [choice.quantization]
    if not machine.gpus:
        return [None]
    return [o.precision for o in precision_options(profile, machine.gpus[0].architecture)[:2]] or [None]


def choices(machine: Machine, profile: Profile, choice: Choice) -> list[Choice]:
    return [c.model_copy(update={"quantization": q}) if q else c
            for q in precisions(machine, profile, choice) for c in _splits(machine, profile, choice)]


def _splits(machine: Machine, profile: Profile, choice: Choice) -> list[Choice]:
    tps = [choice.tensor_parallel_size] if choice.tensor_parallel_size else valid_tp_sizes(
        profile.architecture, machine.gpu_count)
    specs: list[bool | None] = [choice.speculative_decoding] if choice.speculative_decoding is not None else (
        [False, True] if profile.speculative else [False])
    out = []
    if choice.data_parallel_size or choice.expert_parallel:
        return [choice.model_copy(update={"speculative_decoding": spec}) for spec in specs]
    for tp in tps:
        instances = choice.instances or machine.gpu_count // tp
        if instances * tp > machine.gpu_count:
            continue
        for spec in specs:
            out.append(choice.model_copy(update={"tensor_parallel_size": tp, "instances": instances,
                                                 "speculative_decoding": spec}))
    if profile.architecture.moe is not None and machine.gpu_count > 1 and choice.expert_parallel is not False:
        # vLLM's recipes for large MoE models: one server, data parallel over every GPU, experts spread over all.
        for spec in specs:
            out.append(choice.model_copy(update={"tensor_parallel_size": 1, "instances": 1,
                                                 "data_parallel_size": machine.gpu_count, "expert_parallel": True,
                                                 "speculative_decoding": spec}))
    return out


def batch_limits(plan: Plan, workload: Workload) -> list[Plan]:
    """The plan, and with a TPOT budget the same plan with smaller batches: fewer sequences per step make each
    token faster at the cost of output."""
    if workload.tpot_budget_ms is None:
        return [plan]
    schedulers = len(plan.instances) * plan.engine.data_parallel_size
    in_flight = -(-(workload.concurrency or workload.num_prompts) // schedulers)  # what each one is sent at most
    out, seqs = [plan], min(plan.engine.max_num_seqs, in_flight) // 2
    while seqs >= SMALLEST_BATCH_LIMIT and len(out) <= BATCH_LIMIT_VARIANTS:
        out.append(replace(plan, engine=replace(plan.engine, max_num_seqs=seqs)))
        seqs //= 2
    return out


def draft_lengths(plan: Plan) -> list[Plan]:
    """The plan, and with speculative decoding the same plan drafting 1 to MAX_DRAFT_TOKENS tokens: more drafts
    pay while the batch leaves tensor cores idle, fewer once it fills them."""
    spec = plan.engine.speculative_config
    if not spec:
        return [plan]
    own = int(spec["num_speculative_tokens"])
    out = [plan]
    for k in range(1, max(own, MAX_DRAFT_TOKENS) + 1):
        if k != own:
            out.append(replace(plan, engine=replace(plan.engine, speculative_config={**spec,
                                                                                   "num_speculative_tokens": k})))
    return out


def token_budgets(plan: Plan, workload: Workload) -> list[Plan]:
    """The plan, and with a TTFT budget the same plan with half and twice the tokens per step: a larger budget
    prefills long prompts in fewer steps, a smaller one keeps decoding steps short while prompts arrive."""
    if workload.ttft_ms is None:
        return [plan]
    e, out = plan.engine, [plan]
    for tokens in (e.max_num_batched_tokens // 2, e.max_num_batched_tokens * 2):
        if max(MIN_TOKEN_BUDGET, e.max_num_seqs) <= tokens <= MAX_TOKEN_BUDGET:
            out.append(replace(plan, engine=replace(e, max_num_batched_tokens=tokens)))
    return out


def _captured(plan: Plan) -> Plan:
    """The CUDA-graph sizes follow the batch: every sequence's tokens in one step, drafts included, at most 512."""
    e = plan.engine
    if not e.compilation_config or "max_cudagraph_capture_size" not in e.compilation_config:
        return plan
    per_step = int(e.speculative_config["num_speculative_tokens"]) + 1 if e.speculative_config else 1
    size = min(e.max_num_seqs * per_step, MAX_CAPTURE_SIZE)
    return replace(plan, engine=replace(e, compilation_config={**e.compilation_config,
                                                                "max_cudagraph_capture_size": size}))


def variants(plan: Plan, workload: Workload, drafts: bool = True) -> list[Plan]:
    """The plan's batch limits and token budgets for this workload, and with `drafts` its draft lengths."""
    return [_captured(t) for d in (draft_lengths(plan) if drafts else [plan]) for b in batch_limits(d, workload)
            for t in token_budgets(b, workload)]

"""What a plan delivers for a workload: its instances simulated under the workload's load. Pure.

The numbers are those `vllm bench serve` prints: output and total tokens/s, requests/s, and TTFT, TPOT and
ITL percentiles over the requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kiln.hardware.model import Machine
from kiln.perf.simulate import Drafting, Limits, Load, Outcome, percentile, poisson_arrivals, simulate
from kiln.perf.steps import Efficiency, Hardware, RooflineSteps, StepModel, speculative_tokens_per_step
from kiln.perf.workload import Workload, spread_lengths
from kiln.profiles.schema import Profile
from kiln.setup.types import Constants, Plan


@dataclass(frozen=True)
class Forecast:
    engine: str
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float
    tokens_per_s_per_user: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def meets(self, workload: Workload) -> bool:
        return not self.misses(workload)

    def overruns(self, workload: Workload) -> list[tuple[str, float, float]]:
        """The budget's terms this forecast breaks: (term, predicted ms, allowed ms)."""
        out = []
        if workload.ttft_ms is not None and self.ttft_ms["p90"] > workload.ttft_ms:
            out.append(("TTFT p90", self.ttft_ms["p90"], workload.ttft_ms))
        budget = workload.tpot_budget_ms
        if budget is not None and self.tpot_ms["p90"] > budget:
            out.append(("TPOT p90", self.tpot_ms["p90"], budget))
        return out

    def misses(self, workload: Workload) -> list[str]:
        """The budget's terms this forecast breaks, each with the predicted number."""
        return [f"{term} {predicted:,.1f} ms > {allowed:,.1f} ms"
                for term, predicted, allowed in self.overruns(workload)]

    def as_dict(self) -> dict[str, Any]:
        def r(d: dict[str, float]) -> dict[str, float]:
            return {k: round(v, 2) for k, v in d.items()}
        return {"output_tokens_per_s": round(self.output_tokens_per_s, 1),
                "total_tokens_per_s": round(self.total_tokens_per_s, 1),
                "requests_per_s": round(self.requests_per_s, 3),
                "tokens_per_s_per_user": round(self.tokens_per_s_per_user, 1),
                "ttft_ms": r(self.ttft_ms), "tpot_ms": r(self.tpot_ms), "itl_ms": r(self.itl_ms),
                "engine": self.engine, "notes": list(self.notes)}


def efficiency(c: Constants, device: str, architecture: str | None = None) -> Efficiency:
    """The calibrated fractions of peak; a GPU generation may reach more or less of its tensor cores' peak."""
    roof = c.get("roofline") if device == "cuda" else c.get("cpu")
    compute = roof.get("compute_efficiency_by_architecture", {}).get(architecture, roof["compute_efficiency"])
    return Efficiency(memory=roof["memory_bandwidth_efficiency"], compute=compute,
                      compute_moe=roof.get("moe_compute_efficiency", compute),
                      step_overhead_s=roof["step_overhead_s"], overhead_per_layer_s=roof["overhead_per_layer_s"],
                      overhead_per_seq_s=roof["overhead_per_seq_s"],
                      overhead_per_rank_s=roof.get("overhead_per_rank_s", 0.0),
                      attention_by_length=tuple((int(n), float(e))
                                                for n, e in roof.get("attention_efficiency_by_length", ())))


def hardware(machine: Machine, precision: str, tp: int, instances: int, c: Constants,
             release: tuple[int, int] | None = None) -> Hardware:
    """Peak figures of the GPUs (or CPU cores) one instance runs on, for the vLLM `release` that serves (None:
    kiln's own, newer than every measurement)."""
    if not machine.gpus:
        cpu = c.get("cpu")
        return Hardware(cpu["memory_bandwidth_gb_s"] * 1e9 / instances,
                        cpu["gflops_per_core"] * 1e9 * max(machine.host.cpu_count // instances, 1), 0.0, 1.0)
    spec = machine.gpus[0].spec
    key = {"nvfp4": "fp4", "mxfp4": "fp4", "int4": "bf16"}.get(precision, precision)
    bf16 = spec.tflops("bf16")
    tflops = spec.tflops(key) or bf16
    expert_tflops = tflops
    if key == "fp8" and spec.tflops("fp8"):  # FP8 tensor cores; without them FP8 weights run at BF16's rate anyway
        slower = fp8_expert_time_vs_bf16(c, spec.architecture.value, release)
        if slower and bf16:
            expert_tflops = bf16 / slower
    nvlink = machine.gpu_count > 1 and all(machine.linked(0, j) for j in range(machine.gpu_count))
    link = "nvlink" if nvlink else "pcie"
    link_gb_s = spec.nvlink_gb_s / 2 if nvlink and spec.nvlink_gb_s else c.get("roofline", "pcie_gb_s")
    tables = c.get("roofline").get("allreduce_us_nvlink", {}).get(spec.architecture.value, {}) if nvlink else {}
    table = tuple((int(n), tuple((int(x), float(y)) for x, y in points)) for n, points in tables.items())
    return Hardware(spec.memory_bandwidth_gb_s * 1e9, tflops * 1e12 if tflops else None,
                    c.get("roofline", "allreduce_latency_s", link) if tp > 1 else 0.0, link_gb_s * 1e9,
                    allreduce_us=table, sparse_mla_min_heads=int(c.get("roofline").get("sparse_mla_min_heads", 0)),
                    sparse_mla_prefill_min_heads=int(c.get("roofline").get("sparse_mla_prefill_min_heads", {}).get(
                        spec.architecture.value, 0)),
                    expert_flops=expert_tflops * 1e12 if expert_tflops else None,
                    attention_flops=bf16 * 1e12 if bf16 else None)


def release_line(text: object) -> tuple[int, int]:
    """A vLLM release's line as numbers: "0.14", "0.19.1" or 0.21 -> (0, 14), (0, 19), (0, 21)."""
    major, minor = str(text).split(".")[:2]
    return int(major), int(minor)


def fp8_expert_time_vs_bf16(c: Constants, architecture: str, release: tuple[int, int] | None) -> float | None:
    """How long vLLM's fused MoE kernel takes over FP8 experts, against BF16 ones, on a GPU generation in the given
    release: the entry of the newest measured release at or before it (the oldest for older ones; the newest for
    kiln's own). None where the generation was not measured."""
    measured = c.get("roofline", "fp8_expert_time_vs_bf16").get(architecture)
    if not measured:
        return None
    table = sorted((release_line(k), float(v)) for k, v in measured.items())
    if release is None:
        return table[-1][1]
    return next((v for r, v in reversed(table) if r <= release), table[0][1])


def drafting(plan: Plan, c: Constants) -> Drafting | None:
    spec = plan.engine.speculative_config
    if not spec:
        return None
    k = int(spec["num_speculative_tokens"])
    acceptance = c.get("roofline", "acceptance_rate").get(spec["method"], 0.5)
    return Drafting(k, speculative_tokens_per_step(acceptance, k))


def kiln_steps(plan: Plan, machine: Machine, profile: Profile, c: Constants,
               release: tuple[int, int] | None = None) -> StepModel:
    """kiln's own engine for this plan's instances, served by vLLM `release` (None: kiln's own)."""
    draft = drafting(plan, c)
    e = plan.engine
    full_topk = profile.architecture.sparse_attention is not None and release is not None and (
        release < release_line(c.get("roofline", "sparse_mla_valid_topk_since")))
    reached = efficiency(c, e.device, machine.gpus[0].architecture.value if machine.gpus else None)
    if profile.serving.lora_adapters:  # the adapters' own GEMMs on every layer (data/planner.yaml `lora`)
        slower = float(c.get("lora", "step_time_factor"))
        reached = replace(reached, memory=reached.memory / slower, compute=reached.compute / slower,
                          compute_moe=reached.compute_moe / slower)
    return RooflineSteps(profile, plan.quantization, plan.tensor_parallel_size,
                         plan.predicted.kv_bytes_per_token_per_gpu,
                         hardware(machine, plan.quantization, plan.tensor_parallel_size, len(plan.instances), c,
                                  release),
                         reached,
                         draft.tokens if draft else 0,
                         data_parallel=e.data_parallel_size, expert_parallel=e.enable_expert_parallel,
                         sparse_full_topk=full_topk,
                         sparse_decode_in_prefill_kernel=full_topk and not plan.kv_cache_dtype.startswith("fp8"),
                         async_scheduling=schedules_async(plan, c, release))


# Speculative methods vLLM schedules asynchronously (vllm-project/vllm#31998; the others turn it off).
ASYNC_SPECULATIVE_METHODS = ("eagle", "eagle3", "mtp", "deepseek_mtp")


def schedules_async(plan: Plan, c: Constants, release: tuple[int, int] | None) -> bool:
    """Whether vLLM `release` (None: kiln's own) schedules this plan asynchronously by default: on GPUs from the
    release that made it the default, with no speculative decoding or a method it supports."""
    spec = plan.engine.speculative_config
    since = release_line(c.get("roofline", "async_scheduling_since"))
    return (plan.engine.device == "cuda" and (release is None or release >= since)
            and (not spec or spec["method"] in ASYNC_SPECULATIVE_METHODS))


def limits(plan: Plan) -> Limits:
    """One scheduler's limits: vLLM gives each data-parallel rank its own max_num_seqs, token budget and KV; a
    pipeline keeps one batch in flight per stage, which share the rank's sequences and KV cache."""
    e = plan.engine
    return Limits(max(e.max_num_seqs // e.pipeline_parallel_size, 1), e.max_num_batched_tokens,
                  plan.predicted.kv_cache_tokens_per_instance // e.schedulers, e.enable_prefix_caching)


# A steady closed loop's outputs spread evenly from half to one and a half times the mean, as `vllm bench serve
# --random-range-ratio 0.5` sends: streams whose requests all take as long would stay in lockstep, each wave of
# prompts arriving at once, which no real load does.
STEADY_SPREAD = ((0.0, 0.5), (1.0, 1.5))


def lockstep_ranks(plan: Plan) -> int:
    """The data-parallel ranks of each instance that step together: a MoE model's, whose expert layers exchange
    tokens (kiln runs data parallelism on MoE models with expert parallelism only); 1 where each rank steps alone,
    as a dense model's do (vllm/v1/engine/core.py: "Non-MoE DP ranks are completely independent")."""
    e = plan.engine
    together = e.data_parallel_size > 1 and e.enable_expert_parallel and e.pipeline_parallel_size == 1
    return e.data_parallel_size if together else 1


def loads(workload: Workload, instances: int, c: Constants) -> list[Load]:
    """What each instance receives when the router spreads the workload evenly. A dataset with a known spread
    (data/planner.yaml `datasets`) gives each request its own output length, and so does a steady load."""
    dataset = c.data.get("datasets", {}).get(workload.dataset, {}) if workload.dataset else {}
    quantiles = dataset.get("output_len_quantiles") or (STEADY_SPREAD if workload.steady else None)
    out = []
    for i in range(instances):
        prompts = workload.num_prompts // instances + (1 if i < workload.num_prompts % instances else 0)
        if prompts == 0:
            continue
        spread = spread_lengths(workload.output_len, prompts, quantiles) if quantiles else ()
        if workload.concurrency is not None:
            conc = workload.concurrency // instances + (1 if i < workload.concurrency % instances else 0)
            if conc == 0:
                continue
            out.append(Load(workload.input_len, workload.output_len, prompts, concurrency=conc,
                            prefix_len=workload.prefix_len, output_lens=spread,
                            warmup=conc if workload.steady else 0))
        else:
            rate = (workload.request_rate or math.inf) / instances
            # A steady load sends every scheduler the same sample of the process: alike, they are simulated once.
            out.append(Load(workload.input_len, workload.output_len, prompts,
                            arrivals=poisson_arrivals(rate, prompts, seed=0 if workload.steady else i),
                            prefix_len=workload.prefix_len, output_lens=spread))
    return out


def _summarize(engine: str, outcomes: list[Outcome], workload: Workload, notes: list[str]) -> Forecast:
    duration = max(o.duration_s for o in outcomes)
    output = sum(o.output_tokens for o in outcomes)
    inputs = sum(o.input_tokens for o in outcomes)
    completed = sum(o.completed for o in outcomes)
    ttft = [t * 1000 for o in outcomes for t in o.ttft_s]
    tpot = [t * 1000 for o in outcomes for t in o.tpot_s]
    itl = [(t * 1000, w) for o in outcomes for t, w in o.itl]
    tpot_p50 = percentile(tpot, 50)
    if sum(o.preemptions for o in outcomes):
        notes.append(f"the KV cache overflowed: {sum(o.preemptions for o in outcomes)} preemptions (recomputed)")
    return Forecast(
        engine=engine,
        output_tokens_per_s=output / duration if duration else 0.0,
        total_tokens_per_s=(output + inputs) / duration if duration else 0.0,
        requests_per_s=completed / duration if duration else 0.0,
        tokens_per_s_per_user=1000 / tpot_p50 if tpot_p50 else 0.0,
        ttft_ms={"p50": percentile(ttft, 50), "p90": percentile(ttft, 90), "p99": percentile(ttft, 99)},
        tpot_ms={"p50": tpot_p50, "p90": percentile(tpot, 90)},
        itl_ms={"p50": percentile([v for v, _ in itl], 50, [w for _, w in itl])},
        notes=tuple(notes),
    )


def forecast(plan: Plan, workload: Workload, steps: StepModel, c: Constants, emitted: float | None = None
             ) -> Forecast:
    """Simulate every instance of `plan` under its share of `workload` with `steps`' step times.

    `emitted` replaces the tokens a verify step keeps on average, where the drafts' acceptance was measured."""
    per_instance = loads(workload, len(plan.instances) * plan.engine.schedulers, c)
    if not per_instance:
        raise ValueError("the workload sends no requests")
    draft = drafting(plan, c)
    if draft and emitted:
        draft = Drafting(draft.tokens, float(emitted))
    lim, ranks = limits(plan), lockstep_ranks(plan)
    cache: dict[tuple[int | None, int, tuple[float, ...], tuple[int, ...], int], Outcome] = {}
    outcomes = []
    for load in per_instance:
        # Instances sent the same requests at the same times serve them alike: simulate one of them.
        key = (load.concurrency, load.num_prompts, load.arrivals, load.output_lens, load.warmup)
        if key not in cache:
            cache[key] = simulate(steps, lim, load, draft, ranks)
        outcomes.append(cache[key])
    notes = []
    if workload.dataset:
        spread = "outputs spread as the dataset's" if per_instance[0].output_lens else "outputs at the mean"
        notes.append(f"{workload.dataset}: prompts at the dataset's mean length, {spread}")
    if draft:
        notes.append(f"speculative decoding: {draft.emitted:.2f} tokens per verify step of {draft.tokens} drafts")
    peak = max(o.peak_running for o in outcomes)
    if workload.concurrency and peak < -(-workload.concurrency // len(per_instance)):
        notes.append(f"requests queue: at most {peak} run at once per instance (max_num_seqs "
                     f"{lim.max_num_seqs}, KV cache {lim.kv_tokens:,} tokens)")
    return _summarize(steps.name, outcomes, workload, notes)

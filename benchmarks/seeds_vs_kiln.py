"""The seeds' published figures beside kiln's prediction for the same model, GPU, precision and load, and whether
each lands in the prediction's band (data/planner.yaml `bands`, from the out-of-sample errors).

Run: .venv/bin/python -m benchmarks.seeds_vs_kiln
Where a seed leaves out part of its setup (request lengths, concurrency), the assumption is printed beside it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kiln.hardware.model import Machine
from kiln.perf.predict import Forecast, forecast, hardware, kiln_steps
from kiln.perf.setup import Fixed, fixed_plan, machine_of
from kiln.perf.workload import Workload
from kiln.planner.bands import band_for
from kiln.profiles.schema import Profile
from kiln.setup.types import Band, Constants, Plan
from kiln.wiring import Kiln


@dataclass(frozen=True)
class Seed:
    name: str
    source: str  # /work/shared/seeds file and what it says
    profile: str
    gpu: str
    gpus: int
    memory_gib: float
    setup: Fixed
    workload: Workload
    metric: str  # output_tok_s, output_tok_s_per_gpu, total_tok_s_per_gpu, tok_s_per_user, ttft_ms
    published: float
    assumed: str
    release: tuple[int, int] | None = None  # the vLLM release the source ran, where it names one (None: kiln's own)


def _spec(method: str, k: int) -> dict[str, object]:
    return {"method": method, "num_speculative_tokens": k}


_GB300_TP2 = Fixed("nvfp4", 2, kv_cache_dtype="fp8", max_num_seqs=1024, max_num_batched_tokens=20480,
                   max_model_len=16384)

SEEDS = [
    Seed("DO Llama 3.3 70B, 2 x H100, FP8 + EAGLE-3", "004: 2,000 tok/s (vs 823 on 4 x H100 vanilla), 1-16 users",
         "llama-3.3-70b-instruct", "h100", 2, 80,
         Fixed("fp8", 2, kv_cache_dtype="fp8", speculative=_spec("eagle3", 2)),
         Workload(1024, 1024, concurrency=16, num_prompts=64), "output_tok_s", 2000,
         "16 users at once, 1,024 in / 1,024 out (the post gives neither lengths nor the users of its figure)"),
    Seed("DO Llama 3.3 70B, 4 x H100 vanilla (BF16 TP4)", "004: 823 tok/s", "llama-3.3-70b-instruct", "h100", 4, 80,
         Fixed("bf16", 4), Workload(1024, 1024, concurrency=16, num_prompts=64), "output_tok_s", 823,
         "as above"),
    Seed("DO Llama 3.3 70B, 2 x H100 TTFT", "004: TTFT 187.9 ms", "llama-3.3-70b-instruct", "h100", 2, 80,
         Fixed("fp8", 2, kv_cache_dtype="fp8", speculative=_spec("eagle3", 2)),
         Workload(1024, 1024, concurrency=16, num_prompts=64), "ttft_ms", 187.9, "as above"),
    Seed("DO DeepSeek-V3.2, B300 NVFP4 TP8, 10K in", "000: 230 tok/s per user, TTFT 0.96 s (Artificial Analysis)",
         "deepseek-v3.2", "b300", 8, 288,
         Fixed("nvfp4", 8, kv_cache_dtype="fp8", max_model_len=16384, speculative=_spec("mtp", 3)),
         Workload(10_000, 1000, concurrency=1, num_prompts=4), "tok_s_per_user", 230,
         "one request at a time, 10,000 in / 1,000 out; MTP k=3 (the post names speculative decoding, not k)"),
    Seed("DO DeepSeek-V3.2, B300 TTFT at 10K in", "000: TTFT 0.96 s", "deepseek-v3.2", "b300", 8, 288,
         Fixed("nvfp4", 8, kv_cache_dtype="fp8", max_model_len=16384, speculative=_spec("mtp", 3)),
         Workload(10_000, 1000, concurrency=1, num_prompts=4), "ttft_ms", 960, "as above"),
    Seed("vLLM DeepSeek-V3.2, GB300 FP4, prefill", "003: 7,360 tok/s per GPU in prefill", "deepseek-v3.2", "b300",
         2, 288, _GB300_TP2, Workload(2048, 1, concurrency=64, num_prompts=1000), "total_tok_s_per_gpu", 7360,
         "vLLM's post (blog.vllm.ai 2026-02-13), vLLM 0.14.1: TP2 on 2 GPUs, 2,048 in / 1 out, 64 at once, 1,000 "
         "prompts, --max-num-batched-tokens 20480, total tok/s per GPU; vLLM's default 1,024 sequences; GB300 as "
         "B300 (the post: GB300 prefills 14% faster)", (0, 14)),
    Seed("vLLM DeepSeek-V3.2, GB300 FP4, mixed", "003: 2,816 tok/s per GPU mixed context", "deepseek-v3.2", "b300",
         2, 288, _GB300_TP2, Workload(2048, 1024, concurrency=512, num_prompts=1000), "output_tok_s_per_gpu", 2816,
         "as above, 2,048 in / 1,024 out; 512 at once, where kiln's output peaks (the post gives no concurrency)",
         (0, 14)),
]


def value(metric: str, f: Forecast, gpus: int, workload: Workload) -> float:
    if metric == "output_tok_s":
        return f.output_tokens_per_s
    if metric == "output_tok_s_per_gpu":
        return f.output_tokens_per_s / gpus
    if metric == "total_tok_s_per_gpu":
        return f.total_tokens_per_s / gpus
    if metric == "tok_s_per_user":
        return f.tokens_per_s_per_user
    return f.ttft_ms["p50"]


def prefill_floor_ms(plan: Plan, machine: Machine, profile: Profile, workload: Workload, c: Constants) -> float | None:
    """The least time the prompts sent at once take to prefill: 2 FLOPs per active parameter per prompt token, on all
    the instance's GPUs at their datasheet peak. A published TTFT below it cannot come from the assumed load."""
    peak = hardware(machine, plan.quantization, plan.tensor_parallel_size, 1, c).flops
    if not peak:
        return None
    at_once = min(workload.concurrency or workload.num_prompts, workload.num_prompts)
    flops = at_once * workload.input_len * 2 * profile.architecture.params_active
    return 1000 * flops / (peak * machine.gpu_count)


def main() -> int:
    kiln = Kiln.create()
    header = f"{'seed':46} {'published':>10} {'kiln':>10} {'ratio':>6}  {'band':>19}  verdict"
    print(header)
    print("-" * len(header))
    for seed in SEEDS:
        profile = kiln.catalog().get(seed.profile)
        machine = machine_of(kiln.gpus.specs[seed.gpu], seed.gpus, seed.memory_gib)
        made = fixed_plan(machine, profile, seed.setup, kiln.constants)
        if isinstance(made, str):
            print(f"{seed.name:46} not modeled: {made}")
            continue
        plan = made
        f = forecast(plan, seed.workload, kiln_steps(plan, machine, profile, kiln.constants, seed.release),
                     kiln.constants)
        ours = value(seed.metric, f, seed.gpus, seed.workload)
        band: Band | None = None
        if seed.metric.startswith(("output", "total")):
            band = band_for(plan, profile, seed.workload, ours, kiln.constants,
                            kiln.gpus.specs[seed.gpu].architecture.value)
        inside = band is not None and band.low <= seed.published <= band.high
        verdict = ("within the band" if inside else "outside the band" if band else
                   "no band: bands are for output tok/s" if seed.metric in ("ttft_ms", "tok_s_per_user") else
                   "no band: kiln holds no out-of-sample errors for this class")
        shown = f"{band.low:,.0f}-{band.high:,.0f}" if band else "-"
        print(f"{seed.name:46} {seed.published:>10,.0f} {ours:>10,.0f} {seed.published / ours:>6.2f}  {shown:>19}  "
              f"{verdict}")
        print(f"{'':46}   {seed.metric}; assumed: {seed.assumed}")
        floor = prefill_floor_ms(plan, machine, profile, seed.workload, kiln.constants) \
            if seed.metric == "ttft_ms" else None
        if floor is not None:
            print(f"{'':46}   the assumed prompts need {floor:,.0f} ms to prefill at the GPUs' peak FLOPs"
                  + (": the published TTFT is for fewer prompts at once" if seed.published < floor else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

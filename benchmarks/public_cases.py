"""The public `vllm bench serve` cases (tests/data/perf_cases.yaml) and kiln's engine on each: the setup a case
describes, its workload, the figure it measured, and the prediction beside it. The benchmarks and the sweeps over
the cases read them from here."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln.perf.predict import Forecast, forecast, kiln_steps, release_line
from kiln.perf.setup import Fixed, fixed_plan, machine_of
from kiln.perf.workload import Workload
from kiln.profiles.catalog import Catalog
from kiln.profiles.schema import Profile
from kiln.setup.types import Plan
from kiln.validation import parse_yaml
from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "tests" / "data" / "perf_cases.yaml"
MODELS = REPO / "tests" / "data" / "perf_models"
WITHIN = 0.25
SAME_SHAPE = 0.05  # mean input and output lengths this close are one request shape
GIB = 2**30


@dataclass
class Row:
    id: str
    gpu: str
    model: str
    setup: str
    workload: str
    measured: float | None
    measured_tpot_ms: float | None
    source: str
    metric: str = "output"  # output or total tokens/s
    kiln: float | None = None
    kiln_tpot_ms: float | None = None
    aic: float | None = None
    measured_ttft_ms: float | None = None
    kiln_ttft_ms: float | None = None
    problem: str | None = None
    notes: list[str] = field(default_factory=list)

    def error(self, engine: str) -> float | None:
        predicted = getattr(self, engine)
        if predicted is None or not self.measured:
            return None
        return float(predicted / self.measured - 1)


def model_profile(kiln: Kiln, key: str, precision: str, checkpoint: str | None = None,
                  catalog: Catalog | None = None) -> Profile | str:
    """A model by its catalog profile's name (`catalog`, read once by a caller that looks up many), or its
    architecture in tests/data/perf_models/ served from `checkpoint` (the architecture's own hf_id by default)
    at `precision`; or why there is none."""
    names = (catalog or kiln.catalog()).profiles
    if key in names:
        return names[key]
    path = MODELS / f"{key}.yaml"
    if not path.is_file():
        return f"no architecture for {key}"
    data = parse_yaml(path.read_text())
    arch = data["architecture"]
    checkpoint = checkpoint or data["hf_id"]
    return Profile.model_validate({
        "name": key, "model": {"hf_id": data.get("hf_id", checkpoint)}, "architecture": arch,
        "checkpoints": {precision: {"hf_id": checkpoint}},
        "serving": {"max_model_len": arch["max_position_embeddings"]}})


def _profile(kiln: Kiln, case: dict[str, Any], catalog: Catalog | None = None) -> Profile | str:
    """The case's model, served from the case's own checkpoint."""
    return model_profile(kiln, case["model"], case["precision"], case["hf_id"], catalog)


def gpu_memory_gib(kiln: Kiln, gpu: str) -> float:
    """The datasheet memory of a GPU class (data/gpus.yaml)."""
    memory = kiln.gpus.specs[gpu].memory_gib
    assert memory is not None, f"data/gpus.yaml gives {gpu} no memory_gib"
    return memory


def vllm_defaults(memory_gib: float, gpu: str) -> tuple[int, int]:
    """vLLM's `vllm serve` defaults (max_num_seqs, max_num_batched_tokens) for a GPU's memory
    (vllm/engine/arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args)."""
    if memory_gib >= 160:
        return 1024, 16384
    if memory_gib >= 70 and not gpu.startswith("a100"):
        return 1024, 8192
    return 256, 2048


def _speculative(case: dict[str, Any]) -> dict[str, object] | None:
    spec = case.get("speculative")
    if not spec or not isinstance(spec, dict) or not spec.get("method"):
        return None
    return {"method": spec["method"], "num_speculative_tokens": int(spec.get("num_speculative_tokens") or 1)}


def setup_of(kiln: Kiln, case: dict[str, Any], catalog: Catalog | None = None) -> tuple[Plan, Profile, Any] | str:
    profile = _profile(kiln, case, catalog)
    if isinstance(profile, str):
        return profile
    spec = kiln.gpus.specs.get(case["gpu"])
    if spec is None:
        return f"no GPU class {case['gpu']}"
    tp, dp = int(case.get("tp") or 1), int(case.get("dp") or 1)
    # Data-parallel ranks with expert parallelism are one server whose MoE layers exchange tokens; without it
    # they are independent replicas.
    expert_parallel = bool(case.get("ep")) and dp > 1
    replicas = int(case.get("instances") or 1) * (1 if expert_parallel else dp)
    memory = gpu_memory_gib(kiln, case["gpu"])
    seqs, batched = vllm_defaults(memory, case["gpu"])
    w = case["workload"]
    fixed = Fixed(precision=case["precision"], tp=tp, instances=replicas,
                  kv_cache_dtype=case.get("kv_cache_dtype") or "auto",
                  max_num_seqs=int(case.get("max_num_seqs") or seqs), max_num_batched_tokens=batched,
                  max_model_len=max(int(w["input_len"]) + int(w["output_len"]), 4096),
                  speculative=_speculative(case), data_parallel=dp if expert_parallel else 1,
                  expert_parallel=expert_parallel)
    machine = machine_of(spec, tp * dp * int(case.get("instances") or 1), memory)
    plan = fixed_plan(machine, profile, fixed, kiln.constants)
    if isinstance(plan, str):
        return plan
    return plan, profile, machine


def workload_of(case: dict[str, Any]) -> Workload:
    """The case's load, at its measured mean lengths; a ShareGPT run's outputs spread as ShareGPT's do."""
    w = case["workload"]
    rate = w.get("request_rate")
    concurrency = w.get("concurrency")
    prompts = int(w.get("num_prompts") or concurrency or 1000)
    closed = concurrency and (rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate)))
    load: dict[str, Any] = ({"concurrency": int(concurrency)} if closed else
                            {"request_rate": math.inf if rate in (None, "inf") else float(rate)})
    return Workload(int(w["input_len"]), int(w["output_len"]), num_prompts=prompts,
                    dataset="sharegpt" if w.get("dataset") == "sharegpt" else None, **load)


# The oldest vLLM release whose measurements count: kiln pins 0.32, and cases from before 0.10 (mid-2025: ROCm's 0.9.1
# fork, the 0.6 V0 engine) ran other schedulers and kernels. They are printed, not fitted or scored. A case whose
# source names no release (a nightly, a recipe's image) counts: each such case in the corpus measures a model released
# after August 2025 (Kimi-K2-Thinking, DeepSeek-V3.2, Hy3) or is dated 2026, so it ran 0.10 or later.
OLDEST_RELEASE = (0, 10)


def release(case: dict[str, Any]) -> tuple[int, int] | None:
    """The vLLM release line a case ran (`vllm_release`, e.g. "0.11"), or None where the source names none."""
    value = case.get("vllm_release")
    return release_line(value) if value else None


def before_oldest_release(case: dict[str, Any]) -> bool:
    """Whether a case ran a vLLM release older than OLDEST_RELEASE (an unnamed release is not)."""
    return (release(case) or OLDEST_RELEASE) < OLDEST_RELEASE


def load_cases(path: Path = CASES, *, older: bool = False) -> list[dict[str, Any]]:
    """The usable cases measured on vLLM 0.10 or later (or an unnamed recent build); with `older`, only those
    measured on releases before OLDEST_RELEASE."""
    usable = [c for c in parse_yaml(path.read_text())["cases"] if c.get("usable")]
    return [c for c in usable if before_oldest_release(c) == older]


def lengths(case: dict[str, Any]) -> dict[str, Any]:
    """The case's workload, with a dataset's mean lengths worked out from its published totals where the
    source gives tokens/s and requests/s but not the lengths."""
    w = dict(case["workload"])
    m = case.get("measured") or {}
    if (not w.get("input_len") or not w.get("output_len")) and m.get("request_throughput") and (
            m.get("output_tokens_per_s") and m.get("total_tokens_per_s")):
        w["output_len"] = round(m["output_tokens_per_s"] / m["request_throughput"])
        w["input_len"] = round((m["total_tokens_per_s"] - m["output_tokens_per_s"]) / m["request_throughput"])
    return w


def measured_throughput(case: dict[str, Any], w: dict[str, Any]) -> tuple[str, float | None]:
    """The figure to compare: output tokens/s, or what the source gives instead, converted exactly."""
    m = case.get("measured") or {}
    if m.get("output_tokens_per_s") and int(w.get("output_len") or 0) > 1:
        return "output", float(m["output_tokens_per_s"])
    if m.get("batch_e2e_latency_s") and w.get("concurrency") and w.get("output_len"):
        # vLLM's benchmark_latency: one batch of `concurrency` requests, all generating output_len tokens.
        return "output", int(w["concurrency"]) * int(w["output_len"]) / float(m["batch_e2e_latency_s"])
    if m.get("total_tokens_per_s"):
        return "total", float(m["total_tokens_per_s"])
    if m.get("total_tokens_per_s_per_gpu"):
        return "total", float(m["total_tokens_per_s_per_gpu"]) * int(case.get("gpus") or 1)
    return "output", None


def evaluate(kiln: Kiln, case: dict[str, Any], catalog: Catalog | None = None) -> Row:
    w = lengths(case)
    case = {**case, "workload": w}
    metric, value = measured_throughput(case, w)
    row = Row(case["id"], case["gpu"], case["model"], "", f"{w['input_len']}/{w['output_len']}", value,
              (case.get("measured") or {}).get("tpot_ms_median"), case.get("source", ""), metric=metric)
    missing = [k for k in ("input_len", "output_len") if not w.get(k)]
    found = f"the source states no {' or '.join(missing)}" if missing else setup_of(kiln, case, catalog)
    if isinstance(found, str):
        row.problem = found
        return row
    plan, profile, machine = found
    workload = workload_of(case)
    spec = plan.engine.speculative_config
    row.setup = (f"{len(plan.instances)}xTP{plan.tensor_parallel_size} {plan.quantization}"
                 f"{' kv-fp8' if plan.kv_cache_dtype == 'fp8' else ''}{' spec' if spec else ''}")
    row.workload += f" {workload.load}"
    spec_case = case.get("speculative") or {}
    steps = kiln_steps(plan, machine, profile, kiln.constants, release(case))
    result: Forecast = forecast(plan, workload, steps, kiln.constants,
                                emitted=spec_case.get("acceptance_length") if isinstance(spec_case, dict) else None)
    row.kiln = result.output_tokens_per_s if metric == "output" else result.total_tokens_per_s
    row.kiln_tpot_ms = result.tpot_ms["p50"]
    row.measured_ttft_ms = (case.get("measured") or {}).get("ttft_ms_median")
    row.kiln_ttft_ms = result.ttft_ms["p50"]
    row.notes = list(result.notes)
    return row


@dataclass(frozen=True)
class SplitGroup:
    """Cases that measure one model on one GPU under one load at several tensor-parallel splits."""

    key: str
    measured: dict[int, float]  # TP -> output per GPU (the mean where a split was measured more than once)
    predicted: dict[int, float]

    @property
    def best_measured(self) -> int:
        return max(self.measured, key=self.measured.__getitem__)

    @property
    def best_predicted(self) -> int:
        return max(self.predicted, key=self.predicted.__getitem__)


def split_groups(cases: list[dict[str, Any]], rows: list[Row]) -> list[SplitGroup]:
    """The corpus's comparisons of splits, with the split that serves the most per GPU, measured and predicted: the
    choice the planner makes at every boot. Runs whose mean lengths are within SAME_SHAPE of each other are one
    shape: ShareGPT's lengths vary with what each run sampled, and a run's mean output with where requests stopped."""
    found: list[tuple[tuple[Any, ...], tuple[int, int], str, dict[int, list[tuple[float, float]]]]] = []
    for case, row in zip(cases, rows, strict=True):
        if row.kiln is None or not row.measured:
            continue
        w = case["workload"]
        setting = (case["model"], case["gpu"], case["precision"], case.get("source_group"), w.get("dataset"),
                   w.get("concurrency") or w.get("request_rate"))
        shape = (int(w["input_len"]), int(w["output_len"]))
        group = next((g for g in found if g[0] == setting and all(
            abs(a / b - 1) <= SAME_SHAPE for a, b in zip(shape, g[1], strict=True))), None)
        if group is None:
            name = f"{case['model']} on {case['gpu']} {case['precision']}, {shape[0]}/{shape[1]} at {setting[-1]} " \
                   f"({case.get('source_group')})"
            group = (setting, shape, name, {})
            found.append(group)
        tp = int(case.get("tp") or 1)
        gpus = tp * int(case.get("instances") or 1) * int(case.get("dp") or 1)
        group[3].setdefault(tp, []).append((row.measured / gpus, row.kiln / gpus))
    return [SplitGroup(name, {tp: statistics.mean(m for m, _ in v) for tp, v in sorted(by_tp.items())},
                       {tp: statistics.mean(p for _, p in v) for tp, v in sorted(by_tp.items())})
            for _, _, name, by_tp in found if len(by_tp) > 1]


def held_out(rows: list[Row], errors: list[float | None]) -> list[Row]:
    """The rows with kiln's prediction replaced by another fit's (its errors, predicted / measured - 1, per case)."""
    return [replace(r, kiln=None if e is None or not r.measured else r.measured * (1 + e))
            for r, e in zip(rows, errors, strict=True)]


def summary(rows: list[Row], engine: str) -> dict[str, Any]:
    errors = [e for e in (r.error(engine) for r in rows) if e is not None]
    return _stats(engine, errors)


def _stats(engine: str, errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"engine": engine, "cases": 0, "within_25": None, "median_abs_error": None}
    return {"engine": engine, "cases": len(errors),
            "within_25": sum(abs(e) <= WITHIN for e in errors) / len(errors),
            "median_abs_error": statistics.median(abs(e) for e in errors)}


def case_class(kiln: Kiln, case: dict[str, Any], catalog: Catalog | None = None) -> tuple[str, str, str] | None:
    """(GPU generation, dense or moe, load regime) of a case, as kiln.planner.bands names a prediction's class."""
    from kiln.planner.bands import regime  # noqa: PLC0415

    profile, spec = _profile(kiln, case, catalog), kiln.gpus.specs.get(case["gpu"])
    if isinstance(profile, str) or spec is None:
        return None
    w = case["workload"]
    replicas = int(case.get("instances") or 1) * int(case.get("dp") or 1)
    load = int(w.get("concurrency") or w.get("num_prompts") or 1000) / replicas
    return spec.architecture.value, "moe" if profile.architecture.moe else "dense", regime(load)

"""The planner's decisions on the DigitalOcean machines and its refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.conftest import Planned

from kiln.choice.schema import Choice, validate_fields
from kiln.hardware.detect import detect_recorded
from kiln.hardware.fixtures import load_fixture
from kiln.hardware.model import Architecture
from kiln.perf.workload import Workload
from kiln.planner.search import make_plan
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

GPU_FIXTURES = ["h100x1", "h100x8", "h200x1", "h200x8", "l40s", "rtx4000ada", "rtx6000ada", "b300x8"]


def plan(kiln: Kiln, machine: str, profile: str, **choice: Any) -> Plan | Refusal:
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    return make_plan(kiln.machine(machine), kiln.catalog().get(profile), Choice(**choice), kiln.constants,
                     alternatives)


def ok(result: Plan | Refusal) -> Plan:
    assert isinstance(result, Plan), result.text() if isinstance(result, Refusal) else result
    return result


def test_70b_does_not_fit_one_h100_and_the_refusal_says_what_would(kiln: Kiln) -> None:
    result = plan(kiln, "h100x1", "llama-3.3-70b-instruct")
    assert isinstance(result, Refusal)
    assert "does not fit" in result.reason
    assert any(s.startswith("a larger machine") for s in result.suggestions)


def test_70b_on_h100x8_is_fp8_replicas_on_nvlink_groups(kiln: Kiln) -> None:
    p = ok(plan(kiln, "h100x8", "llama-3.3-70b-instruct"))
    machine = kiln.machine("h100x8")
    assert p.quantization == "fp8" and p.kv_cache_dtype == "fp8"
    assert p.tensor_parallel_size * len(p.instances) <= 8
    assert len({i.port for i in p.instances}) == len(p.instances)
    used = [g for i in p.instances for g in i.gpus]
    assert len(used) == len(set(used))
    for inst in p.instances:
        assert all(machine.linked(a, b) for a in inst.gpus for b in inst.gpus)
        if p.tensor_parallel_size <= 4:
            assert inst.numa_node is not None  # a group that fits one socket stays on it
    if len(p.instances) > 1:
        assert "concurrent" in " ".join(p.explanation)
    assert p.predicted.kv_cache_tokens_per_instance >= p.engine.max_model_len


def test_latency_splits_wider_than_throughput(kiln: Kiln) -> None:
    fast = ok(plan(kiln, "h100x8", "llama-3.1-8b-instruct", objective="latency"))
    many = ok(plan(kiln, "h100x8", "llama-3.1-8b-instruct", objective="throughput"))
    assert fast.tensor_parallel_size > many.tensor_parallel_size
    assert len(many.instances) > len(fast.instances)
    assert (fast.predicted.tokens_per_s_per_user or 0) > (many.predicted.tokens_per_s_per_user or 0)
    assert fast.engine.max_num_seqs < many.engine.max_num_seqs


def test_blackwell_gets_nvfp4(kiln: Kiln) -> None:
    p = ok(plan(kiln, "b300x8", "llama-3.3-70b-instruct"))
    assert p.quantization == "nvfp4"


def test_deepseek_v32_on_b300(kiln: Kiln) -> None:
    p = ok(plan(kiln, "b300x8", "deepseek-v3.2"))
    assert p.quantization == "nvfp4"
    assert p.engine.speculative_config and p.engine.speculative_config["method"] in ("mtp", "deepseek_mtp")


def test_ada_gets_fp8_on_one_gpu(kiln: Kiln) -> None:
    p = ok(plan(kiln, "l40s", "llama-3.1-8b-instruct"))
    assert p.quantization == "fp8" and p.tensor_parallel_size == 1 and len(p.instances) == 1


def test_ampere_from_a_machine_file_compares_bf16_with_weight_only_fp8(kiln: Kiln, tmp_path: Path) -> None:
    f = tmp_path / "a100.yaml"
    f.write_text('gpus:\n  - {name: "NVIDIA A100-SXM4-80GB", memory_mib: 81920, compute_capability: "8.0", count: 4}\n'
                 "nvlink: true\n")
    p = ok(make_plan(kiln.machine(str(f)), kiln.catalog().get("llama-3.1-8b-instruct"), Choice(), kiln.constants))
    assert p.quantization in ("bf16", "fp8")
    assert "no low-precision tensor cores" in " ".join(p.explanation)


def test_small_gpu_shortens_the_context_and_says_so(kiln: Kiln) -> None:
    p = ok(plan(kiln, "rtx4000ada", "llama-3.1-8b-instruct"))
    target = kiln.catalog().get("llama-3.1-8b-instruct").serving.max_model_len
    if p.engine.max_model_len < target:
        assert "shortened" in " ".join(p.explanation)
    assert p.predicted.kv_cache_tokens_per_instance >= p.engine.max_model_len


def test_user_fixed_context_that_cannot_fit_is_refused_with_the_context_that_would(kiln: Kiln) -> None:
    result = plan(kiln, "rtx4000ada", "qwen3-32b", max_model_len=32768)
    assert isinstance(result, Refusal)
    assert result.suggestions


def test_a_shared_gpu_fraction_is_taken_and_only_the_planner_refuses_one_too_small(kiln: Kiln) -> None:
    """vLLM takes any gpu_memory_utilization in (0, 1] (vllm/config/cache.py); 0.25 is how a GPU is shared."""
    assert not validate_fields({"gpu_memory_utilization": 0.25}, source="command line").problems
    assert validate_fields({"gpu_memory_utilization": 0}, source="command line").problems
    shared = ok(plan(kiln, "h100x1", "qwen3-8b", gpu_memory_utilization=0.25))
    assert shared.engine.gpu_memory_utilization == 0.25
    result = plan(kiln, "h100x1", "qwen3-8b", gpu_memory_utilization=0.12)
    assert isinstance(result, Refusal)
    assert "weights" in result.reason and "(0.12 of" in result.reason
    assert any(s.startswith("more of each GPU: gpu_memory_utilization") for s in result.suggestions)


def test_a_share_that_leaves_cuda_graph_capture_no_room_is_planned_lower_and_says_so(kiln: Kiln) -> None:
    """vllm#57475: at 0.98 of a 24 GB GPU the capture ran out of memory after the KV cache was allocated; at 0.97 it
    started. On the 20 GB RTX 4000 Ada the owner's 0.98 is planned as 0.97, with the reason; an H100 keeps 0.98."""
    small = ok(plan(kiln, "rtx4000ada", "llama-3.1-8b-instruct", gpu_memory_utilization=0.98))
    assert small.engine.gpu_memory_utilization == 0.97
    assert any("gpu_memory_utilization 0.98 leaves CUDA-graph capture too little room" in w and "0.97" in w
               for w in small.warnings), small.warnings
    large = ok(plan(kiln, "h100x1", "llama-3.1-8b-instruct", gpu_memory_utilization=0.98))
    assert large.engine.gpu_memory_utilization == 0.98 and not large.warnings


def test_forced_nvfp4_on_hopper_is_refused(kiln: Kiln) -> None:
    result = plan(kiln, "h100x8", "llama-3.1-8b-instruct", quantization="nvfp4")
    assert isinstance(result, Refusal) and "Blackwell" in result.reason


def test_invalid_tp_lists_the_valid_ones(kiln: Kiln) -> None:
    result = plan(kiln, "h100x8", "llama-3.1-8b-instruct", tensor_parallel_size=3)
    assert isinstance(result, Refusal) and "valid tensor_parallel_size here: 1, 2, 4, 8" in result.suggestions[0]


def test_context_beyond_the_model_is_refused(kiln: Kiln) -> None:
    result = plan(kiln, "h100x8", "llama-3.1-8b-instruct", max_model_len=1_000_000)
    assert isinstance(result, Refusal) and "maximum context" in result.reason


@pytest.mark.parametrize(("input_len", "max_model_len", "refused"), [
    (200_000, None, "exceed qwen3-8b's maximum context of 40,960 tokens"),
    (30_000, 16_384, "exceed max_model_len 16,384"),
    (36_000, None, None),
], ids=["beyond-the-model", "beyond-the-users-context", "beyond-the-default-context"])
def test_a_workload_whose_requests_outgrow_the_context_raises_it_or_is_refused(
        kiln: Kiln, input_len: int, max_model_len: int | None, refused: str | None) -> None:
    workload = Workload(input_len=input_len, output_len=1_000, concurrency=8, num_prompts=16)
    profile = kiln.catalog().get("qwen3-8b")
    result = make_plan(kiln.machine("h100x8"), profile, Choice(max_model_len=max_model_len), kiln.constants,
                       workload=workload)
    if refused:
        assert isinstance(result, Refusal) and refused in result.reason and result.suggestions
        return
    # vLLM refuses a request longer than max_model_len: the plan's context grows past the profile's default to hold it
    assert profile.serving.max_model_len < input_len + 1_000 <= ok(result).engine.max_model_len


def test_a_context_shortened_to_fit_memory_still_holds_the_workloads_requests(kiln: Kiln) -> None:
    """Gemma 3 27B on one L40S is shortened to 16,384 tokens for the default workload; 21,000-token requests keep a
    context that holds them, the last one the shortening tries."""
    machine, profile = kiln.machine("l40s"), kiln.catalog().get("gemma-3-27b-it")
    default = ok(make_plan(machine, profile, Choice(), kiln.constants))
    long = ok(make_plan(machine, profile, Choice(), kiln.constants,
                        workload=Workload(input_len=20_000, output_len=1_000, concurrency=1, num_prompts=4)))
    assert default.engine.max_model_len < 21_000 == long.engine.max_model_len


def test_user_instances_and_tp_are_honoured(kiln: Kiln) -> None:
    p = ok(plan(kiln, "h100x8", "llama-3.1-8b-instruct", instances=2, tensor_parallel_size=2))
    assert len(p.instances) == 2 and p.tensor_parallel_size == 2


def test_speculative_off_when_asked(kiln: Kiln) -> None:
    p = ok(plan(kiln, "h100x8", "llama-3.3-70b-instruct", speculative_decoding=False, objective="latency"))
    assert p.engine.speculative_config is None


def test_gpu_profile_on_a_cpu_machine_points_to_tiny_cpu(kiln: Kiln) -> None:
    result = plan(kiln, "cpu-only", "llama-3.1-8b-instruct")
    assert isinstance(result, Refusal) and "no accelerator" in result.reason
    assert any("tiny-cpu" in s for s in result.suggestions)


def test_amd_machine_is_refused_as_not_supported(kiln: Kiln) -> None:
    result = plan(kiln, "mi300x8", "llama-3.1-8b-instruct")
    assert isinstance(result, Refusal) and "not supported yet" in result.reason


def test_tiny_cpu_plans_two_cpu_instances(kiln: Kiln) -> None:
    p = ok(plan(kiln, "cpu-only", "tiny-cpu"))
    assert p.engine.device == "cpu" and len(p.instances) == 2
    assert set(p.instances[0].cpus).isdisjoint(p.instances[1].cpus)


def test_planning_is_pure(kiln: Kiln) -> None:
    assert plan(kiln, "h200x8", "qwen3-30b-a3b") == plan(kiln, "h200x8", "qwen3-30b-a3b")


# The fast tier plans every profile on these; tests/sweeps/ on every machine.
SAMPLE_FIXTURES = ["h100x8", "l40s"]


@pytest.mark.xdist_group("catalog_plans")  # one test process makes, and shares, every catalog plan
@pytest.mark.parametrize("machine", SAMPLE_FIXTURES)
def test_every_profile_plans_or_refuses_clearly(kiln: Kiln, planned: Planned, machine: str) -> None:
    every_profile_plans_or_refuses_clearly(kiln, planned, machine)


def every_profile_plans_or_refuses_clearly(kiln: Kiln, planned: Planned, machine: str) -> None:
    for name in kiln.catalog().names():
        for objective in ("throughput", "latency"):
            result = planned(machine, name, objective)
            if isinstance(result, Refusal):
                assert result.reason
                continue
            arch = kiln.machine(machine).gpus[0].architecture
            if arch is Architecture.BLACKWELL and "nvfp4" in kiln.catalog().get(name).checkpoints:
                assert result.quantization == "nvfp4"
            if result.engine.task == "chat":
                assert result.predicted.output_tokens_per_s > 0
            else:  # the engine predicts generation, and says so instead of a figure
                assert result.predicted.output_tokens_per_s is None
                assert any("predicts no throughput" in line for line in result.explanation)
            assert result.predicted.kv_cache_tokens_per_instance >= result.engine.max_model_len


def test_unknown_gpu_without_bandwidth_is_refused_not_a_crash(kiln: Kiln) -> None:
    data = load_fixture("h100x1")
    device = {k: v for k, v in data["nvml"]["devices"][0].items()
              if k not in ("nvmlDeviceGetMemoryBusWidth", "nvmlDeviceGetMaxClockInfo_MEM")}
    device["nvmlDeviceGetName"] = "NVIDIA Prototype"
    data["nvml"] = {**data["nvml"], "devices": [device]}
    machine = detect_recorded(data, kiln.gpus)
    result = make_plan(machine, kiln.catalog().get("qwen3-8b"), Choice(), kiln.constants)
    assert isinstance(result, Refusal) and "memory_bandwidth_gb_s" in result.suggestions[0]

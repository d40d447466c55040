"""Every line of a plan's explanation is true of the plan it explains: every catalog profile on every machine
fixture (`kiln detect --list`), each line checked against the plan's own fields."""

from __future__ import annotations

import re
from typing import get_args

import pytest
from tests.conftest import Planned
from tests.unit.test_planner import SAMPLE_FIXTURES

from kiln.choice.items import Quantization
from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.planner.plan import fit_plans
from kiln.planner.search import make_plan
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

GIB = 2**30


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def check(kiln: Kiln, machine_name: str, profile_name: str, plan: Plan) -> None:
    machine, profile = kiln.machine(machine_name), kiln.catalog().get(profile_name)
    e, p = plan.engine, plan.predicted
    lines = plan.explanation
    text = " ".join(lines)
    assert "as asked" not in text and "as the user asked" not in text  # nobody asked for anything
    for line in lines:
        if line.startswith("Machine:") and machine.gpus:
            assert line.startswith(f"Machine: {machine.gpu_count}x {machine.gpus[0].name} ")
        elif line.startswith("Precision:"):
            assert line.startswith(f"Precision: {plan.quantization} (")
            assert f"weights {p.weight_bytes_per_gpu / GIB:.1f} GiB per GPU at TP{e.tensor_parallel_size}" in line
            assert ("expert parallel" in line) == e.enable_expert_parallel
        elif " instances of TP" in line:
            assert line.startswith(f"{len(plan.instances)} instances of TP{e.tensor_parallel_size}")
        elif line.startswith("KV cache in"):
            assert f"{p.kv_cache_tokens_per_instance:,} tokens per instance" in line
            assert ("fp8" in line.split(":")[0]) == (plan.kv_cache_dtype == "fp8")
        elif line.startswith("Batch limits:"):
            assert line == (f"Batch limits: max_num_seqs {e.max_num_seqs}, max_num_batched_tokens "
                            f"{e.max_num_batched_tokens}.")
        elif line.startswith("Context shortened"):
            assert f"to {e.max_model_len:,} tokens" in line
        elif line.startswith("Speculative decoding on"):
            assert e.speculative_config, line
        elif line.startswith("Speculative decoding off"):
            assert not e.speculative_config, line
        elif "not fit in memory" in line:
            for tp in re.findall(r"TP(\d+)", line):
                # A checkpoint-only precision (int4) cannot be asked for; "auto" picks the same checkpoint.
                asked = plan.quantization if plan.quantization in get_args(Quantization) else None
                alone = fit_plans(machine, profile, Choice(tensor_parallel_size=int(tp), quantization=asked,
                                                           instances=1), kiln.constants)
                assert isinstance(alone, Refusal), f"{line} but TP{tp} fits"
        elif line.startswith("Chosen:"):
            split = f"{len(plan.instances)} x TP{e.tensor_parallel_size}"
            assert line.startswith(f"Chosen: {split}"), line
            assert f"{plan.quantization}," in line
            drafts = f"speculative k={e.speculative_config['num_speculative_tokens']}" if e.speculative_config \
                else "no speculative decoding"
            assert drafts in line and f"max_num_seqs {e.max_num_seqs}," in line
            found = re.search(r"predicts ([\d,]+) tok/s", line)
            assert found and _number(found.group(1)) == round(p.output_tokens_per_s or 0)
        elif line.startswith("Workload:"):
            assert plan.workload is not None and line.startswith(f"Workload: {plan.workload['description']}")
        elif line.startswith("A close call:"):
            assert p.band is not None
            found = re.search(r"predicts ([\d,]+) tok/s", line)
            assert found and p.band.low - 1 <= _number(found.group(1)) <= p.band.high + 1


@pytest.mark.xdist_group("catalog_plans")  # one test process makes, and shares, every catalog plan
def test_every_plan_explains_itself_truthfully(kiln: Kiln, planned: Planned) -> None:
    """The fast tier's machines; tests/sweeps/ checks the plans of every machine."""
    plans_explain_themselves_truthfully(kiln, planned, [kiln.machine(m) for m in SAMPLE_FIXTURES], at_least=15)


def plans_explain_themselves_truthfully(kiln: Kiln, planned: Planned, machines: list[Machine], at_least: int) -> None:
    checked = 0
    for machine in machines:
        for name in kiln.catalog().names():
            profile = kiln.catalog().get(name)
            if profile.cpu_only or not machine.gpus:
                continue
            plan = planned(machine.name, name, "throughput")
            if isinstance(plan, Refusal):
                assert plan.reason
                continue
            check(kiln, machine.name, name, plan)
            checked += 1
    assert checked >= at_least


@pytest.mark.parametrize("workload", ["chat", "batch"])
def test_a_workload_plan_of_the_70b_names_only_splits_that_do_not_fit(kiln: Kiln, workload: str) -> None:
    machine, profile = kiln.machine("h100x8"), kiln.catalog().get("llama-3.3-70b-instruct")
    plan = make_plan(machine, profile, Choice.model_validate({"workload": workload}), kiln.constants)
    assert isinstance(plan, Plan)
    check(kiln, "h100x8", "llama-3.3-70b-instruct", plan)
    assert "TP2" not in next((line for line in plan.explanation if "not fit" in line), "")


def test_an_asked_setting_is_said_to_be_asked(kiln: Kiln) -> None:
    machine, profile = kiln.machine("h100x8"), kiln.catalog().get("llama-3.3-70b-instruct")
    plan = make_plan(machine, profile, Choice(speculative_decoding=False), kiln.constants)
    assert isinstance(plan, Plan) and not plan.engine.speculative_config
    assert "Speculative decoding off, as asked." in plan.explanation

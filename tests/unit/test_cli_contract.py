"""`kiln plan` and `kiln predict` driven through their command line in-process, every flag of their contract, and
one setup giving one number: predicting a plan's own setup under its own workload gives back the plan's figure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kiln.cli.main import main

ROUND_TRIPS = [("h100x8", "llama-3.3-70b-instruct"), ("b300x8", "deepseek-v3.2"), ("h100x1", "qwen3-8b"),
               ("l40s", "gpt-oss-20b"), ("h200x8", "qwen3-30b-a3b")]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {}


def setup_flags(plan: dict[str, Any]) -> list[str]:
    """The command-line settings that fix a plan's setup."""
    spec = plan["speculative_config"]
    flags = ["--tp", str(plan["tensor_parallel_size"]), "--instances", str(len(plan["instances"])),
             "--quantization", plan["quantization"], "--kv-cache-dtype", plan["kv_cache_dtype"],
             "--max-model-len", str(plan["max_model_len"]), "--max-num-seqs", str(plan["max_num_seqs"]),
             "--max-num-batched-tokens", str(plan["max_num_batched_tokens"]),
             "--gpu-memory-utilization", str(plan["gpu_memory_utilization"]),
             "--speculative", "on" if spec else "off"]
    if spec:
        flags += ["--num-speculative-tokens", str(spec["num_speculative_tokens"])]
    if plan["data_parallel_size"] > 1:
        flags += ["--dp", str(plan["data_parallel_size"])]
    if plan["enable_expert_parallel"]:
        flags += ["--expert-parallel"]
    return flags


@pytest.mark.parametrize(("machine", "profile"), ROUND_TRIPS)
def test_predicting_a_plans_setup_gives_back_the_plans_number(capsys: pytest.CaptureFixture[str], machine: str,
                                                               profile: str) -> None:
    code, plan = run(capsys, "plan", "--machine", machine, "--profile", profile, "--json")
    assert code == 0
    assert plan["workload"]["preset"] == "serve" and plan["workload"]["tpot_ms_p90"]
    code, predicted = run(capsys, "predict", "--machine", machine, "--profile", profile, *setup_flags(plan),
                          "--workload", plan["workload"]["preset"], "--json")
    assert code == 0
    assert predicted["setup"]["max_num_seqs"] == plan["max_num_seqs"]
    assert predicted["setup"]["speculative_config"] == plan["speculative_config"]
    # The default workload finds its load: the capacity at its budget, with its band, is one figure in both.
    assert predicted["capacity"] == plan["predicted"]["capacity"] and predicted["capacity"]["streams"] > 0


def test_a_plan_for_a_workload_gives_back_the_same_number_through_predict(capsys: pytest.CaptureFixture[str]
                                                                          ) -> None:
    workload = ["--input-len", "2048", "--output-len", "256", "--concurrency", "32", "--ttft-ms", "4000",
                "--tpot-ms", "80"]
    code, plan = run(capsys, "plan", "--machine", "h100x8", "--profile", "qwen3-32b", *workload, "--json")
    assert code == 0
    code, predicted = run(capsys, "predict", "--machine", "h100x8", "--profile", "qwen3-32b", *setup_flags(plan),
                          *workload, "--json")
    assert code == 0
    assert predicted["output_tokens_per_s"] == plan["predicted"]["output_tokens_per_s"]


EVERY_WORKLOAD_FLAG = [
    ["--workload", "chat"], ["--workload", "batch"], ["--workload", "rag"], ["--workload", "agent"],
    ["--workload", "serve"], ["--input-len", "512", "--output-len", "128"], ["--dataset", "sharegpt"],
    ["--input-len", "2048", "--prefix-len", "1024"], ["--concurrency", "8"], ["--request-rate", "inf"],
    ["--request-rate", "INF"], ["--request-rate", "2.5"], ["--num-prompts", "50"], ["--ttft-ms", "900"],
    ["--tpot-ms", "60"], ["--min-tokens-per-s-per-user", "15"],
]


@pytest.mark.parametrize("flags", EVERY_WORKLOAD_FLAG, ids=" ".join)
def test_every_workload_flag_of_predict(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    code, out = run(capsys, "predict", "--machine", "h100x1", "--profile", "llama-3.1-8b-instruct",
                     "--num-prompts", "40", *flags, "--json")
    assert code == 0, flags
    assert out["workload"]["num_prompts"] in (40, 50)
    if "capacity" in out:  # a budget and no load: the load is found
        assert out["capacity"]["output_tokens_per_s"] > 0 and "output_tokens_per_s" not in out
        assert set(out["capacity"]["band"] or {}) <= {"requests_per_s", "output_tokens_per_s", "held", "source"}
    else:
        assert out["output_tokens_per_s"] > 0
        assert set(out["band"] or {}) <= {"low", "high", "held", "source"}


EVERY_SETTING_FLAG = [
    ["--objective", "latency"], ["--objective", "throughput"], ["--tp", "2"], ["--instances", "2"],
    ["--max-model-len", "8192"], ["--gpu-memory-utilization", "0.85"], ["--kv-cache-dtype", "auto"],
    ["--kv-cache-dtype", "fp8"], ["--quantization", "bf16"], ["--quantization", "auto"], ["--speculative", "on"],
    ["--speculative", "off"], ["--speculative", "on", "--num-speculative-tokens", "2"], ["--max-num-seqs", "64"],
    ["--max-num-batched-tokens", "4096"], ["--engine", "kiln"], ["--dp", "8", "--expert-parallel"],
    ["--dp", "4", "--tp", "2", "--expert-parallel"],
]


@pytest.mark.parametrize("flags", EVERY_SETTING_FLAG, ids=" ".join)
def test_every_setting_flag_of_predict(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    profile = "qwen3-30b-a3b" if "--dp" in flags else "llama-3.1-8b-instruct"
    code, out = run(capsys, "predict", "--machine", "h100x8", "--profile", profile, "--num-prompts", "40",
                    "--concurrency", "8", *flags, "--json")
    assert code == 0, flags
    setup = out["setup"]
    if "--dp" in flags:
        assert setup["data_parallel_size"] == int(flags[flags.index("--dp") + 1]) and setup["enable_expert_parallel"]
    if "--tp" in flags:
        assert setup["tensor_parallel_size"] == int(flags[flags.index("--tp") + 1])
    if "--max-num-seqs" in flags:
        assert setup["max_num_seqs"] == 64
    if "--num-speculative-tokens" in flags:
        assert setup["speculative_config"]["num_speculative_tokens"] == 2
    if flags == ["--speculative", "off"]:
        assert setup["speculative_config"] is None


@pytest.mark.parametrize("flags", [["--request-rate", "0"], ["--request-rate", "-1"], ["--request-rate", "fast"],
                                   ["--num-speculative-tokens", "2", "--speculative", "off"],
                                   ["--max-num-seqs", "0"], ["--tp", "3"],
                                   ["--dataset", "sharegpt", "--output-len", "128"]], ids=" ".join)
def test_bad_predict_flags_are_refused_with_a_fix(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    code = main(["predict", "--machine", "h100x8", "--profile", "llama-3.1-8b-instruct", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("kiln:") and "Traceback" not in err


def test_flags_that_conflict_are_named_together_without_pydantic_prefixes(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["predict", "--machine", "h100x8", "--profile", "llama-3.1-8b-instruct", "--dataset", "sharegpt",
                 "--output-len", "5"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("kiln: workload flags: give dataset or input_len/output_len, not both"), err
    assert "Value error" not in err and "--workload" not in err


EVERY_PLAN_FLAG = [
    [], ["--workload", "chat"], ["--workload", "batch", "--request-rate", "inf"],
    ["--concurrency", "16", "--tpot-ms", "80"],
    ["--objective", "latency"], ["--tp", "4"], ["--speculative", "off"], ["--quantization", "fp8"],
    ["--max-model-len", "16384"], ["--launcher", "module"], ["--systemd"], ["--models-dir", "/tmp/models"],
    ["--dp", "8", "--expert-parallel"],
]


@pytest.mark.parametrize("flags", EVERY_PLAN_FLAG, ids=lambda f: " ".join(f) or "no flags")
def test_every_flag_of_plan(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    profile = "qwen3-30b-a3b" if "--dp" in flags else "llama-3.3-70b-instruct"
    code = main(["plan", "--machine", "h100x8", "--profile", profile, *flags,
                 *([] if "--systemd" in flags else ["--json"])])
    out = capsys.readouterr().out
    assert code == 0, flags
    if "--systemd" in flags:
        assert "[Service]" in out
        return
    plan = json.loads(out)
    predicted = plan["predicted"]
    assert (predicted.get("capacity") or predicted)["output_tokens_per_s"] > 0 and plan["workload"]["description"]
    if "--tp" in flags:
        assert plan["tensor_parallel_size"] == 4
    if "--speculative" in flags:
        assert plan["speculative_config"] is None
    if "--request-rate" in flags:
        assert plan["workload"]["request_rate"] == "inf"

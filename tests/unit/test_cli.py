"""The `kiln` command: its console script, and each command's output and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli import run_kiln
from tests.conftest import PROFILES

KILN = str(Path(sys.executable).with_name("kiln"))


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    """`kiln` in this process: the same argv, exit code and output as the script, without a Python start each."""
    return run_kiln(*args, env={**os.environ, "KILN_PROFILES_DIR": str(PROFILES)})


def test_the_console_script_runs() -> None:
    env = {**os.environ, "KILN_PROFILES_DIR": str(PROFILES)}
    result = subprocess.run([KILN, "detect", "--list"], capture_output=True, text=True, env=env, check=False,
                            timeout=120)
    assert result.returncode == 0 and "gpu-h100x8-640gb" in result.stdout


def test_detect_fixture_table_and_json() -> None:
    table = kiln("detect", "--machine", "h100x8")
    assert table.returncode == 0, table.stderr
    assert "NVIDIA H100 80GB HBM3" in table.stdout and "NVLink-connected" in table.stdout
    data = json.loads(kiln("detect", "--machine", "h100x8", "--json").stdout)
    assert len(data["gpus"]) == 8 and data["gpus"][0]["architecture"] == "hopper"


def test_detect_this_machine_never_crashes() -> None:
    result = kiln("detect", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["host"]["cpu_count"] >= 1


def test_detect_list() -> None:
    result = kiln("detect", "--list")
    assert result.returncode == 0 and "gpu-h100x8-640gb" in result.stdout


def test_plan_json_contract() -> None:
    result = kiln("plan", "--machine", "h100x8", "--profile", "llama-3.3-70b-instruct", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("machine", "profile", "objective", "quantization", "kv_cache_dtype", "instances", "predicted",
                "explanation"):
        assert key in data
    for key in ("gpus", "tensor_parallel_size", "port", "argv", "env"):
        assert key in data["instances"][0]
    for key in ("weight_bytes_per_gpu", "kv_bytes_per_token", "kv_cache_tokens_per_instance",
                "max_concurrency_per_instance", "capacity"):
        assert key in data["predicted"]
    # The default workload's figures are its capacity's, under that one name only.
    for key in ("budget", "streams", "requests_per_s", "output_tokens_per_s", "tokens_per_s_per_user",
                "tokens_per_s_per_gpu", "ttft_ms_p90", "tpot_ms_p90", "band"):
        assert key in data["predicted"]["capacity"]
    assert "output_tokens_per_s" not in data["predicted"] and "band" not in data["predicted"]
    assert isinstance(data["explanation"], str) and data["explanation"]


def test_plan_human_output() -> None:
    result = kiln("plan", "--machine", "l40s", "--profile", "llama-3.1-8b-instruct", "--objective", "latency")
    assert result.returncode == 0, result.stderr
    assert "Why" in result.stdout and "KV cache tokens per instance" in result.stdout


def test_refusal_exits_2_with_reason_on_stderr_and_json_error() -> None:
    result = kiln("plan", "--machine", "h100x1", "--profile", "llama-3.3-70b-instruct", "--json")
    assert result.returncode == 2
    assert "does not fit" in result.stderr
    assert "error" in json.loads(result.stdout)


def test_unknown_profile_is_a_clear_error() -> None:
    result = kiln("plan", "--machine", "h100x1", "--profile", "llama-9", "--json")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "kiln profiles list" in json.loads(result.stdout)["fix"]


def test_plan_for_a_local_model_dir(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}))
    result = kiln("plan", "--machine", "h100x1", "--model", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["quantization"] == "fp8"
    assert data["instances"][0]["argv"][3] == str(tmp_path)


def test_systemd_output() -> None:
    result = kiln("plan", "--machine", "h100x8", "--profile", "llama-3.1-8b-instruct", "--systemd")
    assert result.returncode == 0 and result.stdout.count("[Service]") >= 1


def test_profiles_commands(tmp_path: Path) -> None:
    assert "llama-3.3-70b-instruct" in kiln("profiles", "list").stdout
    assert "hf_id" in json.loads(kiln("profiles", "show", "qwen3-8b", "--json").stdout)["model"]
    assert kiln("profiles", "validate").returncode == 0
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: broken\nmodel: {hf_id: x}\narchitecture: {num_layers: -1}\n")
    result = kiln("profiles", "validate", str(bad))
    assert result.returncode == 2
    assert "broken.yaml" in result.stderr and "architecture.num_layers" in result.stderr


def test_choice_reads_a_machine_layout(tmp_path: Path) -> None:
    (tmp_path / "etc/kiln").mkdir(parents=True)
    (tmp_path / "etc/kiln/kiln.yaml").write_text("profile: qwen3-8b\napi_key: abcdefghijklmnop1234\n")
    result = kiln("choice", "--root", str(tmp_path), "--json")
    data = json.loads(result.stdout)
    assert data["choice"]["profile"] == "qwen3-8b" and "api_key" not in data["choice"]
    assert "abcdefghijklmnop1234" not in result.stdout


def test_choice_with_an_unknown_profile_falls_back_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "etc/kiln").mkdir(parents=True)
    (tmp_path / "etc/kiln/kiln.yaml").write_text("profile: llama-9-mega\nobjective: fastest\n")
    result = kiln("choice", "--root", str(tmp_path), "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["profile"] == "qwen3-8b"
    problems = {p["field"]: p for p in data["problems"]}
    assert "fallback" in problems["profile"]["error"] and "kiln profiles list" in problems["profile"]["fix"]
    assert "throughput or latency" in problems["objective"]["fix"]


def test_bench_refuses_counts_and_budgets_that_are_not_positive_where_it_reads_them() -> None:
    for flags, said in ((["--capacity", "--capacity-ceiling", "-5"], "--capacity-ceiling: '-5' is not a whole number"),
                        (["--slo-ttft-ms", "nan"], "--slo-ttft-ms: 'nan' is not a number"),
                        (["--slo-ttft-ms", "1e400"], "--slo-ttft-ms: '1e400' is not a finite number"),
                        (["--slo-tpot-ms", "0"], "--slo-tpot-ms: '0' is not a number above 0"),
                        (["--price-per-hour", "inf"], "--price-per-hour: 'inf' is not a finite number"),
                        (["--num-prompts", "many"], "--num-prompts: 'many' is not a whole number")):
        result = run_kiln("bench", *flags)
        assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, flags


def test_the_plans_capacity_row_keeps_its_band_promise_and_budget_whole() -> None:
    result = run_kiln("plan", "--profile", "llama-3.3-70b-instruct", "--machine", "h100x8")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("capacity (all instances)"))
    assert "out of sample)" in row and "streams) at TTFT p90 <= " in row, row

"""kiln bench against real vLLM on the CPU: a sweep against one server, and kiln's plan against vanilla vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.bench import setups
from kiln.render.vllm import MODULE_VLLM
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

KILN = str(Path(sys.executable).parent / "kiln")
PRICE = 1.57


def test_a_sweep_against_one_server_writes_results_report_and_plots(kiln: Kiln, tmp_path: Path) -> None:
    profile = kiln.catalog().get("tiny-cpu")
    model = make_tiny_model(profile, tmp_path / "tiny-llama")
    argv = setups.vanilla_argv(str(model), "tiny-cpu", 18300, 0, profile.serving.extra_args,
                               launcher=(sys.executable, *MODULE_VLLM))
    with setups.vanilla(tmp_path / "server", argv, local_model=True, env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as server:
        out = tmp_path / "bench"
        done = subprocess.run([KILN, "bench", "--url", server.url, "--concurrency", "1,4", "--input-len", "32",
                               "--output-len", "16", "--num-prompts", "12", "--price-per-hour", str(PRICE),
                               "--out", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2" in done.stderr  # the progress bar
    results = json.loads((out / "results.json").read_text())
    assert [r["concurrency"] for r in results] == [1, 4]
    for r in results:
        assert r["completed"] == 12 and r["failed"] == 0
        assert r["output_tokens_per_s"] > 0 and r["requests_per_s"] > 0
        assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"] and 0 < r["tpot_ms"]["p50"] <= r["tpot_ms"]["p99"]
        assert r["usd_per_million_output_tokens"] == pytest.approx(
            PRICE / (r["output_tokens_per_s"] * 3600) * 1e6, rel=1e-3)
    assert "| 4 |" in (out / "report.md").read_text()
    assert (out / "throughput_vs_concurrency.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "latency_vs_throughput.png").stat().st_size > 10_000


def test_compare_runs_kilns_plan_and_vanilla_vllm_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    done = subprocess.run([KILN, "bench", "compare", "--concurrency", "1,8", "--input-len", "32", "--output-len",
                           "16", "--num-prompts", "16", "--machine", "l40s", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    print(done.stdout)
    result = json.loads((out / "compare.json").read_text())
    assert result["usd_per_hour"] == 1.57 and "gpu-l40sx1-48gb" in result["price_source"]
    assert [r["concurrency"] for r in result["ratios"]] == [1, 8]
    for side in ("kiln", "vanilla"):
        assert all(level["completed"] == 16 and level["failed"] == 0 for level in result[side])
    first = result["ratios"][0]
    assert first["output_tokens_per_s"] == pytest.approx(
        result["kiln"][0]["output_tokens_per_s"] / result["vanilla"][0]["output_tokens_per_s"], rel=1e-2)
    assert "--tensor-parallel-size" not in result["vanilla_argv"]  # one CPU instance, vLLM's defaults
    assert "Output tok/s: kiln vs vanilla" in done.stdout and "x)" in done.stdout
    assert (out / "throughput_vs_concurrency.png").exists() and (out / "compare.md").exists()


# On two cores the benchmark client, nginx, the router and both engines share the CPUs, so a level's output rate
# lands within this factor of the prediction: measured here 0.75x to 1.14x on a quiet machine, down to 0.42x while
# other tests ran beside it. A model wrong by more than 3x still fails.
PREDICTION_FACTOR = 3.0


def test_kiln_bench_prints_the_prediction_beside_each_measured_level(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    with setups.kiln_up(tmp_path / "kiln", "tiny-cpu") as up:
        # --state-dir: the agent's folder has the model's tokenizer (the endpoint names no server path).
        done = subprocess.run([KILN, "bench", "--url", up.url, "--api-key", up.api_key or "", "--concurrency", "1,4,16",
                               "--state-dir", str(tmp_path / "kiln"), "--input-len", "256", "--output-len", "128",
                               "--predict", "tiny-cpu",
                               "--out", str(out)], capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "measured vs predicted" in done.stdout
    results = json.loads((out / "results.json").read_text())
    ratios = {r["concurrency"]: r["output_tokens_per_s"] / r["predicted"]["output_tokens_per_s"] for r in results}
    with capsys.disabled():
        print("\n  measured: tiny-cpu, 256 in / 128 out, measured / predicted output tok/s: "
              + ", ".join(f"concurrency {c}: {r['output_tokens_per_s']:,.0f} / "
                          f"{r['predicted']['output_tokens_per_s']:,.0f} = {ratios[c]:.2f}x" for c, r in
                          zip(ratios, results, strict=True)))
    assert all(r["predicted"]["engine"] == "kiln" for r in results)
    assert all(r["failed"] == 0 for r in results), [(r["concurrency"], r["failed"], r["errors"]) for r in results]
    assert all(1 / PREDICTION_FACTOR <= ratio <= PREDICTION_FACTOR for ratio in ratios.values()), ratios
    # More concurrency, more output: measured and predicted agree on the direction.
    assert results[0]["predicted"]["output_tokens_per_s"] < results[-1]["predicted"]["output_tokens_per_s"]
    assert results[0]["output_tokens_per_s"] < results[-1]["output_tokens_per_s"]

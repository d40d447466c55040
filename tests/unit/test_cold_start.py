"""The predicted cold start: its parts from data/coldstart.yaml, judged on vLLM start-up logs it was not fitted on,
and shown by `kiln plan`."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main
from kiln.perf.coldstart import GIB, predict_cold_start, predict_cold_starts
from kiln.setup.capacity import cudagraph_capture_count, cudagraph_capture_sizes
from kiln.setup.startup import StartShape
from kiln.wiring import Kiln

# Held-out measurements: process start to "Starting vLLM server", weights on disk, torch.compile cold, in
# llm-d-planner's vLLM 0.19.0 H100 logs (accuracy/results/v0.19.0/logs at d3121e05; `python -m
# benchmarks.cold_start --validate DIR` reads them all). (log, TP, "Model loading took" GiB, layers, seconds).
HELD_OUT = [
    ("meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.log", 2, 7.51, 32, 71),
    ("fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log", 4, 16.96, 80, 115),
    ("redhatai-llama-3-3-70b-i--h100-80gb--tp2pp1dp1--8192.log", 2, 33.88, 80, 110),
    ("qwen-qwen2-5-7b-instruct--h100-80gb--tp1pp1dp1--2048.log", 1, 14.25, 28, 56),
    ("microsoft-phi-4--h100-80gb--tp1pp1dp1--8192.log", 1, 27.39, 40, 70),
    ("moonshotai-kimi-dev-72b--h100-80gb--tp2pp1dp1--8192.log", 2, 67.8, 80, 188),
]


def data(kiln: Kiln) -> dict[str, object]:
    found = kiln.constants.get("cold_start")
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize(("log", "tp", "gib", "layers", "seconds"), HELD_OUT)
def test_the_gpu_model_predicts_starts_it_was_not_fitted_on(kiln: Kiln, log: str, tp: int, gib: float, layers: int,
                                                           seconds: float) -> None:
    d = data(kiln)
    start = predict_cold_start(StartShape("cuda", 0, int(gib * GIB), layers, tp, 102, 8), d, baked=False)
    vllm_s = sum(p.seconds for p in start.parts if p.name not in ("kiln agent", "download"))
    assert abs(vllm_s - seconds) <= 0.25 * seconds, (log, vllm_s)


def test_baking_saves_the_download_and_the_compile(kiln: Kiln) -> None:
    shape = StartShape("cuda", 16 * GIB, 16 * GIB, 32, 1, 102, 8)
    starts = predict_cold_starts(shape, data(kiln))
    baked, download = ({p.name: p.seconds for p in s.parts} for s in (starts.baked, starts.download))
    assert "download" not in baked and download["download"] == pytest.approx(16 / 0.42)
    assert baked["torch.compile"] < download["torch.compile"] and "TP group start" not in baked
    assert starts.baked.goal_s == 60 and starts.baked.meets_goal is True
    slow_link = predict_cold_start(shape, data(kiln), baked=False, link_gib_per_s=0.1)
    assert next(p.seconds for p in slow_link.parts if p.name == "download") == pytest.approx(160)
    big = predict_cold_starts(StartShape("cuda", 140 * GIB, 35 * GIB, 80, 2, 102, 70), data(kiln))
    assert big.baked.goal_s == 120 and any(p.name == "TP group start" for p in big.baked.parts)
    cpu = predict_cold_start(StartShape("cpu", GIB, GIB, 2, 1, 0, 0.01), data(kiln), baked=True)
    assert cpu.goal_s is None and cpu.meets_goal is None


def test_kiln_plan_shows_the_cold_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--machine", "h100x1", "--profile", "llama-3.1-8b-instruct"]) == 0
    text = capsys.readouterr().out
    assert "Cold start (s)" in text and "agent start -> serving" in text and "weights baked" in text
    assert main(["plan", "--machine", "h100x8", "--profile", "llama-3.3-70b-instruct", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    cold = plan["cold_start"]
    assert cold["baked"]["goal_s"] == 120 and cold["download"]["total_s"] > cold["baked"]["total_s"]
    parts = {p["part"] for p in cold["download"]["parts"]}
    assert {"download", "weights load", "torch.compile", "KV-cache profile", "CUDA graphs", "TP group start"} <= parts


def test_the_capture_count_is_vllms() -> None:
    """vLLM 0.19-0.32 on H100 at max_num_seqs 1024, max_num_batched_tokens 8192 (llm-d-planner's Llama 3.1 8B log):
    "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)"."""
    assert cudagraph_capture_count(512, 8192, 1024) == 102
    assert cudagraph_capture_count(512) == 51  # the sizes alone, as the memory fit counts them
    assert cudagraph_capture_sizes(512, 8192)[:5] == [1, 2, 4, 8, 16]
    assert cudagraph_capture_sizes(512)[-2:] == [496, 512]
    # max_num_batched_tokens below the ceiling cuts it and is captured itself; FULL decode graphs stop at max_num_seqs.
    assert cudagraph_capture_sizes(512, 300)[-3:] == [272, 288, 300]
    assert cudagraph_capture_count(64, 8192, 16) == 11 + 5
    # With 3 draft tokens a decode step is 4 tokens a sequence: FULL graphs from 4 to 4 x max_num_seqs.
    assert cudagraph_capture_count(128, 8192, 32, decode_query_len=4) == 19 + 17  # 4, then 8 to 128

"""A vLLM instance's start-up, read from its own log lines: public GPU logs, and this machine's CPU build."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import DATA

from kiln.cli.status import startup_lines
from kiln.serve.reports.startup import AgentSteps, parse_startup

LOGS = DATA / "startup"


def _lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def _phases(name: str) -> dict[str, tuple[float, float | None]]:
    return {p.name: (p.seconds, p.gib) for p in parse_startup(_lines(name)).phases}


def test_a_warm_gpu_start_reads_weights_compile_and_cuda_graphs() -> None:
    timeline = parse_startup(_lines("gpu-warm-vllm-20264.log"))
    assert _phases("gpu-warm-vllm-20264.log") == {
        "weights loaded": (0.902026, 3.4213), "torch.compile": (7.51, None), "CUDA graphs": (17.0, 0.48),
        "engine ready (profile, KV cache, warm-up)": (34.11, None)}
    assert timeline.compile_cache == "warm"
    assert timeline.ready_s is None  # that log was quoted without its last lines


def test_a_cold_gpu_start_and_its_time_to_ready() -> None:
    timeline = parse_startup(_lines("gpu-cold-runai-67.log"))
    assert timeline.compile_cache == "cold"
    assert _phases("gpu-cold-runai-67.log")["torch.compile"] == (45.81, None)
    assert timeline.ready_s == 45.0  # 11:03:11 to 11:03:56


def test_the_cpu_build_of_vllm_0_32_logs_its_compile_warm_up() -> None:
    timeline = parse_startup(_lines("cpu-0.32-cold.log"))
    names = [p.name for p in timeline.phases]
    assert names[0] == "weights loaded" and "compile and warm-up" in names
    assert timeline.compile_cache == "cold" and timeline.ready_s is not None and timeline.ready_s > 0


def test_only_the_last_start_of_an_appended_log_counts() -> None:
    first = _lines("cpu-0.32-cold.log")
    again = [line.replace("saved AOT compiled function", "Directly load AOT compilation from path") for line in first]
    assert parse_startup([*first, "crash", *again]).compile_cache == "warm"


def test_a_log_without_vllm_lines_has_no_phases() -> None:
    timeline = parse_startup(["Traceback (most recent call last):", "RuntimeError: CUDA out of memory"])
    assert timeline.phases == [] and timeline.ready_s is None


def test_the_agent_share_leaves_out_the_download_and_kiln_status_shows_it_all(tmp_path: Path) -> None:
    steps = AgentSteps()
    for name, seconds in [("read the choice", 0.01), ("detect and plan", 0.2), ("download", 30.0),
                          ("start the units", 0.05)]:
        steps.add(name, seconds)
    shown = steps.as_dict()
    assert shown["own_s"] == 0.26 and shown["total_s"] == 30.26
    text = "\n".join(startup_lines({"agent": shown, "instances": {
        "vllm-0": parse_startup(_lines("gpu-cold-runai-67.log")).as_dict()}}))
    assert "the agent's own share 0.26 s (read the choice 0.01 s, detect and plan 0.20 s, download 30.00 s" in text
    assert "vllm-0: ready in 45.0 s, compile cache cold: torch.compile 45.8 s, CUDA graphs 37.0 s (0.45 GiB)" in text

"""kiln bench's arithmetic, prices, reports and the boot self-check's verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from kiln.bench.capacity import against_prediction, measure_capacity, probe_args
from kiln.bench.report import write_sweep
from kiln.bench.sweep import Slo, SweepSpec, ratios, summarize
from kiln.cli.bench import price
from kiln.errors import ConfigError
from kiln.perf.capacity import stream_grid
from kiln.perf.predict import Forecast
from kiln.perf.workload import Workload, WorkloadSpec, resolve
from kiln.serve.reports.selfcheck import SelfCheckSettings, judge, predicted

RAW: dict[str, Any] = {
    "output_throughput": 2000.0, "request_throughput": 7.8125, "request_goodput": 7.5, "completed": 64,
    "failed": 0, **{f"p{p}_{m}_ms": float(p + i) for i, m in enumerate(("ttft", "tpot", "itl", "e2el"))
                    for p in (50, 90, 99)},
}


def test_cost_per_million_output_tokens() -> None:
    level = summarize(16, RAW, 23.92)
    # 2,000 tokens/s is 7.2 M tokens an hour; $23.92 / 7.2 = $3.3222 per million.
    assert level["usd_per_million_output_tokens"] == pytest.approx(3.3222, abs=1e-4)
    assert level["output_tokens_per_s"] == 2000.0 and level["requests_per_s"] == 7.812
    assert level["ttft_ms"] == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert level["tpot_ms"]["p99"] == 100.0 and level["e2e_ms"]["p50"] == 53.0
    assert summarize(16, RAW, None)["usd_per_million_output_tokens"] is None
    assert summarize(16, {**RAW, "output_throughput": 0.0}, 3.0)["usd_per_million_output_tokens"] is None


def test_a_level_keeps_the_distinct_reasons_its_requests_failed() -> None:
    errors = ["", "Bad Request: prompt too long", "", "Bad Request: prompt too long", "ServerDisconnectedError", ""]
    level = summarize(4, {**RAW, "failed": 3, "errors": errors}, None)
    assert level["failed"] == 3
    assert level["errors"] == ["Bad Request: prompt too long", "ServerDisconnectedError"]
    assert summarize(4, RAW, None)["errors"] == []


def test_the_seeds_figures_as_ratios() -> None:
    # DigitalOcean's post: 2,000 vs 823 tok/s, TTFT 187.9 vs 316.8 ms, on the same machine and price.
    kiln = summarize(64, {**RAW, "p50_ttft_ms": 187.9}, 6.74)
    vanilla = summarize(64, {**RAW, "output_throughput": 823.0, "p50_ttft_ms": 316.8}, 6.74)
    [row] = ratios([kiln], [vanilla])
    assert row["output_tokens_per_s"] == pytest.approx(2.43, abs=0.005)
    assert row["ttft_ms_p50"] == pytest.approx(0.593, abs=0.001)
    assert row["usd_per_million_output_tokens"] == pytest.approx(823 / 2000, abs=0.001)


def test_each_level_asks_vllms_client_for_percentiles_and_goodput() -> None:
    spec = SweepSpec((1, 8), 512, 256, slo=Slo(500, 40))
    flags = spec.workload(8)
    assert flags[flags.index("--max-concurrency") + 1] == "8"
    assert flags[flags.index("--num-prompts") + 1] == "64"
    assert flags[flags.index("--metric-percentiles") + 1] == "50,90,99"
    assert flags[flags.index("--goodput") + 1:flags.index("--goodput") + 3] == ["ttft:500", "tpot:40"]
    assert SweepSpec((1,), 8, 8, "sharegpt", "/data/sg.json").workload(1)[:4] == [
        "--dataset-name", "sharegpt", "--dataset-path", "/data/sg.json"]


def test_prices_come_from_the_droplet_data_with_their_source() -> None:
    def args(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"price_per_hour": None, "machine": None, **kw})

    usd, source = price(args(machine="h100x8"))
    assert usd == 23.92 and "gpu-h100x8-640gb" in source and "as of" in source
    assert price(args(price_per_hour=2.5, machine="h100x8")) == (2.5, "command line")
    assert price(args())[0] is None
    with pytest.raises(ConfigError):
        price(args(machine="cpu-only"))


def test_the_report_files(tmp_path: Path) -> None:
    levels = [summarize(c, {**RAW, "output_throughput": 100.0 * c}, 1.57) for c in (1, 2, 4)]
    files = write_sweep(tmp_path, levels, {"label": "kiln", "url": "http://x", "model": "m", "dataset": "random",
                                           "input_len": 8, "output_len": 8, "usd_per_hour": 1.57})
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["concurrency"] for r in results] == [1, 2, 4]
    assert {"output_tokens_per_s", "requests_per_s", "usd_per_million_output_tokens"} <= set(results[0])
    assert results[0]["ttft_ms"]["p99"] == 99.0 and results[0]["tpot_ms"]["p50"] == 51.0
    assert (tmp_path / "report.md").read_text().count("\n| ") >= 4
    pngs = [f for f in files if f.suffix == ".png"]
    assert len(pngs) == 2 and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in pngs)


def test_the_self_check_judges_gpu_shortfalls_only() -> None:
    forecast = Forecast("kiln", 400.0, 800.0, 2.0, 100.0, {"p50": 20.0, "p90": 30.0, "p99": 40.0},
                        {"p50": 10.0, "p90": 12.0}, {"p50": 10.0})
    expected = predicted(forecast)
    assert expected == {"tpot_ms": 10.0, "ttft_ms": 20.0, "output_tokens_per_s": 400.0}
    slow = summarize(4, {**RAW, "output_throughput": 100.0}, None)
    degraded, why = judge(slow, expected, "cuda", 0.4)
    assert degraded and "25% of the prediction" in why
    assert not judge(summarize(4, {**RAW, "output_throughput": 300.0}, None), expected, "cuda", 0.4)[0]
    assert judge(slow, expected, "cpu", 0.4) == (False, why.split("; below")[0] + "; not judged on the CPU backend")


def test_the_self_check_takes_the_workloads_shape_capped() -> None:
    base = SelfCheckSettings()
    agent = base.shaped(resolve(WorkloadSpec(preset="agent")))
    assert (agent.input_len, agent.output_len, agent.concurrency) == (4096, 128, base.concurrency)
    chat = base.shaped(resolve(WorkloadSpec(preset="chat")))
    assert (chat.input_len, chat.output_len) == (230, 128)
    assert base.shaped(None) == base
    assert chat.workload().concurrency == base.concurrency and chat.workload().num_prompts == base.prompts


def _endpoint(knee: int, calls: list[int]) -> Any:
    """A stand-in for vLLM's client against an endpoint whose TTFT p90 crosses 500 ms past `knee` streams: its
    result JSON, from the flags kiln passes."""
    def run(argv: list[str]) -> dict[str, Any]:
        streams = int(argv[argv.index("--max-concurrency") + 1])
        calls.append(streams)
        ttft = 400.0 * streams / knee
        return {**RAW, "p90_ttft_ms": ttft, "p90_tpot_ms": 30.0, "output_throughput": 100.0 * streams,
                "request_throughput": streams / 2, "request_goodput": streams / 2 * (0.95 if ttft <= 500 else 0.5),
                "completed": int(argv[argv.index("--num-prompts") + 1])}
    return run


def test_a_capacity_search_doubles_then_bisects_to_the_most_streams_within_the_budget() -> None:
    budget = Workload(256, 128, ttft_ms=500.0, tpot_ms=50.0)
    calls: list[int] = []
    found = measure_capacity(budget, _endpoint(40, calls), ceiling=256)
    # 400 ms x streams / 40 <= 500 ms up to 50 streams; the grid (2^(1/8) steps) holds 49 and 53
    assert found.streams == max(n for n in stream_grid(256) if 400 * n / 40 <= 500)
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64] and len(calls) <= 12 and len(set(calls)) == len(calls)
    assert found.as_dict()["share_within_budget"] == 0.95 and found.as_dict()["output_tokens_per_s"] == 4900.0
    again: list[int] = []
    assert measure_capacity(budget, _endpoint(40, again), ceiling=256, start=45).streams == found.streams
    assert len(again) < len(calls)  # started at the prediction
    assert measure_capacity(budget, _endpoint(0.5, []), ceiling=256).streams == 0  # not even one stream


def test_a_measured_capacity_beside_the_prediction_says_whether_the_band_holds_it() -> None:
    budget = Workload(256, 128, ttft_ms=500.0, tpot_ms=50.0)
    measured = measure_capacity(budget, _endpoint(40, []), ceiling=256)
    predicted = {"streams": 45, "output_tokens_per_s": 4500.0, "ttft_ms_p90": 450.0, "tpot_ms_p90": 30.0,
                 "band": {"output_tokens_per_s": [3600.0, 5400.0], "source": "test"}}
    side = against_prediction(measured, predicted, 22.5)
    assert side["streams"] == [49, 45, 1.089] and side["band"]["measured_inside"] is True
    narrow = {**predicted, "band": {"output_tokens_per_s": [4000.0, 4800.0], "source": "test"}}
    assert against_prediction(measured, narrow, 22.5)["band"]["measured_inside"] is False
    assert against_prediction(measured, {**predicted, "band": None}, None)["band"]["measured_inside"] is None


def test_a_capacity_probe_is_a_command_line_vllms_client_takes() -> None:
    """vLLM's own parser reads the probe's flags, the steady spread of outputs included."""
    from vllm.benchmarks.serve import add_cli_args  # noqa: PLC0415 - importing vLLM takes seconds

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    flags = probe_args(Workload(256, 128, concurrency=8, ttft_ms=500.0, tpot_ms=50.0))
    args = parser.parse_args(["--model", "m", *flags])
    assert args.max_concurrency == 8 and args.num_prompts == 32 and args.num_warmups == 8
    assert json.loads(args.random_range_ratio) == {"input": 0.0, "output": 0.5}
    assert args.goodput == ["ttft:500", "tpot:50"]

"""kiln bench's arithmetic, prices, reports and the boot self-check's verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from kiln.bench.report import write_sweep
from kiln.bench.sweep import Slo, SweepSpec, ratios, summarize
from kiln.cli.bench import price
from kiln.errors import ConfigError
from kiln.perf.predict import Forecast
from kiln.perf.workload import WorkloadSpec, resolve
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

"""`kiln bench --capacity`: the most streams a running endpoint carries within a latency budget, found by the search
the engine's capacity uses (perf.capacity.find_streams: doubling until the budget breaks, then bisecting on the same
grid of counts), each probe a run of vLLM's own benchmark client. Pure but for the runner passed in.

A probe holds its streams for about four requests each, after as many warm-up requests, with outputs spread from
half to one and a half times the mean (`--random-range-ratio`), as the engine's steady load is: streams of equal
requests would stay in lockstep, each wave of prompts arriving at once. The budget holds when the p90 of the
requests' TTFT and the p90 of their TPOT are within it, as the engine judges a forecast; vLLM's client also counts
the share of requests meeting both at once (its goodput), reported beside.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kiln.bench.sweep import METRICS, PERCENTILES, Slo, summarize
from kiln.perf.capacity import find_streams
from kiln.perf.workload import Workload

WAVES = 4  # requests per stream in a probe
MIN_PROMPTS = 32
SPREAD = json.dumps({"input": 0.0, "output": 0.5})  # the engine's steady spread (perf.predict.STEADY_SPREAD)

Runner = Callable[[list[str]], dict[str, Any]]
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Measured:
    """One probe's level (sweep.summarize's figures) with the share of its requests within the budget."""

    level: dict[str, Any]

    def meets(self, workload: Workload) -> bool:
        if self.level["failed"] or not self.level["completed"]:
            return False
        ttft_ok = workload.ttft_ms is None or self.level["ttft_ms"]["p90"] <= workload.ttft_ms
        budget = workload.tpot_budget_ms
        return ttft_ok and (budget is None or self.level["tpot_ms"]["p90"] <= budget)


@dataclass(frozen=True)
class MeasuredCapacity:
    workload: Workload
    streams: int  # 0: not even one stream meets the budget
    at: dict[str, Any] | None  # the level at those streams
    probes: list[dict[str, Any]]  # every level measured, by streams

    def as_dict(self) -> dict[str, Any]:
        at = self.at or {}
        return {"budget": {"ttft_ms_p90": self.workload.ttft_ms, "tpot_ms_p90": self.workload.tpot_budget_ms},
                "streams": self.streams,
                "requests_per_s": at.get("requests_per_s"),  # a closed loop of `streams`
                "output_tokens_per_s": at.get("output_tokens_per_s"),
                "ttft_ms_p90": at.get("ttft_ms", {}).get("p90"), "tpot_ms_p90": at.get("tpot_ms", {}).get("p90"),
                "share_within_budget": at.get("share_within_budget"), "probes": self.probes}


def probe_args(workload: Workload) -> list[str]:
    """vLLM's benchmark client for one probe: `workload.concurrency` streams of random prompts."""
    streams = workload.concurrency or 1
    slo = Slo(workload.ttft_ms or 1e9, workload.tpot_budget_ms or 1e9)
    return ["--dataset-name", "random", "--random-input-len", str(workload.input_len),
            "--random-output-len", str(workload.output_len), "--random-range-ratio", SPREAD,
            "--num-prompts", str(max(MIN_PROMPTS, WAVES * streams)), "--max-concurrency", str(streams),
            "--num-warmups", str(streams), "--ignore-eos", "--percentile-metrics", ",".join(METRICS),
            "--metric-percentiles", ",".join(map(str, PERCENTILES)), *slo.flags()]


def measure_capacity(workload: Workload, runner: Runner, ceiling: int, start: int = 1,
                     progress: Progress | None = None) -> MeasuredCapacity:
    """The most streams (up to `ceiling`) within `workload`'s budget, starting the search at `start` (the
    prediction, when there is one: fewer probes)."""
    levels: list[dict[str, Any]] = []

    def probe(load: Workload) -> Measured:
        streams = load.concurrency or 1
        raw = runner(probe_args(load))
        level = summarize(streams, raw, None)
        good, rate = raw.get("request_goodput"), level["requests_per_s"]
        level["share_within_budget"] = round(min(good / rate, 1.0), 3) if good is not None and rate else None
        level["meets_budget"] = Measured(level).meets(workload)
        levels.append(level)
        if progress:
            progress(level)
        return Measured(level)

    budgeted = replace(workload, concurrency=None, request_rate=None)
    streams, found = find_streams(probe, budgeted, max(ceiling, 1), max(start, 1))
    return MeasuredCapacity(budgeted, streams, found.level if found else None,
                            sorted(levels, key=lambda lv: lv["concurrency"]))


def against_prediction(measured: MeasuredCapacity, predicted: dict[str, Any],
                       predicted_rate_at_streams: float | None) -> dict[str, Any]:
    """The measured capacity beside the engine's (perf.capacity's figures, with their band): each figure's ratio,
    and whether the output at capacity lies inside the band."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return None if not a or not b else round(a / b, 3)

    at = measured.as_dict()
    band = (predicted.get("band") or {}).get("output_tokens_per_s")
    output = at["output_tokens_per_s"]
    inside = None if not band or output is None else band[0] <= output <= band[1]
    return {"streams": [measured.streams, predicted.get("streams"), ratio(measured.streams, predicted.get("streams"))],
            "requests_per_s": [at["requests_per_s"], predicted_rate_at_streams,
                               ratio(at["requests_per_s"], predicted_rate_at_streams)],
            "output_tokens_per_s": [output, predicted.get("output_tokens_per_s"),
                                    ratio(output, predicted.get("output_tokens_per_s"))],
            "ttft_ms_p90": [at["ttft_ms_p90"], predicted.get("ttft_ms_p90"),
                            ratio(at["ttft_ms_p90"], predicted.get("ttft_ms_p90"))],
            "tpot_ms_p90": [at["tpot_ms_p90"], predicted.get("tpot_ms_p90"),
                            ratio(at["tpot_ms_p90"], predicted.get("tpot_ms_p90"))],
            "band": {"output_tokens_per_s": band, "source": (predicted.get("band") or {}).get("source"),
                     "measured_inside": inside}}

"""A sweep over concurrency levels, summarized per level with its cost. Pure but for the runner passed in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.perf.workload import DEFAULT_TPOT_MS, DEFAULT_TTFT_MS
from kiln.pricing import usd_per_million_tokens

PERCENTILES = (50, 90, 99)
METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}


@dataclass(frozen=True)
class Slo:
    """The budget goodput counts within: by default the `serve` preset's, the budget a default plan is made for."""

    ttft_ms: float = DEFAULT_TTFT_MS
    tpot_ms: float = DEFAULT_TPOT_MS

    def flags(self) -> list[str]:
        return ["--goodput", f"ttft:{self.ttft_ms:g}", f"tpot:{self.tpot_ms:g}"]


@dataclass(frozen=True)
class SweepSpec:
    concurrencies: tuple[int, ...]
    input_len: int
    output_len: int
    dataset: str = "random"
    dataset_path: str | None = None
    prompts_per_level: int | None = None  # default: 8 per concurrent client, at least 16
    slo: Slo = field(default_factory=Slo)

    def prompts(self, concurrency: int) -> int:
        return self.prompts_per_level or max(16, 8 * concurrency)

    def workload(self, concurrency: int) -> list[str]:
        data = ["--dataset-name", self.dataset]
        if self.dataset == "random":
            data += ["--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len)]
        else:
            data += ["--dataset-path", str(self.dataset_path), "--sharegpt-output-len", str(self.output_len)]
        # Warm-up requests first, so the first level does not pay for cold code paths the others do not.
        return [*data, "--num-prompts", str(self.prompts(concurrency)), "--max-concurrency", str(concurrency),
                "--num-warmups", str(max(2, concurrency)),
                "--ignore-eos", "--percentile-metrics", ",".join(METRICS), "--metric-percentiles",
                ",".join(map(str, PERCENTILES)), *self.slo.flags()]


def _distinct_errors(errors: list[str], keep: int = 3) -> list[str]:
    """The first few different reasons requests failed (vLLM's client records one per request, most empty)."""
    out: list[str] = []
    for error in errors:
        text = " ".join(str(error).split())[:300]
        if text and text not in out:
            out.append(text)
        if len(out) == keep:
            break
    return out


def summarize(concurrency: int, raw: dict[str, Any], usd_per_hour: float | None) -> dict[str, Any]:
    """One level: throughput, latency percentiles, goodput and cost, from vLLM's result."""
    out_tps = float(raw.get("output_throughput") or 0.0)
    level: dict[str, Any] = {
        "concurrency": concurrency,
        "output_tokens_per_s": round(out_tps, 2),
        "requests_per_s": round(float(raw.get("request_throughput") or 0.0), 3),
        "goodput_requests_per_s": None if raw.get("request_goodput") is None else round(raw["request_goodput"], 3),
        "completed": raw.get("completed"),
        "failed": raw.get("failed", 0),
        "errors": _distinct_errors(raw.get("errors") or []),
    }
    for metric, name in METRICS.items():
        level[name] = {f"p{p}": round(float(raw.get(f"p{p}_{metric}_ms") or 0.0), 2) for p in PERCENTILES}
    cost = usd_per_million_tokens(usd_per_hour, out_tps) if usd_per_hour is not None else None
    level["usd_per_million_output_tokens"] = None if cost is None else round(cost, 4)
    return level


Runner = Callable[[list[str]], dict[str, Any]]
Progress = Callable[[int, int, dict[str, Any] | None], None]


def run_sweep(spec: SweepSpec, runner: Runner, usd_per_hour: float | None,
              progress: Progress | None = None) -> list[dict[str, Any]]:
    levels: list[dict[str, Any]] = []
    for i, concurrency in enumerate(spec.concurrencies):
        if progress:
            progress(i, len(spec.concurrencies), None)
        levels.append(summarize(concurrency, runner(spec.workload(concurrency)), usd_per_hour))
        if progress:
            progress(i + 1, len(spec.concurrencies), levels[-1])
    return levels


def ratios(kiln: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency: kiln's figure over the baseline's (throughput up is better; latency and cost down)."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return None if not a or not b else round(a / b, 3)

    by_level = {b["concurrency"]: b for b in baseline}
    rows = []
    for k in kiln:
        b = by_level.get(k["concurrency"])
        if b is None:
            continue
        rows.append({"concurrency": k["concurrency"],
                     "output_tokens_per_s": ratio(k["output_tokens_per_s"], b["output_tokens_per_s"]),
                     "ttft_ms_p50": ratio(k["ttft_ms"]["p50"], b["ttft_ms"]["p50"]),
                     "tpot_ms_p50": ratio(k["tpot_ms"]["p50"], b["tpot_ms"]["p50"]),
                     "e2e_ms_p50": ratio(k["e2e_ms"]["p50"], b["e2e_ms"]["p50"]),
                     "usd_per_million_output_tokens": ratio(k["usd_per_million_output_tokens"],
                                                            b["usd_per_million_output_tokens"])})
    return rows

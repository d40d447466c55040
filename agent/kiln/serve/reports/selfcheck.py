"""The self-check at boot: a few seconds of small load in the user's workload shape once the instances serve, its
figures beside what the performance model predicts for that load, and a verdict. The judging is pure; the load is
vLLM's benchmark client (kiln.bench.client)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kiln.bench.sweep import Slo, SweepSpec, summarize
from kiln.perf.predict import Forecast
from kiln.perf.workload import Workload

# The self-check stays short whatever the workload: its prompts and outputs are capped.
MAX_INPUT_LEN, MAX_OUTPUT_LEN = 4096, 128


@dataclass(frozen=True)
class SelfCheckSettings:
    concurrency: int = 4
    prompts: int = 16
    input_len: int = 128
    output_len: int = 64
    shortfall: float = 0.4  # below this share of the predicted rate, the machine is reported degraded

    def spec(self) -> SweepSpec:
        return SweepSpec((self.concurrency,), self.input_len, self.output_len, prompts_per_level=self.prompts,
                         slo=Slo())

    def shaped(self, workload: Workload | None) -> SelfCheckSettings:
        """The user's request shape (capped), at the self-check's small load."""
        if workload is None:
            return self
        return replace(self, input_len=min(workload.input_len, MAX_INPUT_LEN),
                       output_len=min(workload.output_len, MAX_OUTPUT_LEN))

    def workload(self) -> Workload:
        return Workload(self.input_len, self.output_len, concurrency=self.concurrency, num_prompts=self.prompts)


def predicted(forecast: Forecast) -> dict[str, float]:
    return {"tpot_ms": round(forecast.tpot_ms["p50"], 2), "ttft_ms": round(forecast.ttft_ms["p50"], 1),
            "output_tokens_per_s": round(forecast.output_tokens_per_s, 1)}


def judge(measured: dict[str, Any], expected: dict[str, float], device: str, shortfall: float) -> tuple[bool, str]:
    """(degraded, why). On the CPU backend the load's client shares the instances' few cores, so it is measured
    but not judged."""
    rate, want = float(measured["output_tokens_per_s"]), expected["output_tokens_per_s"]
    share = rate / want if want else 0.0
    text = (f"measured {rate:,.1f} output tokens/s and TPOT p50 {measured['tpot_ms']['p50']:,.1f} ms at "
            f"concurrency {measured['concurrency']}; predicted {want:,.1f} tokens/s and {expected['tpot_ms']:,.1f} ms "
            f"({share:.0%} of the prediction)")
    if device != "cuda":
        return False, text + "; not judged on the CPU backend"
    if measured.get("failed"):
        return True, text + f"; {measured['failed']} request(s) failed"
    if share < shortfall:
        return True, text + f"; below {shortfall:.0%}: check GPU clocks, NVLink, and `kiln status` for errors"
    return False, text


def self_check_result(raw: dict[str, Any], forecast: Forecast, device: str,
                      settings: SelfCheckSettings) -> dict[str, Any]:
    measured = summarize(settings.concurrency, raw, None)
    expected = predicted(forecast)
    degraded, verdict = judge(measured, expected, device, settings.shortfall)
    return {"state": "done", "degraded": degraded, "verdict": verdict, "predicted": expected,
            "shape": {"input_len": settings.input_len, "output_len": settings.output_len,
                      "concurrency": settings.concurrency, "prompts": settings.prompts},
            "measured": {"concurrency": measured["concurrency"], "output_tokens_per_s": measured["output_tokens_per_s"],
                         "ttft_ms_p50": measured["ttft_ms"]["p50"], "tpot_ms_p50": measured["tpot_ms"]["p50"],
                         "failed": measured["failed"]}}

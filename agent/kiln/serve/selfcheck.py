"""The self-check at boot: a few seconds of small load once the instances serve, its figures beside the plan's
predictions, and a verdict. The judging is pure; the load is vLLM's benchmark client (kiln.bench.client)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.bench.sweep import Slo, SweepSpec, summarize


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


def predicted(plan: dict[str, Any], concurrency: int) -> dict[str, float]:
    """What the plan expects at this small concurrency: every sequence decoding at the roofline rate."""
    per_seq = float(plan["predicted"]["decode_tokens_per_s_per_seq"])
    return {"tpot_ms": round(1000 / per_seq, 2), "output_tokens_per_s": round(per_seq * concurrency, 1)}


def judge(measured: dict[str, Any], expected: dict[str, float], device: str, shortfall: float) -> tuple[bool, str]:
    """(degraded, why). The CPU backend's predictions are not calibrated, so it is measured but not judged."""
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


def self_check_result(raw: dict[str, Any], plan: dict[str, Any], device: str,
                      settings: SelfCheckSettings) -> dict[str, Any]:
    measured = summarize(settings.concurrency, raw, None)
    expected = predicted(plan, settings.concurrency)
    degraded, verdict = judge(measured, expected, device, settings.shortfall)
    return {"state": "done", "degraded": degraded, "verdict": verdict, "predicted": expected,
            "measured": {"concurrency": measured["concurrency"], "output_tokens_per_s": measured["output_tokens_per_s"],
                         "ttft_ms_p50": measured["ttft_ms"]["p50"], "tpot_ms_p50": measured["tpot_ms"]["p50"],
                         "failed": measured["failed"]}}

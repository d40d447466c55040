"""The planner's search in words: the chosen setup and each it beat, quoting the predictions. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.perf.predict import Forecast
from kiln.perf.workload import Workload
from kiln.setup.types import Plan

SHOWN = 6  # the setups an explanation names; the rest are counted


@dataclass(frozen=True)
class Option:
    plan: Plan
    forecast: Forecast

    @property
    def label(self) -> str:
        e = self.plan.engine
        spec = e.speculative_config
        drafts = f"speculative k={spec['num_speculative_tokens']}" if spec else "no speculative decoding"
        split = f"TP{e.tensor_parallel_size}" + (f" x DP{e.data_parallel_size}" if e.data_parallel_size > 1 else "")
        split += f" x PP{e.pipeline_parallel_size}" if e.pipeline_parallel_size > 1 else ""
        split += " + EP" if e.enable_expert_parallel else ""
        return (f"{len(self.plan.instances)} x {split} {self.plan.quantization}, {drafts}, max_num_seqs "
                f"{e.max_num_seqs}, max_num_batched_tokens {e.max_num_batched_tokens}")

    def numbers(self) -> str:
        f = self.forecast
        return (f"{f.output_tokens_per_s:,.0f} tok/s, {f.tokens_per_s_per_user:,.1f} tok/s per user, "
                f"TTFT p90 {f.ttft_ms['p90']:,.0f} ms, TPOT p90 {f.tpot_ms['p90']:.1f} ms")


def explain(best: Option, others: Sequence[Option], workload: Workload, objective: str) -> list[str]:
    lines = [f"Workload: {workload.shape()}; {workload.budget()}.",
             f"Chosen: {best.label}: predicts {best.numbers()}."]
    out = best.forecast.output_tokens_per_s
    spec_on = bool(best.plan.engine.speculative_config)
    twin = next((o for o in others if o.plan.tensor_parallel_size == best.plan.tensor_parallel_size
                 and bool(o.plan.engine.speculative_config) != spec_on), None)
    if twin is not None:
        ratio = twin.forecast.output_tokens_per_s / out if out else 0.0
        tpot = twin.forecast.tpot_ms["p50"] / best.forecast.tpot_ms["p50"] if best.forecast.tpot_ms["p50"] else 0
        lines.append(f"Speculative decoding {'on' if spec_on else 'off'}: at {workload.load} turning it "
                     f"{'off' if spec_on else 'on'} predicts {ratio:.2f}x the output and {tpot:.2f}x the time per "
                     "token.")
    for o in others[:SHOWN]:
        verdict = "misses the budget: " + "; ".join(o.forecast.misses(workload)) if not o.forecast.meets(
            workload) else ("slower per token" if objective == "latency" else "less output")
        ratio = o.forecast.output_tokens_per_s / out if out else 0.0
        lines.append(f"Beaten: {o.label}: {ratio:.2f}x the output ({o.numbers()}); {verdict}.")
    if len(others) > SHOWN:
        lines.append(f"... and {len(others) - SHOWN} more setups predicted (`kiln plan --json` lists them).")
    return lines



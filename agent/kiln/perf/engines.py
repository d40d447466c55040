"""The performance engines behind StepModel, and which one a setup gets.

- kiln: the calibrated roofline of kiln.perf.steps, for any GPU in kiln's data and the CPU.
- aiconfigurator: NVIDIA AIConfigurator's measured vLLM kernel timings. It answers whole static batches
  (TTFT and TPOT for `batch` requests of `isl`/`osl` tokens), so kiln asks it once for a grid of decode
  batches and contexts and of prefill lengths, and reads step times off that grid. At about a second per
  point it is for `kiln predict` and the benchmarks, not for the planner's search at every boot.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kiln.errors import KilnError
from kiln.hardware.model import Machine
from kiln.perf.aiconfigurator import SYSTEMS, AicEstimate, AicRequest
from kiln.perf.predict import kiln_steps
from kiln.perf.steps import Step, StepModel
from kiln.profiles.schema import Profile
from kiln.setup.types import Constants, Plan

# The grid kiln asks AIConfigurator for: it costs about a second per point on two cores.
DECODE_BATCHES = (1, 4, 16, 64, 256, 1024)
DECODE_CONTEXTS = (1024, 8192)
PREFILL_TOKENS = (512, 2048, 8192)


class Estimator(Protocol):
    """The AIConfigurator boundary (kiln.perf.aiconfigurator.AiConfigurator): static-batch estimates, or the
    reason each could not be made."""

    def estimate(self, requests: Sequence[AicRequest], timeout_s: float | None = None
                 ) -> list[AicEstimate | str]: ...


@dataclass(frozen=True)
class GridSteps:
    """Step times read off AIConfigurator's grid: decode by (batch, context), prefill by tokens; a step that
    mixes both costs the decode step plus the prefill chunk's time beyond an empty step."""

    label: str
    decode_ms: dict[tuple[int, int], float]  # (batch, context) -> TPOT; batches that did not fit are left out
    prefill_ms: dict[int, float]

    @property
    def name(self) -> str:
        return self.label

    def _decode(self, batch: float, context: float) -> float:
        batches = sorted({b for b, _ in self.decode_ms})

        def at(b: int) -> float:
            return _interpolate(DECODE_CONTEXTS, [self.decode_ms[(b, c)] for c in DECODE_CONTEXTS], context)
        return _interpolate(batches, [at(b) for b in batches], batch, log=True)

    def seconds(self, step: Step) -> float:
        total = 0.0
        if step.decode_seqs:
            seqs = step.decode_seqs * step.tokens_per_seq
            total += self._decode(seqs, step.decode_context / step.decode_seqs)
        if step.prefill_tokens:
            lengths = sorted(self.prefill_ms)
            chunk = _interpolate(lengths, [self.prefill_ms[t] for t in lengths], step.prefill_tokens)
            total += chunk - (self._decode(1, 0) if step.decode_seqs else 0.0)
        return max(total, 0.0) / 1000


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float, log: bool = False) -> float:
    """Piecewise linear through (xs, ys), extended linearly past the ends (in log x when `log`)."""
    def f(v: float) -> float:
        return math.log(max(v, 1e-9)) if log else v
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = f(xs[i - 1]), f(xs[i])
    y0, y1 = ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (f(x) - x0) / (x1 - x0), 0.0)


def aic_model(profile: Profile, c: Constants) -> str | None:
    """The model id AIConfigurator ships whose architecture is this profile's (data/planner.yaml)."""
    table: dict[str, str] = c.get("aiconfigurator", "models")
    return table.get(profile.name)


def quantization(precision: str, kv_cache_dtype: str, moe: bool) -> tuple[str | None, str, str | None]:
    """kiln's precision in AIConfigurator's names: FP8 MoE checkpoints are block-scaled (fp8_block), gpt-oss
    keeps attention in bf16 and its experts in MXFP4 (w4a16_mxfp4)."""
    gemm = {"bf16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4", "mxfp4": "bf16"}.get(precision)
    experts = {"fp8": "fp8_block", "mxfp4": "w4a16_mxfp4", "nvfp4": "nvfp4", "bf16": "bf16"}.get(precision)
    return gemm, "fp8" if kv_cache_dtype == "fp8" else "bf16", experts if moe else None


def grid_requests(model: str, system: str, plan: Plan, moe: bool) -> list[AicRequest]:
    gemm, kv, experts = quantization(plan.quantization, plan.kv_cache_dtype, moe)

    def ask(isl: int, batch: int, mode: str) -> AicRequest:
        return AicRequest(model, system, isl=isl, osl=2, batch_size=batch, tp=plan.tensor_parallel_size,
                          gemm_quant=gemm, kvcache_quant=kv, moe_quant=experts, mode=mode)
    # Decode steps alone (static_gen) and prefills alone (static_ctx): the simulator mixes them as vLLM does.
    return ([ask(ctx, b, "static_gen") for b in DECODE_BATCHES for ctx in DECODE_CONTEXTS]
            + [ask(t, 1, "static_ctx") for t in PREFILL_TOKENS])


def aic_steps(plan: Plan, machine: Machine, profile: Profile, c: Constants, estimator: Estimator
              ) -> GridSteps | str:
    """AIConfigurator's step times for this plan, or why it does not cover it."""
    if not machine.gpus:
        return "AIConfigurator has no CPU data"
    system = SYSTEMS.get(machine.gpus[0].spec.class_name)
    if system is None:
        return f"AIConfigurator has no vLLM data for {machine.gpus[0].spec.class_name}"
    model = aic_model(profile, c)
    if model is None:
        return f"AIConfigurator ships no model with {profile.name}'s architecture"
    requests = grid_requests(model, system, plan, profile.architecture.moe is not None)
    answers = estimator.estimate(requests)
    n = len(DECODE_BATCHES) * len(DECODE_CONTEXTS)
    # A batch too large for the GPUs' memory (AIConfigurator says OOM) leaves its row out; the grid extends the
    # largest batch that fits.
    failed = {r.batch_size for r, a in zip(requests[:n], answers[:n], strict=True) if isinstance(a, str)}
    decode = {(r.batch_size, r.isl): a.tpot_ms for r, a in zip(requests[:n], answers[:n], strict=True)
              if isinstance(a, AicEstimate) and r.batch_size not in failed}
    prefill = {r.isl: a.ttft_ms for r, a in zip(requests[n:], answers[n:], strict=True) if isinstance(a, AicEstimate)}
    if len({b for b, _ in decode}) < 2 or len(prefill) < 2:
        reason = next((a for a in answers if isinstance(a, str)), "too few points")
        return f"AIConfigurator: {reason}"
    return GridSteps(f"aiconfigurator ({system}, {model})", decode, prefill)


def engine_for(kind: str, plan: Plan, machine: Machine, profile: Profile, c: Constants,
               estimator: Estimator | None) -> StepModel:
    """The step model `kind` asks for: kiln, aiconfigurator, or auto (AIConfigurator where it covers the setup,
    if the calibration prefers it there, else kiln)."""
    if kind == "kiln" or (kind == "auto" and not c.get("aiconfigurator", "preferred")):
        return kiln_steps(plan, machine, profile, c)
    if estimator is None:
        if kind == "aiconfigurator":
            raise KilnError("AIConfigurator is not installed", fix="`bash ci/aiconfigurator.sh` makes .venv-aic")
        return kiln_steps(plan, machine, profile, c)
    steps = aic_steps(plan, machine, profile, c, estimator)
    if isinstance(steps, str):
        if kind == "aiconfigurator":
            raise KilnError(steps, fix="use --engine kiln")
        return kiln_steps(plan, machine, profile, c)
    return steps

"""The user's workload and latency budget: request shape, load and service levels. Pure.

A workload is what `vllm bench serve` would send: requests of `input_len` prompt tokens and `output_len`
generated tokens (means; a dataset's outputs spread about theirs as its own do), either `concurrency` at a time
(closed loop, a new request as one finishes) or `request_rate` per second (open loop, Poisson arrivals; infinite:
all `num_prompts` at once).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# vLLM's `vllm bench serve` sends 1,000 prompts unless told otherwise (--num-prompts default).
DEFAULT_NUM_PROMPTS = 1000


@dataclass(frozen=True)
class Dataset:
    """A benchmark dataset's request lengths, as means."""

    name: str
    input_len: int
    output_len: int
    source: str


DATASETS = {
    # 1,000 requests from ShareGPT (Aeala/ShareGPT_Vicuna_unfiltered) through `vllm bench serve` with Llama 3.1's
    # tokenizer: 229,711 input and 203,068 generated tokens.
    "sharegpt": Dataset("sharegpt", 230, 203, "https://github.com/vllm-project/vllm/pull/18566"),
}


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    concurrency: int | None = None  # closed loop
    request_rate: float | None = None  # open loop, requests/s for the whole machine; math.inf: all at once
    num_prompts: int = DEFAULT_NUM_PROMPTS
    prefix_len: int = 0  # leading prompt tokens every request shares
    dataset: str | None = None
    ttft_ms: float | None = None  # p90 budget
    tpot_ms: float | None = None  # p90 budget
    min_tokens_per_s_per_user: float | None = None
    preset: str | None = None
    steady: bool = False  # a closed loop's latencies leave out its first wave, which arrives at once

    @property
    def request_tokens(self) -> int:
        """A request's whole length, prompt and reply: the context it needs (vLLM refuses a longer one)."""
        return self.input_len + self.output_len

    @property
    def has_budget(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.min_tokens_per_s_per_user))

    @property
    def tpot_budget_ms(self) -> float | None:
        """The tighter of the TPOT budget and the per-user speed, as milliseconds per token."""
        limits = [v for v in (self.tpot_ms, 1000 / self.min_tokens_per_s_per_user
                              if self.min_tokens_per_s_per_user else None) if v is not None]
        return min(limits) if limits else None

    @property
    def finds_capacity(self) -> bool:
        """A budget and no load given: the load is what is found, the most that the budget holds at."""
        return self.has_budget and self.concurrency is None and self.request_rate is None

    @property
    def load(self) -> str:
        if self.finds_capacity:
            return "the most load within the budget"
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        if self.request_rate is None or math.isinf(self.request_rate):
            return f"{self.num_prompts} requests at once"
        return f"{self.request_rate:g} requests/s"

    def shape(self) -> str:
        source = f"{self.dataset}: " if self.dataset else ""
        prefix = f", {self.prefix_len:,} shared" if self.prefix_len else ""
        return f"{source}{self.input_len:,} in{prefix} / {self.output_len:,} out, {self.load}"

    def budget(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT p90 <= {self.ttft_ms:g} ms")
        if self.tpot_ms is not None:
            parts.append(f"TPOT p90 <= {self.tpot_ms:g} ms")
        if self.min_tokens_per_s_per_user is not None:
            parts.append(f">= {self.min_tokens_per_s_per_user:g} tok/s per user")
        return ", ".join(parts) or "no latency budget"

    def as_dict(self) -> dict[str, object]:
        return {"preset": self.preset, "dataset": self.dataset, "input_len": self.input_len,
                "output_len": self.output_len, "prefix_len": self.prefix_len, "concurrency": self.concurrency,
                "request_rate": None if self.request_rate is None else (
                    "inf" if math.isinf(self.request_rate) else self.request_rate),
                "num_prompts": self.num_prompts, "ttft_ms_p90": self.ttft_ms, "tpot_ms_p90": self.tpot_ms,
                "min_tokens_per_s_per_user": self.min_tokens_per_s_per_user}


@dataclass(frozen=True)
class Preset:
    workload: Workload
    why: str


# The per-user speed floor of the default workload. MLPerf Inference's server scenarios bound the time per output
# token at 40 ms (Llama 2 70B interactive) to 200 ms (Llama 2 70B server), with 80-175 ms for the others
# (https://docs.mlcommons.org/inference/benchmarks/language/llama2-70b/, "TPOT ... 200 ms", "interactive ... 40 ms").
# kiln takes 50 ms at p90, 20 tokens/s per user: near the interactive end, faster than people read.
DEFAULT_TPOT_MS = 50.0
# Its time to first token: MLPerf's interactive scenario bounds it at 450 ms (TTFT) beside its 40 ms TPOT, and
# NVIDIA Dynamo's SLA planner defaults to 500 ms TTFT with 50 ms ITL; kiln's TPOT is that of Dynamo's default, so
# it takes Dynamo's TTFT too (docs/planner.md).
DEFAULT_TTFT_MS = 500.0

PRESETS: dict[str, Preset] = {
    "serve": Preset(
        Workload(1024, 1024, num_prompts=DEFAULT_NUM_PROMPTS, ttft_ms=DEFAULT_TTFT_MS, tpot_ms=DEFAULT_TPOT_MS,
                 preset="serve"),
        "an endpoint behind an API, kiln's default: 1,024 tokens in and out, and the most requests per second the "
        f"machine carries while each starts within {DEFAULT_TTFT_MS:g} ms and streams at "
        f"{1000 / DEFAULT_TPOT_MS:g} tokens/s or faster (TTFT p90 <= {DEFAULT_TTFT_MS:g} ms and TPOT p90 <= "
        f"{DEFAULT_TPOT_MS:g} ms: NVIDIA Dynamo's SLA defaults, inside MLPerf's server-scenario bounds)."),
    "batch": Preset(
        Workload(1024, 1024, request_rate=math.inf, num_prompts=DEFAULT_NUM_PROMPTS, preset="batch"),
        "offline or bulk work: 1,024 tokens in and out (the shape of the seeds' and most recipes' benchmarks), "
        "every request sent at once, no latency budget; the highest output per machine wins."),
    "chat": Preset(
        Workload(DATASETS["sharegpt"].input_len, DATASETS["sharegpt"].output_len, dataset="sharegpt", ttft_ms=500,
                 tpot_ms=50, preset="chat"),
        "people chatting: ShareGPT's request lengths (vLLM's own serving benchmark), and the most conversations "
        "at once that each get the first token within half a second and at least 20 tokens/s, faster than "
        "people read."),
    "rag": Preset(
        Workload(4096, 256, ttft_ms=2000, tpot_ms=60, preset="rag"),
        "retrieval-augmented answers: retrieved passages make long prompts (4,096 tokens) and short answers "
        "(256); the prefill dominates, so the first token may take 2 s; the most answers at once within that."),
    "agent": Preset(
        Workload(10_000, 1000, ttft_ms=1000, tpot_ms=40, preset="agent"),
        "agents' tool loops: 10,000 tokens in as in the DeepSeek-V3.2 seed's test (Artificial Analysis), 1,000 "
        "out; the most loops at once that each get the first token within a second and 25 tokens/s or faster "
        "(TPOT p90 <= 40 ms, MLPerf's interactive bound)."),
}
DEFAULT_PRESET = "serve"


class WorkloadSpec(BaseModel):
    """`workload:` in user-data and the `--workload` options: a preset, and fields that override it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["serve", "batch", "chat", "rag", "agent"] | None = None
    dataset: Literal["sharegpt"] | None = None
    input_len: int | None = Field(default=None, ge=1, le=10_000_000)
    output_len: int | None = Field(default=None, ge=1, le=1_000_000)
    prefix_len: int | None = Field(default=None, ge=0, le=10_000_000)
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    request_rate: float | Literal["inf"] | None = None
    num_prompts: int | None = Field(default=None, ge=1, le=1_000_000)
    ttft_ms: float | None = Field(default=None, gt=0, le=3_600_000)
    tpot_ms: float | None = Field(default=None, gt=0, le=600_000)
    min_tokens_per_s_per_user: float | None = Field(default=None, gt=0, le=100_000)

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        if isinstance(self.request_rate, float) and not self.request_rate > 0:
            raise ValueError("request_rate must be above 0 (or inf: every request at once)")
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give concurrency or request_rate, not both")
        if self.dataset and (self.input_len or self.output_len):
            raise ValueError("give dataset or input_len/output_len, not both")
        # Against the prompt the workload resolves to: the preset's or the dataset's when input_len is not given.
        if self.input_len is not None:
            prompt, whose = self.input_len, "input_len"
        elif self.dataset:
            prompt, whose = DATASETS[self.dataset].input_len, f"{self.dataset}'s mean prompt"
        else:
            preset = self.preset or DEFAULT_PRESET
            prompt, whose = PRESETS[preset].workload.input_len, f"the {preset} preset's prompt"
        if self.prefix_len and self.prefix_len >= prompt:
            raise ValueError(f"prefix_len ({self.prefix_len}) must be shorter than {whose} ({prompt:,} tokens); "
                             "give input_len above it, or a shorter prefix_len")
        return self


def spread_lengths(mean: int, count: int, quantiles: Sequence[Sequence[float]], seed: int = 0) -> tuple[int, ...]:
    """`count` lengths whose spread about `mean` follows a dataset's quantile function ([quantile, length / mean]
    points, linear between), one from each of `count` equal slices of it, in a seeded random order (the order
    `vllm bench serve` draws a dataset's requests in is random too)."""
    points = [(float(q), float(v)) for q, v in quantiles]

    def at(u: float) -> float:
        for (q0, v0), (q1, v1) in itertools.pairwise(points):
            if u <= q1:
                return v0 + (v1 - v0) * (u - q0) / (q1 - q0) if q1 > q0 else v1
        return points[-1][1]

    ratios = [at((i + 0.5) / count) for i in range(count)]
    scale = mean * count / sum(ratios)
    lengths = [max(1, round(r * scale)) for r in ratios]
    import random  # noqa: PLC0415 - seeded locally, so the result is a pure function of its inputs

    random.Random(seed).shuffle(lengths)
    return tuple(lengths)


def resolve(spec: WorkloadSpec | None) -> Workload:
    """The workload a spec describes: its preset (default: serve) with the spec's fields over it."""
    spec = spec or WorkloadSpec()
    base = PRESETS[spec.preset or DEFAULT_PRESET].workload
    if spec.dataset:
        data = DATASETS[spec.dataset]
        base = replace(base, dataset=data.name, input_len=data.input_len, output_len=data.output_len)
    elif spec.input_len or spec.output_len:
        base = replace(base, dataset=None)
    rate = math.inf if spec.request_rate == "inf" else spec.request_rate
    load: dict[str, object] = {}
    if spec.concurrency is not None:
        load = {"concurrency": spec.concurrency, "request_rate": None}
    elif rate is not None:
        load = {"concurrency": None, "request_rate": float(rate)}
    named = {k: v for k, v in spec.model_dump().items()
             if v is not None and k in ("input_len", "output_len", "prefix_len", "num_prompts", "ttft_ms",
                                         "tpot_ms", "min_tokens_per_s_per_user")}
    out = replace(base, **named, **load)  # type: ignore[arg-type]
    if out.prefix_len >= out.input_len:
        raise ValueError(f"prefix_len ({out.prefix_len}) must be shorter than input_len ({out.input_len})")
    return out

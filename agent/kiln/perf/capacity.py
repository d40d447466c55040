"""Capacity at a latency budget (goodput): the most load a setup carries while the budget holds. Pure.

DistServe's goodput is the highest request rate at which a target share of requests (90%) meets both the TTFT and
the TPOT objective. kiln holds the budget at p90 over the requests, as its workloads state it, and finds the load
two ways, as a serving benchmark would:
- streams: the most requests kept in flight at once (a closed loop), found by doubling until the budget breaks and
  then bisecting, as GuideLLM's goodput profile and `vllm bench sweep serve_sla` search on concurrency, over a
  fixed grid of counts about 9% apart, so that a search started elsewhere gives the same answer;
- requests/s: the highest Poisson arrival rate at which the budget holds (what `vllm bench serve --request-rate`
  sends), searched below the rate those streams complete.
Every probe serves each stream about `ROUNDS` requests; a closed loop's first wave, which arrives at once, is served
but left out of the latencies (a steady load, as GuideLLM measures after its warm-up).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from kiln.perf.predict import Forecast
from kiln.perf.workload import Workload
from kiln.setup.headline import headline_of

ROUNDS = 3  # requests per stream in a probe: the first wave, left out, and two more
MIN_PROMPTS = 32
RATE_PROMPTS = 400  # requests in a Poisson probe: enough that a burst is rare, not so many that a probe is slow
GRID_STEPS_PER_DOUBLING = 8  # the streams a search answers are about 9% apart, well inside the model's error
RATE_STEPS = 5  # bisections of the rate: within 3% of its bracket

Probe = Callable[[Workload], Forecast]


class Verdict(Protocol):
    """What a probe at a load answers: a forecast, or a measurement (`kiln bench --capacity`)."""

    def meets(self, workload: Workload) -> bool: ...


V = TypeVar("V", bound=Verdict)


@dataclass(frozen=True)
class Capacity:
    """The most a setup carries within `workload`'s budget, and its figures at that load."""

    ttft_ms: float | None  # the budget it holds: TTFT p90
    tpot_ms: float | None  # and TPOT p90 (the tighter of tpot_ms and the per-user floor)
    streams: int  # requests in flight at once (closed loop), the whole machine; 0: not even one meets it
    requests_per_s: float  # Poisson arrivals, the whole machine
    at_streams: Forecast | None  # the engine's figures with `streams` in flight
    at_rate: Forecast | None  # and at `requests_per_s`
    gpus: int

    @property
    def met(self) -> bool:
        return self.streams > 0

    @property
    def output_tokens_per_s(self) -> float:
        return self.at_streams.output_tokens_per_s if self.at_streams else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.output_tokens_per_s / self.gpus if self.gpus else 0.0

    def headline(self) -> str:
        return headline_of(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        f = self.at_streams
        return {
            "budget": {"ttft_ms_p90": self.ttft_ms, "tpot_ms_p90": self.tpot_ms, "share": 0.9},
            "streams": self.streams,
            "requests_per_s": round(self.requests_per_s, 3),
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "tokens_per_s_per_user": round(f.tokens_per_s_per_user, 1) if f else None,
            "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
            "ttft_ms_p90": round(f.ttft_ms["p90"], 1) if f else None,
            "tpot_ms_p90": round(f.tpot_ms["p90"], 2) if f else None,
            "ttft_ms_p90_at_rate": round(self.at_rate.ttft_ms["p90"], 1) if self.at_rate else None,
            "tpot_ms_p90_at_rate": round(self.at_rate.tpot_ms["p90"], 2) if self.at_rate else None,
        }


def streams_load(workload: Workload, streams: int) -> Workload:
    return replace(workload, concurrency=streams, request_rate=None, num_prompts=max(MIN_PROMPTS, ROUNDS * streams),
                   steady=True)


def rate_load(workload: Workload, rate: float) -> Workload:
    return replace(workload, concurrency=None, request_rate=rate, num_prompts=RATE_PROMPTS, steady=True)


def stream_grid(ceiling: int, anchors: tuple[int, ...] = ()) -> list[int]:
    """The stream counts a search may answer: 1 to `ceiling` in steps of 2^(1/8) (about 9%), and the `anchors`
    (the engines' own slots), so that the answer does not depend on where the search started."""
    grid = sorted({max(1, round(2 ** (i / GRID_STEPS_PER_DOUBLING)))
                   for i in range(int(math.log2(max(ceiling, 1)) * GRID_STEPS_PER_DOUBLING) + 1)}
                  | {ceiling, *anchors})
    return [n for n in grid if n <= ceiling]


def find_streams(probe: Callable[[Workload], V], workload: Workload, ceiling: int, start: int = 1,
                 anchors: tuple[int, ...] = (), known: Mapping[int, V] | None = None) -> tuple[int, V | None]:
    """The most streams on the grid whose probe (a forecast, or a measurement) meets the budget: galloping from
    `start` (up while it holds, down while it breaks), then bisecting between the last that held and the first
    that broke. `known` holds probes already made, by stream count; where it has `start`'s, the answer is likely
    near it, so the neighbouring count is tried before galloping (and, below it, a single stream)."""
    grid = stream_grid(ceiling, anchors)
    seen: dict[int, V] = {grid.index(n): v for n, v in (known or {}).items() if n in grid}

    def meets(i: int) -> bool:
        if i not in seen:
            seen[i] = probe(streams_load(workload, grid[i]))
        return seen[i].meets(workload)

    def up(j: int) -> int:  # the first count at least twice grid[j]
        return next((k for k in range(j + 1, len(grid)) if grid[k] >= 2 * grid[j]), len(grid))

    def down(j: int) -> int:  # the last count at most half grid[j]
        return next((k for k in range(j - 1, -1, -1) if grid[k] <= grid[j] // 2), -1)

    i = min(range(len(grid)), key=lambda j: abs(grid[j] - start))
    near = i in seen
    if meets(i):
        good, bad = i, len(grid)
        if near and i + 1 < len(grid) and not meets(i + 1):
            return grid[i], seen[i]
        while (nxt := up(good)) < len(grid) and meets(nxt):
            good = nxt
        if nxt < len(grid):
            bad = nxt
        elif good < len(grid) - 1 and meets(len(grid) - 1):
            good = len(grid) - 1
        elif good < len(grid) - 1:
            bad = len(grid) - 1
    else:
        good, bad = -1, i
        if near and i > 0 and meets(i - 1):
            return grid[i - 1], seen[i - 1]
        if near and not meets(0):  # a setup that misses alone, as the slowest do, is settled in one more probe
            return 0, None
        while (prv := down(bad)) >= 0 and not meets(prv):
            bad = prv
        if prv >= 0:
            good = prv
        elif bad > 0 and meets(0):
            good = 0
        elif bad > 0:
            bad = 0
        if good < 0:
            return 0, None
    while bad - good > 1:
        mid = (good + bad) // 2
        if meets(mid):
            good = mid
        else:
            bad = mid
    return grid[good], seen[good]


def find_rate(probe: Probe, workload: Workload, high: float) -> tuple[float, Forecast | None]:
    """The highest Poisson rate at or below `high` whose forecast meets the budget, by bisection."""
    f = probe(rate_load(workload, high))
    if f.meets(workload):
        return high, f
    low, low_f = 0.0, None
    for _ in range(RATE_STEPS):
        mid = (low + high) / 2
        f = probe(rate_load(workload, mid))
        if f.meets(workload):
            low, low_f = mid, f
        else:
            high = mid
    return low, low_f


def capacity(probe: Probe, workload: Workload, gpus: int, slots: int, *, with_rate: bool = True,
             start: int = 1, streams_found: Capacity | None = None,
             known: Mapping[int, Forecast] | None = None) -> Capacity:
    """`workload`'s budget held at the most load: streams first (or those of `streams_found`), then (with_rate)
    the Poisson rate below the rate those streams complete. `slots` are the engines' sequences at once; `known`,
    forecasts already made at some stream counts."""
    if streams_found is not None:
        streams, at_streams = streams_found.streams, streams_found.at_streams
    else:
        streams, at_streams = find_streams(probe, workload, streams_ceiling(slots), start, (slots,), known)
    rate, at_rate = 0.0, None
    if at_streams is not None and with_rate:
        rate, at_rate = find_rate(probe, workload, at_streams.requests_per_s)
    elif at_streams is not None:
        rate = at_streams.requests_per_s
    return Capacity(workload.ttft_ms, workload.tpot_budget_ms, streams, rate, at_streams, at_rate, gpus)


def streams_ceiling(slots: int) -> int:
    """Streams beyond the engines' sequence slots wait in vLLM's queue for one to free: a quarter more than the
    slots already keeps a fifth of the requests waiting, which only the loosest TTFT budget absorbs."""
    return max(1, slots + slots // 4)


def ranking(cap: Capacity) -> tuple[float, float]:
    """Requests/s at the budget, ties broken by output per GPU."""
    rate = cap.at_streams.requests_per_s if cap.at_streams else 0.0
    return (rate, cap.tokens_per_s_per_gpu)


"""Data-parallel ranks of a MoE model step together: the simulator prices one rank's steps against the others as
its own recent steps show them. Judged here against stepping every rank, each step as long as the slowest one
(benchmarks.lockstep_vs_every_rank)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from benchmarks.lockstep_vs_every_rank import every_rank_stepped

from kiln.perf.lockstep import Peers
from kiln.perf.predict import STEADY_SPREAD
from kiln.perf.simulate import Limits, Load, percentile, simulate
from kiln.perf.steps import Step
from kiln.perf.workload import spread_lengths


@dataclass(frozen=True)
class Prefilling:
    """Decoding is cheap, a prompt chunk is not: 10 ms a step plus 20 us a prompt token."""

    @property
    def name(self) -> str:
        return "prefilling"

    def seconds(self, step: Step) -> float:
        return 0.010 + 0.00002 * step.prefill_tokens + 0.000001 * step.decode_seqs


LIMITS = Limits(max_num_seqs=256, max_num_batched_tokens=4096, kv_tokens=10_000_000)
RANKS = 8


def steady(seed: int, streams: int = 24, requests: int = 96) -> Load:
    """A closed loop whose outputs spread from half to one and a half times the mean, in this rank's order."""
    return Load(600, 120, requests, concurrency=streams, warmup=streams,
                output_lens=spread_lengths(120, requests, STEADY_SPREAD, seed=seed))


def test_one_ranks_prompt_holds_up_every_rank_as_stepping_them_all_does() -> None:
    """Eight ranks under a steady load: a rank prefills a prompt every few steps, and some rank does at most
    steps, so each rank's decoding runs at the pace of another's prefill. Priced through one rank's recent steps,
    throughput and time per output token land within 5% of stepping all eight, and well below one rank alone."""
    model = Prefilling()
    every = every_rank_stepped(model, LIMITS, [steady(seed) for seed in range(RANKS)])
    one = simulate(model, LIMITS, steady(0), ranks=RANKS)
    alone = simulate(model, LIMITS, steady(0))
    reference = sum(o.output_tokens for o in every) / every[0].duration_s / RANKS
    tpot = percentile([t for o in every for t in o.tpot_s], 50)
    assert one.output_tokens_per_s == pytest.approx(reference, rel=0.05)
    assert percentile(one.tpot_s, 50) == pytest.approx(tpot, rel=0.05)
    assert alone.output_tokens_per_s > 1.2 * reference


def test_a_first_wave_reaches_every_rank_at_once_and_holds_none_up() -> None:
    """Every request sent at once with the same lengths: the ranks prefill and decode in step, so stepping
    together costs nothing, as it does when all ranks are stepped."""
    model = Prefilling()
    burst = Load(600, 120, 24, concurrency=24)
    every = every_rank_stepped(model, LIMITS, [burst] * RANKS)
    one = simulate(model, LIMITS, burst, ranks=RANKS)
    alone = simulate(model, LIMITS, burst)
    assert one.duration_s == pytest.approx(alone.duration_s)
    assert every[0].duration_s == pytest.approx(alone.duration_s)


def test_the_other_ranks_are_drawn_from_this_ranks_recent_steps() -> None:
    """With no recent steps the others run alike. Once this rank has prefilled in one step of four, the largest of
    seven others' chunks is a prompt with chance 1 - (3/4) ** 7: a decode step is held up that often, and a step
    prefilling as large a prompt is not."""
    model = Prefilling()
    decode = Step(32, 32 * 700.0)
    chunk = Step(32, 32 * 700.0, prefill_tokens=600, prefill_context=600 * 300.0, prefill_seqs=1)
    peers = Peers(RANKS - 1)
    assert peers.seconds(model, decode) == pytest.approx(model.seconds(decode))
    for _ in range(40):
        peers.record(chunk)
        peers.record(decode, repeat=3)
    held = 1 - 0.75 ** 7
    assert peers.seconds(model, decode) == pytest.approx((1 - held) * model.seconds(decode)
                                                         + held * model.seconds(chunk))
    assert peers.seconds(model, chunk) == pytest.approx(model.seconds(chunk))

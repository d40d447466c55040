"""The continuous-batching simulator against what vLLM's scheduler does, with step times simple enough to
work out by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from kiln.perf.simulate import Drafting, Limits, Load, percentile, poisson_arrivals, simulate
from kiln.perf.steps import Step


@dataclass(frozen=True)
class Linear:
    """A step costs `fixed` plus `per_token` for every token in it."""

    fixed: float = 0.010
    per_token: float = 0.0

    @property
    def name(self) -> str:
        return "linear"

    def seconds(self, step: Step) -> float:
        return self.fixed + self.per_token * step.tokens


ROOMY = Limits(max_num_seqs=256, max_num_batched_tokens=8192, kv_tokens=10_000_000)


def test_one_request_at_a_time_takes_one_prefill_step_then_one_step_per_token() -> None:
    out = simulate(Linear(), ROOMY, Load(input_len=100, output_len=11, num_prompts=5, concurrency=1))
    assert out.completed == 5 and out.steps == 5 * 11
    assert out.ttft_s == pytest.approx([0.010] * 5)  # the prefill step samples the first token
    assert out.tpot_s == pytest.approx([0.010] * 5)
    assert out.duration_s == pytest.approx(5 * 11 * 0.010)
    assert out.output_tokens_per_s == pytest.approx(5 * 11 / out.duration_s)


def test_a_batch_decodes_together_and_outputs_scale_with_it() -> None:
    one = simulate(Linear(), ROOMY, Load(100, 50, num_prompts=8, concurrency=1))
    eight = simulate(Linear(), ROOMY, Load(100, 50, num_prompts=8, concurrency=8))
    assert eight.peak_running == 8
    assert eight.output_tokens_per_s == pytest.approx(8 * one.output_tokens_per_s, rel=0.02)


def test_chunked_prefill_spreads_a_long_prompt_over_the_token_budget() -> None:
    limits = Limits(max_num_seqs=8, max_num_batched_tokens=1000, kv_tokens=10_000_000)
    out = simulate(Linear(), limits, Load(input_len=3500, output_len=2, num_prompts=1, concurrency=1))
    assert out.ttft_s == pytest.approx([4 * 0.010])  # 1000 + 1000 + 1000 + 500 tokens


def test_max_num_seqs_queues_the_rest() -> None:
    limits = Limits(max_num_seqs=4, max_num_batched_tokens=8192, kv_tokens=10_000_000)
    out = simulate(Linear(), limits, Load(100, 20, num_prompts=8, concurrency=8))
    assert out.peak_running == 4
    assert max(out.ttft_s) == pytest.approx(20 * 0.010 + 0.010, rel=0.05)  # the second wave waits a full turn


def test_a_full_kv_cache_bounds_admission() -> None:
    limits = Limits(max_num_seqs=256, max_num_batched_tokens=8192, kv_tokens=3 * 150)
    out = simulate(Linear(), limits, Load(100, 40, num_prompts=9, concurrency=9))
    assert out.completed == 9
    assert out.peak_running <= 4


class Counted:
    """A step costs 10 ms, whatever is in it; counts how many times it was asked."""

    name = "counted"

    def __init__(self) -> None:
        self.asked = 0

    def seconds(self, step: Step) -> float:
        self.asked += 1
        return 0.010


def test_decoding_that_leaves_no_room_for_the_next_prompt_is_taken_in_jumps() -> None:
    """While the KV cache cannot take the next prompt, nothing changes until a request finishes: those decode steps
    are priced together, not one by one, and take as long."""
    limits = Limits(max_num_seqs=256, max_num_batched_tokens=8192, kv_tokens=3 * 120 + 20)  # 3 whole requests
    model = Counted()
    out = simulate(model, limits, Load(100, 20, num_prompts=9, concurrency=9))
    assert out.completed == 9 and out.peak_running == 3 and out.preemptions == 0
    assert out.duration_s == pytest.approx(out.steps * 0.010)
    assert model.asked < out.steps / 4, (model.asked, out.steps)


def test_decoding_past_the_kv_cache_preempts_the_newest_and_recomputes_it() -> None:
    limits = Limits(max_num_seqs=256, max_num_batched_tokens=8192, kv_tokens=2 * 100 + 60)
    out = simulate(Linear(), limits, Load(100, 100, num_prompts=2, concurrency=2))
    assert out.completed == 2 and out.preemptions >= 1
    assert out.output_tokens == pytest.approx(200, abs=2)


def test_a_cached_shared_prefix_is_not_prefilled_again() -> None:
    per_token = Linear(fixed=0.001, per_token=0.0001)
    plain = simulate(per_token, ROOMY, Load(2000, 2, num_prompts=4, concurrency=1))
    shared = simulate(per_token, ROOMY, Load(2000, 2, num_prompts=4, concurrency=1, prefix_len=1800))
    assert shared.ttft_s[0] == pytest.approx(plain.ttft_s[0])  # the first request computes the prefix
    assert all(t < plain.ttft_s[0] / 4 for t in shared.ttft_s[1:])


def test_speculative_decoding_emits_the_accepted_tokens_per_step() -> None:
    plain = simulate(Linear(), ROOMY, Load(100, 101, num_prompts=2, concurrency=1))
    drafted = simulate(Linear(), ROOMY, Load(100, 101, num_prompts=2, concurrency=1), Drafting(tokens=3, emitted=2.5))
    assert drafted.tpot_s[0] == pytest.approx(plain.tpot_s[0] / 2.5, rel=0.02)
    assert drafted.output_tokens == pytest.approx(plain.output_tokens, abs=1)


def test_an_open_loop_below_capacity_sees_no_queue() -> None:
    arrivals = tuple(float(i) for i in range(10))  # one a second; each takes 0.11 s
    out = simulate(Linear(), ROOMY, Load(100, 11, num_prompts=10, arrivals=arrivals))
    assert out.ttft_s == pytest.approx([0.010] * 10)
    assert out.duration_s == pytest.approx(9 + 11 * 0.010)


def test_everything_at_once_queues_behind_the_batch_limit() -> None:
    limits = Limits(max_num_seqs=2, max_num_batched_tokens=8192, kv_tokens=10_000_000)
    out = simulate(Linear(), limits, Load(100, 10, num_prompts=6, arrivals=poisson_arrivals(math.inf, 6)))
    assert sorted(out.ttft_s) == pytest.approx([0.01, 0.01, 0.11, 0.11, 0.21, 0.21], abs=0.002)


def test_poisson_arrivals_have_the_asked_rate_and_are_repeatable() -> None:
    times = poisson_arrivals(4.0, 4000, seed=1)
    assert times == poisson_arrivals(4.0, 4000, seed=1)
    assert times[-1] / len(times) == pytest.approx(0.25, rel=0.05)


def test_percentiles_match_numpys_linear_rule_and_weights_count() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([1.0, 10.0], 50, weights=[9, 1]) == 1.0
    assert percentile([], 50) == 0.0


def test_each_request_generates_its_own_length_and_the_longest_sets_the_duration() -> None:
    lengths = (5, 40, 10, 7)
    out = simulate(Linear(), ROOMY, Load(100, 15, num_prompts=4, concurrency=4, output_lens=lengths))
    assert out.completed == 4 and out.output_tokens == pytest.approx(sum(lengths))
    assert out.duration_s == pytest.approx(max(lengths) * 0.010)  # one prefill step, then one token per step
    assert sorted(out.tpot_s) == pytest.approx([0.010] * 4)  # each divided by its own length
    fixed = simulate(Linear(), ROOMY, Load(100, 15, num_prompts=4, concurrency=4))
    assert fixed.output_tokens == pytest.approx(4 * 15) and fixed.duration_s == pytest.approx(15 * 0.010)

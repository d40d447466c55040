"""Capacity at a latency budget: the search (doubling then bisecting streams, bisecting the Poisson rate), the
planner's choice by it, and one predicted figure for one setup wherever it is shown."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from kiln.choice.schema import Choice
from kiln.cli.main import main
from kiln.perf.capacity import find_rate, find_streams, streams_load
from kiln.perf.predict import Forecast, forecast, kiln_steps, limits
from kiln.perf.simulate import Load, simulate
from kiln.perf.workload import PRESETS, Workload, resolve
from kiln.planner.by_capacity import burst, capacity_of
from kiln.planner.demand import demand_of_users
from kiln.planner.search import make_plan, predict_options
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

BUDGET = Workload(1024, 256, ttft_ms=500, tpot_ms=50)


def fake(ttft_ms: float, tpot_ms: float, rate: float = 1.0) -> Forecast:
    return Forecast("fake", 0.0, 0.0, rate, 0.0, {"p50": ttft_ms, "p90": ttft_ms, "p99": ttft_ms},
                    {"p50": tpot_ms, "p90": tpot_ms}, {"p50": tpot_ms})


def test_streams_double_until_the_budget_breaks_then_bisect() -> None:
    asked: list[int] = []

    def probe(w: Workload) -> Forecast:
        assert w.concurrency is not None and w.steady and w.num_prompts >= 3 * w.concurrency
        asked.append(w.concurrency)
        return fake(100 if w.concurrency <= 37 else 900, 20)

    streams, at = find_streams(probe, BUDGET, ceiling=4096)
    assert streams == 35 and at is not None  # the grid's last point at or below 37: 2^(41/8)
    assert asked[:7] == [1, 2, 4, 8, 16, 32, 64] and len(asked) <= 7 + 3
    assert find_streams(probe, BUDGET, ceiling=4096, start=300)[0] == 35  # started elsewhere, the same answer
    assert find_streams(lambda w: fake(900, 20), BUDGET, ceiling=4096) == (0, None)
    assert find_streams(lambda w: fake(100, 20), BUDGET, ceiling=100)[0] == 100  # the ceiling bounds the search


@pytest.mark.parametrize(("limit", "start", "answer", "probes"), [
    (37, 35, 35, 1), (33, 35, 32, 1), (37, 32, 35, None), (20, 35, 19, None)])
def test_a_search_started_at_a_known_probe_tries_its_neighbours_first(limit: int, start: int, answer: int,
                                                                      probes: int | None) -> None:
    """Where the probe at `start` is already known (another setup's answer), one more probe settles an answer at
    or just below it; elsewhere the search gallops on, to the answer a search from one stream finds."""
    asked: list[int] = []

    def probe(w: Workload) -> Forecast:
        assert w.concurrency is not None
        asked.append(w.concurrency)
        return fake(100 if w.concurrency <= limit else 900, 20)

    known = {start: fake(100 if start <= limit else 900, 20)}
    streams, at = find_streams(probe, BUDGET, ceiling=4096, start=start, known=known)
    made = list(asked)
    assert streams == answer == find_streams(probe, BUDGET, ceiling=4096)[0] and at is not None
    assert start not in made
    if probes is not None:
        assert len(made) == probes, made


def test_the_rate_is_bisected_below_what_the_streams_complete() -> None:
    rate, at = find_rate(lambda w: fake(100 if (w.request_rate or 0) <= 3.3 else 900, 20), BUDGET, high=5.0)
    assert at is not None and 3.3 * 0.97 <= rate <= 3.3
    assert find_rate(lambda w: fake(100, 20), BUDGET, high=5.0)[0] == 5.0


def test_a_steady_closed_loop_leaves_its_first_wave_out_of_the_latencies(kiln: Kiln) -> None:
    machine, profile = kiln.machine("h100x1"), kiln.catalog().get("llama-3.1-8b-instruct")
    plan = make_plan(machine, profile, Choice(speculative_decoding=False), kiln.constants)
    assert isinstance(plan, Plan)
    steps, lim = kiln_steps(plan, machine, profile, kiln.constants), limits(plan)
    warm = simulate(steps, lim, Load(1024, 64, 80, concurrency=16, warmup=16))
    cold = simulate(steps, lim, Load(1024, 64, 80, concurrency=16))
    assert warm.completed == cold.completed == 80
    assert (len(cold.ttft_s), len(warm.ttft_s)) == (80, 64)
    assert max(warm.ttft_s) < max(cold.ttft_s)  # the sixteen prompts that arrived at once are left out


def test_the_default_plan_carries_the_most_requests_within_its_budget(kiln: Kiln) -> None:
    """h100x1 with Llama 3.1 8B: the chosen setup's capacity is the highest of every setup that fits (within the
    tie), it meets the budget at its streams and breaks it well beyond them."""
    machine, profile = kiln.machine("h100x1"), kiln.catalog().get("llama-3.1-8b-instruct")
    work = resolve(None)
    plan = make_plan(machine, profile, Choice(), kiln.constants)
    assert isinstance(plan, Plan) and plan.predicted.capacity is not None
    cap = plan.predicted.capacity
    assert cap["streams"] > 0 and cap["budget"] == {"ttft_ms_p90": 500.0, "tpot_ms_p90": 50.0, "share": 0.9}
    assert cap["ttft_ms_p90"] <= 500 and cap["tpot_ms_p90"] <= 50
    assert cap["band"]["requests_per_s"][0] < cap["requests_per_s"] < cap["band"]["requests_per_s"][1]
    steps = kiln_steps(plan, machine, profile, kiln.constants)
    assert forecast(plan, streams_load(work, cap["streams"]), steps, kiln.constants).meets(work)
    beyond = forecast(plan, streams_load(work, 2 * cap["streams"]), steps, kiln.constants)
    assert not beyond.meets(work)
    options, _ = predict_options(machine, profile, Choice(), burst(work), kiln.constants,
                                 lambda p: kiln_steps(p, machine, profile, kiln.constants))
    chosen_rate = capacity_of(plan, work, 1, kiln.constants, steps, with_rate=False).at_streams
    assert chosen_rate is not None
    for o in options:
        rival = capacity_of(o.plan, work, 1, kiln.constants, kiln_steps(o.plan, machine, profile, kiln.constants),
                            with_rate=False)
        theirs = rival.at_streams.requests_per_s if rival.at_streams else 0.0
        assert theirs <= chosen_rate.requests_per_s * 1.02 + 1e-9, o.label


def test_one_setup_has_one_capacity_in_the_plan_and_in_predict(kiln: Kiln) -> None:
    machine, profile = kiln.machine("h100x8"), kiln.catalog().get("llama-3.3-70b-instruct")
    plan = make_plan(machine, profile, Choice(), kiln.constants)
    assert isinstance(plan, Plan) and plan.predicted.capacity is not None
    again = capacity_of(plan, resolve(None), machine.gpu_count, kiln.constants,
                        kiln_steps(plan, machine, profile, kiln.constants)).as_dict()
    shown = {k: v for k, v in plan.predicted.capacity.items() if k != "band"}
    assert shown == again
    assert set(plan.predicted.as_dict()) >= {"capacity"} and "output_tokens_per_s" not in plan.predicted.as_dict()
    assert "carries" in plan.explanation[-1] or any("Chosen for the most requests/s" in x for x in plan.explanation)


@pytest.mark.parametrize("preset", ["chat", "rag", "agent"])
def test_every_preset_with_a_budget_plans_its_capacity(kiln: Kiln, preset: str) -> None:
    plan = make_plan(kiln.machine("h100x1"), kiln.catalog().get("qwen3-8b"), Choice(), kiln.constants,
                     workload=PRESETS[preset].workload)
    assert isinstance(plan, Plan) and plan.predicted.capacity is not None and plan.predicted.capacity["streams"] > 0


def test_a_budget_no_setup_meets_even_alone_says_what_would(kiln: Kiln) -> None:
    tight = replace(BUDGET, ttft_ms=1.0)
    refused = make_plan(kiln.machine("h100x1"), kiln.catalog().get("qwen3-8b"), Choice(), kiln.constants,
                        workload=tight)
    assert isinstance(refused, Refusal) and "concurrency 1" in refused.reason
    assert any(s.startswith("a looser budget") for s in refused.suggestions), refused.suggestions


def test_a_fleet_is_sized_from_one_droplets_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    """`kiln fleet plan --demand R`: ceil(R / one droplet's capacity) droplets of each size, cheapest first, at the
    plan's own capacity; --users N turns users into requests/s by Little's law."""
    assert main(["fleet", "plan", "--demand", "40", "--profile", "llama-3.1-8b-instruct", "--machines",
                 "h100x1,l40s", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    options = {o["machine"]: o for o in out["options"]}
    for o in options.values():
        assert o["droplets"] == math.ceil(40 / o["capacity_requests_per_s"])
        assert o["usd_per_million_output_tokens"] == pytest.approx(
            o["usd_per_hour"] / (40 * 1024 * 3600) * 1e6, rel=1e-3)
    assert [o["usd_per_hour"] for o in out["options"]] == sorted(o["usd_per_hour"] for o in out["options"])
    assert demand_of_users(100, 9.0, streams=10, requests_per_s=10.0) == pytest.approx(10.0)  # 1 s + 9 s a turn
    for bad in (["--users", "0"], ["--demand", "inf"], ["--demand", "nan"], ["--demand", "-1"],
                ["--users", "10", "--think-s", "-5"], ["--users", "10", "--think-s", "nan"]):
        assert main(["fleet", "plan", *bad, "--profile", "qwen3-8b"]) == 2, bad  # a usage error, no traceback
        assert "fix:" in capsys.readouterr().err

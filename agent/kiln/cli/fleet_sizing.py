"""How many droplets a demand needs, for `kiln fleet up` and `kiln fleet scale`: the demand divided by one droplet's
capacity within the budget, where that capacity is the one each droplet's agent plans at boot from the same user-data
(serve.decide), as `kiln fleet plan` divides it."""

from __future__ import annotations

import argparse
import math

from kiln import datafiles
from kiln.choice.resolve import layers_from_inputs, merge
from kiln.choice.sources import RawInputs
from kiln.errors import ConfigError, KilnError
from kiln.perf.workload import resolve as resolve_workload
from kiln.planner.demand import Sizing, demand_of_users, size
from kiln.pricing import hourly_price
from kiln.render.vllm import Runtime
from kiln.serve.decide import decide
from kiln.wiring import Kiln


def add_demand_arguments(parser: argparse.ArgumentParser, load: argparse._MutuallyExclusiveGroup) -> None:
    load.add_argument("--demand", type=float, help="requests per second to carry")
    load.add_argument("--users", type=int, help="users, each sending a request, reading it, and sending the next")
    parser.add_argument("--think-s", type=float, default=0.0, help="with --users: seconds a user waits between a "
                                                                   "reply and the next request (default 0)")


def check_demand(args: argparse.Namespace) -> None:
    if (args.demand is not None and not 0 < args.demand < math.inf) or (args.users is not None and args.users <= 0):
        raise KilnError("the demand must be a number above 0", fix="give --demand R (requests/s) or --users N "
                        "above 0")
    if not 0 <= args.think_s < math.inf:
        raise KilnError(f"--think-s {args.think_s:g} is not a time", fix="give --think-s 0 or more seconds")


def droplets_for(kiln: Kiln, size_slug: str, user_data: str, args: argparse.Namespace) -> tuple[Sizing, float]:
    """The droplets of `size_slug` that carry the demand `args` names, each serving what `user_data` chooses, and
    that demand in requests/s."""
    check_demand(args)
    droplets = datafiles.read_yaml("droplets.yaml")
    fixture = (droplets["sizes"].get(size_slug) or {}).get("fixture")
    if not fixture:
        known = ", ".join(s for s, d in droplets["sizes"].items() if d.get("fixture"))
        raise ConfigError(f"kiln has no machine for the droplet size {size_slug!r} to plan a demand on",
                          fix=f"give the count instead, or one of: {known}")
    resolved = merge(layers_from_inputs(RawInputs(user_data=user_data.encode("utf-8"))))
    decision = decide(kiln, fixture, resolved, Runtime())
    if decision.failure or decision.plan is None or decision.machine is None:
        what, fix = decision.failure or ("no plan", "")
        raise KilnError(f"the droplets' plan: {what}", fix=fix)
    plan, workload = decision.plan, resolve_workload(resolved.choice.workload)
    capacity = plan.predicted.capacity
    if not capacity:
        raise ConfigError(f"the user-data's workload ({workload.shape()}) has no latency budget, so a droplet's "
                          "capacity is not known", fix="give the count, or a workload with ttft_ms or tpot_ms (the "
                          "default, serve, has both)")
    demand = args.demand if args.demand is not None else demand_of_users(
        args.users, args.think_s, int(capacity["streams"]), float(capacity["requests_per_s"]))
    sized = size(demand, fixture, size_slug, f"{plan.layout()} {plan.quantization}", capacity,
                 hourly_price(decision.machine, droplets), workload.output_len)
    if sized is None:
        raise KilnError(f"one {size_slug} droplet carries no load at {workload.budget()}",
                        fix="a larger size or a looser budget (`kiln fleet plan` compares the sizes)")
    return sized, demand


def said(sized: Sizing, demand: float) -> str:
    return (f"kiln fleet: {sized.droplets} droplet(s) of {sized.droplet_size} carry {demand:g} requests/s: each "
            f"carries {sized.capacity_requests_per_s:,.2f} requests/s ({sized.capacity_streams} streams) within the "
            f"budget, serving {sized.setup}")

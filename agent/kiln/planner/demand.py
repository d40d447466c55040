"""How many droplets carry a demand within the latency budget, and what they cost: the demand divided by one
droplet's capacity at the budget, as NVIDIA Dynamo's SLA planner sizes replicas. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kiln.pricing import usd_per_million_tokens


@dataclass(frozen=True)
class Sizing:
    machine: str
    droplet_size: str | None
    setup: str
    capacity_requests_per_s: float  # one droplet, within the budget
    capacity_streams: int
    droplets: int
    usd_per_hour: float | None  # all of them
    usd_per_million_output_tokens: float | None  # at the demand

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "droplet_size": self.droplet_size, "setup": self.setup,
                "capacity_requests_per_s": round(self.capacity_requests_per_s, 3),
                "capacity_streams": self.capacity_streams, "droplets": self.droplets,
                "usd_per_hour": None if self.usd_per_hour is None else round(self.usd_per_hour, 2),
                "usd_per_million_output_tokens": None if self.usd_per_million_output_tokens is None else round(
                    self.usd_per_million_output_tokens, 4)}


def demand_of_users(users: int, think_s: float, streams: int, requests_per_s: float) -> float:
    """Requests/s from `users` who each wait `think_s` between requests: a request lasts streams / rate at the
    capacity's load (Little's law), so each user sends one every (that + think_s) seconds."""
    lasts = streams / requests_per_s if requests_per_s > 0 else math.inf
    return users / (lasts + think_s)


def size(demand_rps: float, machine: str, droplet_size: str | None, setup: str, capacity: dict[str, Any],
         droplet_usd_per_hour: float | None, output_len: int) -> Sizing | None:
    """The droplets of one size that carry `demand_rps`; None when one droplet carries no load within the budget."""
    rate = float(capacity["requests_per_s"])
    if rate <= 0:
        return None
    count = max(1, math.ceil(demand_rps / rate))
    hourly = count * droplet_usd_per_hour if droplet_usd_per_hour is not None else None
    per_million = usd_per_million_tokens(hourly, demand_rps * output_len) if hourly is not None else None
    return Sizing(machine, droplet_size, setup, rate, int(capacity["streams"]), count, hourly, per_million)

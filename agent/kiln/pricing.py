"""What serving costs: a droplet's hourly price and the price of a million output tokens. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln.hardware.model import Machine


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float | None:
    """What a million output tokens cost at this rate; None when nothing is being generated."""
    if tokens_per_s <= 0:
        return None
    return usd_per_hour / (tokens_per_s * 3600) * 1e6


def hourly_price(machine: Machine, droplets: Mapping[str, Any]) -> float | None:
    """The on-demand price of the DigitalOcean size with this machine's GPUs (data/droplets.yaml)."""
    if not machine.gpus:
        return None
    gpu_class, count = machine.gpus[0].spec.class_name, len(machine.gpus)
    for size in droplets.get("sizes", {}).values():
        if size.get("gpu") == gpu_class and size.get("gpu_count") == count and size.get("usd_per_hour"):
            return float(size["usd_per_hour"])
    return None

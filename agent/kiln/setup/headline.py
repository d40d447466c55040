"""A capacity report in words, as the plan, the MOTD and `kiln status` say it. Pure, and light to import: `kiln
status` shows it without loading the performance engine."""

from __future__ import annotations

from typing import Any


def held_phrase(held: float | None) -> str:
    """A band's promise: how often bands like it held on public runs left out of their fit."""
    return "" if held is None else f", held {held:.0%} out of sample"


def capacity_clause(figures: dict[str, Any]) -> str:
    """What a capacity report carries within its budget, with its band: the headline without its verb and output
    (kiln.perf.capacity.Capacity.as_dict, with its band)."""
    budget = figures["budget"]
    terms = [f"TTFT p90 <= {budget['ttft_ms_p90']:,.0f} ms" if budget.get("ttft_ms_p90") is not None else "",
             f"TPOT p90 <= {budget['tpot_ms_p90']:,.0f} ms" if budget.get("tpot_ms_p90") is not None else ""]
    within = " and ".join(t for t in terms if t)
    if not figures["streams"]:
        return f"no load at {within}: one request alone misses it"
    band = figures.get("band")
    likely = (f" (likely {band['requests_per_s'][0]:,.1f} to {band['requests_per_s'][1]:,.1f}"
              f"{held_phrase(band.get('held'))})" if band else "")
    return f"{figures['requests_per_s']:,.1f} requests/s{likely} (about {figures['streams']:,} streams) at {within}"


def headline_of(figures: dict[str, Any]) -> str:
    """The headline of a capacity report (kiln.perf.capacity.Capacity.as_dict, with its band)."""
    if not figures["streams"]:
        return f"carries {capacity_clause(figures)}"
    return f"carries {capacity_clause(figures)}; {figures['output_tokens_per_s']:,.0f} output tok/s there"

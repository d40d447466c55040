from __future__ import annotations

from collections.abc import Callable

import pytest

from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

Planned = Callable[[str, str, str], Plan | Refusal]


@pytest.fixture(scope="session")
def planned(kiln: Kiln) -> Planned:
    """The catalog's plans by (machine, profile, objective), each made once per test process: several tests check
    every profile on every machine, and each plan runs the engine's search."""
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    made: dict[tuple[str, str, str], Plan | Refusal] = {}

    def plan(machine: str, profile: str, objective: str = "throughput") -> Plan | Refusal:
        key = (machine, profile, objective)
        if key not in made:
            made[key] = make_plan(kiln.machine(machine), kiln.catalog().get(profile), Choice(objective=objective),
                                  kiln.constants, alternatives)
        return made[key]

    return plan

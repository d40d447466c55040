"""Every catalog profile on every recorded machine: it plans or refuses clearly, every command line it renders passes
vLLM's own parser, and every line of its explanation is true of the plan. The fast tier checks a sample of the
machines (tests/unit/test_planner.py, test_render.py, test_explanations.py); this sweep takes them all."""

from __future__ import annotations

import pytest
from tests.conftest import Planned
from tests.unit.test_explanations import plans_explain_themselves_truthfully
from tests.unit.test_planner import GPU_FIXTURES, every_profile_plans_or_refuses_clearly
from tests.unit.test_render import rendered_argv_parses_with_vllm

from kiln.wiring import Kiln

# One test process makes every catalog plan once and shares it with the fast tier's samples of the same checks.
pytestmark = pytest.mark.xdist_group("catalog_plans")


@pytest.mark.parametrize("machine", GPU_FIXTURES)
def test_every_profile_plans_or_refuses_clearly_on_every_machine(kiln: Kiln, planned: Planned, machine: str) -> None:
    every_profile_plans_or_refuses_clearly(kiln, planned, machine)


def test_every_rendered_argv_of_every_machine_parses_with_vllm(kiln: Kiln, planned: Planned) -> None:
    rendered_argv_parses_with_vllm(kiln, planned, [*GPU_FIXTURES, "cpu-only"], at_least=60)


def test_every_plan_of_every_machine_explains_itself_truthfully(kiln: Kiln, planned: Planned) -> None:
    plans_explain_themselves_truthfully(kiln, planned, list(kiln.fixtures()), at_least=30)

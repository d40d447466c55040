"""A profile's extra_args may not set what kiln plans: vLLM takes the later of two values, and kiln's flags come
first, so the plan's prediction would be for settings vLLM does not run."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from tests.conftest import Planned
from tests.unit.test_cluster_plan import cluster
from tests.unit.test_render import all_plans

from kiln.planner.cluster import ClusterPlan
from kiln.profiles.schema import PLANNED_FLAGS, Serving, ServingOverride
from kiln.render.cluster import Node, node_args
from kiln.render.vllm import Runtime, vllm_args
from kiln.wiring import Kiln


@pytest.mark.parametrize("extra", [
    ["--max-num-batched-tokens", "8192"],
    ["--max_num_batched_tokens=8192"],
    ["--compilation-config.max_cudagraph_capture_size", "2048"],
    ["-tp", "2"],
    ["--max-num-seqs\n", "64"],
])
def test_extra_args_that_set_a_planned_flag_are_refused_in_any_spelling(extra: list[str]) -> None:
    with pytest.raises(ValidationError, match="kiln plans itself"):
        Serving(max_model_len=4096, extra_args=tuple(extra))
    with pytest.raises(ValidationError, match="kiln plans itself"):
        ServingOverride(extra_args=tuple(extra))


def test_flags_kiln_does_not_plan_pass() -> None:
    serving = Serving(max_model_len=4096, extra_args=("--tokenizer-mode", "deepseek_v32", "--block-size", "256"))
    assert serving.extra_args[-1] == "256"


def _flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("-")}


@pytest.mark.xdist_group("catalog_plans")  # shares the catalog's plans with the render tests
def test_every_flag_kiln_renders_is_one_a_profile_may_not_set(kiln: Kiln, planned: Planned) -> None:
    """The list the profile schema refuses is the renderers' own: every flag of every catalog plan's command line,
    the profile's extra_args aside, and of each node's in a cluster."""
    rendered: set[str] = set()
    for _, _, _, plan in all_plans(kiln, planned, ["h100x8", "b300x8", "cpu-only"]):
        args = vllm_args(plan, plan.instances[0], Runtime())
        rendered |= _flags(args[:len(args) - len(plan.engine.extra_args)])
    for gbps in (3200, None):  # data-parallel ranks across fast links; a pipeline across the VPC
        result = cluster(kiln, "h100x8", 2, "deepseek-v3.2", gbps)
        assert isinstance(result, ClusterPlan)
        for option in (result.chosen, *result.alternatives):
            plan = option.option.plan
            for rank in range(2):
                rendered |= _flags(node_args(plan, Node(rank, 2, "10.10.0.2"), Runtime())) - _flags(
                    list(plan.engine.extra_args))
    assert {"--headless", "--data-parallel-address", "--nnodes", "--max-num-seqs"} <= rendered
    assert rendered <= PLANNED_FLAGS, sorted(rendered - PLANNED_FLAGS)

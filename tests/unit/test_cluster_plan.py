"""Planning one model across several nodes, and each node's vLLM command line."""

from __future__ import annotations

import json

import pytest
from tests.cli import run_kiln
from tests.unit.test_render import vllm_accepts, vllm_parser

from kiln.choice.schema import Choice
from kiln.errors import ConfigError
from kiln.perf.predict import kiln_steps
from kiln.perf.workload import resolve
from kiln.planner.cluster import ClusterPlan, Fleet, plan_cluster
from kiln.planner.search import make_plan
from kiln.render.cluster import DP_RPC_PORT, MASTER_PORT, Node, distributed_ports, node_argv, node_env
from kiln.render.vllm import IMAGE_VLLM, Runtime
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln


def cluster(kiln: Kiln, machine: str, nodes: int, profile: str, gbps: float | None = None,
            choice: Choice | None = None) -> ClusterPlan | Fleet | Refusal:
    m, p = kiln.machine(machine), kiln.catalog().get(profile)
    return plan_cluster(m, nodes, p, choice or Choice(), resolve(None), kiln.constants, kiln.network(None, gbps),
                        lambda plan: kiln_steps(plan, m, p, kiln.constants))


def parse_node(argv: tuple[str, ...]) -> object:
    assert argv[:2] == IMAGE_VLLM
    args = vllm_parser().parse_args(list(argv[2:]))
    vllm_accepts(args)
    return args


def test_the_vpc_figure_comes_from_digitalocean_with_its_source(kiln: Kiln) -> None:
    vpc = kiln.network()
    assert vpc.name == "vpc" and vpc.gbps == 25 and "docs.digitalocean.com" in vpc.source
    with pytest.raises(ConfigError, match="publishes no bandwidth"):
        kiln.network("fabric")
    assert kiln.network("fabric", 3200).gbps == 3200


def test_deepseek_on_two_h100x8_is_split_across_nodes_with_tensor_parallel_inside_each(kiln: Kiln) -> None:
    alone = make_plan(kiln.machine("h100x8"), kiln.catalog().get("deepseek-v3.2"), Choice(), kiln.constants)
    assert isinstance(alone, Refusal)
    result = cluster(kiln, "h100x8", 2, "deepseek-v3.2")
    assert isinstance(result, ClusterPlan)
    assert result.layout.kind == "pipeline" and (result.layout.tp, result.layout.pp) == (8, 2)
    e = result.plan.engine
    assert e.tensor_parallel_size <= 8 and e.pipeline_parallel_size == 2
    # Each GPU holds half the layers: half what one node's GPUs would need, which is why it fits.
    assert result.plan.predicted.weight_bytes_per_gpu < 0.55 * 690e9 / 8
    assert result.chosen.option.forecast.output_tokens_per_s > 0
    # Over the 25 Gbit/s VPC the experts' all-to-all crossing nodes is predicted far slower than the pipeline.
    experts = [o for o in result.alternatives if o.layout.kind == "expert"]
    assert experts and all(o.option.forecast.output_tokens_per_s < 0.2 * result.chosen.option.forecast
                           .output_tokens_per_s for o in experts)
    assert any("25 Gbit/s" in line for line in result.explanation)


def test_a_faster_network_between_nodes_helps_the_experts_layout_most(kiln: Kiln) -> None:
    slow, fast = cluster(kiln, "h100x8", 2, "deepseek-v3.2"), cluster(kiln, "h100x8", 2, "deepseek-v3.2", 3200)
    assert isinstance(slow, ClusterPlan) and isinstance(fast, ClusterPlan)

    def best(result: ClusterPlan, kind: str) -> float:
        every = [result.chosen, *result.alternatives]
        return max(o.option.forecast.output_tokens_per_s for o in every if o.layout.kind == kind)

    gain_experts = best(fast, "expert") / best(slow, "expert")
    gain_pipeline = best(fast, "pipeline") / best(slow, "pipeline")
    assert gain_experts > 5 and 1 <= gain_pipeline < 1.5


def test_a_model_that_fits_one_node_is_a_fleet_never_a_split(kiln: Kiln) -> None:
    result = cluster(kiln, "h100x8", 3, "llama-3.3-70b-instruct")
    assert isinstance(result, Fleet) and result.nodes == 3
    assert result.plan.engine.pipeline_parallel_size == 1
    assert any("fleet" in line for line in result.explanation)
    assert result.forecast is not None and result.forecast.output_tokens_per_s > 0


def test_too_few_nodes_says_how_many_would_do(kiln: Kiln) -> None:
    result = cluster(kiln, "h100x1", 2, "deepseek-v3.2")
    assert isinstance(result, Refusal)
    assert "GiB per GPU" in result.reason and "155" not in result.reason  # one real GPU's memory, not a stack's
    assert result.suggestions[0].startswith("more nodes: it fits")
    needed = int(result.suggestions[0].split("--nodes ")[1].rstrip(")"))
    assert isinstance(cluster(kiln, "h100x1", needed, "deepseek-v3.2"), ClusterPlan)
    assert isinstance(cluster(kiln, "h100x8", 1, "deepseek-v3.2"), Refusal)


def test_every_nodes_command_line_parses_with_vllm(kiln: Kiln) -> None:
    result = cluster(kiln, "h100x8", 2, "deepseek-v3.2", 3200)
    assert isinstance(result, ClusterPlan)
    seen = set()
    for option in (result.chosen, *result.alternatives):
        plan = option.option.plan
        for rank in range(2):
            args = parse_node(node_argv(plan, Node(rank, 2, "10.10.0.2"), Runtime()))
            assert args.headless is (rank == 1)  # type: ignore[attr-defined]
            if option.layout.kind == "pipeline":
                assert (args.nnodes, args.node_rank, args.master_addr, args.master_port) == (  # type: ignore[attr-defined]
                    2, rank, "10.10.0.2", MASTER_PORT)
                assert args.pipeline_parallel_size == 2  # type: ignore[attr-defined]
            else:
                local = option.layout.dp // 2
                assert args.data_parallel_size == option.layout.dp  # type: ignore[attr-defined]
                assert args.data_parallel_size_local == local  # type: ignore[attr-defined]
                assert args.data_parallel_address == "10.10.0.2"  # type: ignore[attr-defined]
                assert args.data_parallel_rpc_port == DP_RPC_PORT  # type: ignore[attr-defined]
                assert args.data_parallel_start_rank == (rank * local if rank else None)  # type: ignore[attr-defined]
                assert args.enable_expert_parallel is True  # type: ignore[attr-defined]
            seen.add(option.layout.kind)
        assert distributed_ports(plan) == ((MASTER_PORT,) if option.layout.kind == "pipeline" else (DP_RPC_PORT,))
    assert seen == {"pipeline", "expert"}


def test_kiln_plan_nodes_prints_each_node_and_json(kiln: Kiln) -> None:
    done = run_kiln("plan", "--machine", "h100x8", "--nodes", "2", "--profile", "deepseek-v3.2",
                           "--json", check=True)
    data = json.loads(done.stdout)
    assert data["kind"] == "cluster" and len(data["node_argv"]) == 2
    assert "--headless" in data["node_argv"][1] and "--headless" not in data["node_argv"][0]
    assert data["network"]["gbps"] == 25 and data["predicted"]["engine"] == "kiln"
    text = run_kiln("plan", "--machine", "h100x8", "--nodes", "2", "--profile", "deepseek-v3.2",
                           "--workload", "chat", check=True).stdout
    assert "node 1 (headless)" in text and "Predicted:" in text
    assert "`cluster: {name: NAME, nodes: 2}` and `do_token`, tag them kiln-cluster:NAME" in text
    fleet = run_kiln("plan", "--machine", "h100x8", "--nodes", "2", "--profile",
                            "llama-3.3-70b-instruct", "--json", check=True)
    assert json.loads(fleet.stdout)["kind"] == "fleet"
    refused = run_kiln("plan", "--machine", "h100x1", "--nodes", "2", "--profile", "deepseek-v3.2")
    assert refused.returncode == 2 and "--nodes" in refused.stderr
    for count in ("0", "1"):  # not read as "one machine": the flag asks for a cluster
        refused = run_kiln("plan", "--machine", "h100x8", "--nodes", count, "--profile", "deepseek-v3.2")
        assert refused.returncode == 2 and f"a cluster has 2 to 16 nodes; asked for {count}" in refused.stderr


def test_a_plan_for_one_machine_is_unchanged_by_the_cluster_fields(kiln: Kiln) -> None:
    plan = make_plan(kiln.machine("h100x8"), kiln.catalog().get("llama-3.3-70b-instruct"), Choice(), kiln.constants)
    assert isinstance(plan, Plan)
    assert plan.engine.pipeline_parallel_size == 1 and plan.engine.schedulers == plan.engine.data_parallel_size


def test_each_node_talks_to_the_others_from_its_private_address(kiln: Kiln) -> None:
    result = cluster(kiln, "h100x8", 2, "deepseek-v3.2")
    assert isinstance(result, ClusterPlan)
    env = node_env(result.plan, Node(1, 2, "10.10.0.2", address="10.10.0.3", interface="eth1"), Runtime())
    assert env["VLLM_HOST_IP"] == "10.10.0.3"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "VLLM_HOST_IP" not in node_env(result.plan, Node(0, 2, "10.10.0.2"), Runtime())

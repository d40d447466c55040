"""`kiln plan --nodes N`: one model across N machines of a kind, or N replicas when one machine holds it."""

from __future__ import annotations

import argparse
from typing import Any

from kiln.cli import planargs
from kiln.cli.output import print_json
from kiln.cli.predict import option_dict
from kiln.perf.predict import kiln_steps
from kiln.perf.workload import resolve
from kiln.planner.cluster import ClusterPlan, Fleet, plan_cluster
from kiln.render.cluster import Node, distributed_ports, node_argv
from kiln.setup.types import Refusal
from kiln.wiring import Kiln


def cmd_plan_nodes(kiln: Kiln, args: argparse.Namespace) -> int:
    machine = kiln.machine(args.machine)
    profile = kiln.profile(args.profile, args.model, revision=getattr(args, "revision", None))
    choice = planargs.plan_choice(args)
    workload = planargs.workload_from(args) if planargs.workload_given(args) else resolve(None)
    network = kiln.network(args.network, args.inter_node_gbps)
    result = plan_cluster(machine, args.nodes, profile, choice, workload, kiln.constants, network,
                          lambda plan: kiln_steps(plan, machine, profile, kiln.constants))
    if isinstance(result, Refusal):
        return planargs.refused(args, result)
    runtime = planargs.runtime_for(args)
    local = profile.local_model
    if isinstance(result, Fleet):
        data = fleet_dict(result)
        print_json(data) if args.json else print(fleet_text(result))
        return 0
    argvs = [list(node_argv(result.plan, Node(rank, result.nodes, args.head_address), runtime, local_model=local))
             for rank in range(result.nodes)]
    if args.json:
        print_json(cluster_dict(result, argvs, workload.as_dict()))
    else:
        print(cluster_text(result, argvs))
    return 0


def fleet_dict(fleet: Fleet) -> dict[str, Any]:
    return {"kind": "fleet", "nodes": fleet.nodes, "per_node": {
        "machine": fleet.plan.machine, "quantization": fleet.plan.quantization,
        "tensor_parallel_size": fleet.plan.tensor_parallel_size, "instances": len(fleet.plan.instances)},
        "predicted": fleet.forecast.as_dict() if fleet.forecast else None,
        "explanation": list(fleet.explanation)}


def fleet_text(fleet: Fleet) -> str:
    return "\n".join(["Fleet, not a cluster:", *(f"  - {line}" for line in fleet.explanation)])


def cluster_dict(cluster: ClusterPlan, argvs: list[list[str]], workload: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "cluster", "nodes": cluster.nodes, "machine": cluster.machine.name,
            "layout": {"kind": cluster.layout.kind, "tensor_parallel_size": cluster.layout.tp,
                       "pipeline_parallel_size": cluster.layout.pp, "data_parallel_size": cluster.layout.dp},
            "network": {"name": cluster.network.name, "gbps": cluster.network.gbps,
                        "latency_us": cluster.network.latency_us, "source": cluster.network.source},
            "workload": workload, "predicted": cluster.chosen.option.forecast.as_dict(),
            "head_ports": list(distributed_ports(cluster.plan)),
            "node_argv": argvs, "alternatives": [{"layout": o.layout.label, **option_dict(o.option)}
                                                 for o in cluster.alternatives],
            "explanation": list(cluster.explanation)}


def cluster_text(cluster: ClusterPlan, argvs: list[list[str]]) -> str:
    f = cluster.chosen.option.forecast
    lines = [f"Cluster: {cluster.nodes} x {cluster.machine.name}, {cluster.layout.label}",
             f"Predicted: {f.output_tokens_per_s:,.0f} output tok/s, {f.tokens_per_s_per_user:,.1f} tok/s per user, "
             f"TTFT p50 {f.ttft_ms['p50']:,.0f} ms, TPOT p50 {f.tpot_ms['p50']:.1f} ms ({f.engine})", ""]
    lines += [f"  - {line}" for line in cluster.explanation]
    ports = ", ".join(map(str, distributed_ports(cluster.plan)))
    lines += ["", f"Each node's command (the head listens on {ports} for the others, on the private network):"]
    for rank, argv in enumerate(argvs):
        lines.append(f"  node {rank} ({'head' if rank == 0 else 'headless'}): {' '.join(argv)}")
    lines += ["", f"At boot, each node's agent runs its own: give all {cluster.nodes} droplets the same user-data with "
                  f"`cluster: {{name: NAME, nodes: {cluster.nodes}}}` and `do_token`, tag them kiln-cluster:NAME, "
                  "and create them in one VPC of their own."]
    return "\n".join(lines)

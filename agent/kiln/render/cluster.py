"""A cluster plan as one vLLM command line per node. Pure.

The head (rank 0) runs the API server the router and the front reach; the others run headless, holding only
their GPUs' workers or engine ranks. Two of vLLM's multi-node paths, both on its multiprocessing backend:
  - a pipeline over nodes: `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`
    (vLLM's docs, "Multi-node deployment with multiprocessing");
  - data parallel over nodes: `--data-parallel-size-local`, `--data-parallel-address`,
    `--data-parallel-rpc-port`, and `--data-parallel-start-rank` on the headless nodes
    (vLLM's docs, "Data Parallel Deployment", and its DeepSeek multi-node recipe).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.render.vllm import Runtime, instance_env, vllm_args
from kiln.setup.types import Plan

MASTER_PORT = 29500  # torch.distributed's conventional rendezvous port
DP_RPC_PORT = 13345  # the port vLLM's data-parallel recipes use for the head's coordinator


@dataclass(frozen=True)
class Node:
    rank: int
    nodes: int
    head_address: str  # the head's private address: every node dials it, never over the public network
    address: str | None = None  # this node's private address
    interface: str | None = None  # the network interface that holds it (eth1, a droplet's VPC interface)

    @property
    def is_head(self) -> bool:
        return self.rank == 0


def node_env(plan: Plan, node: Node, runtime: Runtime, *, local_model: bool = False) -> dict[str, str]:
    """The instance's environment, plus where this node talks to the others: without them Gloo and NCCL pick the
    host name's address (often loopback) and vLLM's message queues bind 0.0.0.0, and the nodes never meet."""
    env = instance_env(plan, plan.instances[0], runtime, local_model=local_model)
    if node.address:
        env["VLLM_HOST_IP"] = node.address
    if node.interface:
        env["GLOO_SOCKET_IFNAME"] = node.interface
        env["NCCL_SOCKET_IFNAME"] = node.interface
    return env


def distributed_ports(plan: Plan) -> tuple[int, ...]:
    """The TCP ports the head listens on for the other nodes (the firewall opens them to the VPC only)."""
    return (MASTER_PORT,) if plan.engine.pipeline_parallel_size > 1 else (DP_RPC_PORT,)


def node_args(plan: Plan, node: Node, runtime: Runtime, *, local_model: bool = False) -> list[str]:
    """The flags after the launcher for one node; vLLM's own parser accepts every one (tests check it)."""
    e = plan.engine
    args = vllm_args(plan, plan.instances[0], runtime, local_model=local_model)
    if e.pipeline_parallel_size > 1:
        args += ["--nnodes", str(node.nodes), "--node-rank", str(node.rank), "--master-addr", node.head_address,
                 "--master-port", str(MASTER_PORT)]
    else:
        local = e.data_parallel_size // node.nodes
        args += ["--data-parallel-size-local", str(local), "--data-parallel-address", node.head_address,
                 "--data-parallel-rpc-port", str(DP_RPC_PORT)]
        if not node.is_head:
            args += ["--data-parallel-start-rank", str(node.rank * local)]
    if not node.is_head:
        args.append("--headless")
    return args


def node_argv(plan: Plan, node: Node, runtime: Runtime, *, local_model: bool = False) -> tuple[str, ...]:
    return (*runtime.serve_command(), *node_args(plan, node, runtime, local_model=local_model))

"""Planning across several machines of one kind. Pure.

A model that fits one node never spans nodes: N such nodes are a fleet of N replicas behind a load balancer.
A model that does not fit one node is split the ways vLLM runs across nodes, each predicted for the workload
with the network the droplets really have between them, and the best chosen:
  - pipeline: tensor parallel inside each node over NVLink, one pipeline stage per node (vLLM's `--nnodes`);
  - expert (MoE models): data parallel over every GPU of every node, the routed experts spread over all of them
    (vLLM's multi-node data parallel, as in its DeepSeek recipes), attention on one GPU per rank or on a node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kiln.choice.schema import Choice
from kiln.hardware.model import Gpu, Machine
from kiln.perf.predict import Forecast, forecast
from kiln.perf.steps import PipelineSteps, RooflineSteps, StepModel
from kiln.perf.workload import Workload
from kiln.planner.explain import Option, explain
from kiln.planner.plan import Context, fit_plans
from kiln.planner.precision import precision_options
from kiln.planner.search import Choosing, choose, make_plan, plan_of
from kiln.profiles.schema import Profile
from kiln.setup import capacity as cap
from kiln.setup.types import Constants, InstancePlan, Plan, Refusal

GIB = 2**30
MAX_NODES = 16


@dataclass(frozen=True)
class Network:
    """The link between two nodes of a cluster (data/network.yaml)."""

    name: str
    gbps: float  # one node's bandwidth to the others, one direction
    latency_us: float  # one small message between nodes, as NCCL over TCP sees it
    source: str

    @property
    def bytes_s(self) -> float:
        return self.gbps * 1e9 / 8


@dataclass(frozen=True)
class Layout:
    kind: str  # pipeline | expert
    nodes: int
    tp: int
    pp: int = 1
    dp: int = 1

    @property
    def label(self) -> str:
        if self.kind == "pipeline":
            return f"TP{self.tp} x PP{self.pp} (a pipeline stage per node)"
        return f"TP{self.tp} x DP{self.dp} + EP over {self.nodes} nodes"


@dataclass(frozen=True)
class ClusterOption:
    layout: Layout
    option: Option  # the plan as each node runs it, and its forecast for the whole cluster


@dataclass(frozen=True)
class ClusterPlan:
    nodes: int
    machine: Machine  # one node
    network: Network
    chosen: ClusterOption
    alternatives: tuple[ClusterOption, ...]
    explanation: tuple[str, ...]

    @property
    def plan(self) -> Plan:
        return self.chosen.option.plan

    @property
    def layout(self) -> Layout:
        return self.chosen.layout


@dataclass(frozen=True)
class Fleet:
    """The model fits one node: every node serves its own replica behind a load balancer."""

    nodes: int
    plan: Plan  # one node's
    forecast: Forecast | None  # the fleet's: every node under its share of the workload
    explanation: tuple[str, ...]


StepsFor = Callable[[Plan], StepModel]


def _stacked(machine: Machine, stages: int, c: Constants, profile: Profile) -> Machine:
    """One node's GPUs, each holding `stages` GPUs' memory: a pipeline of `stages` nodes as the single-node
    planner sees it (every layer at the node's tensor-parallel width). The stages beyond the first each pay again
    what the driver reserves and what vLLM's activations and graphs take."""
    reserved = int(c.get("vllm", "driver_reserved_bytes"))
    plan_c = c.get("planning")
    runtime = cap.overhead_bytes_per_gpu(profile, machine.gpu_count, plan_c["max_num_seqs"]["throughput"],
                                         plan_c["max_num_batched_tokens"]["throughput"],
                                         cap.cudagraph_capture_count(512), c)
    gpus = tuple(replace(g, memory_bytes=g.memory_bytes * stages - (stages - 1) * (reserved + runtime))
                 for g in machine.gpus)
    return replace(machine, gpus=gpus)


def _joined(machine: Machine, nodes: int) -> Machine:
    """Every GPU of `nodes` nodes as one machine, so the planner can spread data-parallel ranks over them."""
    count = machine.gpu_count * nodes
    gpus: list[Gpu] = [replace(g, index=n * machine.gpu_count + g.index) for n in range(nodes) for g in machine.gpus]
    linked = tuple(tuple(True for _ in range(count)) for _ in range(count))
    return replace(machine, gpus=tuple(gpus), nvlink=linked, topology=())


def _per_node(plan: Plan, machine: Machine, nodes: int, layout: Layout) -> Plan:
    """The plan as each node runs it: one server on all its GPUs; the engine's sizes are the cluster's."""
    engine = replace(plan.engine, pipeline_parallel_size=layout.pp)
    first = plan.instances[0]
    local = tuple(range(machine.gpu_count))
    instance = InstancePlan(name="vllm-0", gpus=local, gpu_uuids=tuple(g.uuid for g in machine.gpus),
                            device_minors=tuple(g.minor_number if g.minor_number is not None else g.index
                                                for g in machine.gpus),
                            port=first.port, numa_node=None, cpus=())
    weights = plan.predicted.weight_bytes_per_gpu // layout.pp
    kv = plan.predicted.kv_cache_bytes_per_gpu // layout.pp
    predicted = replace(plan.predicted, weight_bytes_per_gpu=weights, kv_cache_bytes_per_gpu=kv)
    return replace(plan, machine=f"{nodes} x {machine.name}", engine=engine, instances=(instance,),
                   predicted=predicted)


def _layouts(machine: Machine, nodes: int, profile: Profile, choice: Choice) -> list[Layout]:
    g = machine.gpu_count
    out = [Layout("pipeline", nodes, tp=g, pp=nodes)]
    if profile.architecture.moe is not None and choice.expert_parallel is not False:
        out.append(Layout("expert", nodes, tp=1, dp=nodes * g))
        if g > 1:
            out.append(Layout("expert", nodes, tp=g, dp=nodes))
    return out


def _layout_plan(machine: Machine, profile: Profile, choice: Choice, c: Constants, layout: Layout,
                 speculative: bool | None, shortest_context: int) -> Plan | Refusal:
    base = choice.model_copy(update={"tensor_parallel_size": layout.tp, "instances": 1,
                                     "speculative_decoding": speculative})
    if layout.kind == "pipeline":
        made = fit_plans(_stacked(machine, layout.pp, c, profile), profile,
                         base.model_copy(update={"data_parallel_size": None, "expert_parallel": False}), c,
                         shortest_context=shortest_context)
    else:
        made = fit_plans(_joined(machine, layout.nodes), profile,
                         base.model_copy(update={"data_parallel_size": layout.dp, "expert_parallel": True}), c,
                         shortest_context=shortest_context)
    return made if isinstance(made, Refusal) else _per_node(made[0], machine, layout.nodes, layout)


def _misfit(machine: Machine, profile: Profile, choice: Choice, c: Constants, layout: Layout) -> str | None:
    """Why a layout does not fit, in one node's real GPUs (the planner saw stacked or joined ones)."""
    options = precision_options(profile, machine.gpus[0].architecture)
    if choice.quantization and choice.quantization != "auto":
        options = [o for o in options if o.precision == choice.quantization]
    if not options:
        return None
    precision = options[0].precision
    if layout.kind == "pipeline":
        weights = cap.weight_bytes(profile, precision) // (layout.tp * layout.pp)
    else:
        weights = cap.weight_bytes_per_gpu(profile, precision, layout.tp, layout.tp * layout.dp)
    utilization = choice.gpu_memory_utilization or c.get("vllm", "default_gpu_memory_utilization")
    usable = Context(machine, profile, choice, c, "throughput", utilization).gpu_memory * utilization
    return (f"{precision} weights {weights / GIB:.1f} GiB per GPU leave too little of the {usable / GIB:.1f} GiB "
            "vLLM may use for its runtime and a KV cache")


def cluster_steps(profile: Profile, layout: Layout, network: Network, node_steps: StepModel) -> StepModel:
    """The step time across nodes: a pipeline adds each hand-over between stages; with experts over every node,
    the all-to-all's share for other nodes crosses the network, which each node's GPUs share."""
    if layout.kind == "pipeline":
        return PipelineSteps(node_steps, layout.pp, hidden_size=profile.architecture.hidden_size,
                             link_bytes_s=network.bytes_s, latency_s=network.latency_us * 1e-6)
    if not isinstance(node_steps, RooflineSteps):
        raise ValueError(f"{node_steps.name} cannot model an all-to-all across nodes; use kiln's engine")
    gpus_per_node = layout.tp * layout.dp // layout.nodes
    remote = (layout.nodes - 1) / layout.nodes
    nvlink = node_steps.hardware.link_bytes_s
    per_gpu = network.bytes_s / gpus_per_node
    blended = 1 / (remote / per_gpu + (1 - remote) / nvlink)
    return replace(node_steps, all_to_all_link=(blended, network.latency_us * 1e-6))


def _fleet(machine: Machine, nodes: int, plan: Plan, workload: Workload | None, c: Constants,
           steps_for: StepsFor) -> Fleet:
    per_node = None
    if workload is not None:
        share = replace(workload, num_prompts=max(workload.num_prompts // nodes, 1),
                        concurrency=None if workload.concurrency is None else max(workload.concurrency // nodes, 1),
                        request_rate=None if workload.request_rate is None else workload.request_rate / nodes)
        one = forecast(plan, share, steps_for(plan), c)
        per_node = replace(one, output_tokens_per_s=one.output_tokens_per_s * nodes,
                           total_tokens_per_s=one.total_tokens_per_s * nodes,
                           requests_per_s=one.requests_per_s * nodes)
    split = f"TP{plan.tensor_parallel_size} x {len(plan.instances)}"
    lines = [f"{plan.profile} fits one {machine.name} ({plan.quantization}, {split}), so it is never split across "
             f"nodes: the network between droplets is far slower than NVLink inside one.",
             f"{nodes} nodes are a fleet: {nodes} independent replicas behind a load balancer "
             f"(`kiln fleet up --count {nodes}`), each planned as one node; a node lost takes only its share."]
    if per_node is not None:
        lines.append(f"Predicted for the fleet: {per_node.output_tokens_per_s:,.0f} output tok/s "
                     f"({nodes} x {per_node.output_tokens_per_s / nodes:,.0f}).")
    return Fleet(nodes, plan, per_node, tuple(lines))


def plan_cluster(machine: Machine, nodes: int, profile: Profile, choice: Choice, workload: Workload,
                 c: Constants, network: Network, steps_for: StepsFor) -> ClusterPlan | Fleet | Refusal:
    """Serve `profile` on `nodes` machines like `machine`, for `workload`, over `network`.

    `steps_for` gives one node's step model for a plan (kiln's roofline or AIConfigurator's data)."""
    if not 2 <= nodes <= MAX_NODES:
        return Refusal(f"a cluster has 2 to {MAX_NODES} nodes; asked for {nodes}",
                       ("leave out --nodes to plan one machine",))
    if profile.cpu_only or not machine.gpus:
        return Refusal(f"{profile.name} on {machine.name}: clusters are planned for GPU machines",
                       ("plan a GPU machine, e.g. --machine h100x8",))
    fits = fit_plans(machine, profile, choice, c, shortest_context=workload.request_tokens)
    if not isinstance(fits, Refusal):
        found = choose(machine, profile, choice, workload, c, steps_for, closest=True)
        one = plan_of(machine, profile, choice, found, workload, c) if isinstance(found, Choosing) else fits[0]
        return _fleet(machine, nodes, one, workload, c, steps_for)
    alone = fits
    if workload.finds_capacity:
        # Layouts across nodes are compared by their output with every request at once within the TPOT budget:
        # their capacity at a TTFT budget is not searched (each probe would simulate every node's pipeline).
        workload = replace(workload, request_rate=math.inf, ttft_ms=None)
    options: list[ClusterOption] = []
    reasons: list[str] = []
    specs: list[bool | None] = [choice.speculative_decoding] if choice.speculative_decoding is not None else (
        [False, True] if profile.speculative else [False])
    for layout in _layouts(machine, nodes, profile, choice):
        for spec in specs:
            made = _layout_plan(machine, profile, choice, c, layout, spec, workload.request_tokens)
            if isinstance(made, Refusal):
                reasons.append(f"{layout.label}: {_misfit(machine, profile, choice, c, layout) or made.reason}")
                break
            steps = cluster_steps(profile, layout, network, steps_for(made))
            options.append(ClusterOption(layout, Option(made, forecast(made, workload, steps, c))))
    if not options:
        more = next((n for n in range(nodes + 1, MAX_NODES + 1) if isinstance(
            _layout_plan(machine, profile, choice, c, Layout("pipeline", n, tp=machine.gpu_count, pp=n), False,
                         workload.request_tokens),
            Plan)), None)
        return Refusal(f"{profile.name} does not fit on {nodes} x {machine.name}: "
                       + (reasons[0] if reasons else "no layout fits"),
                       (f"more nodes: it fits {more} (--nodes {more})" if more else
                        f"a machine with more GPU memory: it does not fit {MAX_NODES} x {machine.name} either",
                        *reasons[1:]))
    objective = choice.objective or "throughput"
    meeting = [o for o in options if o.option.forecast.meets(workload)] or options

    def score(o: ClusterOption) -> tuple[float, float]:
        f = o.option.forecast
        return (-f.tpot_ms["p50"], f.output_tokens_per_s) if objective == "latency" else (
            f.output_tokens_per_s, -f.tpot_ms["p50"])

    ranked = sorted(meeting, key=score, reverse=True) + [o for o in options if o not in meeting]
    best, others = ranked[0], ranked[1:]
    lines = _explain_cluster(machine, nodes, alone, network, best, others, workload, objective)
    return ClusterPlan(nodes, machine, network, best, tuple(others), tuple(lines))


def _explain_cluster(machine: Machine, nodes: int, alone: Refusal, network: Network, best: ClusterOption,
                     others: Sequence[ClusterOption], workload: Workload, objective: str) -> list[str]:
    plan = best.option.plan
    lines = [f"One {machine.name} is not enough: {alone.reason}.",
             f"Between nodes: {network.name}, {network.gbps:g} Gbit/s per node and about {network.latency_us:g} us "
             f"({network.source}).",
             f"Layout: {best.layout.label}; {plan.quantization} weights "
             f"{plan.predicted.weight_bytes_per_gpu / GIB:.1f} GiB per GPU, KV cache "
             f"{plan.predicted.kv_cache_tokens_per_instance:,} tokens across the cluster."]
    if best.layout.kind == "pipeline":
        lines.append("Tensor parallel stays inside each node over NVLink; only the hidden states of each batch "
                     "cross the network, once per stage, so the slow link carries little.")
    else:
        lines.append("Every GPU runs its own data-parallel rank; the routed experts are spread over all "
                     f"{best.layout.tp * best.layout.dp} GPUs and each MoE layer's all-to-all crosses the network "
                     "for the experts on other nodes.")
    return lines + explain(best.option, [o.option for o in others], workload, objective)


def cpu_pipeline(machine: Machine, nodes: int, profile: Profile, choice: Choice, c: Constants) -> Plan | Refusal:
    """A CPU profile (kiln's test model) over `nodes` machines: one pipeline stage per node, so vLLM's multi-node
    path runs where there is no GPU. Nothing is gained by it but the path itself; GPU profiles go through
    plan_cluster, which never splits a model that fits one node."""
    one = make_plan(machine, profile, choice.model_copy(update={"instances": 1}), c)
    if isinstance(one, Refusal):
        return one
    engine = replace(one.engine, pipeline_parallel_size=nodes)
    return replace(one, machine=f"{nodes} x {machine.name}", engine=engine, instances=one.instances[:1],
                   explanation=(*one.explanation, f"{profile.name} runs as a pipeline of {nodes} stages, one per "
                                "node, over vLLM's multi-node path (a CPU test profile: the split is for the path, "
                                "not for speed)."))

"""The boot's decision: detect the machine, read the user's choice, pick the profile and plan, with the fallback.

Never raises for bad input: every problem is reported with its fix, and the best plan that can be made is returned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln.choice.items import LoraAdapter, ModelItem
from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import SECRET_FIELDS, Choice, Problem, tls_summary
from kiln.choice.select import FALLBACK_PROFILE, select_profile
from kiln.cluster.membership import Membership
from kiln.errors import KilnError
from kiln.hardware.model import Machine
from kiln.perf.predict import kiln_steps
from kiln.perf.workload import resolve as resolve_workload
from kiln.planner.cluster import ClusterPlan, Fleet, cpu_pipeline, plan_cluster
from kiln.planner.search import choose, make_plan, plan_of
from kiln.planner.several import SeveralPlan, plan_several
from kiln.profiles.schema import Profile
from kiln.render.cluster import Node, node_argv, node_env
from kiln.render.vllm import RenderedInstance, Runtime, plan_document, render_instances
from kiln.setup.types import LoraModule, Plan, Refusal
from kiln.wiring import Kiln

# Choice fields that override the planner; without them a profile gets the planner's own settings. Every other
# field says what to serve or how it is reached (a test holds the two lists to the choice's fields).
OVERRIDES = ("objective", "max_model_len", "instances", "tensor_parallel_size", "data_parallel_size",
             "expert_parallel", "quantization", "kv_cache_dtype", "speculative_decoding", "gpu_memory_utilization",
             "workload")
NOT_OVERRIDES = ("profile", "model", "revision", "api_key", "hf_token", "price_per_hour", "api_keys", "tls", "cluster",
                 "do_token", "trust_remote_code", "models")


@dataclass
class ServedModel:
    """One more model beside the first when a machine serves several: its plan, its names and its instances."""

    name: str
    profile: Profile
    plan: Plan
    gpus: tuple[int, ...]
    share: float | None
    rendered: list[RenderedInstance] = field(default_factory=list)

    @property
    def names(self) -> tuple[str, ...]:
        """What clients may ask for in `model`: its names and its adapters'."""
        return self.plan.engine.served_and_adapters

    def report(self) -> dict[str, Any]:
        return {"name": self.name, "profile": self.profile.name, "task": self.profile.task, "gpus": list(self.gpus),
                "memory_share": self.share, "served_names": list(self.names),
                "plan": plan_document(self.plan, self.rendered, max(len(self.gpus), 1))}


@dataclass
class Decision:
    choice: ResolvedChoice
    problems: list[Problem] = field(default_factory=list)
    machine: Machine | None = None
    profile: Profile | None = None
    plan: Plan | None = None
    rendered: list[RenderedInstance] = field(default_factory=list)
    failure: tuple[str, str] | None = None  # what, fix: nothing can be served
    node: Node | None = None  # this machine's part of a cluster; None: it serves alone
    # With several models: every one, the first included (whose plan, profile and instances are the fields above)
    models: list[ServedModel] = field(default_factory=list)

    def render(self, runtime: Runtime) -> None:
        """The plan's instances for this runtime; again when the runtime changes after planning (the cache disk)."""
        if not (self.plan and self.profile):
            return
        placed = replace(runtime, first_instance_port=None)  # placement gave every model's instances their ports
        for served in self.models:
            served.rendered = render_instances(served.plan, placed, local_model=served.profile.local_model)
        if self.models:
            self.rendered = self.models[0].rendered
            return
        local = self.profile.local_model
        if self.node is None:
            self.rendered = render_instances(self.plan, runtime, local_model=local)
            return
        first = render_instances(self.plan, runtime, local_model=local)[0]  # a node runs one server
        self.rendered = [replace(first, argv=node_argv(self.plan, self.node, runtime, local_model=local),
                                 env=node_env(self.plan, self.node, runtime, local_model=local))]

    def choice_report(self) -> dict[str, Any]:
        values = json.loads(self.choice.choice.model_dump_json(exclude=set(SECRET_FIELDS), exclude_none=True))
        return {"values": values, "origins": dict(self.choice.origins), "summary": self.choice.summary(),
                "api_key_set": self.choice.choice.api_key is not None,
                "hf_token_set": self.choice.choice.hf_token is not None,
                "api_key_names": sorted(self.choice.choice.api_keys or ()),
                "tls": tls_summary(self.choice.choice.tls),
                "profile": self.profile.name if self.profile else None,
                "problems": [p.as_dict() for p in self.problems]}

    def plan_report(self) -> dict[str, Any] | None:
        if not (self.plan and self.machine):
            return None
        document = plan_document(self.plan, self.rendered, self.machine.gpu_count)
        if self.models:
            document["models"] = [served.report() for served in self.models]
        return document

    @property
    def all_rendered(self) -> list[RenderedInstance]:
        """Every instance on the machine, of every model."""
        return [r for served in self.models for r in served.rendered] if self.models else self.rendered


def _refusal_problem(refusal: Refusal, profile: str, then: str) -> Problem:
    fix = "; ".join(refusal.suggestions) or "choose a smaller profile"
    return Problem("plan", "profile", f"{profile}: {refusal.reason}; {then}", fix)


def first_of_several(choice: Choice) -> tuple[Choice, Problem | None]:
    """`models:` as the one model this agent serves: the first item, its settings over the top-level ones."""
    assert choice.models
    first = choice.models[0]
    served = choice.with_item(first)
    rest = [item.name or item.profile or item.model or "" for item in choice.models[1:]]
    ignored = [key for key in ("name", "gpus", "task", "lora") if getattr(first, key)]
    if not rest and not ignored:
        return served, None
    what = f"the agent serves one model per machine: {first.profile or first.model} (models[0])"
    if rest:
        what += f"; not served: {', '.join(rest)}"
    if ignored:
        what += f"; models[0]'s {', '.join(ignored)} not applied"
    return served, Problem("choice", "models", what, "`kiln plan --config FILE` shows how the models would share "
                           "this machine; serve the others from droplets of their own")


@dataclass(frozen=True)
class ModelsChange:
    """What a reload changes of the models a machine serves, each model by its name."""

    kept: tuple[ServedModel, ...]  # running, unchanged
    changed: tuple[tuple[ServedModel, ServedModel], ...]  # running, and its new plan (other GPUs, settings)
    added: tuple[ServedModel, ...]
    removed: tuple[ServedModel, ...]

    @property
    def any(self) -> bool:
        return bool(self.changed or self.added or self.removed)


def _setup(model: ServedModel) -> tuple[object, ...]:
    """What makes two plans of a model the same running processes: not their names or ports."""
    plan = model.plan
    return (plan.engine, model.gpus, model.share, tuple((i.gpus, i.cpus, i.omp_cpus) for i in plan.instances))


def models_change(old: list[ServedModel], new: list[ServedModel]) -> ModelsChange:
    before = {m.name: m for m in old}
    after = {m.name: m for m in new}
    return ModelsChange(
        kept=tuple(m for m in old if m.name in after and _setup(m) == _setup(after[m.name])),
        changed=tuple((m, after[m.name]) for m in old if m.name in after and _setup(m) != _setup(after[m.name])),
        added=tuple(m for m in new if m.name not in before),
        removed=tuple(m for m in old if m.name not in after))


def renumbered(model: ServedModel, names: set[str], ports: set[int], first_port: int) -> ServedModel:
    """The model's instances under names and on ports no running instance has: a new instance starts beside the
    ones it replaces, and a rolling change stops first only the old instances on its GPUs or of its name."""
    moved = []
    for inst in model.plan.instances:
        number = next(n for n in range(len(names) + len(model.plan.instances) + 1) if f"vllm-{n}" not in names)
        port = next(p for p in range(first_port, first_port + 65536) if p not in ports)
        names.add(f"vllm-{number}")
        ports.add(port)
        moved.append(replace(inst, name=f"vllm-{number}", port=port))
    return replace(model, plan=replace(model.plan, instances=tuple(moved)), rendered=[])


def serves_several(choice: Choice) -> bool:
    """`models:` that asks more than one model, or of its one model what only placement does (its own name, GPUs,
    task or adapters)."""
    if not choice.models:
        return False
    first = choice.models[0]
    return len(choice.models) > 1 or any(getattr(first, key) for key in ("name", "gpus", "task", "lora"))


def plan_settings(kiln: Kiln, machine: Machine, choice: Choice, source: str = "settings",
                  hub_cache: Path | None = None, first_port: int | None = None) -> SeveralPlan:
    """The models of a settings file placed on `machine`, each with its plan: what `kiln plan --config` prints and
    what the agent serves."""
    def load(item: ModelItem) -> Profile:
        if item.model:
            return kiln.profile(None, item.model, choice.hf_token, item.revision, hub_cache)
        return kiln.catalog().get(item.profile or "")

    def plan_one(on: Machine, profile: Profile, settings: Choice) -> Plan | Refusal:
        return make_plan(on, profile, settings, kiln.constants)

    def read_adapter(adapter: LoraAdapter) -> LoraModule:
        return kiln.adapter(adapter.name, adapter.source, adapter.revision, choice.hf_token, hub_cache)

    return plan_several(machine, choice, load, kiln.constants, plan_one, read_adapter, source=source,
                        first_port=first_port)


def _decide_several(kiln: Kiln, decision: Decision, choice: Choice, runtime: Runtime) -> Decision:
    """Every model of `models:` that fits, each with its GPUs and plan; one that cannot be served is reported and
    the others serve."""
    assert decision.machine is not None
    hub_cache = Path(runtime.hf_home) / "hub" if runtime.hf_home else None
    several = plan_settings(kiln, decision.machine, choice, "models", hub_cache, runtime.first_instance_port)
    decision.problems += several.problems
    placed = several.placement.placed
    if not placed:
        decision.failure = (f"none of the {len(choice.models or ())} models can be served on "
                            f"{decision.machine.name}",
                            "see the problems on /status; `kiln plan --config FILE` shows what would fit")
        return decision
    decision.models = [ServedModel(p.wanted.name, p.wanted.profile, p.plan, p.gpus, p.share) for p in placed]
    decision.profile, decision.plan = placed[0].wanted.profile, placed[0].plan
    decision.render(runtime)
    return decision


def decide(kiln: Kiln, machine_spec: str | None, resolved: ResolvedChoice, runtime: Runtime,
           fallback: str = FALLBACK_PROFILE, detect: Callable[[str | None], Machine] | None = None,
           membership: Membership | None = None) -> Decision:
    decision = Decision(choice=resolved, problems=list(resolved.problems))
    try:
        decision.machine = (detect or kiln.machine)(machine_spec)
    except KilnError as exc:
        decision.failure = (f"hardware detection failed: {exc.what}", exc.fix or "check `kiln detect`")
        return decision
    catalog = kiln.catalog()
    choice = resolved.choice
    if serves_several(choice) and membership is None:
        return _decide_several(kiln, decision, choice, runtime)
    if choice.models:
        choice, problem = first_of_several(choice)
        resolved = replace(resolved, choice=choice)
        if problem is not None:
            decision.problems.append(problem)
    hub_cache = Path(runtime.hf_home) / "hub" if runtime.hf_home else None
    profile, problems = select_profile(choice, catalog, lambda model: kiln.profile(
        None, model, choice.hf_token, choice.revision, hub_cache), fallback)
    decision.problems += problems
    if membership is not None:
        return _decide_cluster(kiln, decision, profile, membership, runtime)
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    bare = resolved.choice.model_copy(update={k: None for k in OVERRIDES})
    # What the user asked for; the same profile without their overrides; the image's fallback.
    attempts = [(profile, resolved.choice)]
    if resolved.choice != bare:
        attempts.append((profile, bare))
    if profile.name != fallback:
        attempts.append((catalog.get(fallback), bare))
    plan: Plan | Refusal | None = None
    for n, (candidate, choice) in enumerate(attempts):
        profile, plan = candidate, make_plan(decision.machine, candidate, choice.model_copy(update={"workload": None}),
                                             kiln.constants, alternatives)
        if isinstance(plan, Plan):
            break
        if n + 1 < len(attempts):
            then = ("serving it without the overrides" if attempts[n + 1][0] is candidate
                    else f"serving the fallback profile {fallback}")
            decision.problems.append(_refusal_problem(plan, candidate.name, then))
    assert plan is not None
    decision.profile = profile
    if isinstance(plan, Refusal):
        decision.failure = (f"{profile.name} cannot be served on {decision.machine.name}: {plan.reason}",
                            "; ".join(plan.suggestions) or "use a machine with a supported NVIDIA GPU")
        return decision
    if choice.workload is not None and not profile.cpu_only and profile.generates:
        plan = _for_workload(kiln, decision, profile, choice, plan, alternatives)
    decision.plan = plan
    decision.render(runtime)
    return decision


def _for_workload(kiln: Kiln, decision: Decision, profile: Profile, choice: Choice, plan: Plan,
                  alternatives: list[Machine]) -> Plan:
    """The setup whose prediction serves the user's workload best within its budget; when none meets the
    budget, the throughput plan, with the closest setup and what would meet it reported."""
    assert decision.machine is not None
    machine = decision.machine
    workload = resolve_workload(choice.workload)
    found = choose(machine, profile, choice, workload, kiln.constants,
                   lambda p: kiln_steps(p, machine, profile, kiln.constants), alternatives)
    if isinstance(found, Refusal):
        decision.problems.append(Problem("plan", "workload", f"{found.reason}; serving the plan with the most "
                                         "output instead", "; ".join(found.suggestions) or "loosen ttft_ms/tpot_ms"))
        return plan
    return plan_of(machine, profile, choice, found, workload, kiln.constants)


def _decide_cluster(kiln: Kiln, decision: Decision, profile: Profile, member: Membership,
                    runtime: Runtime) -> Decision:
    """This node's part of one model across the cluster; a model that fits one node is served by each alone."""
    assert decision.machine is not None
    machine, choice = decision.machine, decision.choice.choice
    where = f"{member.nodes} x {machine.name}"
    if profile.cpu_only:
        found: ClusterPlan | Fleet | Refusal | Plan = cpu_pipeline(machine, member.nodes, profile, choice,
                                                                   kiln.constants)
    else:
        found = plan_cluster(machine, member.nodes, profile, choice, resolve_workload(choice.workload),
                             kiln.constants, kiln.network(),
                             lambda p: kiln_steps(p, machine, profile, kiln.constants))
    decision.profile = profile
    if isinstance(found, Refusal):
        decision.failure = (f"{profile.name} cannot be served on {where}: {found.reason}",
                            "; ".join(found.suggestions) or "choose a smaller profile")
        return decision
    if isinstance(found, Fleet):
        decision.problems.append(Problem(
            "plan", "cluster", f"{profile.name} fits one {machine.name}, so it is not split across nodes; "
            "this node serves it alone", f"remove `cluster` and put the nodes behind a load balancer "
            f"(`kiln fleet up --count {member.nodes}`)"))
        decision.plan = found.plan
    else:
        plan = found.plan if isinstance(found, ClusterPlan) else found
        if isinstance(found, ClusterPlan):
            plan = replace(plan, explanation=found.explanation)
        decision.plan = plan
        decision.node = Node(member.rank, member.nodes, member.head_address, member.address, member.interface)
    decision.render(runtime)
    return decision

"""Several models on one machine: which GPUs each gets, whole or a share of one, and each one's own plan. Pure.

A model that needs whole GPUs gets them, as many as the GPUs the others leave allow, in proportion to its weights;
the planner then chooses its split inside them, and GPUs its plan leaves idle go to the small models. Small
models (embedding and reranking models always, chat models when the GPUs are fewer than the models) share a GPU
through memory budgets (`--gpu-memory-utilization`), which sum below what the GPU offers with room for each
process's CUDA-graph overrun, and start one after another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from kiln.choice.items import ModelItem
from kiln.choice.schema import Choice
from kiln.hardware.model import Machine
from kiln.planner.plan import GIB, device_minor, fit_plans
from kiln.profiles.schema import Profile
from kiln.setup.types import Constants, LoraModule, Plan, Refusal

PlanOne = Callable[[Machine, Profile, Choice], "Plan | Refusal"]


@dataclass(frozen=True)
class Wanted:
    """One model to place: the user's item (the top-level settings under its own), and its profile."""

    position: int  # its index in `models:`
    item: ModelItem
    profile: Profile
    served_names: tuple[str, ...]
    adapters: tuple[LoraModule, ...] = ()  # LoRA adapters served with it, each under its own name

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may give for it: its own and its adapters'."""
        return (*self.served_names, *(a.name for a in self.adapters))

    @property
    def name(self) -> str:
        return self.served_names[0]

    @property
    def label(self) -> str:
        return f"models[{self.position}] ({self.name})"


@dataclass(frozen=True)
class Placed:
    wanted: Wanted
    gpus: tuple[int, ...]  # the machine's GPUs its instances run on
    share: float | None  # its --gpu-memory-utilization on a GPU it shares; None: whole GPUs
    plan: Plan
    shares_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unplaced:
    wanted: Wanted
    reason: str
    suggestions: tuple[str, ...] = ()

    def text(self) -> str:
        fix = f" ({'; '.join(self.suggestions)})" if self.suggestions else ""
        return f"{self.wanted.label}: {self.reason}{fix}"


@dataclass(frozen=True)
class Placement:
    machine: Machine
    placed: tuple[Placed, ...]
    refused: tuple[Unplaced, ...] = ()
    notes: tuple[str, ...] = ()

    def gpu_map(self) -> dict[int, list[tuple[str, float | None]]]:
        """GPU -> the models on it, each with its memory share (None: the GPU is its own)."""
        out: dict[int, list[tuple[str, float | None]]] = {g: [] for g in range(self.machine.gpu_count)}
        for p in self.placed:
            for g in p.gpus:
                out[g].append((p.wanted.name, p.share))
        return out


@dataclass
class _Pool:
    """GPUs not yet given, in the machine's order (NUMA node, then PCI bus)."""

    free: list[int] = field(default_factory=list)

    def take(self, count: int) -> tuple[int, ...]:
        taken, self.free = tuple(self.free[:count]), self.free[count:]
        return taken

    def give_back(self, gpus: Sequence[int]) -> None:
        self.free = sorted({*self.free, *gpus})


def sub_machine(machine: Machine, gpus: Sequence[int]) -> Machine:
    """The machine as a planner sees it when only `gpus` are its own: the same host, those GPUs and their links."""
    keep = list(gpus)
    nvlink = tuple(tuple(machine.nvlink[i][j] for j in keep) for i in keep) if machine.nvlink else ()
    topology = tuple(tuple(machine.topology[i][j] for j in keep) for i in keep) if machine.topology else ()
    return replace(machine, gpus=tuple(machine.gpus[g] for g in keep), nvlink=nvlink, topology=topology)


def _on_machine(machine: Machine, plan: Plan, gpus: Sequence[int], first_port: int, first_index: int,
                share: float | None) -> Plan:
    """A plan made on a sub-machine, its GPUs, devices, ports and instance names moved to the machine's."""
    moved = [tuple(gpus[g] for g in inst.gpus) for inst in plan.instances]
    instances = tuple(
        replace(inst, name=f"vllm-{first_index + n}", port=first_port + n, gpus=on,
                device_minors=tuple(device_minor(machine, g) for g in on))
        for n, (inst, on) in enumerate(zip(plan.instances, moved, strict=True)))
    engine = plan.engine if share is None else replace(plan.engine, gpu_memory_utilization=share)
    return replace(plan, instances=instances, engine=engine)


def _used(plan: Plan) -> tuple[int, ...]:
    return tuple(sorted({g for inst in plan.instances for g in inst.gpus}))


def _fits_alone(plan: Plan, gpu_memory: int) -> int:
    """The bytes one process of `plan` needs on its GPU: weights, the rest vLLM keeps, and a cache that holds one
    request of the plan's whole context."""
    own = int(plan.engine.gpu_memory_utilization * gpu_memory)
    rest = own - plan.predicted.weight_bytes_per_gpu - plan.predicted.kv_cache_bytes_per_gpu
    context = plan.predicted.kv_bytes_per_token_per_gpu * plan.engine.max_model_len
    return plan.predicted.weight_bytes_per_gpu + max(rest, 0) + context


def place(machine: Machine, wanted: Sequence[Wanted], base: Choice, constants: Constants,
          plan_one: PlanOne, first_port: int | None = None) -> Placement:
    """Each model's GPUs and plan; what cannot be placed is refused on its own, saying what would fit."""
    refused: list[Unplaced] = []
    notes: list[str] = []
    reserved = int(constants.get("vllm", "driver_reserved_bytes"))
    gpu_memory = min((g.memory_bytes for g in machine.gpus), default=0) - reserved
    default_share = float(constants.get("vllm", "default_gpu_memory_utilization"))
    headroom = int(constants.get("vllm", "cudagraph_capture_overrun_bytes"))
    if first_port is None:
        first_port = int(constants.get("planning", "first_instance_port"))

    def choice_of(w: Wanted, share: float | None = None) -> Choice:
        own = base.with_item(w.item)
        return own if share is None else own.model_copy(update={"gpu_memory_utilization": share})

    named: dict[str, Wanted] = {}
    listed: list[Wanted] = []
    cpu: list[Wanted] = []
    counted: list[Wanted] = []
    small: list[Wanted] = []
    large: list[Wanted] = []
    for w in wanted:
        twice = next((n for n in w.names if n in named), None)
        if twice is not None:
            refused.append(Unplaced(w, f"the name {twice} is already served by {named[twice].label}",
                                    ("give one of them another `name`",)))
            continue
        named.update(dict.fromkeys(w.names, w))
        if not machine.gpus:
            cpu.append(w)
            continue
        gpus = w.item.gpus
        if isinstance(gpus, tuple):
            listed.append(w)
        elif isinstance(gpus, int):
            counted.append(w)
        elif not w.profile.generates:
            small.append(w)
        else:
            large.append(w)

    if not machine.gpus:
        return _on_cpu(machine, cpu, choice_of, plan_one, refused, first_port)
    pool = _Pool(list(range(machine.gpu_count)))
    placed: list[tuple[Wanted, tuple[int, ...], float | None, Plan | Refusal]] = []
    for w in listed:  # the GPUs the owner named
        gpus = w.item.gpus if isinstance(w.item.gpus, tuple) else ()
        missing = [g for g in gpus if g >= machine.gpu_count]
        clash = [g for g in gpus if g not in pool.free]
        if missing or clash:
            why = (f"GPU {missing[0]} does not exist: {machine.name} has GPUs 0 to {machine.gpu_count - 1}" if missing
                   else f"GPU {clash[0]} is already given to another model")
            refused.append(Unplaced(w, why, ("list other GPUs, or give a count and let kiln choose them",)))
            continue
        pool.free = [g for g in pool.free if g not in gpus]
        placed.append((w, gpus, None, plan_one(sub_machine(machine, gpus), w.profile, choice_of(w))))

    def fits(w: Wanted, gpus: Sequence[int]) -> list[Plan] | Refusal:
        return fit_plans(sub_machine(machine, gpus), w.profile, choice_of(w), constants)

    def plan_on(w: Wanted, gpus: Sequence[int]) -> Plan | Refusal:
        return plan_one(sub_machine(machine, gpus), w.profile, choice_of(w))

    # Models that need whole GPUs: the fewest each fits on; a chat model that fits one GPU's share may share.
    fewest: dict[int, int] = {}
    for w in [*counted, *large]:
        need = w.item.gpus if isinstance(w.item.gpus, int) else _fewest_gpus(machine.gpu_count, partial(fits, w))
        if need is None:
            refused.append(Unplaced(w, f"it does not fit on the {machine.gpu_count} GPUs of {machine.name}",
                                    ("choose a smaller model or a larger machine",)))
            continue
        fewest[w.position] = need
    counted = [w for w in counted if w.position in fewest]
    large = [w for w in large if w.position in fewest]
    while large and sum(fewest[w.position] for w in [*counted, *large]) + (1 if small else 0) > len(pool.free):
        smallest = min(large, key=lambda w: (w.profile.architecture.params_total, -w.position))
        if fewest[smallest.position] > 1:
            break
        large.remove(smallest)
        small.append(smallest)
        notes.append(f"{smallest.name} shares a GPU: {len(pool.free)} GPU(s) are left for "
                     f"{len(counted) + len(large) + len(small)} models")
    reserve = 1 if small else 0
    whole = [*counted, *large]
    while whole and sum(fewest[w.position] for w in whole) + reserve > len(pool.free):
        last = whole.pop()  # the later item gives way
        left = len(pool.free) - reserve - sum(fewest[w.position] for w in whole)
        refused.append(Unplaced(last, f"it needs {fewest[last.position]} whole GPU(s), and the models listed "
                                      f"before it leave {left}",
                                ("list it earlier, give the others fewer `gpus`, or use a larger machine",)))
    spare = len(pool.free) - reserve - sum(fewest[w.position] for w in whole)
    given = {w.position: fewest[w.position] for w in whole}
    growing = [w for w in large if w in whole]
    for _ in range(max(spare, 0)):  # spare GPUs to the model with the most weight per GPU
        if not growing:
            break
        most = max(growing, key=lambda w: (w.profile.architecture.params_total / given[w.position], -w.position))
        given[most.position] += 1
    for w in whole:
        gpus = pool.take(given[w.position])
        plan = _largest_fitting(gpus, partial(plan_on, w), exact=w in counted)
        if isinstance(plan, Refusal):
            pool.give_back(gpus)
            refused.append(Unplaced(w, plan.reason, plan.suggestions))
            continue
        used = tuple(gpus[g] for g in _used(plan))
        pool.give_back([g for g in gpus if g not in used])
        placed.append((w, used, None, plan))

    # Small models: a GPU of their own while there are enough, else shared by memory budgets.
    needs: dict[int, int] = {}
    for w in small:
        own = fits(w, (pool.free or [0])[:1])
        if isinstance(own, Refusal):
            refused.append(Unplaced(w, own.reason, own.suggestions))
            continue
        needs[w.position] = min(_fits_alone(p, gpu_memory) for p in own) + headroom
    small = [w for w in small if w.position in needs]
    if len(pool.free) >= len(small):
        for w in small:
            gpus = pool.take(1)
            plan = plan_one(sub_machine(machine, gpus), w.profile, choice_of(w))
            placed.append((w, gpus, None, plan))
    else:
        bins: dict[int, list[Wanted]] = {g: [] for g in pool.free}
        budget = int(gpu_memory * default_share)
        for w in sorted(small, key=lambda w: -needs[w.position]):
            room = {g: budget - sum(needs[o.position] for o in on) for g, on in bins.items()}
            gpu = max(room, key=lambda g: (room[g], -g)) if room else None
            if gpu is None or room[gpu] < needs[w.position]:
                refused.append(Unplaced(w, f"it needs {needs[w.position] / GIB:.1f} GiB of a GPU, and the models "
                                           "before it leave less on every GPU",
                                        ("give it `gpus: 1`, list it earlier, or use a larger machine",)))
                continue
            bins[gpu].append(w)
        for gpu, on in bins.items():
            spare_bytes = budget - sum(needs[o.position] for o in on)
            for w in on:
                share = None if len(on) == 1 else (
                    math.floor((needs[w.position] + spare_bytes / len(on)) / gpu_memory * 100) / 100)
                plan = plan_one(sub_machine(machine, (gpu,)), w.profile, choice_of(w, share))
                placed.append((w, (gpu,), share, plan))

    return _finish(machine, placed, refused, notes, first_port)


def _on_cpu(machine: Machine, wanted: list[Wanted], choice_of: Callable[[Wanted], Choice], plan_one: PlanOne,
            refused: list[Unplaced], first_port: int) -> Placement:
    """A machine without GPUs (vLLM's CPU backend): one instance per model unless its item asks for more, the
    cores split evenly between all instances, or taken in turn when the instances outnumber them."""
    planned: list[tuple[Wanted, Plan | Refusal]] = []
    for w in wanted:
        own = choice_of(w)
        planned.append((w, plan_one(machine, w.profile, own if own.instances else
                                    own.model_copy(update={"instances": 1}))))
    count = sum(len(p.instances) for _, p in planned if isinstance(p, Plan))
    cores = machine.host.cpu_count
    per = max(cores // max(count, 1), 1)
    placed: list[tuple[Wanted, tuple[int, ...], float | None, Plan | Refusal]] = []
    n = 0
    for w, made in planned:
        if isinstance(made, Plan):
            moved = []
            for inst in made.instances:
                start = (n * per) % cores
                cpus = tuple(range(start, start + per))
                moved.append(replace(inst, cpus=cpus, omp_cpus=cpus))
                n += 1
            made = replace(made, instances=tuple(moved))  # noqa: PLW2901 -- the same plan on its own cores
        placed.append((w, (), None, made))
    return _finish(machine, placed, refused, [], first_port)


def _finish(machine: Machine, placed: list[tuple[Wanted, tuple[int, ...], float | None, Plan | Refusal]],
            refused: list[Unplaced], notes: list[str], first_port: int) -> Placement:
    """Plans on the machine's GPUs and ports, in the order of `models:`; who shares a GPU with whom."""
    done: list[Placed] = []
    port, index = first_port, 0
    for w, gpus, share, plan in sorted(placed, key=lambda p: p[0].position):
        if isinstance(plan, Refusal):
            refused.append(Unplaced(w, plan.reason, plan.suggestions))
            continue
        moved = _on_machine(machine, plan, gpus, port, index, share)
        moved = replace(moved, engine=replace(moved.engine, served_model_names=w.served_names,
                                              lora_modules=w.adapters))
        port += len(moved.instances)
        index += len(moved.instances)
        done.append(Placed(w, gpus, share, moved))
    shared = tuple(
        replace(p, shares_with=tuple(o.wanted.name for o in done if o is not p and set(o.gpus) & set(p.gpus)))
        for p in done)
    return Placement(machine, shared, tuple(sorted(refused, key=lambda u: u.wanted.position)), tuple(notes))


def _fewest_gpus(gpu_count: int, fits_on: Callable[[Sequence[int]], list[Plan] | Refusal]) -> int | None:
    """The fewest whole GPUs the model fits on, trying 1, 2, 4, ... up to the machine's."""
    count = 1
    while count <= gpu_count:
        if not isinstance(fits_on(range(count)), Refusal):
            return count
        count *= 2
    return None


def _largest_fitting(gpus: tuple[int, ...], plan_on: Callable[[Sequence[int]], Plan | Refusal],
                     exact: bool) -> Plan | Refusal:
    """The plan on the most of `gpus` the model runs on (7 GPUs may serve as 6: three of two); with `exact`,
    on all of them or refused. A plan that does not fit is refused by its own first step (fit_plans)."""
    last: Plan | Refusal = Refusal("no GPUs are left for it")
    for count in range(len(gpus), 0, -1):
        last = plan_on(gpus[:count])
        if isinstance(last, Plan) or exact:
            return last
    return last

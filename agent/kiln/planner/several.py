"""From the user's `models:` to a placement: each item's profile, task and served names, then the GPUs and plans.

Pure but for the loader passed in (a catalog lookup, or a model's files read from the Hub or a directory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.choice.items import LoraAdapter, ModelItem
from kiln.choice.schema import Choice, Problem
from kiln.errors import KilnError
from kiln.hardware.model import Machine
from kiln.planner.placement import Placement, PlanOne, Wanted, place
from kiln.planner.plan import served_names
from kiln.profiles.schema import Profile
from kiln.setup.types import LORA_RANKS, Constants, LoraModule

LoadProfile = Callable[[ModelItem], Profile]
ReadAdapter = Callable[[LoraAdapter], LoraModule]


@dataclass(frozen=True)
class SeveralPlan:
    placement: Placement
    problems: tuple[Problem, ...] = ()


def items_of(choice: Choice) -> tuple[ModelItem, ...]:
    """The models to serve: `models:`, or the one-model settings as a single item."""
    if choice.models:
        return choice.models
    if choice.profile or choice.model:
        return (ModelItem(**choice.model_settings()),)
    return ()


def with_task(profile: Profile, item: ModelItem) -> Profile:
    """The owner's task and trust_remote_code over the profile's."""
    update: dict[str, object] = {}
    if item.task is not None and item.task != profile.task:
        update["task"] = item.task
        if item.task != "chat":
            update["speculative"] = ()
    if item.trust_remote_code is not None and item.trust_remote_code != profile.serving.trust_remote_code:
        update["serving"] = profile.serving.model_copy(update={"trust_remote_code": item.trust_remote_code})
    return profile.model_copy(update=update) if update else profile


def wanted_models(items: Sequence[ModelItem], load: LoadProfile, source: str,
                  read_adapter: ReadAdapter) -> tuple[list[Wanted], list[Problem]]:
    """Each item with its profile and adapters; an item whose model cannot be read, or an adapter, is reported on
    its own."""
    wanted: list[Wanted] = []
    problems: list[Problem] = []
    for n, item in enumerate(items):
        try:
            profile = with_task(load(item), item)
        except KilnError as exc:
            field = f"models[{n}].{'model' if item.model else 'profile'}"
            problems.append(Problem(source, field, f"{exc.what}; this model is not served",
                                    exc.fix or "fix the item; the other models are served without it"))
            continue
        adapters: list[LoraModule] = []
        for k, adapter in enumerate(item.lora):
            try:
                adapters.append(read_adapter(adapter))
            except KilnError as exc:
                problems.append(Problem(source, f"models[{n}].lora[{k}]", f"{exc.what}; the model is served "
                                        "without it", exc.fix or "fix the adapter; the model and the others serve"))
        names = (item.name,) if item.name else served_names(profile)
        if adapters:  # planned with their memory and their cost per step
            rank = next(r for r in LORA_RANKS if r >= max(a.rank for a in adapters))
            profile = profile.model_copy(update={"serving": profile.serving.model_copy(
                update={"lora_adapters": len(adapters), "max_lora_rank": rank})})
        wanted.append(Wanted(n, item, profile, names, tuple(adapters)))
    return wanted, problems


def plan_several(machine: Machine, choice: Choice, load: LoadProfile, constants: Constants, plan_one: PlanOne,
                 read_adapter: ReadAdapter, source: str = "models", first_port: int | None = None) -> SeveralPlan:
    """The models' placement on `machine`, with a problem for each model that cannot be served and why; the
    instances' ports from `first_port` (default: the planner's)."""
    wanted, problems = wanted_models(items_of(choice), load, source, read_adapter)
    placement = place(machine, wanted, choice, constants, plan_one, first_port)
    for unplaced in placement.refused:
        problems.append(Problem("plan", f"models[{unplaced.wanted.position}]",
                                f"{unplaced.wanted.name}: {unplaced.reason}; this model is not served",
                                "; ".join(unplaced.suggestions) or "choose a smaller model or a larger machine"))
    return SeveralPlan(placement, tuple(problems))

"""How far a prediction may be off: a band from the out-of-sample errors of predictions like it, with how often
bands fitted that way held on public runs left out of their fit. Pure.

The bands come from `python -m benchmarks.perf_model_vs_public --out-of-sample` (data/planner.yaml `bands`). Every
public case is predicted by constants fitted without it, as the ratio measured / predicted. A class is the GPU
generation, dense or MoE, and the load regime; its band is as narrow as lets at least 80% of the cases left out of
its fit land inside (benchmarks.band_coverage), and says how many did. A model of a family the corpus holds gets
the bands judged leaving out each source; any other model, those judged leaving out each model family.
"""

from __future__ import annotations

from typing import Any

from kiln.perf.workload import Workload
from kiln.profiles.names import normalize_name
from kiln.profiles.schema import Profile
from kiln.setup.types import Band, Constants, Plan

# A class with fewer cases borrows a coarser class's band: the 10th and 90th percentiles of fewer than 10 ratios
# are little more than their extremes, and a handful of cases is mostly one or two sources' setups.
MIN_CASES = 10
LOW_LOAD = 16  # requests per scheduler at or below which a case is "low" load: decode latency dominates


def regime(concurrency_per_scheduler: float) -> str:
    return "low" if concurrency_per_scheduler <= LOW_LOAD else "high"


def family(profile: Profile) -> str:
    return "moe" if profile.architecture.moe is not None else "dense"


def model_family(name: str) -> str:
    """A model's family as the corpus groups them: its name's first part (gpt-oss, qwen3, deepseek, llama...)."""
    normal = normalize_name(name)
    return "gpt-oss" if normal.startswith("gpt-oss") else normal.split("-", maxsplit=1)[0]


def class_keys(generation: str, fam: str, load: str) -> list[str]:
    """From the most specific class to the coarsest."""
    return [f"{generation}/{fam}/{load}", f"{generation}/{fam}", f"*/{fam}/{load}", f"*/{fam}", "*"]


def band_for(plan: Plan, profile: Profile, workload: Workload, predicted: float, c: Constants,
             architecture: str) -> Band | None:
    """The band of `predicted` output tok/s, or None when kiln holds no out-of-sample errors for its class."""
    bands: dict[str, Any] = c.data.get("bands", {})
    known = model_family(profile.name) in bands.get("families", ())
    table: dict[str, Any] = bands.get("classes" if known else "new_family", {})
    if plan.engine.device == "cpu" or predicted <= 0:
        return None
    schedulers = max(len(plan.instances) * plan.engine.schedulers, 1)
    load = workload.concurrency if workload.concurrency is not None else min(
        workload.num_prompts, plan.engine.max_num_seqs * schedulers)
    left_out = "source" if known else "model family"
    for key in class_keys(architecture, family(profile), regime(load / schedulers)):
        found = table.get(key)
        if found and found["cases"] >= MIN_CASES:
            held, judged = found.get("held"), found.get("judged")
            judged_on = held is not None and bool(judged)
            promise = f"; held for {held} of {judged} public runs whose {left_out} it was fitted without" if judged_on \
                else ""
            return Band(predicted * found["low"], predicted * found["high"],
                        f"{key}: {found['cases']} public cases predicted out of sample{promise}",
                        held / judged if judged_on else None)
    return None

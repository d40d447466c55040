"""How far a prediction may be off: a band from the out-of-sample errors of predictions like it. Pure.

The errors come from `python -m benchmarks.perf_model_vs_public --out-of-sample`: every public case predicted by
constants fitted without the case's source, as the ratio measured / predicted. A class is the GPU generation, dense or
MoE, and the load regime; the band is its 10th to 90th percentile ratio, or a coarser class's where it has too
few cases (data/planner.yaml `bands`).
"""

from __future__ import annotations

from typing import Any

from kiln.perf.workload import Workload
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


def class_keys(generation: str, fam: str, load: str) -> list[str]:
    """From the most specific class to the coarsest."""
    return [f"{generation}/{fam}/{load}", f"{generation}/{fam}", f"*/{fam}/{load}", f"*/{fam}", "*"]


def band_for(plan: Plan, profile: Profile, workload: Workload, predicted: float, c: Constants,
             architecture: str) -> Band | None:
    """The band of `predicted` output tok/s, or None when kiln holds no out-of-sample errors for its class."""
    table: dict[str, Any] = c.data.get("bands", {}).get("classes", {})
    if plan.engine.device == "cpu" or predicted <= 0:
        return None
    schedulers = max(len(plan.instances) * plan.engine.schedulers, 1)
    load = workload.concurrency if workload.concurrency is not None else min(
        workload.num_prompts, plan.engine.max_num_seqs * schedulers)
    for key in class_keys(architecture, family(profile), regime(load / schedulers)):
        found = table.get(key)
        if found and found["cases"] >= MIN_CASES:
            return Band(predicted * found["low"], predicted * found["high"],
                        f"{key}: {found['cases']} public cases predicted out of sample")
    return None


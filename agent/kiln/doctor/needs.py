"""What a plan asks of the machine, for the doctor: its tensor-parallel groups and the checkpoint it downloads."""

from __future__ import annotations

from kiln.doctor.facts import Needs
from kiln.profiles.schema import Profile
from kiln.setup.capacity import weight_bytes
from kiln.setup.types import Plan


def needs_of(plan: Plan, profile: Profile) -> Needs:
    groups = tuple(i.gpus for i in plan.instances) if plan.engine.device == "cuda" else ()
    model = plan.engine.model
    if model.startswith("/") or profile.local_model:
        return Needs(groups, None, model)  # a folder on the machine: nothing to download
    # Online quantization (--quantization fp8) downloads the BF16 checkpoint and quantizes it while loading.
    precision = "bf16" if plan.engine.quantization else plan.quantization
    return Needs(groups, weight_bytes(profile, precision), model)

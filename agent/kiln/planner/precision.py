"""Weight precision by GPU architecture and the checkpoints a profile has. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.hardware.model import Architecture
from kiln.profiles.schema import Checkpoint, Profile

# Preferred first. FP8 tensor cores arrived with Ada/Hopper (sm_89/sm_90), FP4 with Blackwell (sm_100+).
# vLLM still runs FP8 and MXFP4 checkpoints on Ampere through its weight-only Marlin kernels.
PREFERENCE: dict[Architecture, tuple[str, ...]] = {
    Architecture.BLACKWELL: ("nvfp4", "mxfp4", "fp8", "int4", "bf16"),
    Architecture.HOPPER: ("fp8", "mxfp4", "int4", "bf16"),
    Architecture.ADA: ("fp8", "mxfp4", "int4", "bf16"),
    Architecture.AMPERE: ("bf16", "mxfp4", "fp8", "int4"),
    Architecture.UNKNOWN: ("bf16", "mxfp4", "int4"),
}
NATIVE_FP8 = {Architecture.ADA, Architecture.HOPPER, Architecture.BLACKWELL}


@dataclass(frozen=True)
class PrecisionOption:
    precision: str
    checkpoint: Checkpoint
    online: str | None = None  # "fp8": vLLM quantizes the bf16 checkpoint while loading

    def describe(self) -> str:
        if self.online:
            return f"{self.precision} (quantized online from {self.checkpoint.hf_id})"
        return f"{self.precision} ({self.checkpoint.hf_id})"


def precision_options(profile: Profile, arch: Architecture) -> list[PrecisionOption]:
    """Every way to load this model on this architecture, preferred first."""
    options: list[PrecisionOption] = []
    for precision in PREFERENCE[arch]:
        checkpoint = profile.checkpoints.get(precision)  # type: ignore[call-overload]
        if checkpoint is not None:
            options.append(PrecisionOption(precision, checkpoint))
        elif (precision == "fp8" and arch in NATIVE_FP8 and profile.online_fp8
              and "bf16" in profile.checkpoints):
            options.append(PrecisionOption("fp8", profile.checkpoints["bf16"], online="fp8"))
    return options


def forced_option(profile: Profile, arch: Architecture, wanted: str) -> PrecisionOption | str:
    """The option for a precision the user asked for, or why it cannot be had."""
    if wanted == "nvfp4" and arch is not Architecture.BLACKWELL:
        return f"nvfp4 runs natively on Blackwell GPUs only; this machine is {arch.value}: use fp8 or auto"
    if wanted == "fp8" and arch not in NATIVE_FP8 and "fp8" not in profile.checkpoints:
        return f"{arch.value} GPUs have no FP8 tensor cores and the profile has no FP8 checkpoint: use bf16"
    for option in precision_options(profile, arch):
        if option.precision == wanted:
            return option
    if wanted in profile.checkpoints:
        return PrecisionOption(wanted, profile.checkpoints[wanted])
    have = ", ".join(profile.checkpoints)
    return f"profile {profile.name} has no {wanted} checkpoint (it has: {have}); use auto"

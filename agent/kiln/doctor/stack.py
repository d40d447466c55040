"""The GPU software stack the image installs (data/gpu_stack.yaml) and whether its versions agree.

Pure: values in, verdicts out. tests/integration/test_gpu_stack_pins.py feeds it PyPI's metadata, the vllm role
feeds it the same file at build time, and `kiln doctor` compares a machine's driver with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")


def version_key(text: str) -> tuple[int, ...]:
    """"580.65.06" -> (580, 65, 6): NVIDIA versions compare part by part, as numbers."""
    if not VERSION.match(text.strip()):
        raise ValueError(f"not a dotted version: {text!r}")
    return tuple(int(p) for p in text.strip().split("."))


def at_least(version: str, minimum: str) -> bool:
    return version_key(version) >= version_key(minimum)


def _checked(text: str) -> str:
    version_key(text)
    return text


Dotted = Annotated[str, AfterValidator(_checked)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmPin(_Strict):
    version: Dotted
    torch: Dotted
    source: str


class TorchPin(_Strict):
    version: Dotted
    cuda: Dotted
    source: str


class FlashInferPin(_Strict):
    version: str  # a PEP 440 version (0.7.0.post1), not a dotted one
    kernels: str  # the distribution of its precompiled kernels: flashinfer-jit-cache or flashinfer-cubin
    source: str


class ArchitectureMinimum(_Strict):
    gpus: str
    driver: Dotted
    source: str


class DriverPin(_Strict):
    branch: Dotted
    version: Dotted
    source: str


class GpuStack(_Strict):
    """data/gpu_stack.yaml."""

    python: str
    vllm: VllmPin
    torch: TorchPin
    flashinfer: FlashInferPin
    cuda_minimum_driver: dict[str, Dotted] = Field(min_length=1)
    cuda_minimum_driver_source: str
    architecture_minimum_driver: dict[str, ArchitectureMinimum]
    driver: DriverPin
    cuda_toolkit: Dotted

    def minimum_driver(self, cuda: str) -> str | None:
        """The oldest driver that runs this CUDA release (major.minor), if the table knows it."""
        return self.cuda_minimum_driver.get(cuda)

    def architecture(self, compute_capability: tuple[int, int]) -> ArchitectureMinimum | None:
        return self.architecture_minimum_driver.get(f"{compute_capability[0]}.{compute_capability[1]}")

    def required_driver(self) -> str:
        """What every GPU needs from the driver: torch's CUDA and every supported architecture."""
        needs = [self.minimum_driver(self.torch.cuda) or "0"]
        needs += [a.driver for a in self.architecture_minimum_driver.values()]
        return max(needs, key=version_key)


def _requirements(requires_dist: Iterable[str]) -> list[Requirement]:
    found = []
    for line in requires_dist:
        try:
            found.append(Requirement(line))
        except InvalidRequirement:
            continue
    return found


def _applies_on_linux(req: Requirement) -> bool:
    """Whether a requirement holds on the image (Linux x86_64, no extras asked for)."""
    if req.marker is None:
        return True
    env = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64",
           "python_version": "3.12", "extra": ""}
    return bool(req.marker.evaluate(env))


def pinned_version(requires_dist: Iterable[str], name: str) -> str | None:
    """The exact version a wheel pins a dependency to (`name==X`), or None."""
    for req in _requirements(requires_dist):
        if req.name.lower() == name.lower() and _applies_on_linux(req):
            exact = [s.version for s in req.specifier if s.operator == "=="]
            if exact:
                return exact[0]
    return None


# The packages that tell a torch wheel's CUDA release: CUDA 13 wheels pin NVIDIA's cuda-toolkit meta package,
# CUDA 12 wheels pin the runtime itself.
CUDA_RUNTIME_PINS = ("cuda-toolkit", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime")


def cuda_of_torch(requires_dist: Iterable[str]) -> str | None:
    """The CUDA release (major.minor) a torch wheel is built for, from its pinned CUDA runtime; None for CPU."""
    lines = list(requires_dist)
    for name in CUDA_RUNTIME_PINS:
        version = pinned_version(lines, name)
        if version:
            major, minor = version_key(version.split("+")[0])[:2]
            return f"{major}.{minor}"
    return None


def pin_problems(stack: GpuStack, *, vllm_requires: Iterable[str] | None = None,
                 torch_requires: Iterable[str] | None = None, driver_branch: str | None = None,
                 driver_version: str | None = None, cuda_toolkit: str | None = None) -> list[str]:
    """Every disagreement between the stack's pins, the wheels' metadata and what the roles install."""
    problems: list[str] = []
    if vllm_requires is not None:
        torch = pinned_version(vllm_requires, "torch")
        if torch != stack.torch.version or torch != stack.vllm.torch:
            problems.append(f"vLLM {stack.vllm.version} pins torch=={torch}, but gpu_stack.yaml says "
                            f"{stack.vllm.torch}/{stack.torch.version}")
        flashinfer = pinned_version(vllm_requires, "flashinfer-python")
        if flashinfer != stack.flashinfer.version:
            problems.append(f"vLLM {stack.vllm.version} pins flashinfer-python=={flashinfer}, but gpu_stack.yaml "
                            f"says {stack.flashinfer.version}")
    cuda = stack.torch.cuda
    if torch_requires is not None:
        found = cuda_of_torch(torch_requires)
        if found != stack.torch.cuda:
            problems.append(f"torch {stack.torch.version}'s Linux wheel is built for CUDA {found}, "
                            f"but gpu_stack.yaml says {stack.torch.cuda}")
        cuda = found or cuda
    minimum = stack.minimum_driver(cuda)
    if minimum is None:
        problems.append(f"no minimum driver is recorded for CUDA {cuda}: add it to cuda_minimum_driver "
                        f"from {stack.cuda_minimum_driver_source}")
        return problems
    branch = driver_branch if driver_branch is not None else stack.driver.branch
    version = driver_version if driver_version is not None else stack.driver.version
    if version and not version.startswith(f"{branch}."):
        problems.append(f"driver version {version} is not on branch {branch}")
    # A branch alone (no exact version) is judged by its first release, the most the archive might give.
    judged = version or f"{branch}.0"
    needed = max(minimum, *(a.driver for a in stack.architecture_minimum_driver.values()), key=version_key)
    if not at_least(judged, needed):
        why = f"CUDA {cuda} (torch {stack.torch.version}, vLLM {stack.vllm.version}) needs {minimum}"
        if needed != minimum:
            why += f" and the supported GPUs need {needed}"
        problems.append(f"driver {version or 'branch ' + branch} cannot run the pinned stack: {why}")
    toolkit = cuda_toolkit if cuda_toolkit is not None else stack.cuda_toolkit
    if version_key(toolkit)[:2] > version_key(cuda)[:2]:
        problems.append(f"the CUDA toolkit {toolkit} is newer than torch's CUDA {cuda}")
    elif version_key(toolkit)[:1] != version_key(cuda)[:1]:
        problems.append(f"the CUDA toolkit {toolkit} is another major release than torch's CUDA {cuda}")
    return problems

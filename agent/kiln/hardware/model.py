"""The machine as kiln sees it: plain immutable values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Architecture(str, Enum):
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    CDNA3 = "cdna3"
    UNKNOWN = "unknown"


def architecture_of(compute_capability: tuple[int, int]) -> Architecture:
    """NVIDIA architecture from the CUDA compute capability."""
    major, minor = compute_capability
    if major == 8 and minor == 9:
        return Architecture.ADA
    if major == 8:
        return Architecture.AMPERE
    if major == 9:
        return Architecture.HOPPER
    if major in (10, 11, 12):
        return Architecture.BLACKWELL
    return Architecture.UNKNOWN


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet facts for a GPU class (from kiln's hardware data or a machine file)."""

    class_name: str
    architecture: Architecture
    memory_bandwidth_gb_s: float
    dense_tflops: dict[str, float | None] = field(default_factory=dict)
    nvlink_gb_s: float | None = None
    supported: bool = True
    unsupported_reason: str = ""
    memory_gib: float | None = None  # the datasheet's memory per GPU; a machine's own GPUs report theirs

    def tflops(self, precision: str) -> float | None:
        return self.dense_tflops.get(precision)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    pci_bus_id: str
    numa_node: int | None
    cpus: tuple[int, ...]
    mig_enabled: bool | None  # None: the GPU has no MIG
    nvlink_links: int
    spec: GpuSpec
    minor_number: int | None = None  # /dev/nvidiaN

    @property
    def architecture(self) -> Architecture:
        return self.spec.architecture

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30


@dataclass(frozen=True)
class Host:
    cpu_count: int
    memory_bytes: int
    disk_free_bytes: int


@dataclass(frozen=True)
class Machine:
    """Everything the planner needs to know about one machine."""

    name: str
    source: str
    gpus: tuple[Gpu, ...]
    host: Host
    # nvlink[i][j]: GPUs i and j talk over NVLink (directly or through NVSwitch).
    nvlink: tuple[tuple[bool, ...], ...] = ()
    # topology[i][j]: NVML_TOPOLOGY_* level of the closest common ancestor (0 = same GPU).
    topology: tuple[tuple[int, ...], ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    unsupported_accelerators: tuple[str, ...] = ()
    droplet_size: str | None = None
    description: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    def linked(self, i: int, j: int) -> bool:
        if i == j:
            return True
        return bool(self.nvlink) and self.nvlink[i][j]

    def accelerator_problem(self) -> str | None:
        """Why this machine cannot serve on GPUs, or None when it can."""
        if self.unsupported_accelerators and not self.gpus:
            names = ", ".join(sorted(set(self.unsupported_accelerators)))
            return (
                f"{names}: not supported yet; kiln serves on NVIDIA GPUs only "
                "(ROCm support is planned). Use an NVIDIA GPU Droplet (H100, H200, L40S, B300)."
            )
        unsupported = [g for g in self.gpus if not g.spec.supported]
        if unsupported:
            return unsupported[0].spec.unsupported_reason or f"{unsupported[0].name}: not supported"
        if not self.gpus:
            return "no accelerator: no NVIDIA GPU was found (NVML is absent or lists no device)"
        if any(g.mig_enabled for g in self.gpus):
            return (
                "MIG is enabled on at least one GPU; kiln plans whole GPUs. "
                "Disable it with `nvidia-smi -mig 0` and reboot."
            )
        return None

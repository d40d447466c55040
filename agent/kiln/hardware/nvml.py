"""The one adapter over NVML: turns nvidia-ml-py answers into GPU values.

It takes the NVML module as an argument, so the real `pynvml` and a recorded fixture
(kiln.hardware.fixtures.RecordedNvml) go through exactly the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from kiln.hardware.model import Gpu
from kiln.hardware.specs import GpuCatalog, hbm_bandwidth_gb_s

NO_DRIVER_CODES = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_NO_PERMISSION,
}


@dataclass(frozen=True)
class NvmlReading:
    gpus: tuple[Gpu, ...]
    nvlink: tuple[tuple[bool, ...], ...]
    topology: tuple[tuple[int, ...], ...]
    driver_version: str | None
    cuda_driver_version: str | None
    problem: str | None = None  # why NVML could not be read, when it could not


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Any, *args: Any) -> Any:
    """The answer, or None where this GPU does not support the query."""
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def cpus_from_mask(words: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """CPU ids set in NVML's affinity mask (64-bit words, bit i of word w = CPU 64w+i)."""
    cpus: list[int] = []
    for w, word in enumerate(words):
        cpus.extend(64 * w + bit for bit in range(64) if int(word) >> bit & 1)
    return tuple(cpus)


def cuda_version_text(value: int | None) -> str | None:
    if value is None:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


def _nvlink_links(nvml: Any, handle: Any) -> int:
    active = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            break
        active += int(state == pynvml.NVML_FEATURE_ENABLED)
    return active


def _read_gpu(nvml: Any, index: int, handle: Any, catalog: GpuCatalog, cpu_words: int) -> Gpu:
    name = _text(nvml.nvmlDeviceGetName(handle))
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    mig = _optional(nvml.nvmlDeviceGetMigMode, handle)
    numa = _optional(nvml.nvmlDeviceGetNumaNodeId, handle)
    affinity = _optional(nvml.nvmlDeviceGetCpuAffinity, handle, cpu_words) or []
    bandwidth = hbm_bandwidth_gb_s(
        _optional(nvml.nvmlDeviceGetMemoryBusWidth, handle),
        _optional(nvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
    )
    return Gpu(
        index=index,
        name=name,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        compute_capability=(int(major), int(minor)),
        pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
        numa_node=None if numa is None or numa < 0 else int(numa),
        cpus=cpus_from_mask(affinity),
        mig_enabled=None if mig is None else bool(mig[0]),
        nvlink_links=_nvlink_links(nvml, handle),
        spec=catalog.resolve(name, (int(major), int(minor)), bandwidth),
        minor_number=_optional(nvml.nvmlDeviceGetMinorNumber, handle),
    )


def read_nvml(nvml: Any, catalog: GpuCatalog, cpu_count: int) -> NvmlReading:
    """Read every GPU through NVML; no driver is an answer (no GPUs), never a crash."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        reason = "NVIDIA driver not loaded" if exc.value in NO_DRIVER_CODES else f"NVML failed: {exc}"
        return NvmlReading((), (), (), None, None, problem=reason)
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        cpu_words = max(1, (cpu_count + 63) // 64)
        gpus = tuple(_read_gpu(nvml, i, h, catalog, cpu_words) for i, h in enumerate(handles))
        nvlink = tuple(
            tuple(
                i == j
                or _optional(nvml.nvmlDeviceGetP2PStatus, hi, hj, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                == pynvml.NVML_P2P_STATUS_OK
                for j, hj in enumerate(handles)
            )
            for i, hi in enumerate(handles)
        )
        topology = tuple(
            tuple(
                0 if i == j else int(_optional(nvml.nvmlDeviceGetTopologyCommonAncestor, hi, hj) or 50)
                for j, hj in enumerate(handles)
            )
            for i, hi in enumerate(handles)
        )
        return NvmlReading(
            gpus=gpus,
            nvlink=nvlink,
            topology=topology,
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_driver_version=cuda_version_text(_optional(nvml.nvmlSystemGetCudaDriverVersion)),
        )
    except pynvml.NVMLError as exc:
        return NvmlReading((), (), (), None, None, problem=f"NVML failed while reading GPUs: {exc}")
    finally:
        _optional(nvml.nvmlShutdown)

"""The doctor's NVML reads: health counters per GPU and peer-to-peer reachability.

Like kiln.hardware.nvml, it takes the NVML module as an argument, so the real `pynvml` and a recorded fixture go
through the same code. A query a GPU does not support is an unknown (None), never an error.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from kiln.doctor.facts import GpuHealth, NvmlHealth, PcieLink, RemappedRows

# NVML_P2P_CAPS_INDEX_READ; nvidia-ml-py spells that constant `= 0,`, a tuple ctypes cannot pass.
P2P_CAPS_INDEX_READ = 0


def _optional(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None
    except AttributeError:  # an nvidia-ml-py too old to know the call
        return None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _fabric(nvml: Any, handle: Any) -> tuple[int | None, int | None]:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    if _optional(nvml.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info)) is None:
        return None, None
    return int(info.state), int(info.status)


def _remapped(nvml: Any, handle: Any) -> RemappedRows | None:
    rows = _optional(nvml.nvmlDeviceGetRemappedRows, handle)
    if rows is None:
        return None
    corr, unc, pending, failure = rows
    return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))


def _pcie(nvml: Any, handle: Any) -> PcieLink:
    return PcieLink(
        generation=_int(_optional(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)),
        max_generation=_int(_optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)),
        gpu_max_generation=_int(_optional(nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle)),
        width=_int(_optional(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)),
        max_width=_int(_optional(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)),
    )


def _gpu(nvml: Any, index: int, handle: Any) -> GpuHealth:
    persistence = _optional(nvml.nvmlDeviceGetPersistenceMode, handle)
    pending_pages = _optional(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    state, status = _fabric(nvml, handle)
    return GpuHealth(
        index=index,
        persistence_mode=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
        ecc_uncorrected_volatile=_int(_optional(nvml.nvmlDeviceGetTotalEccErrors, handle,
                                                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)),
        retired_pages_pending=None if pending_pages is None else pending_pages == pynvml.NVML_FEATURE_ENABLED,
        remapped_rows=_remapped(nvml, handle),
        pcie=_pcie(nvml, handle),
        clock_event_reasons=_int(_optional(nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)),
        fabric_state=state,
        fabric_status=status,
    )


def read_health(nvml: Any) -> NvmlHealth:
    """Health of every GPU NVML lists; no driver is an answer (no GPUs), never a crash."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlHealth(problem=f"NVML cannot start: {exc}")
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        gpus = tuple(_gpu(nvml, i, h) for i, h in enumerate(handles))
        p2p = tuple(
            tuple(None if i == j else _int(_optional(nvml.nvmlDeviceGetP2PStatus, hi, hj,
                                                     P2P_CAPS_INDEX_READ))
                  for j, hj in enumerate(handles))
            for i, hi in enumerate(handles)
        )
        return NvmlHealth(gpus=gpus, p2p=p2p)
    except pynvml.NVMLError as exc:
        return NvmlHealth(problem=f"NVML failed while reading GPU health: {exc}")
    finally:
        _optional(nvml.nvmlShutdown)

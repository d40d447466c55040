"""`kiln detect --record`: this machine's answers, written in the fixture format that `--machine PATH` reads back.

Every NVML call kiln makes is asked once and its answer kept as plain data, or the name of the NVML error it gave,
so a recording replays through RecordedNvml exactly as the machine answered.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pynvml

from kiln.hardware.fixtures import P2P_KEYS
from kiln.hardware.host import HostProbe
from kiln.hardware.system import SystemProbe

Query = Callable[[Any, Any], Any]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _memory(nvml: Any, h: Any) -> dict[str, int]:
    info = nvml.nvmlDeviceGetMemoryInfo(h)
    return {"total": int(info.total), "free": int(info.free), "used": int(info.used)}


def _pci(nvml: Any, h: Any) -> dict[str, Any]:
    info = nvml.nvmlDeviceGetPciInfo(h)
    ids = {k: int(getattr(info, k)) for k in ("pciDeviceId", "pciSubSystemId") if hasattr(info, k)}
    return {"busId": _text(info.busId), **ids}


def _fabric(nvml: Any, h: Any) -> dict[str, int]:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    return {"state": int(info.state), "status": int(info.status), "cliqueId": int(info.cliqueId)}


def _nvlink_states(nvml: Any, h: Any) -> list[int]:
    states: list[int] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            states.append(int(nvml.nvmlDeviceGetNvLinkState(h, link)))
        except pynvml.NVMLError:
            break
    return states


# Fixture key -> how to ask for it; the keys RecordedNvml answers from.
DEVICE_QUERIES: dict[str, Query] = {
    "nvmlDeviceGetName": lambda n, h: _text(n.nvmlDeviceGetName(h)),
    "nvmlDeviceGetUUID": lambda n, h: _text(n.nvmlDeviceGetUUID(h)),
    "nvmlDeviceGetMemoryInfo": _memory,
    "nvmlDeviceGetCudaComputeCapability": lambda n, h: [int(v) for v in n.nvmlDeviceGetCudaComputeCapability(h)],
    "nvmlDeviceGetPciInfo": _pci,
    "nvmlDeviceGetMinorNumber": lambda n, h: int(n.nvmlDeviceGetMinorNumber(h)),
    "nvmlDeviceGetNumaNodeId": lambda n, h: int(n.nvmlDeviceGetNumaNodeId(h)),
    "nvmlDeviceGetMigMode": lambda n, h: [int(v) for v in n.nvmlDeviceGetMigMode(h)],
    "nvmlDeviceGetMemoryBusWidth": lambda n, h: int(n.nvmlDeviceGetMemoryBusWidth(h)),
    "nvmlDeviceGetMaxClockInfo_MEM": lambda n, h: int(n.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
    "nvmlDeviceGetPersistenceMode": lambda n, h: int(n.nvmlDeviceGetPersistenceMode(h)),
    "nvmlDeviceGetTotalEccErrors_UNCORRECTED_VOLATILE": lambda n, h: int(n.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)),
    "nvmlDeviceGetRetiredPagesPendingStatus": lambda n, h: int(n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
    "nvmlDeviceGetRemappedRows": lambda n, h: [int(v) for v in n.nvmlDeviceGetRemappedRows(h)],
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda n, h: int(n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda n, h: int(n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": lambda n, h: int(n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)),
    "nvmlDeviceGetCurrPcieLinkWidth": lambda n, h: int(n.nvmlDeviceGetCurrPcieLinkWidth(h)),
    "nvmlDeviceGetMaxPcieLinkWidth": lambda n, h: int(n.nvmlDeviceGetMaxPcieLinkWidth(h)),
    "nvmlDeviceGetCurrentClocksEventReasons": lambda n, h: int(n.nvmlDeviceGetCurrentClocksEventReasons(h)),
    "nvmlDeviceGetGpuFabricInfo": _fabric,
}


def _error_name(exc: pynvml.NVMLError) -> str:
    names = [k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and v == exc.value]
    return names[0] if names else "NVML_ERROR_UNKNOWN"


def _ask(query: Callable[[], Any]) -> Any:
    try:
        return query()
    except pynvml.NVMLError as exc:
        return _error_name(exc)


def _peers(handles: list[Any], i: int, call: Callable[[Any, Any], Any]) -> list[Any]:
    """One answer per device, this one's own entry 0, as the fixtures keep them."""
    return [0 if j == i else _ask(partial(call, handles[i], hj)) for j, hj in enumerate(handles)]


def _affinity(nvml: Any, handle: Any, words: int) -> list[int]:
    return [int(w) for w in nvml.nvmlDeviceGetCpuAffinity(handle, words)]


def _p2p(nvml: Any, caps: int) -> Callable[[Any, Any], int]:
    return lambda a, b: int(nvml.nvmlDeviceGetP2PStatus(a, b, caps))


def _ancestor(nvml: Any) -> Callable[[Any, Any], int]:
    return lambda a, b: int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))


def record_nvml(nvml: Any, cpu_count: int) -> dict[str, Any] | None:
    """NVML's answers in the fixture's `nvml` block; None when NVML does not start (no driver)."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        words = max(1, (cpu_count + 63) // 64)
        devices = []
        for i, hi in enumerate(handles):
            device: dict[str, Any] = {key: _ask(partial(query, nvml, hi)) for key, query in DEVICE_QUERIES.items()}
            device["nvmlDeviceGetCpuAffinity"] = _ask(partial(_affinity, nvml, hi, words))
            device["nvmlDeviceGetNvLinkState"] = _nvlink_states(nvml, hi)
            for caps, key in P2P_KEYS.items():
                device[key] = _peers(handles, i, _p2p(nvml, caps))
            device["nvmlDeviceGetTopologyCommonAncestor"] = _peers(handles, i, _ancestor(nvml))
            devices.append(device)
        return {
            "nvmlSystemGetDriverVersion": _ask(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
            "nvmlSystemGetCudaDriverVersion": _ask(lambda: int(nvml.nvmlSystemGetCudaDriverVersion())),
            "devices": devices,
        }
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            nvml.nvmlShutdown()


def record_machine(name: str, description: str, nvml: Any, host: HostProbe, system: SystemProbe) -> dict[str, Any]:
    """A whole machine file: host, system services and NVML, as `--machine PATH` reads it."""
    h = host.host()
    facts = system.facts(Path("/"), None)
    data: dict[str, Any] = {
        "name": name,
        "description": description,
        "captured": True,
        "host": {"cpu_count": h.cpu_count, "memory_bytes": h.memory_bytes, "disk_free_bytes": h.disk_free_bytes},
    }
    if facts.described:
        data["system"] = {"nvswitches": facts.nvswitches, "units": dict(facts.units), "shm_bytes": facts.shm_bytes,
                          "mounts": [m.as_dict() for m in system.mounts() if m.device.startswith("/dev/")]}
    data["pci_accelerators"] = [{"name": a} for a in host.foreign_accelerators()]
    data["nvml"] = record_nvml(nvml, h.cpu_count)
    return data

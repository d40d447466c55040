"""Named machines recorded as data: what NVML, psutil and sysfs answer on each.

`RecordedNvml` answers nvidia-ml-py's calls from a fixture, so detection runs the same
adapter code on a recorded H100x8 as on a real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import yaml

from kiln import datafiles
from kiln.errors import NotFoundError

# nvmlDeviceGetP2PStatus's caps index -> the fixture key holding that row of answers.
P2P_KEYS = {0: "nvmlDeviceGetP2PStatus_READ", pynvml.NVML_P2P_CAPS_INDEX_NVLINK: "nvmlDeviceGetP2PStatus_NVLINK"}


def _answer(value: Any) -> Any:
    """A recorded value, or the NVML error it was recorded as."""
    if isinstance(value, str) and value.startswith("NVML_ERROR_"):
        raise pynvml.NVMLError(getattr(pynvml, value))
    return value


class RecordedNvml:
    """The subset of the pynvml module kiln calls, answered from a fixture's `nvml` block."""

    def __init__(self, recording: Mapping[str, Any] | None) -> None:
        self._rec = recording
        self._devices: list[Mapping[str, Any]] = list(recording.get("devices", [])) if recording else []

    def nvmlInit(self) -> None:
        if self._rec is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        assert self._rec is not None
        return str(_answer(self._rec["nvmlSystemGetDriverVersion"]))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        assert self._rec is not None
        return int(_answer(self._rec["nvmlSystemGetCudaDriverVersion"]))

    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self._devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def _get(self, handle: int, key: str) -> Any:
        device = self._devices[handle]
        if key not in device:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _answer(device[key])

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._get(handle, "nvmlDeviceGetName"))

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return str(self._get(handle, "nvmlDeviceGetUUID"))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(**self._get(handle, "nvmlDeviceGetMemoryInfo"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._get(handle, "nvmlDeviceGetCudaComputeCapability")
        return int(major), int(minor)

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(**self._get(handle, "nvmlDeviceGetPciInfo"))

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetMinorNumber"))

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetNumaNodeId"))

    def nvmlDeviceGetCpuAffinity(self, handle: int, cpu_set_size: int) -> list[int]:
        words = [int(w) for w in self._get(handle, "nvmlDeviceGetCpuAffinity")]
        return (words + [0] * cpu_set_size)[:cpu_set_size]

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        return [int(v) for v in self._get(handle, "nvmlDeviceGetMigMode")]

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetMemoryBusWidth"))

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        if clock != pynvml.NVML_CLOCK_MEM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._get(handle, "nvmlDeviceGetMaxClockInfo_MEM"))

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        links = self._devices[handle].get("nvmlDeviceGetNvLinkState") or []
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(links[link])

    def nvmlDeviceGetP2PStatus(self, handle1: int, handle2: int, caps_index: int) -> int:
        key = P2P_KEYS.get(caps_index)
        if key is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(_answer(self._get(handle1, key)[handle2]))

    # Health, read by `kiln doctor`.
    def nvmlDeviceGetPersistenceMode(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetPersistenceMode"))

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        if (error_type, counter_type) != (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._get(handle, "nvmlDeviceGetTotalEccErrors_UNCORRECTED_VOLATILE"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetRetiredPagesPendingStatus"))

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        corr, unc, pending, failure = self._get(handle, "nvmlDeviceGetRemappedRows")
        return int(corr), int(unc), int(pending), int(failure)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetCurrPcieLinkGeneration"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetMaxPcieLinkGeneration"))

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetGpuMaxPcieLinkGeneration"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetCurrPcieLinkWidth"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetMaxPcieLinkWidth"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return int(self._get(handle, "nvmlDeviceGetCurrentClocksEventReasons"))

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, info: Any) -> int:
        """Fills the c_nvmlGpuFabricInfo_t passed by reference, as the C call does."""
        recorded = self._get(handle, "nvmlDeviceGetGpuFabricInfo")
        target = getattr(info, "_obj", info)  # ctypes.byref(struct) keeps the struct in _obj
        target.state = int(recorded["state"])
        target.status = int(recorded["status"])
        target.cliqueId = int(recorded.get("cliqueId", 0))
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: int, handle2: int) -> int:
        return int(_answer(self._get(handle1, "nvmlDeviceGetTopologyCommonAncestor")[handle2]))


def fixture_names() -> list[str]:
    return datafiles.list_names("machines")


def load_fixture(name: str) -> dict[str, Any]:
    """A named machine fixture's data."""
    if name not in fixture_names():
        raise NotFoundError(
            f"no machine fixture named {name!r}",
            where="--machine",
            fix=f"use one of: {', '.join(fixture_names())}, or a path to a YAML/JSON machine file",
        )
    data = datafiles.read_yaml(f"machines/{name}.yaml")
    assert isinstance(data, dict)
    return data


def load_recording(path: Path) -> dict[str, Any]:
    """A fixture-shaped recording kept outside the package (e.g. captured on real hardware)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data

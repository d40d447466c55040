"""GPU telemetry through NVML: utilization, memory, temperature, power. The NVML module is passed in."""

from __future__ import annotations

from typing import Any

import pynvml


def _read(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def gpu_telemetry(nvml: Any) -> list[dict[str, Any]]:
    """One entry per GPU; an empty list where there is no NVIDIA driver."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        readings = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            util = _read(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = _read(nvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = _read(nvml.nvmlDeviceGetPowerUsage, handle)
            readings.append({
                "index": index,
                "utilization_percent": util.gpu if util is not None else None,
                "memory_used_bytes": memory.used if memory is not None else None,
                "memory_total_bytes": memory.total if memory is not None else None,
                "temperature_c": _read(nvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
                "power_w": power_mw / 1000 if power_mw is not None else None,
            })
        return readings
    finally:
        _read(nvml.nvmlShutdown)

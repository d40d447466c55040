"""GPU datasheet facts: match a detected GPU to its class in data/gpus.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kiln.hardware.model import Architecture, GpuSpec, architecture_of


@dataclass(frozen=True)
class GpuCatalog:
    specs: Mapping[str, GpuSpec]
    names: Mapping[str, str]  # lowercased NVML name -> class name

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> GpuCatalog:
        specs: dict[str, GpuSpec] = {}
        names: dict[str, str] = {}
        for class_name, entry in data["gpus"].items():
            specs[class_name] = GpuSpec(
                class_name=class_name,
                architecture=Architecture(entry["architecture"]),
                memory_bandwidth_gb_s=float(entry["memory_bandwidth_gb_s"]),
                dense_tflops={k: (None if v is None else float(v)) for k, v in entry["dense_tflops"].items()},
                nvlink_gb_s=None if entry.get("nvlink_gb_s") is None else float(entry["nvlink_gb_s"]),
                supported=bool(entry.get("supported", True)),
                unsupported_reason=str(entry.get("unsupported_reason", "")),
                memory_gib=None if entry.get("memory_gib") is None else float(entry["memory_gib"]),
            )
            for name in entry["names"]:
                names[name.lower()] = class_name
        return cls(specs=specs, names=names)

    def lookup(self, gpu_name: str) -> GpuSpec | None:
        class_name = self.names.get(gpu_name.strip().lower())
        return None if class_name is None else self.specs[class_name]

    def resolve(
        self,
        gpu_name: str,
        compute_capability: tuple[int, int],
        derived_bandwidth_gb_s: float | None = None,
    ) -> GpuSpec:
        """The class of a GPU; an unknown GPU gets a spec derived from what NVML measured."""
        known = self.lookup(gpu_name)
        if known is not None:
            return known
        return GpuSpec(
            class_name="unknown",
            architecture=architecture_of(compute_capability),
            memory_bandwidth_gb_s=derived_bandwidth_gb_s or 0.0,
            dense_tflops={},
            supported=True,
        )


def hbm_bandwidth_gb_s(bus_width_bits: int | None, max_memory_clock_mhz: int | None) -> float | None:
    """Peak DRAM bandwidth from NVML's bus width and memory clock (double data rate)."""
    if not bus_width_bits or not max_memory_clock_mhz:
        return None
    return bus_width_bits / 8 * max_memory_clock_mhz * 2 / 1000

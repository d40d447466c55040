"""This machine, read live: the real NVML library, psutil for CPUs, RAM and disk, sysfs for other accelerators.

Kept apart from the recorded adapters so that a command about another machine loads neither library."""

from __future__ import annotations

from pathlib import Path

import psutil
import pynvml

from kiln.hardware.detect import detect, gpu_catalog
from kiln.hardware.host import ACCELERATOR_CLASSES, AMD_VENDOR, pci_devices
from kiln.hardware.model import Host, Machine
from kiln.hardware.specs import GpuCatalog


class LiveHost:
    """This machine, read through psutil and /sys."""

    def __init__(self, disk_path: str = "/", sysfs: Path = Path("/sys/bus/pci/devices")) -> None:
        self._disk_path = disk_path
        self._sysfs = sysfs

    def host(self) -> Host:
        return Host(
            cpu_count=psutil.cpu_count(logical=True) or 1,
            memory_bytes=psutil.virtual_memory().total,
            disk_free_bytes=psutil.disk_usage(self._disk_path).free,
        )

    def foreign_accelerators(self) -> tuple[str, ...]:
        return tuple(f"AMD GPU (PCI {d.vendor}:{d.device})" for d in pci_devices(self._sysfs)
                     if d.vendor == AMD_VENDOR and d.pci_class.startswith(ACCELERATOR_CLASSES) and d.device)


def detect_live(catalog: GpuCatalog | None = None) -> Machine:
    """This machine, through the real NVML library."""
    return detect(pynvml, LiveHost(), catalog or gpu_catalog(), name="this machine", source="nvml")

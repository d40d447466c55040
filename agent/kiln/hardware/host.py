"""The host adapters' shared parts: what a host probe answers, sysfs's PCI devices, a recorded host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kiln.hardware.model import Host

AMD_VENDOR = "0x1002"
# PCI classes: 0x03xxxx display controller, 0x12xxxx processing accelerator.
ACCELERATOR_CLASSES = ("0x03", "0x12")


@dataclass(frozen=True)
class PciDevice:
    vendor: str  # "0x10de"
    pci_class: str  # "0x068000"
    device: str  # "0x22a3"; "" when sysfs does not say


def pci_devices(sysfs: Path) -> list[PciDevice]:
    """Every device under /sys/bus/pci/devices that tells its vendor and class, in bus order."""
    found = []
    for entry in sorted(sysfs.iterdir()) if sysfs.is_dir() else []:
        try:
            vendor = (entry / "vendor").read_text().strip()
            pci_class = (entry / "class").read_text().strip()
        except OSError:
            continue
        try:
            device = (entry / "device").read_text().strip()
        except OSError:
            device = ""
        found.append(PciDevice(vendor, pci_class, device))
    return found


class HostProbe(Protocol):
    def host(self) -> Host: ...

    def foreign_accelerators(self) -> tuple[str, ...]: ...


class RecordedHost:
    """A fixture's `host` and `pci_accelerators` blocks."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def host(self) -> Host:
        h = self._data["host"]
        return Host(int(h["cpu_count"]), int(h["memory_bytes"]), int(h["disk_free_bytes"]))

    def foreign_accelerators(self) -> tuple[str, ...]:
        return tuple(str(a.get("name") or a["vendor_id"]) for a in self._data.get("pci_accelerators") or [])

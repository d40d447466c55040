"""Detection: NVML + host adapters -> one Machine value."""

from __future__ import annotations

from typing import Any

from kiln import datafiles
from kiln.hardware.fixtures import RecordedNvml, load_fixture
from kiln.hardware.host import HostProbe, RecordedHost
from kiln.hardware.model import Machine
from kiln.hardware.nvml import read_nvml
from kiln.hardware.specs import GpuCatalog


def gpu_catalog() -> GpuCatalog:
    return GpuCatalog.from_data(datafiles.read_yaml("gpus.yaml"))


def detect(nvml: Any, host_probe: HostProbe, catalog: GpuCatalog, *, name: str, source: str,
           description: str = "", droplet_size: str | None = None) -> Machine:
    host = host_probe.host()
    reading = read_nvml(nvml, catalog, host.cpu_count)
    return Machine(
        name=name,
        source=source,
        gpus=reading.gpus,
        host=host,
        nvlink=reading.nvlink,
        topology=reading.topology,
        driver_version=reading.driver_version,
        cuda_driver_version=reading.cuda_driver_version,
        unsupported_accelerators=host_probe.foreign_accelerators(),
        droplet_size=droplet_size,
        description=description or (reading.problem or ""),
    )


def detect_recorded(data: dict[str, Any], catalog: GpuCatalog | None = None) -> Machine:
    """A recorded machine, through the same adapter code as a live one."""
    return detect(
        RecordedNvml(data.get("nvml")),
        RecordedHost(data),
        catalog or gpu_catalog(),
        name=str(data["name"]),
        source=f"fixture:{data['name']}",
        description=str(data.get("description", "")),
        droplet_size=data.get("droplet_size"),
    )


def detect_fixture(name: str, catalog: GpuCatalog | None = None) -> Machine:
    return detect_recorded(load_fixture(name), catalog)

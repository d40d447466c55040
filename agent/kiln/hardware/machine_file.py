"""A user's own machine description (`kiln plan --machine PATH`), for hardware outside the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kiln.errors import ConfigError
from kiln.hardware.detect import detect_recorded
from kiln.hardware.model import Gpu, GpuSpec, Host, Machine, architecture_of
from kiln.hardware.specs import GpuCatalog
from kiln.validation import load_yaml_text, validate

FIX = (
    "write gpus as a list of {name, memory_mib, compute_capability, count}; "
    "see README 'Machines outside the catalog'"
)


class GpuGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    compute_capability: str
    count: int = Field(default=1, ge=1, le=64)
    numa_node: int | None = None

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> str:
        text = str(value)
        major, _, minor = text.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise ValueError('must look like "9.0"')
        return text


class HostSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_count: int = Field(default=32, ge=1)
    memory_gib: float = Field(default=256, gt=0)
    disk_free_gib: float = Field(default=500, ge=0)


class MachineFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    gpus: list[GpuGroup] = Field(min_length=1)
    nvlink: bool = False
    memory_bandwidth_gb_s: float | None = Field(default=None, gt=0)
    dense_tflops: dict[str, float | None] | None = None
    host: HostSection = HostSection()


def _spec(group: GpuGroup, doc: MachineFile, catalog: GpuCatalog, where: str) -> GpuSpec:
    cc = tuple(int(p) for p in group.compute_capability.split("."))
    known = catalog.lookup(group.name)
    if known is None and doc.memory_bandwidth_gb_s is None:
        raise ConfigError(
            f"GPU {group.name!r} is not in kiln's hardware data, so its memory bandwidth is unknown",
            where=f"{where}: memory_bandwidth_gb_s",
            fix="add memory_bandwidth_gb_s (the datasheet's GB/s), or use a GPU name kiln knows: "
            + ", ".join(sorted({n for n in catalog.names})),
        )
    arch = known.architecture if known else architecture_of((cc[0], cc[1]))
    return GpuSpec(
        class_name=known.class_name if known else "custom",
        architecture=arch,
        memory_bandwidth_gb_s=doc.memory_bandwidth_gb_s or (known.memory_bandwidth_gb_s if known else 0),
        dense_tflops=doc.dense_tflops or (dict(known.dense_tflops) if known else {}),
        nvlink_gb_s=known.nvlink_gb_s if known else None,
        supported=known.supported if known else True,
        unsupported_reason=known.unsupported_reason if known else "",
    )


def machine_from_file(path: Path, catalog: GpuCatalog) -> Machine:
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the machine file: {exc.strerror}", where=where,
                          fix="give a readable YAML or JSON file, or a fixture name") from None
    data = load_yaml_text(text, where=where)
    if isinstance(data, dict) and "nvml" in data:
        return detect_recorded(data, catalog)
    doc = validate(MachineFile, data, where=where, fix=FIX)
    gpus: list[Gpu] = []
    for group in doc.gpus:
        spec = _spec(group, doc, catalog, where)
        major, minor = (int(p) for p in group.compute_capability.split("."))
        for _ in range(group.count):
            i = len(gpus)
            gpus.append(Gpu(
                index=i, name=group.name, uuid=f"GPU-file-{i}", memory_bytes=group.memory_mib * 2**20,
                compute_capability=(major, minor), pci_bus_id=f"00000000:{i:02X}:00.0",
                numa_node=group.numa_node, cpus=(), mig_enabled=None, nvlink_links=18 if doc.nvlink else 0,
                spec=spec,
            ))
    n = len(gpus)
    nvlink = tuple(tuple(doc.nvlink or i == j for j in range(n)) for i in range(n))
    topology = tuple(tuple(0 if i == j else (20 if doc.nvlink else 50) for j in range(n)) for i in range(n))
    return Machine(
        name=doc.name or path.stem,
        source=f"file:{path}",
        gpus=tuple(gpus),
        host=Host(doc.host.cpu_count, int(doc.host.memory_gib * 2**30), int(doc.host.disk_free_gib * 2**30)),
        nvlink=nvlink,
        topology=topology,
    )
